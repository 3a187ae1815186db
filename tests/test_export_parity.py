"""Keras core vs reloaded SavedModel vs ONNX Runtime: same numbers, one file for all shapes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tensorflow as tf

from export import check_parity, export_onnx, export_saved_model, open_runtime
from export.parity import core_outputs, max_differences, random_segments, runtime_outputs
from txl_tf import TransformerXL, TransformerXLConfig

TOL = 1e-4
SEG_LEN = 5  # "T" of the brief; 1 is the decoding case


def random_core(seed=0, **overrides):
    """A tiny core with weights large enough that the outputs are far from uniform."""
    core = TransformerXL(TransformerXLConfig.preset("tiny", **overrides))
    rng = np.random.default_rng(seed)
    for w in core.weights:
        w.assign(rng.normal(0.0, 0.3, w.shape).astype(np.float32))
    return core


@pytest.fixture(scope="module")
def core():
    return random_core()


@pytest.fixture(scope="module", params=[0, 8], ids=["mem0", "mem8"])
def exported(request, core, tmp_path_factory):
    """Both artefacts for one memory length, exported once per module."""
    out = tmp_path_factory.mktemp(f"export_mem{request.param}")
    vocab = out / "vocab_src"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("".join(f"tok{i}\n" for i in range(256)))
    export_saved_model(core, str(out / "saved_model"), request.param, vocab_dir=str(vocab))
    export_onnx(core, str(out / "model.onnx"), request.param)
    runtimes = {
        "onnx": open_runtime(str(out / "model.onnx"), device="cpu"),
        "onnx_no_binding": open_runtime(str(out / "model.onnx"), device="cpu",
                                        io_binding=False),
        "saved_model": open_runtime(str(out / "saved_model")),
    }
    return request.param, out, runtimes


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("seg_len", [1, SEG_LEN])
def test_step_parity_over_segments(core, exported, batch, seg_len):
    mem_len, _, runtimes = exported
    segments = random_segments(256, batch, seg_len, n_segments=4, seed=batch * 10 + seg_len)
    check_parity(core, list(runtimes.values()), segments, tol=TOL)  # raises beyond TOL
    reference = core_outputs(core, segments, mem_len)
    # Memory really is carried: with memory, the later segments differ from a fresh start.
    if mem_len:
        fresh = core_outputs(core, segments[-1:], mem_len)[0][0]
        assert np.abs(fresh - reference[-1][0]).max() > 1e-3
    assert reference[-1][1].shape == (2, batch, mem_len, 32)
    for name, rt in runtimes.items():
        assert rt.mem_len == mem_len, name


def test_score_equals_gathered_log_probs(core, exported):
    mem_len, _, runtimes = exported
    rng = np.random.default_rng(1)
    segments = random_segments(256, 3, SEG_LEN, n_segments=3, seed=2)
    memory = core.initial_memory(3, mem_len)
    mems = {name: rt.initial_memory(3) for name, rt in runtimes.items()}
    for ids in segments:
        targets = rng.integers(0, 256, ids.shape, dtype=np.int32)
        log_probs, _ = core(ids, memory)
        nll, memory = core(ids, memory, targets=targets)
        gathered = -np.take_along_axis(log_probs.numpy(), targets[..., None], -1)[..., 0]
        np.testing.assert_allclose(nll.numpy(), gathered, atol=TOL)
        for name, rt in runtimes.items():
            got, mems[name] = rt.score(ids, targets, mems[name])
            np.testing.assert_allclose(got, gathered, atol=TOL, err_msg=name)
            np.testing.assert_allclose(mems[name].numpy()[0], memory.mems.numpy(),
                                       atol=TOL, err_msg=name)


def test_onnx_axes_dynamic_and_metadata(exported):
    mem_len, out, runtimes = exported
    model = onnx.load(str(out / "model.onnx"))
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(model.graph.input) + list(model.graph.output)}
    assert dims["token_ids"] == ["batch", "seq_len"]
    assert dims["mems"] == [2, "batch", mem_len, 32]
    assert dims["mem_mask"] == ["batch", mem_len]
    assert dims["new_mems"] == [2, "batch", mem_len, 32]
    assert dims["log_probs"] == ["batch", "seq_len", 256]
    meta = runtimes["onnx"].session.get_modelmeta().custom_metadata_map
    assert json.loads(meta["txl_tf.config"]) == TransformerXLConfig.preset("tiny").to_dict()
    assert (meta["n_layer"], meta["mem_len"], meta["d_model"], meta["vocab_size"]) == \
        ("2", str(mem_len), "32", "256")
    onnx.checker.check_model(model)
    assert not any("Assert" in n.op_type for n in model.graph.node)


def test_saved_model_signatures_and_assets(exported):
    mem_len, out, runtimes = exported
    loaded = runtimes["saved_model"].loaded
    assert set(loaded.signatures) == {"serving_default", "step", "step_last", "initial_memory",
                                      "score", "decode_init", "decode_step", "decode_read",
                                      "decode_memory"}
    _, spec = loaded.signatures["step"].structured_input_signature
    assert spec["token_ids"].shape.as_list() == [None, None]
    assert spec["mems"].shape.as_list() == [2, None, mem_len, 32]
    assert spec["mem_mask"].shape.as_list() == [None, mem_len]
    init = loaded.signatures["initial_memory"](batch_size=tf.constant(3))
    assert init["mems"].shape == (2, 3, mem_len, 32) and not init["mem_mask"].numpy().any()
    assets = sorted(os.listdir(out / "saved_model" / "assets"))
    assert assets == ["config.json", "export_metadata.json", "vocab.txt"]
    assert TransformerXLConfig.from_json(str(out / "saved_model" / "assets" / "config.json")) \
        == TransformerXLConfig.preset("tiny")


def test_saved_model_cli_run_matches(core, exported, tmp_path):
    mem_len, out, runtimes = exported
    ids = random_segments(256, 2, SEG_LEN, n_segments=1, seed=5)[0]
    memory = runtimes["saved_model"].step(ids)[1]
    states, valid = memory.numpy()
    next_ids = random_segments(256, 2, SEG_LEN, n_segments=1, seed=6)[0]
    for name, value in (("token_ids", next_ids), ("mems", states), ("mem_mask", valid)):
        np.save(tmp_path / f"{name}.npy", value)
    inputs = ";".join(f"{n}={tmp_path / n}.npy" for n in ("token_ids", "mems", "mem_mask"))
    cli = Path(sys.executable).parent / "saved_model_cli"
    result = subprocess.run(
        [str(cli), "run", "--dir", str(out / "saved_model"), "--tag_set", "serve",
         "--signature_def", "step", "--inputs", inputs, "--outdir", str(tmp_path / "cli"),
         "--overwrite"], capture_output=True, text=True, timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    expected = core_outputs(core, [ids, next_ids], mem_len)[-1]
    np.testing.assert_allclose(np.load(tmp_path / "cli" / "log_probs.npy"), expected[0],
                               atol=TOL)
    np.testing.assert_allclose(np.load(tmp_path / "cli" / "new_mems.npy"), expected[1],
                               atol=TOL)
    np.testing.assert_array_equal(np.load(tmp_path / "cli" / "new_mem_mask.npy"), expected[2])


def test_runtimes_agree_with_each_other(exported):
    _, _, runtimes = exported
    segments = random_segments(256, 2, 3, n_segments=3, seed=9)
    outputs = {name: runtime_outputs(rt, segments) for name, rt in runtimes.items()}
    diff = max_differences(outputs["onnx"], outputs["saved_model"])
    assert diff["log_probs"] <= TOL and diff["mems"] <= TOL and diff["mem_mask_equal"]


FRESH_PROCESS = r"""
import json, sys
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_registry
from tensorflow.core.protobuf import saved_model_pb2

path, ids_file = sys.argv[1], sys.argv[2]
proto = saved_model_pb2.SavedModel()
proto.ParseFromString(open(path + "/saved_model.pb", "rb").read())
graph = proto.meta_graphs[0].graph_def
ops = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
ops -= {f.signature.name for f in graph.library.function}  # calls of library functions
unknown = sorted(op for op in ops if op_def_registry.get(op) is None)
loaded = tf.saved_model.load(path)
ids = tf.constant(np.load(ids_file))
mem = loaded.signatures["initial_memory"](batch_size=tf.constant(int(ids.shape[0])))
step = loaded.signatures["step"](token_ids=ids, mems=mem["mems"], mem_mask=mem["mem_mask"])
score = loaded.signatures["score"](token_ids=ids, target_ids=ids, mems=mem["mems"],
                                   mem_mask=mem["mem_mask"])
ours = sorted(m for m in sys.modules if m.startswith(("txl_tf", "tensorflow_text")))
print(json.dumps({"unknown_ops": unknown, "modules": ours,
                  "log_probs": step["log_probs"].numpy().tolist(),
                  "nll": score["nll"].numpy().tolist()}))
"""


def test_fresh_process_loads_saved_model_with_core_ops_only(core, exported, tmp_path):
    mem_len, out, _ = exported
    ids = random_segments(256, 2, SEG_LEN, n_segments=1, seed=7)[0]
    np.save(tmp_path / "ids.npy", ids)
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(out / "saved_model"), str(tmp_path / "ids.npy")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ""})
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["unknown_ops"] == [] and report["modules"] == []
    log_probs, _ = core(ids, core.initial_memory(2, mem_len))
    nll, _ = core(ids, core.initial_memory(2, mem_len), targets=ids)
    np.testing.assert_allclose(np.array(report["log_probs"]), log_probs.numpy(), atol=TOL)
    np.testing.assert_allclose(np.array(report["nll"]), nll.numpy(), atol=TOL)


def test_a_nan_is_never_within_tolerance():
    """A NaN where the core has a number (or the reverse) is an infinite
    difference: `max` and `>` ignore NaN, so it passed any tolerance as 0."""
    from export.parity import ParityError, _check
    lp, mems, mask = np.zeros([2, 3, 5], np.float32), np.zeros([2, 2, 4, 8]), np.ones([2, 4], bool)
    bad = lp.copy()
    bad[1, 2, 0] = np.nan
    for reference, other in [(lp, bad), (bad, lp)]:
        diff = max_differences([(reference, mems, mask)], [(other, mems, mask)])
        assert diff["log_probs"] == np.inf
        with pytest.raises(ParityError, match="differs"):
            _check(diff, "onnx", 1e-4)
    same_inf = np.full_like(lp, -np.inf)
    assert max_differences([(same_inf, mems, mask)], [(same_inf, mems, mask)])["log_probs"] == 0
    with pytest.raises(ParityError, match="1 segments' outputs for 2 segments"):
        max_differences([(lp, mems, mask)] * 2, [(lp, mems, mask)])


@pytest.mark.parametrize("tol", [float("nan"), float("inf")])
def test_a_tolerance_that_passes_everything_is_refused(core, exported, tol):
    """tol=NaN passed any difference (`diff > nan` is False): the parity
    check said yes to whatever the runtimes gave."""
    from txl_tf import TxlError
    _, _, runtimes = exported
    segments = random_segments(256, 1, 2, n_segments=1, seed=0)
    with pytest.raises(TxlError, match=r"^tol must be a finite number \(NaN or inf passes "):
        check_parity(core, [runtimes["onnx"]], segments, tol=tol)


def test_no_runtimes_is_one_error(core):
    """`runtimes` non-empty, as documented: none was an IndexError."""
    from txl_tf import TxlError
    with pytest.raises(TxlError, match="at least one runtime"):
        check_parity(core, [], random_segments(256, 1, 2, n_segments=1, seed=0))


@pytest.mark.parametrize("mem_len", [0, 3])
def test_one_head_exports_equal_the_core(tmp_path, mem_len):
    """n_head=1: tf2onnx turned the heads-first transpose (a size-1 axis
    moved) into a reshape copying its input's first axis, then merged it
    into the reshape before it, whose first axis is batch * length: ONNX
    Runtime failed on any segment longer than one token."""
    core = random_core(seed=3, n_head=1, d_head=16)
    export_onnx(core, str(tmp_path / "model.onnx"), mem_len)
    runtime = open_runtime(str(tmp_path / "model.onnx"), device="cpu")
    check_parity(core, [runtime], random_segments(256, 2, 4, n_segments=3, seed=4), tol=TOL)


def test_an_onnx_export_makes_its_folder(tmp_path):
    """`export_onnx(core, "out/model.onnx", ...)` into a folder not made yet
    ended, after the whole conversion, in `FileNotFoundError` naming the
    file (`export_saved_model` makes its folder)."""
    core = random_core(seed=5)
    path = tmp_path / "new" / "deeper" / "model.onnx"
    export_onnx(core, str(path), 2)
    runtime = open_runtime(str(path), device="cpu")
    check_parity(core, [runtime], random_segments(256, 1, 3, n_segments=1, seed=6), tol=TOL)


def random_export_config(seed):
    """A small random config and export memory length; seed % 3 picks the
    corner (one head and no memory, memory below the segment, above it), and
    the two with memory read with `same_length`, seed % 2 picking its
    convention (seeds 1 and 2: "pytorch" below the segment, "tf" above); the
    one above it has empty slots, not zeros (seeds 0 to 2 all drew zeros)."""
    rng = np.random.default_rng(seed)
    n_token = int(rng.choice([24, 40]))
    cutoffs = [int(rng.integers(4, n_token - 4))] if rng.random() < 0.7 else []
    n_head = [1, 2, 3][seed % 3]
    config = TransformerXLConfig(
        n_token=n_token, n_layer=int(rng.integers(1, 3)), d_model=int(rng.choice([8, 12, 16])),
        n_head=n_head, d_head=int(rng.choice([3, 4, 5])), d_inner=16,
        d_embed=int(rng.choice([8, 16, 20])), div_val=int(rng.choice([2, 4])) if cutoffs else 1,
        cutoffs=cutoffs, tie_weight=bool(rng.random() < 0.5),
        tie_projs=[bool(b) for b in rng.random(len(cutoffs) + 1) < 0.5], dropout=0.0,
        untie_r=bool(rng.random() < 0.5), pre_lnorm=bool(rng.random() < 0.5), tgt_len=4,
        mem_len=4, clamp_len=int(rng.choice([-1, 2])),
        same_length=bool(rng.random() < 0.5) or seed % 3 > 0,
        zero_filled_memory=bool(rng.random() < 0.3) and seed % 3 != 2,
        same_length_convention=["tf", "pytorch"][seed % 2])
    return config, [0, 2, 5][seed % 3]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_configurations_export_as_the_core(tmp_path, seed):
    """model.onnx, the decode graphs stepped past a full ring and
    decode_read equal the core over segments with the memory carried."""
    from export import run_export
    from txl_tf.weights import save_pretrained
    config, mem_len = random_export_config(seed)
    core = TransformerXL(config)
    rng = np.random.default_rng(seed)
    for w in core.weights:
        w.assign(rng.normal(0.0, 0.3, w.shape).astype(np.float32))
    save_pretrained(core, tmp_path / "model")
    run_export(str(tmp_path / "out"), str(tmp_path / "model"), formats=["onnx"],
               mem_len=mem_len, log_probs=["all", "last"][seed % 2], verify=False)
    runtime = open_runtime(str(tmp_path / "out"), backend="onnx", device="cpu")
    segments = random_segments(config.n_token, 2, 3, n_segments=3, seed=seed)
    # Each segment decoded on a ring of mem_len + 1 slots: it wraps for mem_len 0 and 2.
    check_parity(core, [runtime], segments, tol=TOL)
    # decode_read of a segment on the cache of the memory before it.
    memory = core.initial_memory(2, mem_len, config.zero_filled_memory)
    _, memory = core(segments[0], memory, training=False)
    expected, memory = core(segments[1], memory, training=False)
    cache = runtime.decode_init(runtime.step(segments[0])[1])
    log_probs, cache = runtime.decode_read(segments[1], cache)
    np.testing.assert_allclose(log_probs, expected.numpy()[:, -1], atol=TOL)
    np.testing.assert_allclose(runtime.cache_memory(cache).numpy()[0], memory.mems.numpy(),
                               atol=TOL)


def test_a_batch_major_graph_of_one_layer_without_memory_loads_and_matches(tmp_path):
    """memory_layout="batch_major", n_layer=1, mem_len=0: tf2onnx wrote the
    layer/batch transpose as a reshape to [-1, 1, 0, d], which ONNX Runtime
    refused to load."""
    import onnxruntime as ort
    core = random_core(seed=5, n_layer=1)
    export_onnx(core, str(tmp_path / "model.onnx"), 0, memory_layout="batch_major")
    session = ort.InferenceSession(str(tmp_path / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    ids = random_segments(256, 2, 3, n_segments=1, seed=6)[0]
    log_probs, new_mems, new_mask = session.run(None, {
        "token_ids": ids, "mems": np.zeros([2, 1, 0, 32], np.float32),
        "mem_mask": np.zeros([2, 0], bool)})
    expected, _ = core(ids, core.initial_memory(2, 0), training=False)
    np.testing.assert_allclose(log_probs, expected.numpy(), atol=TOL)
    assert new_mems.shape == (2, 1, 0, 32) and new_mask.shape == (2, 0)
