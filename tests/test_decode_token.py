"""The step that writes its rings in place (`decode_token`): the core's
`call_with_cache(write="first")` equals its read then its write, and a
runtime stepping over fixed buffers with it (as CUDA graphs replay it; here
on the CPU provider) gives every row what the step and the ring's write
give: log-probs, memory, generations and session tables, with stopped rows
and the ring wrapping, in each cache and decode dtype."""
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from export import SessionTable, open_runtime, run_export
from export.metadata import DECODE_TOKEN_FILE
from test_decode_cache_export import CONFIG, export_of_config
from test_device_ring import assert_same_state
from txl_tf import Memory, TransformerXL
from txl_tf.errors import TxlError
from txl_tf.layers.ring_cache import KeysValues, write_slots, write_token
from txl_tf.weights import save_pretrained


def _ring_rows(ring, axis, row, skip):
    """Row `row` of a layer's ring `[B, ...]` without slot `skip` (None: all)."""
    slots = [s for s in range(ring.shape[axis]) if s != skip]
    return np.take(ring[row], slots, axis=axis - 1)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_core_writing_first_equals_its_read_then_its_write(seed):
    """Rows at different slots of their rings (a row stopped for a while,
    one stopped now, one going on), the ring wrapping: the live rows' hidden
    states equal, and every ring equal but a stopped row's free slot."""
    rng = np.random.default_rng(seed)
    core = TransformerXL(CONFIG.replace(n_token=60))
    batch, mem = 3, CONFIG.mem_len
    cache = core.decode_cache(Memory(tf.random.stateless_normal(
        [CONFIG.n_layer, batch, mem, CONFIG.d_model], [seed, 1]),
        tf.constant(rng.random([batch, mem]) > 0.3)))
    for t in range(2 * (mem + 1) + 1):
        ids = tf.constant(rng.integers(0, 60, batch), tf.int32)
        stopped = tf.constant([False, t % 3 == 1, 2 <= t <= 4])
        want, token = core.call_with_cache(ids, cache, write=False)
        written = write_token(cache, token, stopped)
        got, rings = core.call_with_cache(ids, cache, stopped=stopped, write="first")
        live = ~stopped.numpy()
        np.testing.assert_allclose(got.numpy()[live], want.numpy()[live], atol=1e-5)
        free = write_slots(cache, stopped).numpy()
        for name, axis in (("keys", 3), ("values", 2)):
            for i in range(CONFIG.n_layer):
                for row in range(batch):
                    skip = None if live[row] else free[row]
                    np.testing.assert_allclose(
                        _ring_rows(getattr(rings, name)[i].numpy(), axis, row, skip),
                        _ring_rows(getattr(written, name)[i].numpy(), axis, row, skip),
                        atol=1e-6, err_msg=f"step {t}, {name} {i}, row {row}")
        cache = written
    with pytest.raises(TxlError, match="for one id per row"):
        core.call_with_cache(tf.zeros([batch, 2], tf.int32), cache, write="first")


def test_writing_first_over_flags_written_first_equals_the_read_then_the_write():
    """`flags_written=True` (the flags written by the caller, as `decode_token`
    writes them): the live rows read what the read-only step gives, with
    rows stopped and empty slots; refused without write="first"."""
    rng = np.random.default_rng(3)
    core = TransformerXL(CONFIG.replace(n_token=60))
    batch, mem = 3, CONFIG.mem_len
    cache = core.decode_cache(Memory(tf.random.stateless_normal(
        [CONFIG.n_layer, batch, mem, CONFIG.d_model], [5, 1]),
        tf.constant(rng.random([batch, mem]) > 0.5)))
    for t in range(mem + 3):
        ids = tf.constant(rng.integers(0, 60, batch), tf.int32)
        stopped = tf.constant([False, t % 2 == 1, t >= 2])
        want, token = core.call_with_cache(ids, cache, write=False)
        slots = write_slots(cache, stopped).numpy()
        valid = cache.valid.numpy().copy()
        valid[np.arange(batch), slots] = ~stopped.numpy()
        got, _ = core.call_with_cache(ids, cache._replace(valid=tf.constant(valid)),
                                      stopped=stopped, write="first", flags_written=True)
        live = ~stopped.numpy()
        np.testing.assert_allclose(got.numpy()[live], want.numpy()[live], atol=1e-5,
                                   err_msg=f"step {t}")
        cache = write_token(cache, token, stopped)
    with pytest.raises(TxlError, match="flags_written is for write='first'"):
        core.call_with_cache(ids, cache, flags_written=True)


def test_write_first_is_refused_where_the_core_would_not_write_first():
    """A KeysValues memory read its segment and returned a KeysValues with
    write="first" (its rings are never written first): refused, as a
    DecodeCache's segment is; a misspelt "first" is named."""
    core = TransformerXL(CONFIG)
    rings = tuple(tf.zeros([2, CONFIG.n_head, 3, CONFIG.d_head]) for _ in range(CONFIG.n_layer))
    memory = KeysValues(rings, rings, tf.ones([2, 3], tf.bool))
    with pytest.raises(TxlError, match="'first' are for a DecodeCache"):
        core.call_with_cache(tf.zeros([2, 2], tf.int32), memory, write="first")
    cache = core.decode_cache(core.initial_memory(2, 3))
    with pytest.raises(TxlError, match="write must be a boolean or 'first', got 'First'"):
        core.call_with_cache(tf.zeros([2], tf.int32), cache, write="First")


@pytest.fixture(scope="module")
def exports(built_once, tmp_path_factory):
    """`{name: (with decode_token, without)}`: the default export and ones
    with a float16 cache and a float16 decode, each also copied without its
    `decode_token` graph (as an export made before it)."""
    root = tmp_path_factory.mktemp("decode_token")
    folders = {"float32": export_of_config(built_once)[1]}
    model = root / "model"
    save_pretrained(TransformerXL(CONFIG), model)
    for name, options in (("float16 cache", {"cache_dtype": "float16"}),
                          ("float16 decode", {"decode_dtype": "float16",
                                              "cache_dtype": "float16"})):
        folders[name] = root / name.replace(" ", "_")
        run_export(str(folders[name]), str(model), formats=("onnx",), verify=False, **options)
    pairs = {}
    for name, folder in folders.items():
        without = root / f"{name.replace(' ', '_')}_without"
        shutil.copytree(folder, without)
        (without / DECODE_TOKEN_FILE).unlink()
        pairs[name] = (folder, without)
    return pairs


def _replay(folder):
    return open_runtime(str(folder / "model.onnx"), device="cpu", device_cache=True,
                        cuda_graph=True)


@pytest.mark.parametrize("name", ["float32", "float16 cache", "float16 decode"])
def test_a_replayed_token_step_gives_what_the_step_and_the_write_give(exports, name):
    with_token, without = (_replay(folder) for folder in exports[name])
    tolerance = 1e-5 if name == "float32" else 2e-3
    rng = np.random.default_rng(4)
    memory = with_token.step(rng.integers(0, CONFIG.n_token, [3, 4]))[1]
    caches = [runtime.decode_init(memory) for runtime in (with_token, without)]
    for t in range(2 * (CONFIG.mem_len + 1) + 1):  # the ring wraps twice
        ids = rng.integers(0, CONFIG.n_token, [3])
        stopped = np.array([False, t % 3 == 1, 2 <= t <= 5])
        got, _ = with_token.decode_step(ids, caches[0], stopped)
        want, _ = without.decode_step(ids, caches[1], stopped)
        np.testing.assert_allclose(got[~stopped], want[~stopped], atol=tolerance,
                                   err_msg=f"step {t}")
    assert with_token._residents[3].steps.token_binding is not None
    assert without._residents[3].steps.token_binding is None
    assert_same_state(caches[0], {k: v.numpy() for k, v in caches[1].items()}, tolerance)
    for a, b in zip(with_token.cache_memory(caches[0]).numpy(),
                    without.cache_memory(caches[1]).numpy()):
        np.testing.assert_allclose(a, b, atol=tolerance)
    prompts = [[1, 2, 3], [4], [5, 6]]
    got = with_token.generate(prompts, 6, temperature=0.0)
    want = without.generate(prompts, 6, temperature=0.0)
    np.testing.assert_array_equal(got.ids, want.ids)


def test_a_session_table_over_the_token_step_equals_one_over_the_step_and_write(exports):
    """Sessions joining and leaving a device slab stepped by `decode_token`."""
    outcomes = []
    for folder in exports["float32"]:
        runtime = _replay(folder)
        table = SessionTable(runtime, max_batch=2)
        assert ("token" in table.slab.sessions) == (folder == exports["float32"][0])
        for sid, prompt in enumerate([[1, 2], [3], [4, 5, 6]]):
            table.open(sid, prompt, 3 + sid, temperature=0.0)
        table.run()
        outcomes.append([list(table.close(sid).ids[0]) for sid in range(3)])
    assert outcomes[0] == outcomes[1]


def test_the_export_checks_its_token_step_against_the_core(exports):
    """The export's parity covers the step a GPU replays (`decode_token`
    over fixed buffers), run on the CPU."""
    report = json.loads((exports["float32"][0] / "export_report.json").read_text())
    token = report["parity"]["onnxruntime"]["decode_token"]
    assert token["log_probs"] <= 1e-4 and token["mem_mask_equal"], token


def test_the_exports_token_check_holds_one_copy_of_the_weights(tmp_path, monkeypatch):
    """Each runtime the export's parity opens shares one mapped copy of the
    weights (`low_memory`): the one replaying `decode_token` packed its own
    for the model, the decode step and the token step (three copies)."""
    import export.job as job
    opened = []

    class Opened:
        backend = "onnxruntime"

    def open_runtime(path, **options):
        opened.append(options)
        return Opened()
    monkeypatch.setattr(job, "open_runtime", open_runtime)
    monkeypatch.setattr(job, "check_runtime", lambda *args: {})
    monkeypatch.setattr(job, "check_cached_decode", lambda *args: {})
    (tmp_path / DECODE_TOKEN_FILE).write_bytes(b"")
    report = job._parity(None, None, None, str(tmp_path), ("onnx",), 1e-4, "txl")
    assert "decode_token" in report["onnxruntime"]
    assert [options.get("low_memory") for options in opened] == [True, True], opened


@pytest.mark.parametrize("name, options, disabled", [
    ("float32", {"low_memory": True}, "UNFOLDED"),
    ("float16 decode", {}, "FLOAT16_DECODE_DISABLED")])
def test_the_replayed_step_opens_without_the_optimizers_the_runtime_disables(
        exports, monkeypatch, name, options, disabled):
    """The replayed step's session leaves out the optimizers the runtime's
    other decode sessions leave out (`low_memory`: no weight folded into a
    copy of its own; a float16 decode: no NCHWc), with decode_token and
    with the step and write of an export without it."""
    from export import onnx_runtime
    opened = []

    def recording(path, session_options=None, providers=None, disabled_optimizers=()):
        if isinstance(path, str) and path.endswith((DECODE_TOKEN_FILE, "decode_step.onnx")):
            opened.append((path.rsplit("/", 1)[-1], tuple(disabled_optimizers)))
        return open_session(path, session_options, providers, disabled_optimizers)
    open_session = onnx_runtime.open_session
    monkeypatch.setattr(onnx_runtime, "open_session", recording)
    want = tuple(getattr(onnx_runtime, disabled))
    for folder, graph in zip(exports[name], (DECODE_TOKEN_FILE, "decode_step.onnx")):
        opened.clear()
        runtime = open_runtime(str(folder / "model.onnx"), device="cpu", device_cache=True,
                               cuda_graph=True, **options)
        runtime.generate([[1, 2], [3]], 2, temperature=0.0)
        assert (graph, want) in opened and all(d == want for _, d in opened), opened


def test_the_token_step_leaves_the_id_check_to_the_runtime(exports):
    """`decode_token` carries no in-graph id check (it runs only inside a
    runtime, which checks ids on the host; on CUDA the check could not fail:
    ONNX Runtime's Gather gives 0 for an index out of range), while the step
    a host cache runs keeps its own; a bad id on the device path is still
    one clear error before any graph runs."""
    import onnx
    from export.onnx_export import UNCHECKED_IDS
    folder = exports["float32"][0]

    def checked(name):
        graph = onnx.load(str(folder / name), load_external_data=False).graph
        return any(n.name.startswith("txl_id_check/") for n in graph.node)
    assert UNCHECKED_IDS == ("decode_token",)
    assert not checked(DECODE_TOKEN_FILE) and checked("decode_step.onnx")
    runtime = _replay(folder)
    memory = runtime.step(np.ones([2, 3], np.int32))[1]
    cache = runtime.decode_init(memory)
    for bad in (CONFIG.n_token, -1):
        with pytest.raises(TxlError, match="out of range"):
            runtime.decode_step(np.array([bad, 1]), cache)
    got, _ = runtime.decode_step(np.array([2, 1]), cache)  # the cache is still usable
    assert np.isfinite(got).all()
