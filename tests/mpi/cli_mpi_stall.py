#!/usr/bin/env python3
"""A context-parallel `qkv sdpa` job with one rank that never arrives ends every rank in bounded
time, with exit status 1, the timeout named, and nothing written.

Usage: cli_mpi_stall.py stalled|frozen QKV DATA_DIR WORK_DIR MPIRUN [MPIRUN FLAGS...]

Rank 1 reads its K from a FIFO in WORK_DIR:
  stalled  nobody ever writes it: rank 1 blocks in open(), outside MPI;
  frozen   this script opens it for writing (so rank 1's open() returns), then stops rank 1 with
           SIGSTOP: a rank frozen inside the job.
Rank 0 times out (--mpi-timeout 1) waiting for rank 1. Before qkv::mpi::environment ended a
timed-out job with MPI_Abort, rank 0 then blocked forever in MPI_Finalize.
POSIX only; no numpy."""
import os
import signal
import subprocess
import sys
import time

LIMIT_S = 60  # the timeout (1 s) plus start-up and mpirun's grace for ending the ranks, on a loaded machine


def fifo_readers(path):
    """The processes that have `path` open."""
    target = os.path.realpath(path)
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                if os.path.realpath("/proc/%s/fd/%s" % (pid, fd)) == target:
                    found.append(int(pid))
                    break
        except OSError:
            continue
    return found


def main():
    mode, qkv, data, work = sys.argv[1:5]
    mpirun = sys.argv[5:]
    if mode not in ("stalled", "frozen"):
        sys.exit("mode must be stalled or frozen")
    os.makedirs(work, exist_ok=True)
    for name in os.listdir(work):
        os.remove(os.path.join(work, name))
    fifo = os.path.join(work, "k_fifo.npy")
    os.mkfifo(fifo)
    common = ["sdpa", "--q", os.path.join(data, "q.npy"), "--v", os.path.join(data, "v.npy"), "--backend", "cpu",
              "--context-parallel", "ring", "--mpi-timeout", "1", "--out", "out.npy"]
    job = mpirun + ["-np", "1", qkv] + common + ["--k", os.path.join(data, "k.npy")]
    job += [":", "-np", "1", qkv] + common + ["--k", "k_fifo.npy"]
    start = time.monotonic()
    p = subprocess.Popen(job, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stopped = []
    writer = None
    try:
        if mode == "frozen":
            # Opening for writing succeeds once rank 1 has the FIFO open for reading.
            while writer is None:
                try:
                    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:
                    if p.poll() is not None or time.monotonic() - start > LIMIT_S:
                        sys.exit("rank 1 never opened its FIFO:\n" + p.stdout.read().decode(errors="replace"))
                    time.sleep(0.01)
            # Our open() succeeds as soon as rank 1 is *inside* its open(); its descriptor shows in
            # /proc only once that open() returns, which on a loaded machine can take a while.
            while not stopped:
                stopped = [pid for pid in fifo_readers(fifo) if pid != os.getpid()]
                if not stopped:
                    if p.poll() is not None or time.monotonic() - start > LIMIT_S:
                        sys.exit("no process holds the FIFO open")
                    time.sleep(0.01)
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
        try:
            out, _ = p.communicate(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            sys.exit("the job still ran after %d s (a rank hangs):\n%s" % (LIMIT_S, out.decode(errors="replace")))
    finally:
        if writer is not None:
            os.close(writer)
    took = time.monotonic() - start
    text = out.decode(errors="replace")
    print(text)
    print("%s: mpirun ended after %.1f s with status %d" % (mode, took, p.returncode))
    alive = []
    for pid in stopped:  # a frozen rank left behind is a hang too (a zombie has ended)
        try:
            with open("/proc/%d/status" % pid) as f:
                state = next(line for line in f if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if "zombie" not in state:
            alive.append(pid)
            os.kill(pid, signal.SIGKILL)
    if alive:
        sys.exit("the frozen rank (pid %s) outlived the job" % alive)
    if p.returncode != 1:
        sys.exit("expected exit status 1 (a run-time failure), got %d" % p.returncode)
    if "qkv: rank 0 of 2: timed out after 1 s" not in text:
        sys.exit("rank 0 did not report its timeout")
    left = sorted(set(os.listdir(work)) - {"k_fifo.npy"})
    if left:
        sys.exit("the failed run left files behind: %s" % left)


if __name__ == "__main__":
    main()
