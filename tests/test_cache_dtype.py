"""The float16 decode cache (`python -m export --cache_dtype=float16`): its
graphs take and return keys and values in float16, the ONNX runtimes keep
them so (host numpy, device OrtValues, the slab), its decode stays within a
stated tolerance of the float32 core's, and a bad dtype is one clear error."""
import numpy as np
import onnx
import pytest

from export import SessionTable, open_runtime, run_export
from export.decode_cache import on_device
from export.metadata import ExportInfo, export_metadata
from export.parity import cached_outputs, core_outputs, max_differences, random_segments
from export.runtime import shape_and_dtype
from test_decode_cache_export import CONFIG, stop_and_go_on  # odd head sizes
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


def test_the_decode_graphs_take_and_return_float16_keys_and_values(exported):
    out = exported[1] / "out"
    step = onnx.load(str(out / "decode_step.onnx"), load_external_data=False)
    types = {v.name: onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name
             for v in list(step.graph.input) + list(step.graph.output)}
    assert {types[name] for name in ("keys_0", "values_1", "token_keys", "token_values")} == \
        {"float16"}
    assert {types[name] for name in ("positions", "log_probs", "token_mems")} == {"float32"}
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
