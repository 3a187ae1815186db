"""The cached decode interface of the exports (`export.decode_interface`):
the same numbers as the step that re-reads the memory, in every format, a
generation on it equal to one without it (stops included), and the files
a client that reads only the export needs."""
import contextlib
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from export import open_runtime, run_export
from export.decode_cache import (ALIGNMENT, INIT_OUTPUTS, LAYER_STACKED, READ_INPUTS,
                                 READ_OUTPUTS, STEP_OUTPUTS, copy_cache, in_time_order,
                                 layer_aligned_empty, step_feeds, step_inputs, take_rows)
from export.metadata import ExportInfo
from export.onnx_runtime import external_weights
from export.parity import cached_outputs, core_outputs, max_differences, random_segments
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.weights import save_pretrained
from txl_tf.weights.model_dir import load

# Odd head sizes: a layer's ring is not a whole number of 64-byte lines, so
# the host pads the stacked layers (`decode_cache.layer_aligned_empty`).
CONFIG = TransformerXLConfig.preset("tiny", n_token=60, cutoffs=[20, 40], div_val=2, mem_len=5,
                                    n_head=3, d_head=5)


def export_of_config(built_once):
    """`(core, out)`: a random CONFIG model and its default export (SavedModel,
    ONNX and the decode graphs, parity checked), made once in a test run
    (test_device_ring.py reads it too)."""
    def build(root):
        save_pretrained(TransformerXL(CONFIG), root / "model")
        run_export(str(root / "out"), str(root / "model"))
    root = built_once("decode_cache_export", build)
    return load(str(root / "model"))[0], root / "out"


@pytest.fixture(scope="module")
def exported(built_once):
    core, out = export_of_config(built_once)
    return core, out, json.loads((out / "export_report.json").read_text())


@pytest.fixture(scope="module", params=["onnx", "saved_model"])
def runtime(request, exported):
    return open_runtime(str(exported[1]), backend=request.param, device="cpu")


def test_the_export_writes_and_checks_the_decode_interface(exported):
    _, out, report = exported
    assert {"decode_init.onnx", "decode_step.onnx", "decode_read.onnx"} <= \
        {p.name for p in out.iterdir()}
    for backend in ("onnxruntime", "saved_model"):
        cached = report["parity"][backend]["decode_cache"]
        assert cached["log_probs"] < 1e-5 and cached["mems"] < 1e-5 and cached["mem_mask_equal"]
    saved = json.loads((out / "export_report.json").read_text())
    assert "decode_step.onnx" in saved["files"]


def test_the_onnx_graphs_share_one_copy_of_the_weights(exported):
    core, out, _ = exported
    weight_bytes = sum(w.numpy().nbytes for w in core.weights)
    data = out / "model.onnx.data"
    graphs = [out / name for name in ("model.onnx", "decode_init.onnx", "decode_step.onnx",
                                      "decode_read.onnx")]
    # The data file holds each weight once (page-aligned); no graph embeds them.
    assert weight_bytes <= data.stat().st_size <= weight_bytes + 4096 * len(core.weights)
    for graph in graphs:
        model = onnx.load(str(graph), load_external_data=False)
        weights = [t for t in model.graph.initializer if t.name.startswith("txl_weight_")]
        assert weights and all(t.data_location == onnx.TensorProto.EXTERNAL and
                               t.external_data[0].value == "model.onnx.data" for t in weights)
    # Plain onnxruntime runs model.onnx from the folder.
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    mems = np.zeros([CONFIG.n_layer, 1, 5, CONFIG.d_model], np.float32)
    log_probs, _, _ = session.run(None, {"token_ids": np.array([[1, 2]], np.int32),
                                         "mems": mems, "mem_mask": np.zeros([1, 5], bool)})
    expected = core_outputs(core, [np.array([[1, 2]], np.int32)], mem_len=5)[0][0]
    np.testing.assert_allclose(log_probs, expected, atol=1e-5)


def test_a_cpu_runtime_holds_one_copy_of_the_weights_for_all_its_sessions(exported):
    core, out, _ = exported
    runtime = open_runtime(str(out), backend="onnx", device="cpu")
    shared = runtime._shared_weights
    # Every weight of every graph the runtime opens is one view of the one mapped file...
    names = {name for graph in ("model", "decode_init", "decode_step", "decode_read")
             for name, *_ in external_weights(str(out / f"{graph}.onnx"),
                                              str(out / "model.onnx.data"))}
    assert set(shared) == names and len(names) == len(core.weights)
    mapped = np.memmap(out / "model.onnx.data", np.uint8, mode="r")
    by_name = {f"txl_weight_{i:04d}": w.numpy() for i, w in enumerate(core.weights)}
    for name, value in shared.items():
        np.testing.assert_array_equal(value.numpy(), by_name[name])
    assert sum(v.numpy().nbytes for v in shared.values()) <= mapped.size
    # ...and the sessions read them as they are (no packed copy per session), but
    # for the hot paths (the step, the decode step), which pack theirs unless `low_memory`.
    for low_memory in (False, True):
        runtime = open_runtime(str(out), backend="onnx", device="cpu", low_memory=low_memory)
        runtime.decode_init(runtime.initial_memory(1))
        for name, session in [("model", runtime.session), *runtime._decode_sessions.items()]:
            options = session.get_session_options()
            try:
                unpacked = options.get_session_config_entry("session.disable_prepacking") == "1"
            except RuntimeError:  # not set: packed
                unpacked = False
            assert unpacked == (low_memory or name not in ("model", "decode_step")), name


@pytest.mark.parametrize("name, cut", [("model.onnx", 2), ("decode_step.onnx", 2),
                                       ("model.onnx.data", 2), ("model.onnx.data", 0)])
def test_a_truncated_file_of_an_export_is_one_error_naming_it(exported, tmp_path, name, cut):
    """On the CPU the runtime maps `model.onnx.data` itself (`shared_weights`): a
    graph or that file cut short is a ModelDirError naming it, as onnxruntime's
    own refusal is (`open_session`)."""
    import shutil
    from txl_tf.errors import ModelDirError
    folder = tmp_path / "out"
    shutil.copytree(exported[1], folder)
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[:len(data) // cut] if cut else b"")
    with pytest.raises(ModelDirError, match=name.replace(".", r"\.")):
        open_runtime(str(folder / "model.onnx"), device="cpu")


def test_the_onnx_files_name_their_interface(exported):
    out = exported[1]
    for name, inputs, outputs in (("decode_init", ["mems", "mem_mask"], INIT_OUTPUTS),
                                  ("decode_step", step_inputs(CONFIG.n_layer), STEP_OUTPUTS),
                                  ("decode_read", READ_INPUTS, READ_OUTPUTS)):
        session = ort.InferenceSession(str(out / f"{name}.onnx"))
        meta = session.get_modelmeta().custom_metadata_map
        assert meta["interface"] == name
        assert meta["inputs"].split(",") == [i.name for i in session.get_inputs()] == list(inputs)
        assert meta["outputs"].split(",") == [o.name for o in session.get_outputs()] == \
            list(outputs)
        assert json.loads(meta["txl_tf.config"])["n_token"] == CONFIG.n_token


def test_every_axis_of_the_onnx_interfaces_is_a_size_or_a_named_axis(exported):
    """decode_token's `stopped` had tf2onnx's anonymous `unk__1` axis: a
    TensorRT profile or a Triton config names the batch axis, and a tool
    that merges symbolic shapes could not tell it was the rows'."""
    out = exported[1]
    for path in sorted(out.glob("*.onnx")):
        graph = onnx.load(str(path), load_external_data=False).graph
        for value in list(graph.input) + list(graph.output):
            for dim in value.type.tensor_type.shape.dim:
                assert dim.HasField("dim_value") or dim.dim_param in (
                    "batch", "seq_len", "capacity"), (path.name, value.name, dim)
        if path.name == "decode_token.onnx":
            stopped = next(i for i in graph.input if i.name == "stopped")
            assert [d.dim_param for d in stopped.type.tensor_type.shape.dim] == ["batch"]


def test_a_cached_step_is_a_step_on_the_memory_it_holds(exported, runtime):
    """Token by token, from a memory several segments deep (the ring wraps)."""
    core = exported[0]
    segments = random_segments(CONFIG.n_token, 2, 4, 4, seed=3)
    reference = core_outputs(core, segments, CONFIG.mem_len, token_by_token=True)
    diff = max_differences(reference, cached_outputs(runtime, segments))
    assert diff["log_probs"] < 1e-5 and diff["mems"] < 1e-5 and diff["mem_mask_equal"], diff
    # And not by accident: reading the segments whole gives other numbers.
    whole = core_outputs(core, segments, CONFIG.mem_len)
    assert max_differences(whole, cached_outputs(runtime, segments))["log_probs"] > 2e-5


def test_every_layer_of_the_host_cache_starts_aligned(runtime):
    """What lets TensorFlow take each layer's ring without a copy every step
    (`tf_runtime._zero_copy`): contiguous, on a 64-byte boundary."""
    rng = np.random.default_rng(0)
    memory = (rng.normal(size=(CONFIG.n_layer, 1, CONFIG.mem_len, CONFIG.d_model))
              .astype(np.float32), np.ones([1, CONFIG.mem_len], np.bool_))
    cache = runtime.decode_init(memory)
    assert cache["keys"][0].nbytes % ALIGNMENT  # the padding is exercised
    for made in (cache, copy_cache(cache), take_rows(cache, [0])):
        for name in LAYER_STACKED:
            for layer in made[name]:
                assert layer.flags.c_contiguous and layer.ctypes.data % ALIGNMENT == 0, name
        np.testing.assert_array_equal(made["keys"], cache["keys"])
    for name, array in step_feeds(cache).items():
        if array.dtype == np.float32:
            assert array.flags.c_contiguous and array.ctypes.data % ALIGNMENT == 0, name


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_generation_on_the_cache_equals_generation_without(runtime, temperature):
    prompts = [[1, 2, 3, 4, 5, 6, 7], [8], [9, 10]]
    runtime.use_decode_cache = False
    plain = runtime.generate(prompts, 14, temperature=temperature, seed=5)
    stop = int(plain.ids[1, 3])  # row 1 stops at its 4th token, the others may later
    plain = runtime.generate(prompts, 14, temperature=temperature, seed=5, stop_ids=[stop])
    runtime.use_decode_cache = True
    cached = runtime.generate(prompts, 14, temperature=temperature, seed=5, stop_ids=[stop])
    assert plain.lengths[1] <= 4 and list(cached.lengths) == list(plain.lengths)
    np.testing.assert_array_equal(cached.ids, plain.ids)
    np.testing.assert_allclose(cached.log_probs, plain.log_probs, atol=1e-5)
    for a, b in zip(cached.memory.numpy(), plain.memory.numpy()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # A conversation goes on from either memory the same way.
    more_cached = runtime.generate([[11]], 5, memory=runtime.take(cached.memory, [0]),
                                   temperature=0.0)
    more_plain = runtime.generate([[11]], 5, memory=runtime.take(plain.memory, [0]),
                                  temperature=0.0)
    np.testing.assert_array_equal(more_cached.ids, more_plain.ids)


def test_a_step_reads_the_ring_and_the_host_writes_the_token_in_place(exported, runtime):
    """The step graph's outputs hold one token (no slot axis: it returns no
    ring), `decode_step` advances the cache it is given, and a `take` of
    every row keeps a state to go on from twice."""
    session = ort.InferenceSession(str(exported[1] / "decode_step.onnx"))
    size = CONFIG.mem_len + 1
    assert all(size not in o.shape for o in session.get_outputs())
    cache = runtime.decode_init(runtime.initial_memory(2))
    kept = runtime.take(cache, [0, 1])
    first, same = runtime.decode_step(np.array([1, 2]), cache)
    assert same is cache and int(cache["slot"]) == 0 and int(kept["slot"]) == size - 1
    assert cache["valid"][:, size - 1].all() and not kept["valid"].any()
    again, _ = runtime.decode_step(np.array([1, 2]), kept)
    np.testing.assert_array_equal(again, first)
    for name in ("keys", "values", "cache_mems"):
        np.testing.assert_array_equal(kept[name], cache[name])


def test_decode_step_checks_its_ids(runtime):
    cache = runtime.decode_init(runtime.initial_memory(2))
    with pytest.raises(ValueError, match="token"):
        runtime.decode_step(np.array([1, CONFIG.n_token]), cache)
    with pytest.raises(ValueError, match=r"one id per row, \[batch\], got shape \(1, 2\)"):
        runtime.decode_step(np.array([[1, 2]]), cache)  # not two rows: a [1, 2] segment


def test_a_resume_goes_on_from_the_states_cache_as_one_longer_call(runtime, monkeypatch):
    prompts = [[3, 4, 5], [9, 1, 2]]
    whole = runtime.generate(prompts, 9, temperature=0.0)
    first = runtime.generate(prompts, 4, temperature=0.0)
    projections = []
    project = runtime._decode_init
    monkeypatch.setattr(runtime, "_decode_init", lambda *a: projections.append(1) or project(*a))
    rest = runtime.generate(None, 5, resume=first.state)
    again = runtime.generate(None, 5, resume=first.state)  # the state's cache is intact
    assert not projections  # the memory was not projected again
    for other in (rest, again):
        np.testing.assert_array_equal(np.concatenate([first.ids, other.ids], 1), whole.ids)
        np.testing.assert_allclose(np.concatenate([first.log_probs, other.log_probs], 1),
                                   whole.log_probs, atol=1e-5)
    np.testing.assert_allclose(runtime.take(rest.memory, [0, 1]).numpy()[0],
                               runtime.take(whole.memory, [0, 1]).numpy()[0], atol=1e-5)


def test_a_next_turn_after_a_stop_is_one_call_over_the_whole_text(runtime):
    prompts, turns = [[3, 4, 5], [9, 1, 2]], [[7, 8], [6]]
    stop = int(runtime.generate([[9, 1, 2]], 2, temperature=0.0).ids[0, 1])
    first = runtime.generate(prompts, 4, temperature=0.0, stop_ids=[stop])
    assert first.lengths.min() < 4  # a row stopped early
    turn = runtime.generate(turns, 3, resume=first.state, temperature=0.0, segment_len=1)
    whole = runtime.generate([p + list(ids[:n]) + q for p, ids, n, q in
                              zip(prompts, first.ids, first.lengths, turns)],
                             3, temperature=0.0, segment_len=1, stop_ids=[stop])
    np.testing.assert_array_equal(turn.ids, whole.ids)
    np.testing.assert_allclose(turn.log_probs, whole.log_probs, atol=1e-4)


def test_a_next_turn_is_read_on_the_cache_as_on_the_memory(runtime, monkeypatch):
    """Turns of 5 and 2 ids in segments of 3 (rows of different lengths:
    the cache is split and joined) read on the state's cache give what
    reading them on its memory gives, and the memory is never projected."""
    prompts, turns = [[3, 4, 5], [9, 1, 2]], [[7, 8, 6, 5, 4], [6, 2]]
    first = runtime.generate(prompts, 4, temperature=0.0)
    runtime.use_decode_cache = False
    plain = runtime.generate(turns, 6, memory=first.memory, temperature=0.0, segment_len=3)
    runtime.use_decode_cache = True
    projections = []
    project = runtime._decode_init
    monkeypatch.setattr(runtime, "_decode_init", lambda *a: projections.append(1) or project(*a))
    turn = runtime.generate(turns, 6, resume=first.state, temperature=0.0, segment_len=3)
    assert not projections
    np.testing.assert_array_equal(turn.ids, plain.ids)
    np.testing.assert_allclose(turn.log_probs, plain.log_probs, atol=1e-5)
    for a, b in zip(turn.memory.numpy(), plain.memory.numpy()):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_decode_read_is_a_step_on_the_memory_the_cache_holds(runtime):
    cache = runtime.decode_init(runtime.initial_memory(2))
    for ids in ([1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12], [13, 14]):
        _, cache = runtime.decode_step(np.array(ids), cache)
    kept = runtime.take(cache, [0, 1])
    segment = np.array([[5, 6, 7], [8, 9, 10]], np.int32)
    want, memory = runtime.step(segment, runtime.cache_memory(cache))
    got, new = runtime.decode_read(segment, cache)
    np.testing.assert_allclose(got, want[:, -1], atol=1e-5)
    for a, b in zip(runtime.cache_memory(new).numpy(), memory.numpy()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for name in cache:  # the cache read from is left as it was
        np.testing.assert_array_equal(cache[name], kept[name])


def test_a_next_turn_needs_a_prompt_per_row_and_no_second_memory(runtime):
    first = runtime.generate([[3, 4], [5, 6]], 2, temperature=0.0)
    with pytest.raises(ValueError, match="one prompt per row"):
        runtime.generate([[7]], 2, resume=first.state)
    with pytest.raises(ValueError, match="not both"):
        runtime.generate([[7], [8]], 2, resume=first.state, memory=first.memory)


def test_the_reported_cache_size_is_the_caches(exported, runtime):
    report = json.loads((exported[1] / "export_report.json").read_text())
    sizes = {}
    for batch in (1, 3):
        cache = _numpy_cache(runtime.decode_init(runtime.initial_memory(batch)))
        sizes[batch] = sum(v.nbytes for v in cache.values())
    per_stream = (sizes[3] - sizes[1]) // 2
    assert report["decode_cache_bytes"] == {"per_stream": per_stream,
                                            "shared": sizes[1] - per_stream}


def _numpy_cache(cache):
    return {k: np.array(v, copy=True) for k, v in cache.items()}


@pytest.mark.parametrize("change, message", [
    (lambda c: {k: v for k, v in c.items() if k != "keys"}, "missing"),
    (lambda c: {**c, "keys": c["keys"][:, :, :, :-1]}, "another model or memory length"),
    (lambda c: {**c, "values": c["values"].astype(np.float64)}, "float32"),
    (lambda c: {**c, "valid": c["valid"].astype(np.int32)}, "bool"),
    (lambda c: {**c, "slot": np.int32(6)}, r"slot must lie in \[0, 6\)"),
    (lambda c: {**c, "row_slot": np.array([0, -1], np.int32)}, "row_slot must lie"),
    (lambda c: {k: v[:, :1] if k in ("cache_mems", "keys", "values") else
                v[:1] if k in ("valid", "row_slot") else v for k, v in c.items()},
     "batch mismatch"),
    (lambda c: list(c.values()), "dict decode_init returns"),
])
def test_a_bad_decode_cache_is_one_clear_error(runtime, change, message):
    cache = _numpy_cache(runtime.decode_init(runtime.initial_memory(2)))
    cache["valid"] = cache["valid"].astype(np.bool_)
    runtime.decode_step(np.array([1, 2]), cache)  # the numpy copy itself is accepted
    with pytest.raises(ValueError, match=message):
        runtime.decode_step(np.array([1, 2]), change(cache))


def test_the_stopped_flags_need_one_per_row(runtime):
    cache = runtime.decode_init(runtime.initial_memory(2))
    with pytest.raises(ValueError, match="one flag per row"):
        runtime.decode_step(np.array([1, 2]), cache, stopped=np.array([True]))


def test_a_row_that_stopped_goes_on_as_if_taken_out_and_read_alone(runtime):
    stop_and_go_on(runtime)  # on the device: tests/test_device_ring.py


def stop_and_go_on(runtime, watch=contextlib.nullcontext):
    """Row 1 stops while the ring moves on 3 slots, then goes on: its
    log-probs and memory are those of its cache taken out when it stopped
    and read alone, the other rows' those of theirs stepped without it.
    The steps from the stop on run inside `watch()`."""
    rng, n_token = np.random.default_rng(0), runtime.n_token
    cache = runtime.decode_init(runtime.initial_memory(3))
    for _ in range(4):
        runtime.decode_step(rng.integers(0, n_token, 3), cache)
    alone, others = runtime.take(cache, [1]), runtime.take(cache, [0, 2])
    tokens = rng.integers(0, n_token, [4, 3])
    with watch():
        for token in tokens[:3]:
            runtime.decode_step(token, cache, np.array([False, True, False]))
        got, _ = runtime.decode_step(tokens[3], cache)
    for token in tokens:
        want_others, _ = runtime.decode_step(token[[0, 2]], others)
    np.testing.assert_allclose(got[[0, 2]], want_others, atol=1e-5)
    want, read = runtime.decode_read(tokens[3, 1:2, None], alone)
    np.testing.assert_allclose(got[1:2], want, atol=1e-5)
    for a, b in zip(runtime.cache_memory(runtime.take(cache, [1])).numpy(),
                    runtime.cache_memory(read).numpy()):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("shape, axis", [([3, 4, 7, 2], 2), ([4, 7], 1)])
def test_a_ring_in_time_order_is_the_gather_from_each_rows_oldest_slot(shape, axis):
    rng = np.random.default_rng(0)
    ring = layer_aligned_empty(shape, np.float32) if axis == 2 else np.empty(shape, np.float32)
    ring[...] = rng.normal(size=shape)
    row_slot = np.array([0, 6, 3, 5])  # rows whose free slot is first, last, inside
    size = shape[axis]
    index = (row_slot[:, None] + 1 + np.arange(size - 1)[None, :]) % size
    rows = np.arange(len(row_slot))[:, None]
    want = ring[:, rows, index] if axis == 2 else ring[rows, index]
    got = in_time_order(ring, row_slot, axis)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)


def test_the_saved_models_decode_memory_equals_the_runtimes(exported):
    import tensorflow as tf
    out = exported[1]
    runtime = open_runtime(str(out), backend="saved_model", device="cpu")
    cache = runtime.decode_init(runtime.initial_memory(2))
    for ids in ([1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12], [13, 14]):
        _, cache = runtime.decode_step(np.array(ids), cache)
    signature = tf.saved_model.load(str(out / "saved_model")).signatures["decode_memory"]
    graph = signature(cache_mems=cache["cache_mems"], valid=cache["valid"],
                      row_slot=cache["row_slot"])
    mems, mask = runtime.cache_memory(cache).numpy()
    np.testing.assert_array_equal(graph["mems"].numpy(), mems)
    np.testing.assert_array_equal(graph["mem_mask"].numpy(), mask)


def test_without_the_decode_files_the_runtime_decodes_as_before(exported, tmp_path):
    _, _, _ = exported
    core = TransformerXL(CONFIG)
    save_pretrained(core, tmp_path / "model")
    run_export(str(tmp_path / "out"), str(tmp_path / "model"), formats=("onnx",),
               decode_cache=False, verify=False)
    assert not (tmp_path / "out" / "decode_step.onnx").exists()
    runtime = open_runtime(str(tmp_path / "out"), backend="onnx", device="cpu")
    assert not runtime.has_decode_cache and not runtime.use_decode_cache
    assert runtime.generate([[1, 2]], 3, temperature=0.0).ids.shape == (1, 3)


def test_an_export_with_keys_as_rows_decodes_through_step_last(exported, caplog):
    """Exports before the keys-as-columns cache (no `decode_cache_layout` in
    their metadata) hold keys the other way round: the runtime must not
    write a token into that cache by this version's layout. It decodes
    through `step_last`, with one warning, to the same ids."""
    for backend in ("onnx", "saved_model"):
        runtime = open_runtime(str(exported[1]), backend=backend, device="cpu")
        want = runtime.generate([[1, 2, 3]], 6, temperature=0.0)
        assert runtime.use_decode_cache
        older = {k: v for k, v in runtime.info.values.items() if k != "decode_cache_layout"}
        runtime.info = ExportInfo(older)
        assert not runtime.has_decode_cache and not runtime.use_decode_cache
        assert "re-export it to use the cache" in caplog.text
        got = runtime.generate([[1, 2, 3]], 6, temperature=0.0)
        np.testing.assert_array_equal(got.ids, want.ids)
        with pytest.raises(ValueError, match="no cached decode interface"):
            runtime.decode_init(runtime.initial_memory(1))


def test_the_saved_model_reads_on_an_onnx_runtimes_device_cache(exported):
    """A device cache (OrtValues on the CPU provider) handed to the
    SavedModel runtime reads, joins and steps as its own host cache does."""
    onnx_rt = open_runtime(str(exported[1]), backend="onnx", device="cpu", device_cache=True)
    saved = open_runtime(str(exported[1]), backend="saved_model", device="cpu")
    _, memory = saved.step(np.array([[1, 2, 3], [4, 5, 6]], np.int32))
    caches = [onnx_rt.decode_init(memory), saved.decode_init(memory)]
    read = [saved.decode_read([[7, 8], [9, 10]], cache) for cache in caches]
    np.testing.assert_allclose(read[0][0], read[1][0], atol=1e-5)
    joined = [saved.concat([cache, cache]) for cache in caches]
    for got, want in zip(saved.cache_memory(joined[0]).numpy(),
                         saved.cache_memory(joined[1]).numpy()):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_memory_read_back_from_a_temporary_is_still_right(exported):
    """`RuntimeMemory.numpy()` copies: a view of an OrtValue's buffer dangles
    once the value is gone (`take` of a memory read back from the temporary
    gave garbage before)."""
    runtime = open_runtime(str(exported[1]), backend="onnx", device="cpu")
    ids = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    kept = runtime.step(ids)[1]
    taken = runtime.take(kept, [1, 0]).numpy()[0]
    _ = [np.full(taken.size, 7.0, np.float32) for _ in range(20)]  # reuse freed memory
    np.testing.assert_array_equal(taken, kept.numpy()[0][:, [1, 0]])


# The segment graph's kernels (nodes that are not views) as ONNX Runtime's CPU
# provider optimizes it, at CONFIG: 251 (324 before its layer norms were written
# to fuse and its queries stopped slicing the inputs back out; 1 of them flags an
# empty segment for the id check; each is a launch or a host-side step on a GPU).
MAX_SEGMENT_KERNELS = 251


def test_the_segment_graph_has_few_kernels_and_one_node_a_layer_norm(exported):
    """`model.onnx` (inference: `training` falsy) writes its layer norms as
    ONNX Runtime fuses them: one node each (a dozen unfused), as the decode
    graphs do (`layers.layer_norm`)."""
    from benchmarks.inference import kernels, node_counts
    for graph in ("model.onnx", "decode_read.onnx"):
        counts = node_counts(str(exported[1] / graph), "all")
        norms = counts["LayerNormalization"] + counts["SkipLayerNormalization"]
        assert norms == 2 * CONFIG.n_layer and counts["ReduceMean"] == 0, (graph, counts)
        if graph == "model.onnx":
            assert kernels(counts) <= MAX_SEGMENT_KERNELS, counts


def test_one_head_without_memory_reads_a_segment_as_the_core(tmp_path):
    """n_head=1, mem_len=0: decode_read's ring in time order (no slot) went
    through transposes of an empty axis that tf2onnx wrote as reshapes to a
    0, which ONNX reads as "copy the axis": a stale slot joined the keys and
    values (wrong log-probs, or a broadcast error)."""
    config = TransformerXLConfig.preset("tiny", n_token=40, n_layer=1, n_head=1, d_head=4,
                                        d_model=16, d_inner=16, mem_len=0)
    core = TransformerXL(config)
    rng = np.random.default_rng(1)
    for w in core.weights:
        w.assign(rng.normal(0.0, 0.3, w.shape).astype(np.float32))
    save_pretrained(core, tmp_path / "model")
    run_export(str(tmp_path / "out"), str(tmp_path / "model"), formats=["onnx"], verify=False)
    runtime = open_runtime(str(tmp_path / "out"), backend="onnx", device="cpu")
    for length in (1, 3):
        ids = random_segments(40, 2, length, n_segments=1, seed=length)[0]
        log_probs, _ = runtime.decode_read(ids, runtime.decode_init(runtime.initial_memory(2)))
        expected, _ = core(ids, core.initial_memory(2, 0), training=False)
        np.testing.assert_allclose(log_probs, expected.numpy()[:, -1], atol=1e-4)


def test_the_host_slab_rotates_an_admitted_row_and_its_own_slot_together():
    """A row admitted at another ring slot than the slab's is rotated onto
    it, its own free slot with it: the slab's rows all stand at the slab's
    slot, and the row evicted at once holds its memory in the same order."""
    from export.decode_cache import SLOT_AXES, in_time_order
    from export.slab import CacheSlab
    rng = np.random.default_rng(4)
    size = 5  # odd: a rotation by +2 is not one by -2

    def one_row(row_slot):
        valid = np.ones([1, size], bool)
        valid[0, row_slot] = False
        return {"cache_mems": rng.normal(size=[1, 1, size, 2]).astype(np.float32),
                "keys": rng.normal(size=[1, 1, 1, 2, size]).astype(np.float32),
                "values": rng.normal(size=[1, 1, 1, size, 2]).astype(np.float32),
                "valid": valid, "slot": np.array(row_slot, np.int32),
                "row_slot": np.array([row_slot], np.int32),
                "positions": np.zeros([2 * size, 2], np.float32)}

    caches = {"a": one_row(1), "b": one_row(3)}
    slab = CacheSlab(2)
    for key, cache in caches.items():
        slab.admit(key, {name: value.copy() for name, value in cache.items()})
    assert int(slab.batch()["slot"]) == 1
    np.testing.assert_array_equal(slab.batch()["row_slot"], [1, 1])
    for key in ("b", "a"):
        back, alone = slab.evict(key), caches[key]
        for name, axis in SLOT_AXES.items():
            np.testing.assert_array_equal(
                in_time_order(back[name], back["row_slot"], axis),
                in_time_order(alone[name], alone["row_slot"], axis), err_msg=f"{key} {name}")


def test_the_onnx_graphs_compute_as_the_specs_reference_evaluator_does(exported):
    """ONNX's own reference implementation (`onnx.reference`) gives ONNX
    Runtime's outputs on every graph, the ring written by decode_token
    through two turns of its slots with stopped rows: no graph leans on a
    runtime's reading of what the spec leaves undefined (duplicate scatter
    indices, indices out of range, integer division of negatives, empty
    reductions)."""
    from onnx.reference import ReferenceEvaluator
    out, rng = exported[1], np.random.default_rng(5)
    n_layer, batch, size = CONFIG.n_layer, 3, CONFIG.mem_len + 1

    def both(name, feeds):
        session = ort.InferenceSession(str(out / name), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        want = dict(zip(names, session.run(None, feeds)))
        got = dict(zip(names, ReferenceEvaluator(str(out / name)).run(None, feeds)))
        for key, value in want.items():
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, (name, key)
            np.testing.assert_allclose(got[key], value, atol=1e-5, err_msg=f"{name} {key}")
        # (NaN equals NaN there: a graph reading the NaN slots would pass)
        assert np.isfinite(want.get("log_probs", 0)).all(), name
        return want

    mems = rng.normal(size=[n_layer, batch, CONFIG.mem_len, CONFIG.d_model]).astype(np.float32)
    mask = rng.random([batch, CONFIG.mem_len]) < 0.6
    mask[0], mask[1] = False, True
    mems[:, ~mask] = np.nan  # never read
    ids = rng.integers(0, CONFIG.n_token, [batch, 4]).astype(np.int32)
    both("model.onnx", {"token_ids": ids, "mems": mems, "mem_mask": mask})
    cache = both("decode_init.onnx", {"mems": mems, "mem_mask": mask})
    layers = {f"{kind}_{i}": np.ascontiguousarray(cache[kind][i])
              for kind in ("keys", "values") for i in range(n_layer)}
    both("decode_step.onnx", {"token_ids": ids[:, 0], "valid": cache["valid"],
                              "slot": cache["slot"], "positions": cache["positions"], **layers})
    read = both("decode_read.onnx",
                {"token_ids": ids, **{name: cache[name] for name in READ_INPUTS[1:]}})
    state = {"cache_mems": read["new_cache_mems"], "valid": read["new_valid"],
             "slot": read["new_slot"], "row_slot": read["new_row_slot"],
             "positions": cache["positions"],
             **{f"{kind}_{i}": np.ascontiguousarray(read[f"new_{kind}"][i])
                for kind in ("keys", "values") for i in range(n_layer)}}
    for step in range(2 * size):
        stopped = np.array([False, step % 3 == 1, step >= 4])
        new = both("decode_token.onnx", {"token_ids": rng.integers(0, CONFIG.n_token, batch)
                                         .astype(np.int32), "stopped": stopped, **state})
        state.update({name[4:]: value for name, value in new.items()
                      if name.startswith("new_")})
