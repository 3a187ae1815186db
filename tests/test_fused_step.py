"""The fused-step benchmark's logic (`benchmarks/fused_step.py`) on a tiny
exported `decode_token` on the CPU provider: every form's rewrite of the
whole step keeps the exported step's log-probs, rings, memory and flags
over steps with the ring moving on and rows stopped; the slots a form adds
are hidden (and would change the answer if shown); DMMHA's CUDA rewrite
writes its keys in the kernel's chunks; a graph of another shape is one
clear error; the rows, table and summary say what the GPU check needs.
No timing is asserted."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from benchmarks import attention_nodes as forms
from benchmarks import fused_step as bench
from benchmarks.inference import export_step
from txl_tf import TransformerXLConfig

CONFIG = TransformerXLConfig.preset("tiny", n_token=50, mem_len=8, n_layer=2, n_head=2,
                                    d_head=8, d_model=16, d_inner=32)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """`{dtype: folder}`: the tiny model's decode_token in float32 and float16."""
    root = tmp_path_factory.mktemp("fused_step")
    folders = {}
    for dtype in forms.DTYPES:
        folder = root / dtype
        export_step(CONFIG, CONFIG.mem_len, str(folder), decode_dtype=dtype,
                    interface="decode_token")
        (folder / "config.json").write_text(json.dumps(CONFIG.to_dict()))
        folders[dtype] = str(folder)
    return folders


def _ops(model):
    ops = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return ops


def test_every_form_keeps_the_exported_steps_numbers_in_float32(exports):
    rows, bandwidth = bench.run([exports["float32"]], forms.FORMS, [1, 3], "cpu", steps=4,
                                iters=2, copy_mib=1)
    assert bandwidth > 0 and len(rows) == 2 * len(forms.FORMS)
    fused = {"mha": "MultiHeadAttention", "mha_pad": "MultiHeadAttention",
             "attention23": "Attention", "attention23_pad": "Attention",
             "attention24_pad": "Attention", "dmmha": "DecoderMaskedMultiHeadAttention",
             "dmmha_inflight": "DecoderMaskedMultiHeadAttention", "gqa": "GroupQueryAttention"}
    for row in rows:
        assert "error" not in row, row
        assert row["max_abs_log_probs"] <= 1e-5 and row["max_abs_rings"] <= 1e-5, row
        assert row["max_abs_memory"] <= 1e-5 and row["flags_equal"] and row["parity_ok"], row
        assert row["ratio_to_today"] > 0 and row["x_bound"] == pytest.approx(
            row["ms"] / row["bound_ms"])
        # the batch axis kept through the form's reshapes: ONNX Runtime still fuses each
        # residual Add into the layer norm after the attention (with -1 it did not for the
        # com.microsoft ops: two more nodes a layer)
        assert row["nodes"]["SkipLayerNormalization"] == 2 * CONFIG.n_layer, row
        if row["form"] == "today":
            assert row["nodes"]["Softmax"] == CONFIG.n_layer and row["max_abs_log_probs"] == 0
        else:
            assert row["nodes"][fused[row["form"]]] == CONFIG.n_layer, row["nodes"]
            assert "Softmax" not in row["nodes"], row["nodes"]
    assert rows[0]["bound_ms"] < rows[1]["bound_ms"]  # batch 3 reads more rings
    assert all(row["form_seconds"] > 0 for row in rows)  # (the GPU check budgets from them)
    json.dumps(rows)
    text = bench.table(rows)
    assert "attention24_pad float32 b3" in text and "vs exported: log-probs" in text


def test_the_rewrite_replaces_each_layers_attention_and_nothing_else(exports):
    model, info = bench.load_step(exports["float32"])
    before = _ops(model)
    for form in ("attention24_pad", "dmmha", "mha_pad"):
        rewritten = bench.rewrite(model, form)
        onnx.checker.check_model(rewritten)  # nodes in order, names defined once
        after = _ops(rewritten)
        layers = CONFIG.n_layer
        # the rings' writes go (2 a layer); valid's and the memory's ScatterElements stay
        rings = 2 * layers if forms.scatter_writes(form) else 0
        assert after.get("ScatterElements", 0) == before["ScatterElements"] - rings, form
        assert after.get("Softmax", 0) == 0 and after["LogSoftmax"] == 1, form
        assert after["MatMul"] == before["MatMul"] - 2 * layers, form
        assert after.get("TensorScatter", 0) == rings, form
        # the mask's slots padded (hidden), and the position table's (zero), once for all
        pads = after.get("Pad", 0)
        assert pads == (2 if form.endswith("_pad") or form in forms.SCRATCH else 0), form
    assert bench.rewrite(model, "today") == model  # the graph as exported


@pytest.mark.parametrize("form", ["mha_pad", "dmmha", "gqa"])
def test_the_slots_a_form_adds_are_hidden_and_would_change_the_answer(exports, form,
                                                                      monkeypatch):
    """The padded or scratch slots hold large keys and values here: hidden
    they change nothing; with a hidden value of 0 they would be seen."""
    model, info = bench.load_step(exports["float32"])
    case = bench.make_case(info, 2, 2, seed=1)
    base = bench.open_session(model.SerializeToString(), "cpu")
    reference = bench.steps_of(base, case["state"], case, "cpu", info["n_token"])
    for hidden, agrees in ((forms.HIDDEN["float32"], True), (0.0, False)):
        monkeypatch.setitem(forms.HIDDEN, "float32", hidden)
        session = bench.open_session(bench.rewrite(model, form).SerializeToString(), "cpu")
        state = bench.form_state(form, case["state"], info, "cpu")
        for i in range(info["n_layer"]):
            for ring in (f"keys_{i}", f"values_{i}"):
                state[ring][:, :, info["slots"]:] = 30.0
        got = bench.steps_of(session, state, case, "cpu", info["n_token"])
        found = bench.differences(form, reference, got, info)
        assert (found["max_abs_log_probs"] <= 1e-5) == agrees, (form, hidden, found)


def test_float16_forms_keep_the_float16_step_within_its_tolerance(exports):
    rows, _ = bench.run([exports["float16"]], ["today", "attention24_pad", "dmmha"], [2],
                        "cpu", steps=3, iters=2, copy_mib=1)
    for row in rows:
        assert row["dtype"] == "float16" and "error" not in row, row
        assert row["max_abs_log_probs"] <= bench.TOLERANCE["float16"] and row["parity_ok"], row
    model, _ = bench.load_step(exports["float16"])
    rewritten = bench.rewrite(model, "attention24_pad")
    # the float32 mask, clipped into float16's range and cast once for every layer
    assert _ops(rewritten)["Clip"] == 1
    clip = next(n for n in rewritten.graph.node if n.op_type == "Clip")
    low = next(t for t in rewritten.graph.initializer if t.name == clip.input[1])
    assert onnx.numpy_helper.to_array(low) == np.float32(forms.HIDDEN["float16"])


def test_dmmha_on_cuda_writes_its_keys_in_the_kernels_chunks(exports):
    """The CUDA rewrite's key rings are `[B, H, d / x, S + 1, x]`; one step
    of it (here on the CPU provider, unbound: its attention reads the chunks
    as BNSH, its write is the point) writes the token where the exported
    step writes it."""
    model, info = bench.load_step(exports["float32"])
    rewritten = bench.rewrite(model, "dmmha", device="cuda")
    x = forms.chunk("float32")
    dims = [d.dim_value or d.dim_param for d in
            next(i for i in rewritten.graph.input if i.name == "keys_0").type.tensor_type
            .shape.dim]
    assert dims == ["batch", 2, 8 // x, info["slots"] + 1, x]
    case = bench.make_case(info, 2, 1)
    feeds = {"token_ids": case["ids"][0], "stopped": case["stopped"][0],
             **bench.form_state("dmmha", case["state"], info, "cuda")}
    names = [f"new_keys_{i}" for i in range(info["n_layer"])]
    got = ort.InferenceSession(rewritten.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(names, feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=[
        "CPUExecutionProvider"]).run(names[:1], {"token_ids": case["ids"][0],
                                                  "stopped": case["stopped"][0],
                                                  **case["state"]})[0]
    keys, _ = bench.exported_rings("dmmha", got[0], feeds["values_0"], info["slots"])
    np.testing.assert_allclose(keys, want, atol=1e-6)  # layer 0: the same inputs


def test_a_graph_of_another_shape_is_refused_with_one_error(exports):
    model, _ = bench.load_step(exports["float32"])
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    node = next(n for n in changed.graph.node if n.output == softmax.output)
    node.op_type = "Sigmoid"
    del node.attribute[:]
    with pytest.raises(bench.FusedStepError, match="layer 0's scores go through a Sigmoid"):
        bench.rewrite(changed, "mha")
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    renamed.graph.input[-1].name = "values_x"
    with pytest.raises(bench.FusedStepError, match="are not a decode_token's"):
        bench.rewrite(renamed, "mha")
    with pytest.raises(bench.FusedStepError, match="unknown form 'flash'"):
        bench.rewrite(model, "flash")


def test_the_command_line_writes_its_json_and_refuses_a_skeleton(jobs, exports, tmp_path):
    import shutil

    from benchmarks.long_memory import MARK
    output = tmp_path / "fused.json"
    done = jobs.run("benchmarks.fused_step",
                    [f"--exports={exports['float32']}", "--forms=today,mha", "--batch_sizes=1",
                     "--steps=2", "--iters=2", "--copy_mib=1", f"--output={output}"])
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(output.read_text())
    assert [r["form"] for r in result["rows"]] == ["today", "mha"]
    last = done.stdout.strip().splitlines()[-1]
    assert last == result["summary"] and last.startswith("fused step on cpu"), last
    assert result["partial"] is False and result["copy_bytes_per_s"] > 0
    skeleton = tmp_path / "skeleton"  # a weight emptied as long_memory.strip marks it
    shutil.copytree(exports["float32"], skeleton)
    model = onnx.load(str(skeleton / "decode_token.onnx"))
    model.graph.initializer[0].doc_string = MARK
    onnx.save(model, str(skeleton / "decode_token.onnx"))
    broken = tmp_path / "broken"  # a file cut short in a copy
    shutil.copytree(exports["float32"], broken)
    (broken / "decode_token.onnx").write_bytes(b"\x08\x07\x12")
    for args, message in (([f"--exports={skeleton}"], "fill them first"),
                          ([f"--exports={broken}"], "is no ONNX model that loads: DecodeError"),
                          ([f"--exports={tmp_path}"], "has no decode_token.onnx"),
                          ([], "--exports must name at least one export folder")):
        bad = jobs.run("benchmarks.fused_step", args)
        last = bad.stderr.strip().splitlines()[-1]
        assert bad.returncode == 2 and last.startswith("error: ") and message in last, last


def test_the_summary_names_the_fastest_form_within_parity_and_the_targets():
    def row(form, batch, ms, x_bound, ok=True, ratio=1.0):
        return dict(form=form, dtype="float32", batch=batch, ms=ms, x_bound=x_bound,
                    parity_ok=ok, ratio_to_today=ratio)
    rows = [row("today", 1, 0.79, 11.6), row("dmmha", 1, 0.5, 7.0, ratio=0.63),
            row("mha", 1, 0.1, 1.0, ok=False), row("today", 16, 2.0, 4.2),
            row("attention24_pad", 16, 0.9, 1.9, ratio=0.45), dict(form="gqa", dtype="float32",
                                                                    batch=16, error="no")]
    assert bench.summary(rows, "cuda") == (
        "fused step on cuda (fastest form within parity): float32 b1: fastest dmmha 0.500 ms "
        "(0.63x today's 0.790 ms), meets <= 0.78 ms; float32 b16: fastest attention24_pad "
        "0.900 ms (0.45x today's 2.000 ms), 1.9x bound: meets <= 2x")


def swap_u_and_v(monkeypatch):
    """Plants a defect: every form reads the query with v (the relative
    term's: the output of the projection's Split after the query with u)
    for the query with u."""
    find = bench.find_layers

    def swapped(graph):
        layers = find(graph)
        producer = {out: node for node in graph.node for out in node.output}
        for layer in layers:
            split = producer[layer.q_u]
            assert split.op_type == "Split" and split.output[0] == layer.q_u
            layer.q_u = split.output[1]
        return layers
    monkeypatch.setattr(bench, "find_layers", swapped)


def test_a_defect_float16s_tolerance_cannot_see_is_caught_in_float32(exports, monkeypatch):
    """u and v swapped moves the float16 step less than its tolerance: the
    form counts in no dtype where its float32 rows miss parity. The forms
    run in turn in both exports (a run stopped at its budget has the first
    ones in both dtypes), each compared with its own export's `today`."""
    swap_u_and_v(monkeypatch)
    rows, _ = bench.run([exports["float32"], exports["float16"]], ["mha", "today"], [1], "cpu",
                        steps=3, iters=2, copy_mib=1)
    assert [(r["form"], r["dtype"]) for r in rows] == [
        ("today", "float32"), ("today", "float16"), ("mha", "float32"), ("mha", "float16")]
    by = {(r["form"], r["dtype"]): r for r in rows}
    for dtype in ("float32", "float16"):
        assert by["mha", dtype]["ratio_to_today"] == pytest.approx(
            by["mha", dtype]["ms"] / by["today", dtype]["ms"])
    assert not by["mha", "float32"]["parity_ok"] and by["mha", "float16"]["parity_ok"]
    for row in rows:
        row["ms"] = 1.0 if row["form"] == "today" else 0.5
    assert "float16 b1: fastest today 1.000 ms" in bench.summary(rows, "cpu")


def test_the_parity_is_that_of_the_session_that_is_timed(exports, monkeypatch):
    """A timed session computing something other than the one profiled
    (here: u and v swapped in it alone) misses parity."""
    model, _ = bench.load_step(exports["float32"])
    right = bench.rewrite(model, "mha").SerializeToString()
    with monkeypatch.context() as planted:
        swap_u_and_v(planted)
        wrong = bench.rewrite(model, "mha").SerializeToString()
    assert wrong != right
    open_session = bench.open_session

    def timed_wrong(model_bytes, device, cuda_graph=False, profile_dir=None):
        timed = model_bytes == right and profile_dir is None
        return open_session(wrong if timed else model_bytes, device, cuda_graph, profile_dir)
    monkeypatch.setattr(bench, "open_session", timed_wrong)
    rows, _ = bench.run([exports["float32"]], ["mha"], [1], "cpu", steps=2, iters=2, copy_mib=1)
    assert rows[0]["form"] == "mha" and rows[0]["parity_ok"] is False, rows[0]
