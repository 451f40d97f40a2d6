"""qkv.mpi after a timed-out collective (CTest: python.mpi_timeout): the job must end, not hang in
mpi4py's MPI_Finalize at exit. Run as `mpi_timeout_check.py MPIRUN [FLAGS...] NUMPROC_FLAG` (CMake's
QKV_MPIRUN and MPIEXEC_NUMPROC_FLAG), it starts itself under that mpirun on 2 ranks, twice: rank 1
freezes (SIGSTOP, as a debugger or a stopped job would) before the call; rank 0's qkv.mpi.sdpa
raises qkv.mpi.Timeout within its timeout, timed_out() turns True, and the script ends normally.
qkv.mpi's exit handler must then end the whole job with MPI_Abort: mpirun exits with status 1
within seconds, the frozen rank ended too. Without the handler rank 0 waits in MPI_Finalize for the
frozen rank forever (here: until the limit below, a failure). The first job gives q_len and kv_len
(the wait is qkv::mpi's), the second does not (qkv.mpi sums them over the ranks first, a wait that
must time out too). Exits non-zero on failure."""

import os
import signal
import subprocess
import sys
import time

LIMIT_S = 120  # far above a job's few seconds (two interpreters importing numpy and qkv)


def rank_part(given):
    import numpy as np
    from mpi4py import MPI

    import qkv.mpi

    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 3, 16), dtype=np.float32) for _ in range(3))
    print(f"rank {comm.rank}: timed_out before: {qkv.mpi.timed_out()}", flush=True)
    comm.Barrier()
    if comm.rank == 1:
        print("rank 1: freezing", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(LIMIT_S)  # continued only by the launcher ending the job (Open MPI sends SIGCONT first)
        return
    lengths = dict(q_len=3 * comm.size, kv_len=3 * comm.size) if given else {}
    try:
        qkv.mpi.sdpa(comm, q, k, v, timeout=0.5, device="cpu", **lengths)
        print("rank 0: no Timeout", flush=True)
    except qkv.mpi.Timeout as e:
        print(f"rank 0: Timeout: {e}", flush=True)
    print(f"rank 0: timed_out after: {qkv.mpi.timed_out()}", flush=True)
    print("rank 0: leaving", flush=True)


def job(lengths):
    """One job of 2 ranks (q_len and kv_len "given" or "summed"); its failures."""
    start = time.monotonic()
    run = subprocess.Popen(sys.argv[1:] + ["2", sys.executable, __file__, "--rank", lengths], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = run.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)  # the job's own process group (start_new_session)
        out, _ = run.communicate()
        print(out)
        return [f"q_len and kv_len {lengths}: the job still ran after {LIMIT_S} s (a hang after the timeout)"]
    took = time.monotonic() - start
    print(out)
    failures = []
    for want in ("rank 0: timed_out before: False", "rank 1: timed_out before: False", "rank 1: freezing",
                 "rank 0: Timeout: ", "rank 0: timed_out after: True", "rank 0: leaving"):
        if want not in out:
            failures.append(f"missing from the output: {want!r}")
    if "no Timeout" in out:
        failures.append("no Timeout was raised")
    if run.returncode != 1:
        failures.append(f"mpirun exited with {run.returncode}, not 1 (MPI_Abort(MPI_COMM_WORLD, 1))")
    print(f"q_len and kv_len {lengths}: the job ended in {took:.1f} s, status {run.returncode}")
    return [f"q_len and kv_len {lengths}: {f}" for f in failures]


def main():
    if len(sys.argv) < 3:
        print("usage: mpi_timeout_check.py MPIRUN [FLAGS...] NUMPROC_FLAG", file=sys.stderr)
        return 1
    failures = job("given") + job("summed")
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    print(f"qkv.mpi after a timeout: {'ok' if not failures else 'FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank":
        rank_part(sys.argv[2] == "given")
    else:
        sys.exit(main())
