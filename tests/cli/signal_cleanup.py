#!/usr/bin/env python3
"""SIGTERM and SIGINT during `qkv attention` leave no temporary file and every existing file as it
was; the process ends by the signal. Usage: signal_cleanup.py QKV WORK_DIR (POSIX only; no numpy)."""
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


if __name__ == "__main__":
    main()
