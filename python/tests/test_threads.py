"""Calls from several Python threads at once (one shared context, the float64 reference, caches):
every result equals the single-threaded one, and the GIL is released during the work, so another
Python thread keeps running meanwhile."""

import threading
import time

import numpy as np

import qkv

from conftest import needs_vulkan


def inputs(seed, L=17, S=200):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape, dtype=np.float32) for shape in ((1, 4, L, 32), (1, 4, S, 32),
                                                                           (1, 4, S, 32)))


def run_threads(target, count):
    errors, threads = [], []

    def guarded(i):
        try:
            target(i)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    for i in range(count):
        threads.append(threading.Thread(target=guarded, args=(i,)))
        threads[-1].start()
    for t in threads:
        t.join()
    assert errors == []


def test_threads_share_the_reference_and_the_default_context():
    devices = ["cpu"] + ([None] if qkv.devices() else [])
    problems = [inputs(seed) for seed in range(4)]
    want = {(d, i): qkv.scaled_dot_product_attention(*problems[i], is_causal=True, device=d)
            for d in devices for i in range(4)}
    got = {}

    def work(i):
        for round in range(3):
            for d in devices:
                got[(d, i, round)] = qkv.scaled_dot_product_attention(*problems[i], is_causal=True, device=d)

    run_threads(work, 4)
    for (d, i, _), out in got.items():
        assert np.array_equal(out, want[(d, i)])  # identical bits, whatever ran beside it


@needs_vulkan
def test_threads_append_and_decode_one_cache():
    cache = qkv.KVCache(None, 1, 2, 400, 32, 32)
    k, v = inputs(9, S=10)[1:]
    k, v = k[:, :2], v[:, :2]

    def work(i):
        for _ in range(10):
            try:
                cache.append(k, v)
            except qkv.LimitExceeded:
                pass  # the capacity is shared: some appends do not fit, none passes it
            cache.decode(inputs(i, L=1)[0][:, :2])

    run_threads(work, 4)
    assert cache.size == 400


def test_the_gil_is_released_during_the_work():
    """While a thread runs a long call, the main thread keeps executing Python: the longest pause
    between its steps stays far below the call's duration (were the GIL held, it would pause for
    the whole call)."""
    S = 2048
    while True:  # a call long enough to tell (a fifth of a second or more), whatever the machine's speed
        q, k, v = inputs(1, L=512, S=S)
        start = time.perf_counter()
        qkv.scaled_dot_product_attention(q, k, v, device="cpu")
        duration = time.perf_counter() - start
        if duration >= 0.2 or S >= 32768:
            break
        S *= 2
    done = threading.Event()

    def call():
        qkv.scaled_dot_product_attention(q, k, v, device="cpu")
        done.set()

    t = threading.Thread(target=call)
    t.start()
    longest, last, steps = 0.0, time.perf_counter(), 0
    while not done.is_set():
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
        steps += 1
    t.join()
    assert duration > 0.05, "the call is too short to tell"
    assert steps > 100 and longest < 0.5 * duration, (steps, longest, duration)
