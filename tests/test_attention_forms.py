"""The attention-forms benchmark's logic (`benchmarks/attention_forms.py`)
at tiny size on the CPU provider: every form's one-layer graph is a valid
ONNX model, writes the token into the ring in place and equals the numpy
statement of the step's attention and today's form; the slots a form adds
(scratch, padding) matter and are hidden; the rows carry the bound and the
ratio. No timing is asserted."""
import json
import os

import numpy as np
import pytest

from benchmarks import attention_forms as bench


@pytest.mark.parametrize("batch", [1, 3])
def test_every_form_equals_the_numpy_statement_in_float32(batch):
    case = bench.make_case("tiny", batch, seed=batch)
    for form in bench.FORMS:
        row = bench.measure(form, "tiny", "float32", batch, "cpu", iters=2, case=case)
        assert "error" not in row, row
        assert row["max_abs_out"] <= 1e-5, row
        assert row["max_abs_rings"] == 0.0, row  # the token's key and value, in place


def test_rows_compare_each_form_with_today_and_with_the_bound():
    rows, bandwidth = bench.run(bench.FORMS, "tiny", ["float32"], [2], "cpu", iters=2,
                                copy_mib=1)
    assert bandwidth > 0 and [r["form"] for r in rows] == list(bench.FORMS)
    ops = {"today": "Softmax", "mha": "MultiHeadAttention", "mha_pad": "MultiHeadAttention",
           "dmmha_inflight": "DecoderMaskedMultiHeadAttention",
           "attention23": "Attention", "attention23_pad": "Attention",
           "attention24_pad": "Attention",
           "dmmha": "DecoderMaskedMultiHeadAttention", "gqa": "GroupQueryAttention"}
    for row in rows:
        assert row["max_abs_vs_today"] <= 1e-5, row
        assert row["ratio_to_today"] > 0 and "out" not in row
        assert row["bound_ms"] == pytest.approx(1e3 * bench.ring_bytes("tiny", 2, "float32")
                                                / bandwidth)
        assert row["x_bound"] == pytest.approx(row["ms"] / row["bound_ms"])
        assert row["nodes"].get(ops[row["form"]]) == 1, row["nodes"]
        assert "Softmax" not in row["nodes"] or row["form"] == "today"
    json.dumps(rows)
    assert "today" in bench.table(rows) and "x bound" in bench.table(rows)


@pytest.mark.parametrize("form", ["dmmha", "gqa", "attention23_pad", "attention24_pad"])
def test_the_slots_a_form_adds_are_hidden_and_would_change_the_answer(form):
    import onnxruntime as ort
    case = bench.make_case("tiny", 2)
    assert bench.slots_of(form, 17) > 17
    model = bench.build_form(form, "tiny", "float32", case["r_kernel"])
    want = bench.reference(case)["out"]
    for shown, agrees in ((False, True), (True, False)):
        feeds = bench.ring_layout(form, case, "float32")
        assert not feeds["visible"][:, 17:].any()
        feeds["visible"][:, 17:] = shown
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        out = session.run(["out"], feeds)[0]
        assert (np.abs(out - want).max() <= 1e-5) == agrees, (form, shown)


def test_layouts_round_trip_to_the_ring():
    case = bench.make_case("tiny", 2)
    assert [bench.slots_of(f, 17) for f in ("today", "mha", "mha_pad", "dmmha", "gqa")] \
        == [17, 17, 24, 18, 18]
    for form in bench.FORMS:
        feeds = bench.ring_layout(form, case, "float32")
        slots = bench.slots_of(form, 17)
        want_keys = (2, 2, 16, slots) if form == "today" else (2, 2, slots, 16)
        assert feeds["keys"].shape == want_keys and feeds["values"].shape == (2, 2, slots, 16)
        keys, values = bench.bnsh_rings(form, {"keys_out": feeds["keys"],
                                               "values_out": feeds["values"]}, 17)
        np.testing.assert_array_equal(keys, case["keys"])
        np.testing.assert_array_equal(values, case["values"])
    with pytest.raises(ValueError, match="unknown form 'flash'"):
        bench.build_form("flash", "tiny")


def test_a_16_bit_row_runs_or_names_its_error():
    row = bench.measure("attention23", "tiny", "float16", 1, "cpu", iters=2)
    assert ("error" in row) != ("max_abs_out" in row), row
    if "max_abs_out" in row:
        assert row["max_abs_out"] < 1e-2, row


def test_captured_keeps_the_lines_that_name_a_kernel():
    with bench.Captured() as captured:
        os.write(1, b"ONNX Attention: using Memory Efficient Attention\nnoise\n")
        os.write(2, b"Operator=MultiHeadAttention Node=x Unfused=1\n")
        os.write(1, b"ONNX Attention: using Memory Efficient Attention\n")
    assert captured.lines == ["ONNX Attention: using Memory Efficient Attention",
                              "Operator=MultiHeadAttention Node=x Unfused=1"]


def test_the_command_line_writes_its_json(jobs, tmp_path):
    output = tmp_path / "forms.json"
    done = jobs.run("benchmarks.attention_forms",
                    ["--forms=today,mha", "--batch_sizes=1", "--iters=2", "--copy_mib=1",
                     f"--output={output}"])
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(output.read_text())
    assert [r["form"] for r in result["rows"]] == ["today", "mha"]
    assert result["device"] == "cpu" and result["copy_bytes_per_s"] > 0
    last = done.stdout.strip().splitlines()[-1]  # the GPU check's row
    assert last.startswith("attention forms, ms a call") and "float32 b1: today" in last, last
    for flag, message in (("--batch_sizes=0", "error: --batch_sizes must be"),
                          ("--sdpa_kernel=-1", "error: --sdpa_kernel must be a bit mask")):
        bad = jobs.run("benchmarks.attention_forms", [flag])
        assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
            message), bad.stderr[-500:]


def test_a_diagnosed_run_keeps_the_log_and_gives_the_output_back(capfd):
    row = bench.measure("attention23", "tiny", "float32", 1, "cpu", iters=2, diagnose=True)
    assert isinstance(row["kernel_log"], list) and row["max_abs_out"] <= 1e-5, row
    print("still printed")
    assert "still printed" in capfd.readouterr().out


def test_node_counts_per_run_and_the_ops_left_to_the_cpu():
    def node(op, ts, provider):
        return {"cat": "Node", "name": f"n{ts}_kernel_time", "ts": ts,
                "args": {"op_name": op, "provider": provider}}
    events = [{"name": "model_run", "ts": 0}, node("MatMul", 1, "CUDAExecutionProvider"),
              {"name": "model_run", "ts": 10}, node("MatMul", 11, "CUDAExecutionProvider"),
              node("Reshape", 12, "CUDAExecutionProvider"),
              node("GroupQueryAttention", 13, "CPUExecutionProvider"),
              {"name": "model_run", "ts": 20}, node("MatMul", 21, "CUDAExecutionProvider"),
              node("GroupQueryAttention", 23, "CPUExecutionProvider")]
    assert bench.node_counts(events, 2) == ({"GroupQueryAttention": 1, "MatMul": 1},
                                            ["GroupQueryAttention"])
    with pytest.raises(bench.BenchmarkError, match="holds 3 runs, not 4"):
        bench.node_counts(events, 4)


def test_dmmha_on_cuda_keeps_its_keys_in_the_kernels_chunks():
    """The CUDA decoder kernel writes key element (b, h, s, i) of a buffer of
    S slots at ((b * H + h) * S * d) + (i // x) * S * x + s * x + i % x
    (x = 16 bytes of elements): the feeds are laid out so, the graph is valid,
    and the rings read back to BNSH; on the CPU and for other forms, BNSH."""
    case = bench.make_case("tiny", 2)
    assert not bench.chunked_keys("dmmha", "cpu") and not bench.chunked_keys("gqa", "cuda")
    for dtype in ("float32", "float16"):
        x = bench.chunk(dtype)
        assert x == {"float32": 4, "float16": 8}[dtype]
        feeds = bench.ring_layout("dmmha", case, dtype, device="cuda")
        b, h, chunks, slots, _ = feeds["keys"].shape
        assert (chunks, slots) == (16 // x, 18)
        flat = feeds["keys"].reshape(-1)
        for bi, hi, si, i in [(1, 1, 5, 13), (0, 1, 16, 3), (1, 0, 0, 15)]:
            at = (bi * h + hi) * slots * 16 + (i // x) * slots * x + si * x + i % x
            assert flat[at] == case["keys"][bi, hi, si, i].astype(dtype)
        keys, _ = bench.bnsh_rings("dmmha", {"keys_out": feeds["keys"],
                                            "values_out": feeds["values"]}, 17)
        np.testing.assert_array_equal(keys, case["keys"].astype(dtype))
        model = bench.build_form("dmmha", "tiny", dtype, case["r_kernel"], device="cuda")
        names = [i.name for i in model.graph.input]
        assert set(names) == set(feeds), (names, sorted(feeds))
        if dtype == "float32":  # the graph's write into the chunks (run here without binding)
            import onnxruntime as ort
            session = ort.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
            written = session.run(["keys_out"], feeds)[0]
            keys, _ = bench.bnsh_rings("dmmha", {"keys_out": written,
                                                "values_out": feeds["values"]}, 17)
            np.testing.assert_array_equal(keys, bench.reference(case)["keys"].astype(dtype))


def test_the_inflight_form_sets_the_kernels_switch_only_while_it_runs(monkeypatch):
    seen = []
    monkeypatch.setattr(bench, "_measure",
                        lambda *args: seen.append(os.environ.get(bench.INFLIGHT)) or {})
    monkeypatch.delenv(bench.INFLIGHT, raising=False)
    bench.measure("dmmha_inflight", "tiny", "float32", 1, "cpu", 1)
    bench.measure("dmmha", "tiny", "float32", 1, "cpu", 1)
    assert seen == ["1", None] and bench.INFLIGHT not in os.environ


def test_the_summary_names_the_fastest_form_against_today_per_dtype_and_batch():
    rows = [dict(form="today", dtype="float32", batch=1, x_bound=12.0),
            dict(form="mha", dtype="float32", batch=1, x_bound=10.0, ratio_to_today=0.9),
            dict(form="dmmha", dtype="float32", batch=1, x_bound=4.0, ratio_to_today=0.3),
            dict(form="gqa", dtype="float32", batch=1, error="not registered"),
            dict(form="today", dtype="float16", batch=1, error="no kernel"),
            dict(form="mha", dtype="float16", batch=1, x_bound=5.0)]
    line = bench.summary(rows)
    assert line.endswith("float32 b1: today 12.0x bound, fastest dmmha 0.30x today "
                         "(4.0x bound); float16 b1: today's form failed"), line
