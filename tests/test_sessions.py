"""The session table: sessions interleaved in shared batches get exactly what
each gets alone, on the decode cache's slab (ONNX Runtime, SavedModel) and
through `step_last` (an export without the cache, the compiled decoder)."""
import os
import re

import keras
import numpy as np
import pytest

from export import SessionTable, open_runtime, run_export
from export.decode_cache import ALIGNMENT, LAYER_STACKED
from export.device_cache import on_device
from export.slab import DeviceSlab
from txl_tf import Decoder, TransformerXL, TransformerXLConfig, TxlError
from txl_tf.weights import save_pretrained

N_TOKEN = 40


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    keras.utils.set_random_seed(3)
    # Odd head sizes: the slab pads its stacked layers to 64-byte boundaries.
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.3,
                                                    n_head=3, d_head=5))
    root = tmp_path_factory.mktemp("sessions")
    save_pretrained(core, root / "model")
    run_export(str(root / "out"), str(root / "model"), mem_len=16, log_probs="last",
               verify=False)
    return root / "out"


# "onnx_device": the slab in device buffers (`DeviceSlab`), forced on the CPU
# provider, over the fixed-buffer steps that CUDA graphs replay on a GPU
# (`TXL_DEVICE_TESTS=cuda -k onnx_device` runs them there).
@pytest.fixture(scope="module", params=["onnx", "saved_model", "onnx_step_last", "onnx_device"])
def runtime(request, exported):
    device_path = request.param == "onnx_device"
    runtime = open_runtime(str(exported), backend="saved_model" if request.param ==
                           "saved_model" else "onnx",
                           device=os.environ.get("TXL_DEVICE_TESTS", "cpu") if device_path
                           else "cpu",
                           **(dict(device_cache=True, cuda_graph=True) if device_path else {}))
    runtime.use_decode_cache = request.param != "onnx_step_last"
    assert runtime.use_decode_cache == (request.param != "onnx_step_last")
    assert isinstance(SessionTable(runtime).slab, DeviceSlab) == device_path
    return runtime


@pytest.fixture(scope="module", params=["onnx", "saved_model"])
def cached_runtime(request, exported):
    return open_runtime(str(exported), backend=request.param, device="cpu")


SESSIONS = {  # id: (prompt, max_new_tokens, settings)
    "a": ([1, 2, 3], 12, dict(temperature=1.0, top_k=8, seed=5)),
    "b": ([7] * 20, 9, dict(temperature=0)),
    "c": ([4, 5], 15, dict(temperature=0.7, top_p=0.9, repetition_penalty=1.3, seed=9,
                           stop_ids=[0, 1, 2])),
    "d": ([30, 31, 32, 33, 34, 35, 36], 6, dict(temperature=1.5, seed=2)),
}


def test_interleaved_sessions_get_what_they_get_alone(runtime):
    table = SessionTable(runtime, max_batch=2)
    table.open("a", *SESSIONS["a"][:2], **SESSIONS["a"][2])
    table.step()
    table.step()
    for sid in "bcd":  # joining while "a" is half-way
        table.open(sid, *SESSIONS[sid][:2], **SESSIONS[sid][2])
    seen_batches = set()
    while table.active():
        seen_batches.add(tuple(sorted(table.step())))
    assert any(len(b) == 2 for b in seen_batches) and len(seen_batches) > 2
    for sid, (prompt, n, settings) in SESSIONS.items():
        got = table.close(sid)
        alone = runtime.generate([prompt], n, **settings)
        length = int(alone.lengths[0])
        np.testing.assert_array_equal(got.ids[0], alone.ids[0, :length], err_msg=sid)
        np.testing.assert_allclose(got.log_probs[0], alone.log_probs[0, :length], atol=1e-5)
        np.testing.assert_allclose(got.memory.numpy()[0], alone.memory.numpy()[0], atol=1e-5)
    assert not table.active()


def test_the_table_keeps_cached_sessions_in_one_slab(cached_runtime):
    runtime = cached_runtime
    table = SessionTable(runtime, max_batch=2)
    for sid in "abc":
        table.open(sid, *SESSIONS[sid][:2], **SESSIONS[sid][2])
    table.step()
    first = table.slab.batch()
    table.step()
    assert table.slab.keys == ["a", "b"] and table.active() == ["a", "b", "c"]
    for name, view in table.slab.batch().items():  # stepped in place, not copied
        assert np.shares_memory(view, first[name]), name
    for name in LAYER_STACKED:  # each layer handed over without a copy
        assert all(layer.ctypes.data % ALIGNMENT == 0 for layer in first[name]), name


@pytest.mark.parametrize("runtime", ["onnx", "saved_model", "onnx_device"], indirect=True)
def test_the_slab_rotates_a_cache_onto_its_slot_and_gives_it_back(runtime):
    """Caches at different ring slots share one step of the slab (the host's
    `CacheSlab`; a `DeviceSlab` in device buffers), and each comes back as
    it would be stepped alone, whichever rows leave first; a row that
    stopped (its own slot behind its cache's) is rotated by its own slot."""
    rng = np.random.default_rng(0)
    caches = []
    for steps in (0, 3, 21):  # different ring slots (21 wraps a ring of 17)
        cache = runtime.decode_init(runtime.initial_memory(1))
        for _ in range(steps):
            runtime.decode_step(rng.integers(0, N_TOKEN, 1), cache)
        caches.append(cache)
    two = runtime.decode_init(runtime.initial_memory(2))
    for t in range(19):  # a full memory, then row 0 stops for 3 steps
        runtime.decode_step(rng.integers(0, N_TOKEN, 2), two, stopped=[t >= 16, False])
    caches.append(runtime.take(two, [0]))
    assert len({int(c["slot"].numpy() if on_device(c) else c["slot"]) for c in caches}) == 4
    for first in (0, 3):  # the stopped row joins a slab with rows, or an empty one
        slab = SessionTable(runtime, max_batch=4).slab
        for key in [first] + [k for k in range(4) if k != first]:
            slab.admit(key, runtime.take(caches[key], [0]))
        token = rng.integers(0, N_TOKEN, 4)
        together = dict(zip(slab.keys, slab.step(token[slab.keys], lambda lp: lp)))
        for key in (3, 0):
            np.testing.assert_allclose(
                together[key], runtime.decode_step(token[key:key + 1],
                                                   runtime.take(caches[key], [0]))[0][0],
                atol=1e-5)
    slab = SessionTable(runtime, max_batch=3).slab
    caches = caches[:3]
    for key, cache in enumerate(caches):
        slab.admit(key, runtime.take(cache, [0]))
    token = rng.integers(0, N_TOKEN, 3)
    together = slab.step(token, lambda log_probs: log_probs)
    for key in (1, 0, 2):  # rows move as others leave
        back = slab.evict(key)
        alone = runtime.decode_step(token[key:key + 1], caches[key])[0]
        np.testing.assert_allclose(together[key:key + 1], alone, atol=1e-5)
        for got, want in zip(runtime.cache_memory(back).numpy(),
                             runtime.cache_memory(caches[key]).numpy()):
            np.testing.assert_allclose(got, want, atol=1e-5)
    assert not len(slab)
    slab.admit("a", runtime.take(caches[0], [0]))
    with pytest.raises(ValueError, match="the slab holds a stream 'a' already"):
        slab.admit("a", runtime.take(caches[1], [0]))  # the host's slab took it as a second row
    with pytest.raises(ValueError, match="a slab admits one row at a time, not 2"):
        slab.admit("b", two)


def test_the_table_also_runs_over_the_compiled_decoders_backend():
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.3,
                                                    n_head=3, d_head=5))
    decoder = Decoder(core, mem_len=16, jit_compile=False)
    table = SessionTable(decoder, max_batch=3)
    for sid, (prompt, n, settings) in SESSIONS.items():
        table.open(sid, prompt, n, **settings)
    table.run()
    for sid, (prompt, n, settings) in SESSIONS.items():
        alone = decoder.generate([prompt], n, **settings)
        np.testing.assert_array_equal(table.close(sid).ids[0],
                                      alone.ids[0, :int(alone.lengths[0])])


def test_bad_session_input(runtime):
    table = SessionTable(runtime)
    table.open("x", [1], 2)
    with pytest.raises(ValueError, match="already open"):
        table.open("x", [1], 2)
    with pytest.raises(ValueError, match="prompt 0 must be a non-empty"):
        table.open("y", [], 2)
    with pytest.raises(ValueError, match="out of range"):
        table.open("y", [N_TOKEN], 2)
    for method in (table.open, table.reset):  # what one decode call holds, as in generate
        with pytest.raises(ValueError, match=r"max_new_tokens must be an integer in "
                                             r"\[0, 1073741824\], got 1073741825"):
            method("x" if method == table.reset else "y", [1], 2 ** 30 + 1)
    with pytest.raises(ValueError, match="max_batch must be"):
        SessionTable(runtime, max_batch=0)
    with pytest.raises(ValueError, match="segment_len must be an integer >= 1, got -1"):
        SessionTable(runtime, segment_len=-1)
    for bad in (-1, 0, 2.5):  # checked in the generation flow every backend shares
        with pytest.raises(ValueError, match=f"segment_len must be an integer >= 1, got {bad}"):
            runtime.generate([[1]], 2, segment_len=bad)
    with pytest.raises(ValueError, match="no open session 'y'"):
        table.close("y")


def test_a_session_that_used_its_budget_resumes_as_one_longer_call(runtime):
    prompt, _, settings = SESSIONS["a"]
    table = SessionTable(runtime, max_batch=2)
    table.open("a", prompt, 5, **settings)
    table.run()
    first = table.close("a")
    assert not first.state.done.any()  # out of budget, not stopped
    rest = runtime.generate(None, 7, resume=first.state)
    whole = runtime.generate([prompt], 12, **settings)
    np.testing.assert_array_equal(np.concatenate([first.ids[0], rest.ids[0]]), whole.ids[0])
    with pytest.raises(ValueError, match="pad_id"):
        table.open("x", prompt, 3, pad_id=N_TOKEN)


def _poison_memory(table, runtime, session_id):
    """Puts a NaN into one valid slot of the session's memory."""
    mems, mem_mask = table._sessions[session_id].state.memory.numpy()
    mems[0, 0, np.flatnonzero(mem_mask[0])[0]] = np.nan
    poisoned = table._sessions[session_id].state._replace(
        memory=runtime.take((mems, mem_mask), [0]))
    table._sessions[session_id] = table._sessions[session_id]._replace(state=poisoned)


def test_a_session_with_a_non_finite_memory_is_named_and_the_others_go_on(runtime):
    from txl_tf import NonFiniteMemoryError
    table = SessionTable(runtime, max_batch=4)
    for sid in "ab":
        table.open(sid, *SESSIONS[sid][:2], **SESSIONS[sid][2])
    _poison_memory(table, runtime, "b")
    with pytest.raises(NonFiniteMemoryError, match=r"stream\(s\) b:"):
        table.step()
    assert table.active() == ["a"]
    table.run()
    prompt, n, settings = SESSIONS["a"]
    np.testing.assert_array_equal(table.close("a").ids[0], runtime.generate([prompt], n,
                                                                           **settings).ids[0])


def test_sessions_go_on_from_a_memory_read_once(runtime):
    from txl_tf import NonFiniteMemoryError
    _, shared = runtime.step(np.array([[3, 1, 4, 1, 5, 9, 2, 6]], np.int32))
    table = SessionTable(runtime, max_batch=2)
    for sid in "ac":
        table.open(sid, *SESSIONS[sid][:2], memory=shared, **SESSIONS[sid][2])
    table.run()
    for sid in "ac":
        prompt, n, settings = SESSIONS[sid]
        alone = runtime.generate([prompt], n, memory=shared, **settings)
        np.testing.assert_array_equal(table.close(sid).ids[0],
                                      alone.ids[0, :int(alone.lengths[0])])
    mems, mem_mask = shared.numpy()
    mems[1, 0, -1] = np.inf
    with pytest.raises(NonFiniteMemoryError):
        table.open("x", [1], 3, memory=(mems, mem_mask))
    with pytest.raises(ValueError, match="batch"):
        table.open("y", [1], 3, memory=runtime.initial_memory(2))


def test_a_reset_session_reads_its_next_document_as_if_alone_and_the_others_go_on(runtime):
    """A document boundary in one session: after `reset` it generates what
    its new prompt gives from an empty memory, while a session sharing its
    batches gets what it gets alone."""
    table = SessionTable(runtime, max_batch=2)
    table.open("a", *SESSIONS["a"][:2], **SESSIONS["a"][2])
    table.open("b", [3, 4, 5, 6], 12, temperature=0)
    for _ in range(4):
        table.step()
    before = list(table._sessions["b"].ids)
    table.reset("b", [9, 8, 7], max_new_tokens=7)
    table.run()
    got_b, got_a = table.close("b"), table.close("a")
    fresh = runtime.generate([[9, 8, 7]], 7, temperature=0)
    np.testing.assert_array_equal(got_b.ids[0], before + list(fresh.ids[0]))
    np.testing.assert_allclose(got_b.memory.numpy()[0], fresh.memory.numpy()[0], atol=1e-5)
    alone = runtime.generate([SESSIONS["a"][0]], SESSIONS["a"][1], **SESSIONS["a"][2])
    np.testing.assert_array_equal(got_a.ids[0], alone.ids[0, :int(alone.lengths[0])])
    with pytest.raises(TxlError, match="no open session 'b'"):
        table.reset("b", [1])


def test_a_short_soak_keeps_every_session_equal_to_it_alone(exported, tmp_path, jobs):
    """`benchmarks.long_memory --part=soak` at a small count: sessions opened, read,
    stepped and closed at random times (some mid-generation) each got
    exactly what they get alone."""
    import json
    output = tmp_path / "soak.json"
    jobs.run("benchmarks.long_memory", ["--part=soak", f"--export_dir={exported}",
                                        "--soak_sessions=40", "--max_open=6",
                                        "--report_every=10", f"--output={output}"], check=True)
    result = json.loads(output.read_text())
    assert result["differing_sessions"] == [] and result["generated_ids"] > 40
    assert [closed for closed, _ in result["resident_mb_by_sessions_closed"]] == [10, 20, 30, 40]


def _alone(runtime, parts, settings):
    """The ids a greedy session gets alone: each part `(prompt, memory, n)`
    (the open, then each reset from an empty memory) generated on its own."""
    ids = []
    for prompt, memory, n in parts:
        if n:
            alone = runtime.generate([prompt], n, memory=memory, **settings)
            ids += list(alone.ids[0, :int(alone.lengths[0])])
    return ids


def _random_table_sequence(runtime, rng, ops):
    """Sessions opened (on an empty memory or on one read once), stepped,
    reset, closed and resumed at random; `[(what, got ids, ids alone)]`."""
    _, shared = runtime.step(rng.integers(0, N_TOKEN, [1, 9]))
    table = SessionTable(runtime, max_batch=int(rng.integers(2, 5)))
    parts, settings, checks = {}, {}, []
    for op in range(ops):
        live, kind = list(parts), rng.choice(["open"] * 2 + ["step"] * 6 + ["close", "reset"])
        if kind == "open" or not live:
            sid, greedy = f"s{op}", bool(rng.integers(0, 2))
            settings[sid] = dict(temperature=0) if greedy else dict(
                temperature=1.0, top_k=int(rng.integers(0, 8)), seed=int(rng.integers(0, 99)))
            if rng.integers(0, 3) == 0:
                settings[sid]["stop_ids"] = [int(i) for i in rng.integers(0, N_TOKEN, 2)]
            prompt = list(rng.integers(0, N_TOKEN, int(rng.integers(1, 20))))
            memory = shared if rng.integers(0, 2) else None
            table.open(sid, prompt, int(rng.integers(0, 22)), memory=memory, **settings[sid])
            parts[sid] = [[prompt, memory, 0]]
        elif kind == "step":
            for sid in table.step():
                parts[sid][-1][2] += 1
        elif kind == "reset" and settings[live[0]].get("temperature") == 0:
            prompt = list(rng.integers(0, N_TOKEN, int(rng.integers(1, 20))))
            table.reset(live[0], prompt, max_new_tokens=int(rng.integers(0, 12)))
            parts[live[0]].append([prompt, None, 0])
        elif kind == "close":
            sid = live[int(rng.integers(0, len(live)))]
            got, (prompt, memory, n) = table.close(sid), parts.pop(sid)[-1]
            checks.append((sid, list(got.ids[0])[-n:] if n else [],
                           _alone(runtime, [(prompt, memory, n)], settings[sid])))
            more = runtime.generate(None, 5, resume=got.state)  # on from its state
            whole = _alone(runtime, [(prompt, memory, n + 5)], settings[sid])
            checks.append((f"{sid} resumed", list(got.ids[0])[len(got.ids[0]) - n:]
                           + list(more.ids[0, :int(more.lengths[0])]), whole))
    while table.active():
        for sid in table.step():
            parts[sid][-1][2] += 1
    for sid, history in parts.items():
        checks.append((sid, list(table.close(sid).ids[0]),
                       _alone(runtime, history, settings[sid])))
    return checks


def _random_slab_sequence(runtime, rng, ops):
    """Rows of caches that took different steps (some stopped for a while)
    admitted, stepped and evicted at random; `[(what, got, alone)]` of every
    step's log-probs and every evicted row's memory."""
    slab = SessionTable(runtime, max_batch=int(rng.integers(1, 5))).slab
    pool, inside, checks = [], {}, []
    for op in range(ops):
        kind = rng.choice(["cache", "pool_step", "admit", "step", "step", "evict"])
        if kind == "cache" or not pool:
            _, memory = runtime.step(rng.integers(0, N_TOKEN, [2, int(rng.integers(1, 20))]))
            pool.append(runtime.decode_init(memory))
        elif kind == "pool_step":
            runtime.decode_step(rng.integers(0, N_TOKEN, 2), pool[-1],
                                stopped=rng.integers(0, 2, 2).astype(bool))
        elif kind == "admit" and not slab.full():
            row = runtime.take(pool[int(rng.integers(0, len(pool)))], [int(rng.integers(0, 2))])
            inside[op] = runtime.take(row, [0])  # stepped alone below
            slab.admit(op, row)
        elif kind == "step" and len(slab):
            ids = rng.integers(0, N_TOKEN, len(slab))
            together = slab.step(ids, lambda log_probs: log_probs)
            for row, key in enumerate(slab.keys):
                alone = runtime.decode_step(ids[row:row + 1], inside[key])[0][0]
                checks.append((f"op {op} row {row}", together[row], alone))
        elif kind == "evict" and len(slab):
            key = slab.keys[int(rng.integers(0, len(slab)))]
            got, alone = (runtime.cache_memory(c).numpy()
                          for c in (slab.evict(key), inside.pop(key)))
            checks.append((f"op {op} evicted {key}", got[0][:, :, got[1][0]],
                           alone[0][:, :, alone[1][0]]))
    return checks


def test_random_operation_sequences_give_each_session_what_it_gets_alone(runtime):
    """A seeded random driver of the table's and the slab's verbs, each
    result against the same stream run alone on the runtime (batch 1): the
    state bugs of the slab's admission and of a fixed-buffer step's
    log-probs were of the kind only such sequences reach."""
    rng = np.random.default_rng(21)
    for sid, got, alone in _random_table_sequence(runtime, rng, ops=60):
        assert [int(i) for i in got] == [int(i) for i in alone], sid
    if runtime.use_decode_cache:
        for what, got, alone in _random_slab_sequence(runtime, rng, ops=45):
            np.testing.assert_allclose(got, alone, atol=1e-5, err_msg=what)


def test_a_slab_that_cannot_fit_is_refused_when_the_table_is_made(cached_runtime, monkeypatch):
    """`max_batch=10**7` was a MemoryError (a 40 GiB ring) at the first
    session; the estimate is the slab's own arrays (less their alignment)."""
    from export.decode_cache import BATCH_AXES
    from export.slab import slab_row_bytes
    from txl_tf.checks import memory_budget
    from txl_tf.checks.memory_budget import MemoryBudgetError
    row = slab_row_bytes(cached_runtime.config, cached_runtime.mem_len)
    table = SessionTable(cached_runtime, max_batch=3)
    table.open("a", [1, 2], 2, temperature=0)
    table.step()
    held = sum(table.slab._arrays[name].nbytes for name in BATCH_AXES)
    assert 3 * row <= held <= 3 * row + ALIGNMENT * (3 * cached_runtime.config.n_layer + 2)
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: 100 * row)
    SessionTable(cached_runtime, max_batch=100)
    need, has = (re.escape(memory_budget.size_words(n)) for n in (101 * row, 100 * row))
    with pytest.raises(MemoryBudgetError, match=rf"^max_batch 101 needs at least {need} for "
                                                rf"the table's decode caches \({row:,} bytes a "
                                                rf"session, memory 16\) and this machine has "
                                                rf"{has} available; lower max_batch$"):
        SessionTable(cached_runtime, max_batch=101)


@pytest.mark.parametrize("runtime", ["onnx", "onnx_step_last"], indirect=True)
def test_a_reset_starts_the_session_afresh_but_for_its_budget_and_random_stream(runtime):
    """After `reset` a session is its new prompt read from an empty memory:
    not stopped (it stopped at a stop id before), no cache of the old
    memory, no penalty for the ids of the old document; without
    `max_new_tokens` it has what was left of its budget."""
    table = SessionTable(runtime, max_batch=2)
    old = list(range(20))  # seen before the reset: penalised if they were kept
    settings = dict(temperature=0, repetition_penalty=1.5)
    stop = int(runtime.generate([old], 1, **settings).ids[0, 0])
    table.open("r", old, 6, stop_ids=[stop], **settings)  # stops at its first id
    table.run()
    assert table._sessions["r"].state.done.all()
    table.reset("r", [30, 31, 32], max_new_tokens=0)
    got = table.close("r")
    fresh = runtime.generate([[30, 31, 32]], 7, stop_ids=[stop], **settings)
    assert int(fresh.lengths[0]) > 2
    more = runtime.generate(None, 7, resume=got.state)
    np.testing.assert_array_equal(more.ids[0], fresh.ids[0])
    np.testing.assert_allclose(more.log_probs[0], fresh.log_probs[0], atol=1e-5)
    table.open("s", old, 10, **settings)
    for _ in range(3):
        table.step()
    table.reset("s", [30, 31, 32])
    table.run()
    alone = runtime.generate([[30, 31, 32]], 7, **settings)
    np.testing.assert_array_equal(table.close("s").ids[0][3:], alone.ids[0])


@pytest.mark.parametrize("runtime", ["onnx_step_last"], indirect=True)
def test_sessions_beyond_max_batch_take_turns(runtime):
    """Round robin: with more live sessions than `max_batch`, the ones
    waiting longest are served next."""
    table = SessionTable(runtime, max_batch=2)
    for sid in "abcd":
        table.open(sid, [1, 2], 2, temperature=0)
    assert [sorted(table.step()) for _ in range(4)] == [["a", "b"], ["c", "d"]] * 2
    assert not table.active()


@pytest.mark.parametrize("runtime", ["onnx", "onnx_step_last"], indirect=True)
def test_a_session_without_budget_generates_nothing(runtime):
    table = SessionTable(runtime, max_batch=2)
    table.open("none", [1, 2], 0)
    table.open("one", [1, 2], 1, temperature=0)
    assert table.active() == ["one"]
    assert list(table.step()) == ["one"] and table.step() == {}
    assert table.close("none").ids.shape == (1, 0)


@pytest.mark.parametrize("runtime", ["onnx", "onnx_device"], indirect=True)
def test_a_step_whose_check_fails_leaves_the_slab_as_it_was(runtime):
    """`slab.step(ids, check)` with a `check` that raises writes nothing:
    the next step is the first step of a slab that never saw it."""
    rng = np.random.default_rng(5)
    caches = [runtime.decode_init(runtime.step(rng.integers(0, N_TOKEN, [1, n]))[1])
              for n in (3, 7)]
    slabs = [SessionTable(runtime, max_batch=2).slab for _ in range(2)]
    for slab in slabs:
        for key, cache in enumerate(caches):
            slab.admit(key, runtime.take(cache, [0]))
    ids = rng.integers(0, N_TOKEN, 2)

    def refuse(log_probs):
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        slabs[0].step(ids, refuse)
    for _ in range(2):
        np.testing.assert_allclose(*(slab.step(ids, lambda lp: np.array(lp)) for slab in slabs),
                                   atol=1e-6)


def _interrupt_at(monkeypatch, owner, name, k, after=False):
    """`owner.name` raising `KeyboardInterrupt` at its k-th call (Ctrl-C in a
    notebook, a cancelled request): before its work, or after it (`after`)."""
    original, calls = getattr(owner, name), [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == k and not after:
            raise KeyboardInterrupt
        out = original(*args, **kwargs)
        if calls[0] == k:
            raise KeyboardInterrupt
        return out
    monkeypatch.setattr(owner, name, interrupted)


def _run_interrupted(table, monkeypatch, owner, name, k, after, alone):
    """Opens `SESSIONS` in `table`, runs it interrupted at `owner.name`'s k-th
    call (`_interrupt_at`), runs it again; every session must get its ids
    alone (`alone`)."""
    for sid, (prompt, n, settings) in SESSIONS.items():
        table.open(sid, prompt, n, **settings)
    _interrupt_at(monkeypatch, owner, name, k, after)
    with pytest.raises(KeyboardInterrupt):
        table.run()
    monkeypatch.undo()
    table.run()
    for sid in SESSIONS:
        assert list(table.close(sid).ids[0]) == alone[sid], (name, k, after, sid)


@pytest.mark.parametrize("path", ["slab", "step_last"])
def test_an_interrupted_step_leaves_every_session_to_get_what_it_gets_alone(
        exported, monkeypatch, path):
    import export.onnx_runtime as onnx_runtime
    runtime = open_runtime(str(exported), backend="onnx", device="cpu")
    runtime.use_decode_cache = path == "slab"
    alone = {sid: _alone(runtime, [(prompt, None, n)], settings)
             for sid, (prompt, n, settings) in SESSIONS.items()}
    where = {"slab": [(onnx_runtime, "write_token", 3, True),  # the slab written, not recorded
                      (type(runtime), "_checked_decode_init", 3, False),  # a session joining
                      (type(runtime), "cache_memory", 1, False)],  # a session leaving
             "step_last": [(type(runtime), "_step_last", 2, False)]}[path]
    for owner, name, k, after in where:
        _run_interrupted(SessionTable(runtime, max_batch=2), monkeypatch, owner, name, k, after,
                         alone)


def test_an_interrupted_evict_leaves_the_slabs_rows_as_they_were(exported, monkeypatch):
    import export.slab as slab_module
    runtime = open_runtime(str(exported), backend="onnx", device="cpu")
    slab = SessionTable(runtime, max_batch=3).slab
    for i, sid in enumerate("abc"):
        _, memory = runtime.step(np.full([1, 3 + i], i + 1))
        slab.admit(sid, runtime.decode_init(memory))
    before = {name: np.array(value) for name, value in slab.batch().items()}
    # `batch` takes one view per array, then each array's row moves: stop after the first.
    _interrupt_at(monkeypatch, slab_module, "_rows", len(slab_module.BATCH_AXES) + 3)
    with pytest.raises(KeyboardInterrupt):
        slab.evict("a")
    monkeypatch.undo()
    assert slab.keys == ["a", "b", "c"]
    for name, value in slab.batch().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


@pytest.mark.parametrize("path", ["slab", "step_last"])
def test_an_interrupted_reset_leaves_the_session_going_on_as_it_was(exported, monkeypatch, path):
    import export.sessions as sessions
    runtime = open_runtime(str(exported), backend="onnx", device="cpu")
    runtime.use_decode_cache = path == "slab"
    table = SessionTable(runtime, max_batch=2)
    for sid in "ab":
        table.open(sid, *SESSIONS[sid][:2], **SESSIONS[sid][2])
    for _ in range(3):
        table.step()
    _interrupt_at(monkeypatch, sessions, "prefill", 1)
    with pytest.raises(KeyboardInterrupt):
        table.reset("a", [9, 9])
    monkeypatch.undo()
    assert sorted(table.active()) == ["a", "b"]
    table.run()
    for sid in "ab":
        prompt, n, settings = SESSIONS[sid]
        assert list(table.close(sid).ids[0]) == _alone(runtime, [(prompt, None, n)], settings)


def test_an_interrupted_evict_leaves_the_device_slabs_rows_as_they_were(exported, monkeypatch):
    import export.slab as slab_module
    runtime = open_runtime(str(exported), backend="onnx", device="cpu", device_cache=True,
                           cuda_graph=True)
    slab = SessionTable(runtime, max_batch=3).slab
    for i, sid in enumerate("abc"):
        _, memory = runtime.step(np.full([1, 3 + i], i + 1))
        slab.admit(sid, runtime.decode_init(memory))
    before = {name: np.array(value.numpy()) for name, value in slab.batch().items()}
    # Ctrl-C as the last row's copy into "a"'s returns, before the keys change.
    _interrupt_at(monkeypatch, slab_module, "put_row", 1, after=True)
    with pytest.raises(KeyboardInterrupt):
        slab.evict("a")
    monkeypatch.undo()
    assert slab.keys == ["a", "b", "c"]
    for name, value in slab.batch().items():
        np.testing.assert_array_equal(value.numpy(), before[name], err_msg=name)


@pytest.mark.parametrize("runtime", ["onnx", "saved_model", "onnx_device"], indirect=True)
def test_a_step_interrupted_as_the_slabs_step_returns_is_recorded(runtime, monkeypatch):
    alone = {sid: _alone(runtime, [(prompt, None, n)], settings)
             for sid, (prompt, n, settings) in SESSIONS.items()}
    table = SessionTable(runtime, max_batch=2)
    for sid, (prompt, n, settings) in SESSIONS.items():
        table.open(sid, prompt, n, **settings)
    # Ctrl-C after the slab's step (taken) and before the table has its log-probs.
    _interrupt_at(monkeypatch, SessionTable, "_step_slab", 2, after=True)
    with pytest.raises(KeyboardInterrupt):
        table.run()
    monkeypatch.undo()
    table.run()
    for sid in SESSIONS:
        assert list(table.close(sid).ids[0]) == alone[sid], sid


def test_an_interrupted_device_slab_write_leaves_every_session_to_get_what_it_gets_alone(
        exported, monkeypatch):
    """Ctrl-C before, inside (between the ring's write, `decode_token`'s
    run, and the move of its positions) or just after `FixedStep.write` in a
    `DeviceSlab.step`."""
    from export.device_cache import FixedStep
    runtime = open_runtime(str(exported), backend="onnx", device="cpu", device_cache=True,
                           cuda_graph=True)
    alone = {sid: _alone(runtime, [(prompt, None, n)], settings)
             for sid, (prompt, n, settings) in SESSIONS.items()}
    sessions = SessionTable(runtime, max_batch=2).slab.sessions
    where = [(FixedStep, "write", 3, False), (FixedStep, "write", 3, True),
             (sessions["token"], "run_with_iobinding", 2, True),  # written, not moved
             (sessions["move"], "run_with_iobinding", 3, True),  # moved, not recorded
             (DeviceSlab, "_size", 3, True)]  # recorded, the host's slot not moved on
    for owner, name, k, after in where:
        table = SessionTable(runtime, max_batch=2)
        assert all(table.slab.sessions[n] is sessions[n] for n in ("token", "move"))
        _run_interrupted(table, monkeypatch, owner, name, k, after, alone)


@pytest.mark.parametrize("stopped", [[0.5, 0.0], [2, 0], ["no", "no"], [np.nan, 0.0]])
def test_decode_step_refuses_stopped_flags_that_are_not_booleans(cached_runtime, stopped):
    cache = cached_runtime.decode_init(cached_runtime.initial_memory(2))
    with pytest.raises(TxlError, match="stopped must be bool"):  # 0.5, 2, NaN: True
        cached_runtime.decode_step(np.array([1, 2]), cache, stopped=stopped)


def test_decode_step_names_ragged_ids(cached_runtime):
    cache = cached_runtime.decode_init(cached_runtime.initial_memory(2))
    with pytest.raises(TxlError, match="rows of other lengths"):  # numpy's ValueError
        cached_runtime.decode_step([[1, 2], [3]], cache)


def test_decode_step_takes_stopped_flags_as_integers_0_and_1(cached_runtime):
    ids, steps = np.array([1, 2]), {}
    for stopped in ([False, True], np.array([0, 1], np.uint8), [0, 1]):
        cache = cached_runtime.decode_init(cached_runtime.initial_memory(2))
        cached_runtime.decode_step(ids, cache)
        log_probs, cache = cached_runtime.decode_step(ids, cache, stopped=stopped)
        steps[str(stopped)] = (log_probs[0], cached_runtime.cache_memory(cache).mems)
    first = next(iter(steps.values()))
    for log_probs, mems in steps.values():
        np.testing.assert_array_equal(log_probs, first[0])
        np.testing.assert_array_equal(mems, first[1])


@pytest.mark.parametrize("runtime", ["onnx", "saved_model", "onnx_device"], indirect=True)
def test_a_row_evicted_before_any_step_holds_the_memory_it_was_admitted_with(runtime):
    """A cache admitted at another ring slot than the slab's is rotated onto
    it, its own free slot with it (the host's `CacheSlab` and the device's
    `DeviceSlab`): evicted at once, before a step could write its free
    slot, it holds the memory it came with, in the same time order."""
    rng = np.random.default_rng(11)
    caches = []
    for steps in (5, 0, 9):  # the first admitted sets the slab's slot; the others move
        cache = runtime.decode_init(runtime.initial_memory(1))
        for _ in range(steps):
            runtime.decode_step(rng.integers(0, N_TOKEN, 1), cache)
        caches.append(cache)
    two = runtime.decode_init(runtime.initial_memory(2))
    for t in range(7):  # row 0 stops for the last 3 steps: its own slot is behind
        runtime.decode_step(rng.integers(0, N_TOKEN, 2), two, stopped=[t >= 4, False])
    caches.append(runtime.take(two, [0]))
    slab = SessionTable(runtime, max_batch=4).slab
    for key, cache in enumerate(caches):
        slab.admit(key, runtime.take(cache, [0]))
    for key in (2, 0, 3, 1):
        back = slab.evict(key)
        for got, want in zip(runtime.cache_memory(back).numpy(),
                             runtime.cache_memory(caches[key]).numpy()):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("runtime", ["onnx", "onnx_device"], indirect=True)
def test_a_non_finite_memory_is_named_at_the_step_before_a_sessions_last_id(runtime):
    """A session with two ids to go whose memory is not finite: the step
    that makes the log-probs of its last id names it (it would draw that
    id from them); only the step of its last id draws nothing from them."""
    from txl_tf import NonFiniteMemoryError
    table = SessionTable(runtime, max_batch=2)
    table.open("a", *SESSIONS["a"][:2], **SESSIONS["a"][2])
    table.open("b", [3, 4, 5], 2, temperature=0)
    _poison_memory(table, runtime, "b")
    with pytest.raises(NonFiniteMemoryError, match=r"stream\(s\) b:"):
        table.step()
    assert table.active() == ["a"]


def test_a_join_interrupted_once_its_row_is_admitted_leaves_every_session_to_get_what_it_gets_alone(
        exported, monkeypatch):
    """Interrupted after the slab admitted a joining session's row, before
    the session left the queue: the next step serves it from its row (it
    is not admitted twice) and every session gets what it gets alone."""
    from export.slab import CacheSlab
    runtime = open_runtime(str(exported), backend="onnx", device="cpu")
    alone = {sid: _alone(runtime, [(prompt, None, n)], settings)
             for sid, (prompt, n, settings) in SESSIONS.items()}
    for k in (2, 3):  # the first step's second join; a join once a session left
        _run_interrupted(SessionTable(runtime, max_batch=2), monkeypatch, CacheSlab, "admit",
                         k, True, alone)
