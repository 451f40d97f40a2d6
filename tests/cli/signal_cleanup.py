#!/usr/bin/env python3
"""SIGTERM and SIGINT during `qkv attention`, and SIGTERM during `qkv bench --json` once it is
timing, leave no temporary file and every existing file as it was; the process ends by the signal.
Usage: signal_cleanup.py QKV WORK_DIR (POSIX only; no numpy)."""
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time


def save(path, rows, cols, rng):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, cols)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%df" % (rows * cols), *(rng.gauss(0, 1) for _ in range(rows * cols))))


def main():
    qkv, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rng = random.Random(8)
    n, d = 3000, 32  # long enough on the CPU backend (N x N weights) to be interrupted
    save(os.path.join(work, "x.npy"), n, d, rng)
    for w in ("wq", "wk", "wv"):
        save(os.path.join(work, w + ".npy"), d, d, rng)
    precious = b"an existing out.npy that must survive"
    with open(os.path.join(work, "out.npy"), "wb") as f:
        f.write(precious)
    before = sorted(os.listdir(work))

    for sig in (signal.SIGTERM, signal.SIGINT):
        args = [qkv, "attention", "--x", "x.npy", "--wq", "wq.npy", "--wk", "wk.npy", "--wv", "wv.npy",
                "--backend", "cpu", "--out", "out.npy", "--weights", "w.npy"]
        p = subprocess.Popen(args, cwd=work, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not any(name.endswith(".tmp") for name in os.listdir(work)):
            if p.poll() is not None:
                sys.exit("qkv ended (status %d) before its temporary files appeared: %s"
                         % (p.returncode, p.stderr.read().decode()))
            if time.monotonic() > deadline:
                p.kill()
                sys.exit("no temporary file appeared within 120 s")
            time.sleep(0.01)
        p.send_signal(sig)
        p.wait()
        if p.returncode != -sig:
            sys.exit("after %s qkv ended with status %d, not by the signal" % (sig.name, p.returncode))
        after = sorted(os.listdir(work))
        if after != before:
            sys.exit("after %s the directory holds %s, expected %s" % (sig.name, after, before))
        with open(os.path.join(work, "out.npy"), "rb") as f:
            if f.read() != precious:
                sys.exit("after %s out.npy changed" % sig.name)
        print("%s: temporaries removed, out.npy unchanged, ended by the signal" % sig.name)
    bench(qkv, os.path.join(work, "bench"))


def bench(qkv, work):
    """`qkv bench --json FILE` ended while it times its rows: FILE is as it was (the report goes to a
    temporary, renamed only when the whole run succeeded)."""
    os.makedirs(work)
    precious = b'{"an existing": "bench.json that must survive"}\n'
    with open(os.path.join(work, "bench.json"), "wb") as f:
        f.write(precious)
    before = sorted(os.listdir(work))
    log_path = work + ".stderr"  # beside the directory, which must hold only bench.json
    with open(log_path, "wb") as log:
        p = subprocess.Popen([qkv, "bench", "--seq", "16", "--dim", "8", "--causal", "no", "--impl", "fused",
                              "--precision", "fp32", "--repeat", "100000", "--warmup", "0", "--no-ceiling",
                              "--json", "bench.json"], cwd=work, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 120
    while b"[1/1]" not in open(log_path, "rb").read():  # the first row is being timed
        if p.poll() is not None:
            sys.exit("qkv bench ended (status %d) before timing: %s" % (p.returncode, open(log_path).read()))
        if time.monotonic() > deadline:
            p.kill()
            sys.exit("qkv bench did not start timing within 120 s")
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    p.wait()
    if p.returncode != -signal.SIGTERM:
        sys.exit("after SIGTERM qkv bench ended with status %d, not by the signal" % p.returncode)
    after = sorted(os.listdir(work))
    if after != before:
        sys.exit("after SIGTERM the bench directory holds %s, expected %s" % (after, before))
    with open(os.path.join(work, "bench.json"), "rb") as f:
        if f.read() != precious:
            sys.exit("after SIGTERM during the sweep bench.json changed")
    print("bench: SIGTERM while timing left bench.json unchanged and no temporary")


if __name__ == "__main__":
    main()
