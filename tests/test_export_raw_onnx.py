"""The ONNX file as a client without txl_tf sees it: plain onnxruntime, outputs
unpacked by position, ids checked inside the graph, garbage in invalid memory
slots harmless, external data for large weights."""
import collections
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from export import export_onnx, open_runtime
from export.metadata import external_data_file
from export.onnx_export import id_check_node_name
from export.parity import core_outputs, random_segments
from txl_tf import TransformerXL, TransformerXLConfig

MEM_LEN, N_TOKEN = 6, 256


@pytest.fixture(scope="module")
def core():
    core = TransformerXL(TransformerXLConfig.preset("tiny"))
    rng = np.random.default_rng(3)
    for w in core.weights:
        w.assign(rng.normal(0.0, 0.3, w.shape).astype(np.float32))
    return core


@pytest.fixture(scope="module")
def onnx_path(core, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("raw") / "model.onnx")
    assert export_onnx(core, path, MEM_LEN) == [path]
    return path


def session(path, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def fresh_feeds(ids, mems=None, mem_mask=None):
    batch = ids.shape[0]
    return {"token_ids": ids.astype(np.int32),
            "mems": np.zeros([2, batch, MEM_LEN, 32], np.float32) if mems is None else mems,
            "mem_mask": np.zeros([batch, MEM_LEN], bool) if mem_mask is None else mem_mask}


CLIENT = r"""
import sys
import numpy as np
import onnxruntime as ort

model, segments_file, out_file = sys.argv[1:]
segments = np.load(segments_file)
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
feeds = {"mems": np.zeros([2, segments.shape[1], %(mem_len)d, 32], np.float32),
         "mem_mask": np.zeros([segments.shape[1], %(mem_len)d], bool)}
results = {}
for i, ids in enumerate(segments):
    feeds["token_ids"] = ids
    log_probs, new_mems, new_mem_mask = session.run(None, feeds)  # by position
    feeds["mems"], feeds["mem_mask"] = new_mems, new_mem_mask
    results.update({f"log_probs{i}": log_probs, f"mems{i}": new_mems, f"mask{i}": new_mem_mask})
np.savez(out_file, **results)
loaded = sorted(m for m in sys.modules if m.startswith(("txl_tf", "tensorflow", "keras", "export")))
print(",".join(loaded))
""" % {"mem_len": MEM_LEN}


def test_positional_outputs_in_a_client_without_txl_tf(core, onnx_path, tmp_path):
    segments = random_segments(N_TOKEN, 2, 4, n_segments=3, seed=1)
    np.save(tmp_path / "segments.npy", np.stack(segments))
    result = subprocess.run(
        [sys.executable, "-c", CLIENT, onnx_path, str(tmp_path / "segments.npy"),
         str(tmp_path / "out.npz")], capture_output=True, text=True, timeout=600,
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == ""  # no txl_tf, TensorFlow or Keras in the client
    got = np.load(tmp_path / "out.npz")
    for i, (log_probs, mems, mask) in enumerate(core_outputs(core, segments, MEM_LEN)):
        np.testing.assert_allclose(got[f"log_probs{i}"], log_probs, atol=1e-4)
        np.testing.assert_allclose(got[f"mems{i}"], mems, atol=1e-4)
        np.testing.assert_array_equal(got[f"mask{i}"], mask)
    meta = session(onnx_path).get_modelmeta().custom_metadata_map
    outputs = [o.name for o in session(onnx_path).get_outputs()]
    assert outputs == meta["outputs"].split(",") == ["log_probs", "new_mems", "new_mem_mask"]
    assert [i.name for i in session(onnx_path).get_inputs()] == meta["inputs"].split(",")


@pytest.mark.parametrize("level", [ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                   ort.GraphOptimizationLevel.ORT_DISABLE_ALL],
                         ids=["optimised", "unoptimised"])
@pytest.mark.parametrize("bad", [-1, N_TOKEN, 2 ** 31 - 1])
def test_out_of_range_ids_fail_in_the_graph(onnx_path, level, bad):
    ids = np.array([[3, bad, 5], [1, 2, 3]], np.int32)
    with pytest.raises(Exception, match=r"out of range: valid ids are 0 to 255"):
        session(onnx_path, level).run(None, fresh_feeds(ids))
    assert id_check_node_name(N_TOKEN) == \
        "token_ids empty or out of range: valid ids are 0 to 255"


class ReduceMax(OpRun):
    """ReduceMax as opset 17 lets a runtime have it: 0 for an empty set
    (the spec defines that case only from opset 18)."""
    op_domain = ""

    def _run(self, data, axes=None, keepdims=1, noop_with_empty_axes=0):
        assert axes is None and not keepdims  # the check's any(): every axis
        return (np.array(data.max() if data.size else 0, data.dtype),)


def id_check_graph(path):
    """The graph of `path`'s id check alone: token_ids → token_ids_checked."""
    model = onnx.load(path, load_external_data=False)
    nodes = [n for n in model.graph.node if n.name.startswith("txl_id_check/")
             or n.name == id_check_node_name(N_TOKEN)]
    graph = onnx.helper.make_graph(
        nodes, "id_check", [model.graph.input[0]],
        [onnx.helper.make_tensor_value_info("token_ids_checked", onnx.TensorProto.INT32,
                                            ["batch", "seq_len"])])
    return onnx.helper.make_model(graph, opset_imports=model.opset_import,
                                  ir_version=model.ir_version)


@pytest.mark.parametrize("reduce_max", ["spec", "zero_for_nothing"])
def test_an_empty_segment_fails_the_id_check_on_any_runtime(onnx_path, reduce_max):
    """The check's any() reduced the ids' flags, an empty set for an empty
    segment: ONNX Runtime's CPU gives the lowest int64 there (a failure, as
    for a bad id), a runtime giving 0 let it through. The flag of an empty
    segment is reduced with them."""
    check = ReferenceEvaluator(id_check_graph(onnx_path),
                               new_ops=[ReduceMax] if reduce_max != "spec" else None)
    ids = np.array([[0, 255, 7]], np.int32)
    np.testing.assert_array_equal(check.run(None, {"token_ids": ids})[0], ids)
    for empty in (np.zeros([1, 0], np.int32), np.zeros([0, 3], np.int32)):
        with pytest.raises(IndexError):  # the check's Gather, out of range
            check.run(None, {"token_ids": empty})
        with pytest.raises(Exception, match=r"token_ids empty or out of range: valid ids are "
                                            r"0 to 255"):  # (ONNX Runtime names the node)
            session(onnx_path).run(None, fresh_feeds(empty))


def test_the_id_check_reads_no_shape_and_costs_few_kernels(onnx_path):
    """The flag of an empty input is a constant in the reduction (-2, an index
    out of range): no Size or Shape, whose value ONNX Runtime's CUDA provider
    keeps on the host (a copy back to the device each call, which no CUDA
    graph captures); 8 kernels (3 for the bad ids, the cast, the constant's
    concat, the reduction, the gather, the add), 10 with a Size."""
    from benchmarks.inference import kernels
    ops = collections.Counter(n.op_type for n in id_check_graph(onnx_path).graph.node
                              if n.op_type != "Constant")
    assert not {"Size", "Shape"} & set(ops), ops
    assert kernels(ops) == 8, ops


def without_id_check(path, out):
    """The same model with the inserted id check removed."""
    model = onnx.load(path)
    keep = [n for n in model.graph.node if not n.name.startswith("txl_id_check/")
            and n.name != id_check_node_name(N_TOKEN)]
    for node in keep:
        node.input[:] = ["token_ids" if i == "token_ids_checked" else i for i in node.input]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    onnx.save(model, out)
    return out


def test_valid_ids_give_identical_results_with_the_check(onnx_path, tmp_path):
    plain = session(without_id_check(onnx_path, str(tmp_path / "plain.onnx")))
    checked = session(onnx_path)
    assert len(onnx.load(str(tmp_path / "plain.onnx")).graph.node) < \
        len(onnx.load(onnx_path).graph.node)
    ids = np.array([[0, 255, 7], [128, 1, 254]], np.int32)
    for a, b in zip(checked.run(None, fresh_feeds(ids)), plain.run(None, fresh_feeds(ids))):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(Exception):
        plain.run(None, fresh_feeds(ids + 1))  # 256: a raw Gather error without the check


@pytest.mark.parametrize("garbage", [np.nan, np.inf, -np.inf, 1e30])
def test_garbage_in_invalid_slots_changes_nothing(core, onnx_path, garbage):
    rng = np.random.default_rng(4)
    ids = rng.integers(0, N_TOKEN, (2, 3), dtype=np.int32)
    mems = rng.normal(size=(2, 2, MEM_LEN, 32)).astype(np.float32)
    mask = np.array([[False, False, True, True, True, True], [False] * MEM_LEN])
    clean = np.where(mask[None, :, :, None], mems, 0).astype(np.float32)
    dirty = np.where(mask[None, :, :, None], mems, garbage).astype(np.float32)
    sess = session(onnx_path)
    expected = sess.run(None, fresh_feeds(ids, clean, mask))
    got = sess.run(None, fresh_feeds(ids, dirty, mask))
    for name, a, b in zip(("log_probs", "new_mems", "new_mem_mask"), got, expected):
        assert np.isfinite(a).all(), name
        np.testing.assert_allclose(a, b, atol=1e-6, err_msg=name)


def test_external_data_for_large_weights(core, onnx_path, tmp_path):
    path = str(tmp_path / "model.onnx")
    files = export_onnx(core, path, MEM_LEN, external_data_threshold=0)
    assert files == [path, external_data_file(path)] == [path, path + ".data"]
    weight_bytes = sum(w.numpy().nbytes for w in core.weights)
    assert os.path.getsize(path) < 100_000 <= weight_bytes <= os.path.getsize(files[1])
    model = onnx.load(path, load_external_data=False)
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(external) == len(core.weights)
    ids = random_segments(N_TOKEN, 2, 4, n_segments=1, seed=8)[0]
    for a, b in zip(session(path).run(None, fresh_feeds(ids)),
                    session(onnx_path).run(None, fresh_feeds(ids))):
        np.testing.assert_array_equal(a, b)
    assert json.loads(open_runtime(path).session.get_modelmeta()
                      .custom_metadata_map["txl_tf.config"])["n_token"] == N_TOKEN
