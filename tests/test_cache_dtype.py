"""The float16 decode cache (`python -m export --cache_dtype=float16`): its
graphs take and return keys and values in float16, the ONNX runtimes keep
them so (host numpy, device OrtValues, the slab), its decode stays within a
stated tolerance of the float32 core's, and a bad dtype is one clear error.
The float16 decode (`--decode_dtype=float16`): weights, compute, keys and
values in float16, within its stated tolerance, with few casts."""
import collections

import keras
import numpy as np
import onnx
import pytest

from benchmarks.inference import export_step, kernels, node_counts, optimized_graph, per_layer
from export import SessionTable, open_runtime, run_export
from export.device_cache import on_device
from export.decode_interface import decode_core
from export.metadata import ExportInfo, export_metadata
from export.parity import cached_outputs, core_outputs, max_differences, random_segments
from export.runtime import shape_and_dtype
from test_decode_cache_export import CONFIG, stop_and_go_on  # odd head sizes
from test_decode_step_nodes import MAX_KERNELS_PER_LAYER
from test_device_ring import DEVICE  # the CPU provider, or TXL_DEVICE_TESTS=cuda
from txl_tf import TransformerXL
from txl_tf.errors import TxlError
from txl_tf.weights import save_pretrained

# This random tiny model's float16 decode against the float32 core: measured
# 4.8e-7 (log-probs) and 6.3e-6 (memory). A trained model's, about 1e-3:
# docs/export-and-serving.md.
TOLERANCE = 1e-4
FLOAT16_CACHE = {"keys": "float16", "values": "float16", "cache_mems": "float32"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache_dtype")
    core = TransformerXL(CONFIG)
    save_pretrained(core, root / "model")
    # Its parity is checked below, token by token.
    run_export(str(root / "out"), str(root / "model"), formats=("onnx",), verify=False,
               cache_dtype="float16")
    return core, root


@pytest.fixture(scope="module", params=[False, True], ids=["host", "device"])
def runtime(request, exported):
    return open_runtime(str(exported[1] / "out" / "model.onnx"),
                        device=DEVICE if request.param else "cpu", device_cache=request.param)


def _dtypes(cache):
    return {name: np.dtype(shape_and_dtype(cache[name])[1]).name for name in FLOAT16_CACHE}


def _check_step_interface_dtypes(out):
    """decode_step.onnx in `out` takes and returns float16 keys and values;
    its other float tensors are float32. Returns it (onnx, no weights)."""
    step = onnx.load(str(out / "decode_step.onnx"), load_external_data=False)
    types = {v.name: onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name
             for v in list(step.graph.input) + list(step.graph.output)}
    assert {types[name] for name in ("keys_0", "values_1", "token_keys", "token_values")} == \
        {"float16"}
    assert {types[name] for name in ("positions", "log_probs", "token_mems")} == {"float32"}
    return step


def test_the_decode_graphs_take_and_return_float16_keys_and_values(exported):
    out = exported[1] / "out"
    _check_step_interface_dtypes(out)
    for name in ("decode_step.onnx", "model.onnx"):
        model = onnx.load(str(out / name), load_external_data=False)
        assert {p.key: p.value for p in model.metadata_props}["decode_cache_dtype"] == "float16"
    assert {i.type.tensor_type.elem_type for i in model.graph.input[1:2]} == \
        {onnx.TensorProto.FLOAT}  # model.onnx's mems


def test_a_float16_cache_decodes_near_the_core_and_stays_float16(exported, runtime):
    segments = random_segments(CONFIG.n_token, 2, 4, 2)
    want = core_outputs(exported[0], segments, CONFIG.mem_len, token_by_token=True)
    diff = max_differences(want, cached_outputs(runtime, segments))
    assert diff["log_probs"] <= TOLERANCE and diff["mems"] <= TOLERANCE, diff
    cache = runtime.decode_init(runtime.initial_memory(3))
    runtime.decode_step(np.array([1, 2, 3]), cache)
    _, read = runtime.decode_read(np.array([[4], [5], [6]]), cache)
    joined = runtime.concat([runtime.take(cache, [0]), runtime.take(cache, [2, 1])])
    for value in (cache, read, joined):
        assert _dtypes(value) == FLOAT16_CACHE
        assert on_device(value) == runtime.device_cache
    stop_and_go_on(runtime)  # on the device, a row rotated by the slab's graphs


def test_a_session_table_on_a_float16_device_slab_equals_the_hosts(exported):
    path = str(exported[1] / "out" / "model.onnx")
    tables = [SessionTable(open_runtime(path, device=DEVICE if on else "cpu", device_cache=on),
                           max_batch=2) for on in (False, True)]
    for table in tables:
        table.open("a", [1, 2, 3], 6)
        table.open("b", [4], 9, temperature=0.9, seed=1)
    while tables[0].active():
        assert tables[1].step() == tables[0].step()
    assert _dtypes(tables[1].slab._tensors) == FLOAT16_CACHE


def test_a_bad_cache_dtype_is_one_clear_error(exported, runtime):
    with pytest.raises(TxlError, match="--cache_dtype must be one of float32, float16, got "
                                       "'bfloat16'"):
        run_export(str(exported[1] / "bad"), str(exported[1] / "model"), cache_dtype="bfloat16")
    with pytest.raises(TxlError, match="decode cache is bfloat16, which this txl_tf does not "
                                       "read"):
        ExportInfo(export_metadata(CONFIG, 5, cache_dtype="bfloat16"))
    cache = runtime.decode_init(runtime.initial_memory(1))
    cache = {**{k: v.numpy() if on_device(cache) else v for k, v in cache.items()},
             "keys": np.zeros(shape_and_dtype(cache["keys"])[0], np.float32)}
    with pytest.raises(TxlError, match="decode cache keys must be float16, got float32"):
        runtime.decode_step(np.array([1]), cache)


# The float16 decode (weights and compute) of `exported16`'s model against
# its float32 core: measured 3.7e-4 (log-probs) and 2.2e-3 (memory: layer
# inputs rounded to float16). A trained model's: docs/export-and-serving.md.
DECODE_TOLERANCE = {"log_probs": 2e-3, "mems": 1e-2}
ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "MatMul", "Gemm", "Pow", "Sqrt"})


@pytest.fixture(scope="module")
def exported16(tmp_path_factory):
    """`(core, export folder)`: a tiny model of larger weights (its
    attention far from uniform) exported with `decode_dtype="float16"`."""
    root = tmp_path_factory.mktemp("decode_dtype")
    keras.utils.set_random_seed(0)
    core = TransformerXL(CONFIG.replace(init_std=0.3))
    save_pretrained(core, root / "model")
    run_export(str(root / "out"), str(root / "model"), formats=("onnx",), verify=False,
               decode_dtype="float16")
    return core, root / "out"


def test_a_float16_decode_reads_float16_weights_keys_and_values(exported16):
    out = exported16[1]
    step = _check_step_interface_dtypes(out)
    for name in ("decode_step.onnx", "decode_read.onnx", "model.onnx"):
        metadata = {p.key: p.value for p in onnx.load(str(out / name),
                                                      load_external_data=False).metadata_props}
        assert (metadata["decode_dtype"], metadata["decode_cache_dtype"]) == ("float16",) * 2
    # What it computes on its weights alone, ONNX Runtime folds at load with
    # its CPU kernels, which do no float16 arithmetic: it scales and joins
    # them in float32, then casts.
    nodes, dtypes = _on_weights(step.graph)
    assert not [n.name for n in nodes if n.op_type in ARITHMETIC
                and dtypes[n.input[0]] == onnx.TensorProto.FLOAT16]
    # As ONNX Runtime opens it: every weight a float16 array.
    graph = optimized_graph(str(out / "decode_step.onnx"), "basic").graph
    large = collections.Counter(onnx.helper.tensor_dtype_to_np_dtype(t.data_type).name
                                for t in graph.initializer if np.prod(t.dims) > 64)
    assert set(large) == {"float16"} and large["float16"] >= 2 * CONFIG.n_layer, large


def test_a_layer_of_the_float16_step_casts_6_times_and_adds_2_kernels(tmp_path):
    """What a layer adds to the float16 step: as written, 6 casts (the
    scores to float32 and back around the softmax, 2 in each layer norm,
    which ONNX Runtime fuses into its `LayerNormalization`), besides its
    weights' (folded at load); as optimized, the float32 step's kernels but
    its two residual adds apart from their layer norms (the CPU provider
    fuses no float16 `SkipLayerNormalization`), the casts that provider
    adds around float16 nodes aside."""
    paths = [export_step(CONFIG.replace(n_layer=n), CONFIG.mem_len, str(tmp_path / str(n)),
                         decode_dtype="float16") for n in (2, 3)]
    assert per_layer(*(_activation_casts(p) for p in paths)) == {"Cast": 6}
    layer = per_layer(*(node_counts(p, "all") for p in paths))
    assert layer["LayerNormalization"] + layer["SkipLayerNormalization"] == 2, layer
    assert kernels(layer) <= MAX_KERNELS_PER_LAYER + 2, layer


@pytest.mark.parametrize("on_device_", [False, True], ids=["host", "device"])
def test_a_float16_decode_stays_near_the_float32_core_end_to_end(exported16, on_device_):
    core, out = exported16
    runtime = open_runtime(str(out / "model.onnx"), device=DEVICE if on_device_ else "cpu",
                           device_cache=on_device_)
    assert runtime.info.decode_dtype == runtime.info.cache_dtype == "float16"
    segments = random_segments(CONFIG.n_token, 2, 4, 2)
    want = core_outputs(core, segments, CONFIG.mem_len, token_by_token=True)
    got = cached_outputs(runtime, segments)
    diff = max_differences(want, got)
    assert all(diff[name] <= DECODE_TOLERANCE[name] for name in DECODE_TOLERANCE), diff
    assert diff["mem_mask_equal"] and got[0][0].dtype == np.float32
    cache = runtime.decode_init(runtime.initial_memory(3))
    log_probs, _ = runtime.decode_step(np.array([1, 2, 3]), cache)
    _, read = runtime.decode_read(np.array([[4], [5], [6]]), cache)
    assert log_probs.dtype == np.float32
    for value in (cache, read):
        assert _dtypes(value) == FLOAT16_CACHE
        assert on_device(value) == runtime.device_cache


def test_the_float16_decode_core_is_the_core_computing_in_float16(exported):
    core = exported[0]
    assert decode_core(core, "float32") is core
    copy = decode_core(core, "float16")
    assert (copy.compute_dtype, copy.variable_dtype) == ("float16", "float32")
    assert all(np.array_equal(a, b) for a, b in zip(copy.get_weights(), core.get_weights()))


def test_contradictory_decode_dtypes_are_one_clear_error(exported):
    root = exported[1]

    def export(**options):
        run_export(str(root / "bad"), str(root / "model"), verify=False, **options)
    with pytest.raises(TxlError, match="--decode_dtype must be one of float32, float16, got "
                                       "'bfloat16'"):
        export(decode_dtype="bfloat16")
    with pytest.raises(TxlError, match="--decode_dtype=float16 keeps the keys and values in "
                                       "float16: drop --cache_dtype=float32"):
        export(decode_dtype="float16", cache_dtype="float32")
    for options in ({"decode_cache": False}, {"formats": ("saved_model",)}):
        with pytest.raises(TxlError, match="--decode_dtype=float16 is the ONNX decode graphs' "
                                           "dtype: it needs onnx in --formats and "
                                           "--decode_cache"):
            export(decode_dtype="float16", **options)
    with pytest.raises(TxlError, match="decode graphs compute in bfloat16, which this txl_tf "
                                       "does not read"):
        ExportInfo(export_metadata(CONFIG, 5, decode_dtype="bfloat16"))


def _on_weights(graph):
    """`(nodes, dtypes)`: the nodes of `graph` that compute on its weights
    and constants alone (ONNX Runtime folds them at load), and the element
    type of each tensor they make."""
    dtypes = {t.name: t.data_type for t in graph.initializer}
    nodes = []
    for node in graph.node:  # in topological order
        if all(name in dtypes for name in node.input if name):
            to = [a.i for a in node.attribute if a.name == "to"]
            dtype = to[0] if to else dtypes[node.input[0]] if node.input else None
            dtypes.update(dict.fromkeys(node.output, dtype))
            nodes.append(node)
    return nodes, dtypes


def _activation_casts(path):
    """`Counter({"Cast": n})`: the graph's casts of tensors computed from its
    inputs (not from its weights alone: those fold at load)."""
    graph = onnx.load(path, load_external_data=False).graph
    folded = {node.output[0] for node in _on_weights(graph)[0]}
    return collections.Counter(n.op_type for n in graph.node
                               if n.op_type == "Cast" and n.output[0] not in folded)
