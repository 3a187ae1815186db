"""`python -m benchmarks.long_memory --part=onnx_weights` carries an export's graphs without
its weights and refills them: the skeleton is small, and filled it opens and
decodes like an export (the way the GPU timings were taken). The tools the
GPU check runs over such an export: the step's kernel count and its profile
by op type (`benchmarks.inference --part=profile`)."""

import json

import numpy as np
import onnx
import pytest

from benchmarks.common import BenchmarkError
from benchmarks.inference import (VIEW_OPS, bind_profiled, kernels, node_counts,
                                  summarize_profile)
from benchmarks.long_memory import cuda_step_nodes
from export.decode_cache import token_in_place, token_inputs, token_outputs
from export import open_runtime, run_export
from export.parity import cached_outputs, max_differences, random_segments, runtime_outputs
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.weights import save_pretrained

CONFIG = TransformerXLConfig.preset("tiny", n_token=3000, mem_len=6, d_model=64, d_inner=128)


def test_a_skeleton_is_small_and_fills_into_a_working_export(tmp_path, jobs):
    save_pretrained(TransformerXL(CONFIG), tmp_path / "model")
    # Parity is not the point (test_export_job.py checks it): the skeleton's round trip is.
    run_export(str(tmp_path / "out"), str(tmp_path / "model"), formats=("onnx",), verify=False)
    skeleton = tmp_path / "skeleton"
    jobs.run("benchmarks.long_memory", ["--part=onnx_weights", f"--export_dir={tmp_path / 'out'}",
                                        f"--skeleton_dir={skeleton}"], check=True)
    assert {p.name for p in skeleton.glob("*.onnx")} == \
        {"model.onnx", "decode_init.onnx", "decode_step.onnx", "decode_read.onnx",
         "decode_token.onnx"}
    def size(folder):  # the graphs and any external weights file
        return sum(p.stat().st_size for p in folder.iterdir() if ".onnx" in p.name)
    assert size(skeleton) * 2 < size(tmp_path / "out")
    assert not list(skeleton.glob("*.data"))
    for name in ("model.onnx", "decode_step.onnx"):
        marked = [t for t in onnx.load(str(skeleton / name)).graph.initializer
                  if t.doc_string == "txl_tf:random"]
        assert marked and not any(t.raw_data for t in marked)
    jobs.run("benchmarks.long_memory", ["--part=onnx_weights", "--fill",
                                        f"--skeleton_dir={skeleton}"], check=True)
    runtime = open_runtime(str(skeleton), device="cpu")
    assert runtime.mem_len == CONFIG.mem_len and runtime.has_decode_cache
    out = runtime.generate([[1, 2, 3]], 8, temperature=0.0)
    assert out.ids.shape == (1, 8) and np.isfinite(out.log_probs).all()
    # Filled, the graphs are still one model: each weight gets the same values in every file
    # (the GPU check compares decode_token on the device with decode_step on the host).
    device = open_runtime(str(skeleton), device="cpu", device_cache=True)
    segments = random_segments(CONFIG.n_token, 2, 4, 3, seed=1)
    cached = cached_outputs(runtime, segments)  # decode_init, decode_step
    # model.onnx reads a segment whole, so only the first (no token further back than
    # mem_len) is the same computation as token by token.
    for want, got in ((cached[:1], runtime_outputs(runtime, segments)[:1]),
                      (cached, cached_outputs(device, segments))):  # decode_token
        diff = max_differences(want, got)
        assert diff["log_probs"] < 1e-5 and diff["mems"] < 1e-5, diff
    # The GPU check's parity part, rehearsed on the CPU provider: the device cache's paths
    # against the host cache over the filled skeleton (the skeleton is what the GPU compares).
    jobs.run("benchmarks.long_memory", ["--part=cuda_parity", "--device=cpu", "--steps=9",
                                        f"--exports={skeleton}", "--tolerance=1e-5",
                                        f"--output={tmp_path / 'parity.json'}"], check=True)
    [row] = json.loads((tmp_path / "parity.json").read_text())["rows"]
    assert row["ring_in_place"] and row["max_diff_device_cache"] < 1e-5, row
    # cuda_parity's kernel count (without CUDA, the CPU provider optimizes the step)
    nodes = cuda_step_nodes(str(skeleton))
    on_cpu = node_counts(str(skeleton / "decode_token.onnx"), "all")
    assert nodes["cuda_step_graph"] == "decode_token", nodes
    assert nodes["cuda_step_kernels"] == kernels(on_cpu) > 0, nodes
    assert sum(nodes["cuda_step_ops"].values()) == nodes["cuda_step_kernels"]
    assert not set(nodes["cuda_step_ops"]) & VIEW_OPS
    # the graphs' profiles: every node of the optimized graph, once a run
    jobs.run("benchmarks.inference", ["--part=profile", f"--export_dir={skeleton}",
                                      "--iters=3", "--batch_sizes=1,2", "--segment_len=5",
                                      f"--output={tmp_path / 'profile.json'}"], check=True)
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["mem_len"] == CONFIG.mem_len
    segment = node_counts(str(skeleton / "model.onnx"), "all")  # dynamic
    assert profile["fixed_shapes"]  # the segment graph's shape arithmetic folded
    for r in profile["graphs"]["model"].values():
        assert "Shape" not in r["ops"] and r["kernels"] < kernels(segment), r
    jobs.run("benchmarks.inference", ["--part=profile", f"--export_dir={skeleton}",
                                      "--iters=3", "--batch_sizes=1,2", "--segment_len=5",
                                      "--graphs=model", "--nofixed_shapes",
                                      f"--output={tmp_path / 'profile.json'}"], check=True)
    profile["graphs"].update(json.loads((tmp_path / "profile.json").read_text())["graphs"])
    for graph, optimized in (("decode_token", on_cpu), ("model", segment)):
        assert list(profile["graphs"][graph]) == ["1", "2"]
        for r in profile["graphs"][graph].values():
            assert r["kernels"] == kernels(optimized) and r["on_cpu"] == [], r
            assert {op: v["count"] for op, v in r["ops"].items()} == dict(optimized)
            assert 0 < r["nodes_ms"] <= r["wall_ms"]
            times = [v["ms"] for v in r["ops"].values()]
            assert times == sorted(times, reverse=True)


def test_the_step_kernels_of_an_export_without_decode_graphs_are_an_error_entry(tmp_path):
    """cuda_parity's row of a folder without the decode graphs: its error
    entry, as for a step ONNX Runtime cannot optimize (was a TypeError
    once the step's file was looked up outside the `try`)."""
    nodes = cuda_step_nodes(str(tmp_path))
    assert nodes["cuda_step_kernels"] is None and "no decode step" in \
        nodes["cuda_step_nodes_error"], nodes


def test_a_profile_counts_the_last_runs_by_op_type():
    def node(op, ts, dur, provider="CUDAExecutionProvider", inputs=([2, 3],)):
        return {"cat": "Node", "name": f"n{ts}_kernel_time", "ts": ts, "dur": dur,
                "args": {"op_name": op, "provider": provider,
                         "input_type_shape": [{"float": list(dims)} for dims in inputs]}}
    memory = ([4, 1, 8], [4, 8, 9])  # a matmul against the memory, the others against weights
    events = [{"cat": "Session", "name": "model_run", "ts": 0, "dur": 900},
              node("MatMul", 1, 800),  # the warm-up run: left out
              {"cat": "Session", "name": "model_run", "ts": 1000, "dur": 100},
              node("MatMul", 1001, 30, inputs=memory), node("MatMul", 1031, 20),
              node("Reshape", 1051, 5),
              {"cat": "Session", "name": "model_run", "ts": 2000, "dur": 80},
              node("MatMul", 2001, 10, inputs=memory), node("MatMul", 2011, 20),
              node("Reshape", 2031, 5), node("Shape", 2036, 1, provider="CPUExecutionProvider")]
    r = summarize_profile(events, 2, device="cuda")
    assert r["wall_ms"] == pytest.approx(0.09) and r["nodes_ms"] == pytest.approx(0.0455)
    assert r["ops"] == {"MatMul": {"ms": pytest.approx(0.04), "count": 2},
                        "Reshape": {"ms": pytest.approx(0.005), "count": 1},
                        "Shape": {"ms": pytest.approx(0.0005), "count": 0}}
    # the two matmuls of a run told apart by their inputs' shapes, costliest first
    assert r["shapes"][:2] == [
        {"op": "MatMul", "inputs": [[4, 1, 8], [4, 8, 9]], "ms": pytest.approx(0.02), "count": 1},
        {"op": "MatMul", "inputs": [[2, 3]], "ms": pytest.approx(0.02), "count": 1}]
    assert [g["op"] for g in r["shapes"]] == ["MatMul", "MatMul", "Reshape", "Shape"]
    assert r["kernels"] == 2 and r["on_cpu"] == ["Shape"]
    assert summarize_profile(events, 2)["on_cpu"] == []  # a CPU session's nodes are all there
    with pytest.raises(BenchmarkError, match="holds 3 runs, not 4"):
        summarize_profile(events, 4)


def test_a_profiled_token_step_writes_its_rings_in_place():
    """The profile runs decode_token as the runtime does: each ring's output
    is its input's buffer (a write into a fresh output would first copy the
    whole ring: that copy, not the step, would fill the profile)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    n_layer = 2
    assert set(token_in_place(n_layer)) == {name[len("new_"):] for name in token_outputs(n_layer)
                                            if name[len("new_"):] in token_inputs(n_layer)
                                            } - {"slot", "row_slot"}
    # A ring written at one slot (ScatterElements, as decode_token writes each ring), whose
    # output is named as the input written in place.
    ring = helper.make_tensor_value_info("keys_0", TensorProto.FLOAT, [2, 5])
    graph = helper.make_graph(
        [helper.make_node("ScatterElements", ["keys_0", "slot", "token"], ["new_keys_0"],
                          axis=1)], "write",
        [ring, helper.make_tensor_value_info("slot", TensorProto.INT64, [2, 1]),
         helper.make_tensor_value_info("token", TensorProto.FLOAT, [2, 1])],
        [helper.make_tensor_value_info("new_keys_0", TensorProto.FLOAT, [2, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"keys_0": np.zeros((2, 5), np.float32), "slot": np.array([[1], [3]], np.int64),
             "token": np.array([[7.0], [8.0]], np.float32)}
    written = np.zeros((2, 5), np.float32)
    written[0, 1], written[1, 3] = 7.0, 8.0
    for in_place, ring_after in ((token_in_place(n_layer), written), ((), feeds["keys_0"])):
        binding, bound = bind_profiled(session, feeds, "cpu", in_place)
        session.run_with_iobinding(binding)
        np.testing.assert_array_equal(binding.get_outputs()[0].numpy(), written)
        np.testing.assert_array_equal(bound["keys_0"].numpy(), ring_after)
