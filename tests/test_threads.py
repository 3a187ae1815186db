"""Serving objects used from several threads at once (a server's thread
pool): each thread's calls on one shared object give what the same calls
give alone. The objects that keep buffers between calls (a fixed-shape
segment's, a `Resident`'s, the fixed-shape sessions' bookkeeping, a
`SessionTable`) run here on the CPU provider, where the device path runs
too (tests/test_device_ring.py); a session slowed down (`Slow`) lets the
other threads in between a call's writes and its reads, where a missing
lock would hand one thread another's results."""
import threading
import time

import numpy as np
import pytest

from export import SessionTable, onnx_runtime, open_runtime
from export.device_cache import FixedStep
from export.device_memory import FixedSegment
from txl_tf.errors import TxlError
from test_decode_cache_export import CONFIG, export_of_config

THREADS = 3


class Slow:
    """A session whose IO-binding runs wait a little first (the GIL let go)."""

    def __init__(self, session):
        self.session = session

    def __getattr__(self, name):
        return getattr(self.session, name)

    def run_with_iobinding(self, *args):
        time.sleep(0.002)
        return self.session.run_with_iobinding(*args)


def in_threads(work, count=THREADS):
    """`[work(i) for i in range(count)]`, each in a thread of its own,
    started together; the first error is raised here."""
    results, errors = [None] * count, []
    barrier = threading.Barrier(count)

    def run(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as error:  # raised again below, in the test's thread
            errors.append(error)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


@pytest.fixture(scope="module")
def path(built_once):
    return str(export_of_config(built_once)[1] / "model.onnx")


def device_runtime(path, **options):
    """The device path (fixed buffers, `Resident`s) forced on the CPU provider."""
    return open_runtime(path, device="cpu", device_cache=True, cuda_graph=True, **options)


def test_steps_and_scores_on_one_fixed_segment_from_threads_equal_each_alone(path):
    runtime = device_runtime(path, fixed_shapes=True)
    shape = (2, 3)
    segment = runtime._fixed_for(shape, open_now=True)
    assert isinstance(segment, FixedSegment)
    segment.session = Slow(segment.session)

    def calls(i):
        rng = np.random.default_rng(i)
        out, memory = [], None
        for _ in range(3):
            ids = rng.integers(0, CONFIG.n_token, shape)
            log_probs, memory = runtime.step(ids, memory)
            nll, memory = runtime.score(ids, rng.integers(0, CONFIG.n_token, shape), memory)
            out += [log_probs, nll]
        return out + list(memory.numpy())
    alone = [calls(i) for i in range(THREADS)]
    for got, want in zip(in_threads(calls), alone):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_decode_steps_of_caches_taking_turns_in_one_resident_from_threads_equal_each_alone(
        path):
    """Each thread decodes its own one-row cache; they share the `Resident`
    of batch size 1, whose buffers each step moves its cache into."""
    runtime = device_runtime(path, fixed_shapes=False)
    runtime._replay()
    step = "token" if "token" in runtime._replay_sessions else "step"  # decode_token's export
    runtime._replay_sessions[step] = Slow(runtime._replay_sessions[step])

    def calls(i):
        rng = np.random.default_rng(i)
        _, memory = runtime.step(rng.integers(0, CONFIG.n_token, [1, 4]))
        cache = runtime.decode_init(memory)
        out = []
        for _ in range(5):
            log_probs, cache = runtime.decode_step(rng.integers(0, CONFIG.n_token, [1]), cache)
            out.append(log_probs)
        return out + list(runtime.cache_memory(cache).numpy())
    alone = [calls(i) for i in range(THREADS)]
    got = in_threads(calls)
    assert list(runtime._residents) == [1]
    for a_thread, want in zip(got, alone):
        for a, b in zip(a_thread, want):
            np.testing.assert_array_equal(a, b)


def test_fixed_shape_sessions_opened_by_threads_at_once_keep_to_the_kept_count(path,
                                                                              monkeypatch):
    """Threads opening sessions of different shapes at once keep at most
    `FIXED_SHAPES_KEPT` of them, each thread's step computing what the
    dynamic session does."""
    monkeypatch.setattr(onnx_runtime, "FIXED_SHAPES_KEPT", 1)
    runtime = open_runtime(path, device="cpu", fixed_shapes=True)
    dynamic = open_runtime(path, device="cpu", fixed_shapes=False)
    opened = runtime._open_fixed

    def slow_open(shape):
        time.sleep(0.05)
        return opened(shape)
    monkeypatch.setattr(runtime, "_open_fixed", slow_open)
    ids = [np.full([1, n], n) for n in range(1, THREADS + 1)]
    for segment in ids:  # each shape seen once: the next call opens its session
        runtime.step(segment)
    got = in_threads(lambda i: runtime.step(ids[i])[0])
    assert len(runtime._fixed) == 1
    for segment, log_probs in zip(ids, got):
        np.testing.assert_allclose(log_probs, dynamic.step(segment)[0], atol=1e-6)


def test_a_table_stepped_by_one_thread_while_others_open_and_close_sessions(path):
    """Request threads open a session each, wait for it to finish and close
    it while a loop thread steps the table: each gets what it gets alone."""
    runtime = open_runtime(path, device="cpu")
    table = SessionTable(runtime, max_batch=2)
    prompts = {i: list(range(1 + i, 4 + 2 * i)) for i in range(2 * THREADS)}
    alone = {i: runtime.generate([p], 4, seed=i).ids[0].tolist() for i, p in prompts.items()}
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            if not table.step():
                time.sleep(0.001)
    stepping = threading.Thread(target=loop)
    stepping.start()

    def client(i):
        got = {}
        for key in (i, i + THREADS):
            table.open(key, prompts[key], 4, seed=key)
            while key in table.active() and stepping.is_alive():
                time.sleep(0.001)
            got[key] = table.close(key).ids[0].tolist()
        return got
    try:
        results = in_threads(client)
    finally:
        stop.set()
        stepping.join(60)
    assert {key: ids for got in results for key, ids in got.items()} == alone


@pytest.mark.parametrize("device_path", [False, True], ids=["host", "device"])
def test_a_slab_used_by_a_second_thread_while_one_steps_it_raises(path, device_path):
    """A slab serves one thread at a time: a call from another thread while
    one is inside a step is refused, naming the slab, and the step goes on."""
    runtime = device_runtime(path) if device_path else open_runtime(path, device="cpu")
    inside, go_on = threading.Event(), threading.Event()

    def check(log_probs):  # the step's check: the slab's first thread is inside
        inside.set()
        assert go_on.wait(30)
        return log_probs
    slab = runtime._generation.cache_slab(2)
    cache = runtime.decode_init(runtime.step(np.ones([1, 3], np.int32))[1])
    slab.admit("a", runtime.take(cache, [0]))
    stepping = threading.Thread(target=lambda: slab.step(np.array([1]), check))
    stepping.start()
    try:
        assert inside.wait(30)
        with pytest.raises(TxlError, match=f"{type(slab).__name__} is in use by another "
                                           "thread: a slab serves one thread at a time"):
            slab.admit("b", runtime.take(cache, [0]))
    finally:
        go_on.set()
        stepping.join(30)
    assert slab.keys == ["a"]
    slab.admit("b", runtime.take(cache, [0]))  # the step over, another thread may go on
    assert slab.keys == ["a", "b"]


def test_runs_replaying_cuda_graphs_take_turns_under_the_runtimes_lock(path, monkeypatch):
    """On CUDA, where a session's captured graphs are its own unguarded
    state, its fixed-shape segments, its `Resident`s and its slabs share one
    lock (here, on the CPU provider, as if each of their sessions replayed)."""
    runtime = device_runtime(path, fixed_shapes=True)
    monkeypatch.setattr(runtime, "_replay_lock_of",
                        lambda captured: runtime._replay_lock)
    assert runtime._fixed_for((1, 2), open_now=True).lock is runtime._replay_lock
    cache = runtime.decode_init(runtime.step(np.ones([1, 3], np.int32))[1])
    assert runtime._holding(cache) is runtime._replay_lock
    slab = runtime._generation.cache_slab(2)
    slab.admit("a", cache)
    held, read = [], FixedStep.read
    monkeypatch.setattr(FixedStep, "read", lambda self, *args: held.append(
        runtime._replay_lock._is_owned()) or read(self, *args))
    slab.step(np.array([1]), lambda log_probs: held.append(runtime._replay_lock._is_owned())
              or log_probs)
    assert held == [True, False]  # the run under it; the check (the caller's code) outside


def test_a_slab_steps_check_waiting_on_another_threads_step_does_not_deadlock(path,
                                                                            monkeypatch):
    """`DeviceSlab.step` held the runtime's replay lock around its `check`
    (the caller's code): a check waiting for another thread's step on that
    runtime (a server handing work to its pool) waited for good."""
    runtime = device_runtime(path)
    monkeypatch.setattr(runtime, "_replay_lock_of", lambda captured: runtime._replay_lock)
    cache = runtime.decode_init(runtime.step(np.ones([1, 3], np.int32))[1])
    slab = runtime._generation.cache_slab(2)
    slab.admit("a", runtime.take(cache, [0]))
    finished = []

    def check(log_probs):
        other = threading.Thread(target=lambda: finished.append(
            runtime.decode_step(np.array([2]), runtime.take(cache, [0]))))
        other.start()
        other.join(5)
        assert finished, "the other thread's step waited for the slab's lock"
        return log_probs
    slab.step(np.array([1]), check)
    assert slab.keys == ["a"]
