"""Context parallelism over MPI from Python: one long sequence spread over the ranks of an mpi4py
communicator, each rank passing its slice of Q, K and V (qkv::mpi::sdpa; docs/distributed.md).

    from mpi4py import MPI
    import qkv.mpi
    comm = MPI.COMM_WORLD
    mine = qkv.mpi.slice_of(L, comm.size, comm.rank)            # this rank's query rows
    q_mine = qkv.mpi.take(q, axis=2, rows=mine)                 # (B, Hq, rows, E)
    out, lse = qkv.mpi.sdpa(comm, q_mine, k_mine, v_mine, is_causal=True, return_lse=True)

Available where qkv was built with qkv::mpi (qkv.mpi.available); mpi4py must use the same MPI
(Debian's python3-mpi4py and libopenmpi-dev do). Every call is collective: it returns on every
rank or raises the same error on every rank, the failing rank named (qkv.mpi.Timeout when a rank
does not arrive in time).

After a Timeout the ranks are out of step and the late rank may never come back (frozen, blocked
outside MPI, dead), so mpi4py's MPI_Finalize at interpreter exit, which waits for every rank,
could wait forever. In a process where a qkv.mpi call raised Timeout (timed_out()), qkv.mpi's exit
handler therefore ends the whole job with MPI_Abort(MPI_COMM_WORLD, 1) instead, after flushing
sys.stdout and sys.stderr: every rank ends, the frozen one included, and the launcher exits with
status 1. Do not call MPI.Finalize() yourself after a Timeout.
"""

import atexit
import numbers
import sys
import time

from . import _arrays, _devices, _qkv
from ._errors import InvalidArgument, MPIError, Timeout
from ._sdpa import TOP_LEFT, check_dtypes, mask_kind, options, same_kind, small

__all__ = ["sdpa", "slice_of", "take", "timed_out", "available", "MPIError", "Timeout"]

available = bool(_qkv._has_mpi)


_timed_out_here = False  # a wait of this module's own (_summed) ran out


def timed_out():
    """Whether a qkv.mpi call of this process has raised Timeout (its own wait ran out, or another
    rank's did): the ranks are then out of step, and the job ends with MPI_Abort at exit."""
    return available and (_timed_out_here or bool(_qkv._mpi_timed_out()))


def _summed(comm, values, timeout):
    """The sums of `values` (ints) over the ranks of comm, waiting at most the call's timeout as
    qkv's own waits do: a rank that never arrives (frozen, dead) gives Timeout, not a hang."""
    import numpy
    from mpi4py import MPI

    global _timed_out_here
    limit = float(timeout) if timeout is not None else _qkv._mpi_default_timeout()
    send = numpy.array(values, dtype=numpy.int64)
    sums = numpy.zeros_like(send)
    request = comm.Iallreduce(send, sums, op=MPI.SUM)
    deadline = time.monotonic() + limit
    while not request.Test():
        if time.monotonic() > deadline:
            _timed_out_here = True
            raise Timeout(f"qkv.mpi.sdpa: summing q_len and kv_len over the {comm.size} ranks: not every rank "
                          f"arrived within the timeout ({limit:g} s)")
        time.sleep(0.001)
    return [int(x) for x in sums]


def _end_after_timeout():
    # Runs before mpi4py's finalisation (Python's exit handlers come first, in reverse order).
    if not timed_out():
        return
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed stream: nothing left to lose
            pass
    MPI.COMM_WORLD.Abort(1)


atexit.register(_end_after_timeout)


def _need_mpi():
    if not available:
        raise NotImplementedError("qkv.mpi: this qkv was built without MPI (qkv::mpi); rebuild with an MPI "
                                  "(Debian: libopenmpi-dev) found")


def _handle(comm):
    try:
        return comm.py2f()
    except AttributeError:
        raise TypeError(f"comm: a {type(comm).__name__} is not an mpi4py communicator") from None


def slice_of(length, ranks, rank, layout="zigzag"):
    """The rows of a sequence of `length` rows that rank `rank` of `ranks` holds, as a list of
    ranges: "zigzag" (chunks r and 2R - 1 - r of 2R: balances causal work) or "contiguous"."""
    _need_mpi()
    return [range(first, end) for first, end in _qkv._mpi_slice(length, ranks, rank, layout)]


def take(array, axis, rows):
    """The rows of `array` along `axis` that the ranges `rows` (slice_of's) name, concatenated: a
    copy (numpy.concatenate or torch.cat) of this rank's part of a whole array."""
    parts = [_arrays.select_range(array, axis, r.start, r.stop) for r in rows]
    if _arrays.kind_of(array) == _arrays.TORCH:
        import torch

        return torch.cat(parts, dim=axis)
    import numpy

    return numpy.concatenate(parts, axis=axis)


def sdpa(comm, query, key, value, attn_mask=None, *, q_len=None, kv_len=None, is_causal=False, scale=None,
         causal_alignment=TOP_LEFT, window=None, softcap=0.0, sinks=None, kv_type=None, return_lse=False,
         precision=None, mode="ring", layout="zigzag", timeout=None, device=None):
    """Context-parallel scaled dot-product attention (collective over `comm`).

    query (B, Hq, Lr, E), key (B, Hkv, Sr, E), value (B, Hkv, Sr, Ev): this rank's rows, as
    slice_of(L or S, comm.size, comm.rank, layout) names them (a rank may hold none: 0 rows).
    q_len, kv_len: the whole sequence's L and S (None: summed over the ranks). attn_mask: the whole
    mask, bool or float, broadcasting to (B, Hq, L, S), the same on every rank; sinks (Hq,) are
    applied once, after merging. mode "ring" (K/V blocks travel) or "allgather" (queries travel:
    decode and short queries); timeout in seconds (None: QKV_MPI_TIMEOUT, else 120).
    device: as scaled_dot_product_attention's ("cpu": the float64 reference backend).

    Returns this rank's output (B, Hq, Lr, Ev) as float32 of the query's kind, and with return_lse
    the tuple (output, lse (B, Hq, Lr)).
    """
    _need_mpi()
    q = _arrays.host_view(query, "query")
    k = _arrays.host_view(key, "key")
    v = _arrays.host_view(value, "value")
    kind = same_kind((q, k, v), ("query", "key", "value"))
    check_dtypes(q, k, v)
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)):
        raise TypeError(f"timeout must be a number of seconds (it is a {type(timeout).__name__})")
    if q_len is None or kv_len is None:
        rows = _summed(comm, [_arrays.shape_of(x)[2] if _arrays.rank(x) == 4 else 0 for x in (q, k)],
                       timeout if timeout is None or timeout > 0 else None)
        q_len = rows[0] if q_len is None else q_len
        kv_len = rows[1] if kv_len is None else kv_len
    for name, n in (("q_len", q_len), ("kv_len", kv_len)):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise InvalidArgument(f"{name} must be a non-negative int (it is {n!r})")
    opts = options(scale=scale, causal=is_causal, alignment=causal_alignment, window=window, softcap=softcap,
                   return_lse=return_lse, kv_type=kv_type, precision=precision)
    mask, is_bool = mask_kind(attn_mask)
    context = _devices.resolve(device)
    out, lse = _qkv._mpi_sdpa(_handle(comm), q, k, v, q_len=int(q_len), kv_len=int(kv_len), mask=mask,
                              mask_is_bool=is_bool, sinks=small(sinks, "sinks"), options=opts, mode=mode,
                              layout=layout, timeout=None if timeout is None else float(timeout), context=context)
    out = _arrays.wrap(out, kind)
    return (out, _arrays.wrap(lse, kind)) if return_lse else out
