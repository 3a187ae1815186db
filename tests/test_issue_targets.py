"""Issues 52's and 53's targets judged from a GPU check's JSON
(`benchmarks/issue_targets.py`): hand-written check documents (every target
met, short, a part failed or skipped, a check stopped early, a field
missing, a CPU or --tiny run), the JSON of a real `--device=cpu --tiny` run
(`fixtures/gpu_check_tiny_cpu.json`), and the command's one `error:` line."""
import copy
import json
import math
import re

import pytest

from benchmarks import gpu_check as gc
from benchmarks import issue_targets as it

FIXTURE = __import__("pathlib").Path(__file__).parent / "fixtures" / "gpu_check_tiny_cpu.json"


def _pair(shape, ours, papers):
    """A pair part's JSON: `ours` and `papers` `{precision: tok/s}`."""
    results = []
    for precision, speed in ours.items():
        results.append({"shape": shape, "variant": f"paper {precision}",
                        "tokens_per_s": papers[precision], "ratio": 1.0})
        results.append({"shape": shape, "variant": f"{precision}+jit", "tokens_per_s": speed,
                        "ratio": speed / papers[precision], "peak_gib": 20.04,
                        "first_step_s": 30.0})
    return {"results": results, "environment": {"gpus": ["/device:GPU:0"]}}


def _evaluation(bound, score, step, paper, tf32=1.25):
    """The evaluation part's JSON; the TF32 rows `tf32` times as fast, 2e-3
    off the float32 bound's NLLs (None: no TF32 rows)."""
    rows = []
    for batch in (1, 16):
        for path, speed in (("bound", bound), ("score", score), ("step", step)):
            rows.append({"preset": "enwik8_base", "batch": batch, "path": path,
                         "tokens_per_s": speed * batch, "over_bound": speed / bound})
        rows.append({"preset": "enwik8_base", "batch": batch, "path": "paper",
                     "tokens_per_s": paper * batch})
    for batch in (1, 16) if tf32 else ():  # after the others: their indices stay
        for path, speed in (("bound_tf32", bound), ("score_tf32", score)):
            rows.append({"preset": "enwik8_base", "batch": batch, "path": path,
                         "tokens_per_s": speed * batch * tf32, "over_bound": speed * tf32 / bound,
                         "nll_max_abs_diff": 2e-3 if path == "score_tf32" else 1e-3})
    return {"device": "cuda", "rows": rows}


def _speed(ms_b1, over_b16, table_over_own, dtype="float32"):
    base = {"preset": "enwik8_base", "mem_len": 2100, "backend": "onnx", "device": "cuda"}
    rows = [dict(base, batch=1, per_token_ms=ms_b1, over_bound=ms_b1 / 0.068),
            dict(base, batch=16, per_token_ms=0.46 * over_b16, bound_ms=0.46,
                 over_bound=over_b16, table_ms=0.46 * over_b16 * table_over_own,
                 table_over_own=table_over_own)]
    for row in rows:
        step = row["per_token_ms"]
        row["token_parts"] = {"step_graph": 0.8 * step, "read": 0.85 * step,
                              "write": 0.1 * step, "token": step, "host": 0.1 * step}
        if dtype != "float32":
            row.update(decode_dtype=dtype, over_own_bound=2 * row["over_bound"])
    # the same export stepped as before decode_token: a third slower
    rows += [dict(r, backend="onnx_step_write", per_token_ms=1.3 * r["per_token_ms"],
                  token_parts={k: 1.3 * v for k, v in r["token_parts"].items()}) for r in rows]
    return {"rows": rows}


def _parity(worst):
    return {"rows": [{"max_diff_device_cache": worst, "max_diff_no_graph": worst / 2,
                      "max_diff_host_cache": worst / 3}]}


def _precision(device="cuda"):
    """The serving_precision part's JSON (`long_memory --part=cache_precision
    --nokeras_rows`): the three exports' rows."""
    rows = [{"precision": "export, float32 cache", "ppl": 5.0507, "max_abs_log_prob_change": 0.0},
            {"precision": "export, float16 cache", "ppl": 5.0508,
             "max_abs_log_prob_change": 2.1e-3},
            {"precision": "export, float16 decode", "ppl": 5.0511,
             "max_abs_log_prob_change": 9.7e-3}]
    return {"settings": {"device": device}, "tokens": 1200, "rows": rows}


def _settings(**first_steps):
    """The compile_flags part's JSON (`gpu_check.run_settings`): `{setting:
    (first step's seconds, tok/s)}`."""
    return {"settings": {name: {"env": {"XLA_FLAGS": f"--{name}"}, "status": "ok",
                                "first_step_s": first, "tokens_per_s": speed,
                                "json": {"environment": {"gpus": ["/device:GPU:0"]}}}
                         for name, (first, speed) in first_steps.items()}}


def _row(part, status="ok", result="fine", **extra):
    return {"part": part, "status": status, "seconds": 1.0, "result": result, **extra}


def met_check():
    """A whole GPU check in which every judged target is met."""
    parts = [
        _row("gpu"),
        _row("compile_flags", json=_settings(triton_gemm_off=(21.4, 190000.0),
                                             autotune_level_0=(12.25, 150000.0))),
        _row("parity", details={"max_abs_diff": 3e-6, "ok": True}),
        _row("losses", details={"max_abs_diff_per_window": [2e-6, 1e-5, 4e-5], "window": 10,
                                "checked": [5.6, 5.1, 4.2], "ok": True}),
        _row("mirrored", details={"max_abs_loss_diff": 0.0, "max_abs_weight_diff": 2e-7}),
        _row("pair_enwik8_base", json=_pair("enwik8_base", {"f32": 81000.0, "bf16": 82914.0,
                                                            "f16": 70000.0},
                                            {"f32": 38762.0, "bf16": 41457.0, "f16": 40000.0})),
        _row("pair_wt103_base", json=_pair("wt103_base", {"f32": 60000.0, "bf16": 70000.0,
                                                          "f16": 65000.0},
                                           {"f32": 50000.0, "bf16": 52000.0, "f16": 51000.0})),
        _row("train", result="killed with its batch log at step 23, resumed at step 20 ...",
             details={"first_step_compile_s": 31.5, "resume_compile_s": 4.2}),
        _row("serving_long_memory", json=_speed(0.78, 1.9, 1.1)),
        _row("serving_evaluation", json=_evaluation(70000.0, 66500.0, 65100.0, 31716.0)),
        _row("serving_soak", json={"settings": {"soak_sessions": 32, "device": "cuda"},
                                   "differing_sessions": []}),
        _row("serving_device_tests"),
        _row("serving_parity", json=_parity(1e-5)),
        _row("serving_profile"),
        _row("serving_float16", json=_speed(0.3, 1.2, 1.0, "float16")),
        _row("serving_parity_float16", json=_parity(2e-3)),
        _row("serving_precision", json=_precision()),
    ]
    return {"seconds": 470.0, "device": "gpu", "tiny": False, "partial": False, "failed": [],
            "parts": parts}


def by_target(check):
    return {r["target"]: r for r in it.judge(check)}


def part(check, name):
    return next(r for r in check["parts"] if r["part"] == name)


TF32 = "enwik8_base TF32 pair: this library (f32+jit) >= 2x the paper's code (TF32)"
BF16 = ("enwik8_base bf16 pair: this library (bf16+jit) >= 2x the paper's code (bf16 "
        "autocast)")
TABLE = "SessionTable step of 16 sessions <= 1.2x the batch step of the same rows"
DECODE_B1 = "decode step, batch 1 (float32): <= 0.78 ms a token"
EVAL_B16 = ("evaluation, batch 16: the runtime API (memory on the device) >= 0.9x the graph "
            "with bound buffers")
COMPILE = "enwik8_base f32+jit: the first training step (XLA's compile) <= 30 s"
FLAGS = ("enwik8_base bf16+jit's first step and tok/s with each compile setting (XLA_FLAGS: "
         "Triton's GEMMs off, autotuning off, LLVM on every core)")
RESUME = ("txl-train: 40 steps, a checkpoint, a kill and a resume to the same step and data, "
          "exit 0")


def test_each_judged_target_names_its_issue_and_one_threshold():
    limits = {t.limit for t in it.TARGETS} - {None, "passes"}
    assert limits == set(it.THRESHOLDS)  # no threshold without its target, and back
    for target in it.TARGETS:
        if target.limit in it.THRESHOLDS:
            assert target.issue == it.THRESHOLDS[target.limit][0], target.asks
    assert len({t.asks for t in it.TARGETS}) == len(it.TARGETS)
    assert {t.part for t in it.TARGETS} <= set(gc.CHECKS)  # parts the check runs


def test_every_target_met_at_its_bounds():
    rows = it.judge(met_check())
    assert {r["verdict"] for r in rows} == {"met", "shown"}
    assert sum(r["verdict"] == "met" for r in rows) == sum(
        t.limit is not None for t in it.TARGETS)
    got = by_target(met_check())
    assert got[TF32]["measured"] == "2.09x (f32+jit 81,000 / paper f32 38,762 tok/s)"
    assert got[TF32]["from"] == ("pair_enwik8_base: json.results['f32+jit'].tokens_per_s / "
                                 "['paper f32'].tokens_per_s")
    assert got[TF32]["threshold"] == ">= 2" and got[TF32]["issue"] == 52
    assert got[BF16]["value"] == pytest.approx(2.0)  # 82,914 / 41,457: met at the bound
    assert got[DECODE_B1]["value"] == 0.78 and got[DECODE_B1]["verdict"] == "met"
    assert got[TABLE]["measured"].startswith("1.10x the batch step (16 sessions")
    compile_row = got["txl-train: the first step's compile seconds"]
    assert (compile_row["verdict"], compile_row["measured"]) == (
        "shown", "31.5 s (the resume's 4.2 s)")
    assert got["wt103_base pair, bf16+jit"]["measured"] == ("70,000 tok/s (1.35x paper bf16), "
                                                             "peak 20.0 GiB")
    table = it.table(it.judge(met_check())).splitlines()
    assert table[0].split(" | ")[:3] == ["issue", "target".ljust(len(table[2].split(" | ")[1])),
                                         "verdict"]
    assert len(table) == 2 + len(it.TARGETS) + 1
    shown = sum(t.limit is None for t in it.TARGETS)
    assert table[-1] == f"targets: {len(rows) - shown} met, {shown} shown"


def test_the_float16_exports_perplexity_is_shown_from_the_gpu_only():
    """issue 53's 16-bit option on a trained model: the float16 decode's
    perplexity beside float32's, shown; taken on the CPU provider (whose
    float16 decode computes in float32) it is not the GPU's figure."""
    asks = ("the float16 export option on a trained model (pystdlib_small): perplexity beside "
            "float32's, on the GPU's kernels")
    got = by_target(met_check())[asks]
    assert (got["verdict"], got["issue"], got["measured"]) == (
        "shown", 53, "ppl 5.0511 in float16, 5.0507 in float32 (largest log-prob change 9.7e-03; "
                     "1,200 tokens)")
    assert got["from"] == "serving_precision: json.rows[export, float16 decode].ppl"
    check = met_check()
    part(check, "serving_precision")["json"] = _precision("cpu")
    assert by_target(check)[asks]["why"] == "taken on cpu, not on the GPU"
    part(check, "serving_precision")["json"]["rows"].pop()
    assert by_target(check)[asks]["why"] == "no row 'export, float16 decode' in its JSON"


def test_evaluation_with_tf32_matmuls_against_the_papers_code_states_its_parity():
    """The TF32 rows (`--tf32_rows`) judged against 2x the paper's code on
    their own, their NLLs' difference to the float32 bound in the text; an
    evaluation without them is not measured there and nothing else moves."""
    tf32_b1 = ("evaluation, batch 1, TF32 matmuls: the API and the bound graph >= 2x the "
               "paper's code (its parity stated)")
    got = by_target(met_check())
    assert got[tf32_b1]["verdict"] == "met"
    assert got[tf32_b1]["value"] == pytest.approx(66500.0 * 1.25 / 31716.0)
    assert got[tf32_b1]["measured"] == (
        "2.62x the paper's 31,716 tok/s (bound_tf32 87,500, score_tf32 83,125; NLLs 2.0e-03 "
        "off the float32 bound's)")
    check = met_check()
    part(check, "serving_evaluation")["json"] = _evaluation(70000.0, 66500.0, 65100.0,
                                                             31716.0, tf32=None)
    without = by_target(check)
    assert without[tf32_b1]["verdict"] == "not measured", without[tf32_b1]
    assert "bound_tf32" in without[tf32_b1]["why"], without[tf32_b1]
    assert {k: v for k, v in without.items() if "TF32 matmuls" not in k} == {
        k: v for k, v in got.items() if "TF32 matmuls" not in k}


@pytest.mark.parametrize("value,why", [
    (None, "no json.rows[batch 1, score_tf32].nll_max_abs_diff"),
    ("2e-3", "json.rows[batch 1, score_tf32].nll_max_abs_diff is not a number: '2e-3'"),
    (float("nan"), "json.rows[batch 1, score_tf32].nll_max_abs_diff is nan, not a difference")])
def test_tf32_rows_without_their_nll_difference_are_not_measured(value, why):
    """The TF32 target states its parity: a TF32 row without a numeric,
    finite NLL difference is not measured and says which (the target was
    met with the other row's difference, or none, in its text)."""
    tf32_b1 = ("evaluation, batch 1, TF32 matmuls: the API and the bound graph >= 2x the "
               "paper's code (its parity stated)")
    check = met_check()
    rows = part(check, "serving_evaluation")["json"]["rows"]
    row = next(r for r in rows if r["path"] == "score_tf32" and r["batch"] == 1)
    if value is None:
        del row["nll_max_abs_diff"]
    else:
        row["nll_max_abs_diff"] = value
    got = by_target(check)[tf32_b1]
    assert (got["verdict"], got["why"]) == ("not measured", why), got


def test_the_first_steps_compile_and_the_flags_that_may_shorten_it():
    """The pair's f32+jit first step against its 30 s (also from a pair
    stopped after it); the compile_flags part's settings shown, the fewest
    seconds its value; a setting stopped before its first step says so."""
    got = by_target(met_check())
    assert (got[COMPILE]["verdict"], got[COMPILE]["measured"], got[COMPILE]["from"]) == (
        "met", "30.0 s, the first step of f32+jit",
        "pair_enwik8_base: json.results['f32+jit'].first_step_s")
    assert (got[FLAGS]["verdict"], got[FLAGS]["value"], got[FLAGS]["measured"]) == (
        "shown", 12.25, "triton_gemm_off 1st 21.4 s, 190,000 tok/s; autotune_level_0 1st "
                        "12.2 s, 150,000 tok/s")
    check = met_check()
    pair = part(check, "pair_enwik8_base")
    pair.update(status="failed", result="failed (timed out after 95 s; so far: ...)")
    pair["json"]["results"] = pair["json"]["results"][:1]  # paper f32 done, f32+jit started
    pair["json"]["started"] = [{"variant": "f32+jit", "first_step_s": 60.7}]
    flags = part(check, "compile_flags")
    flags.update(status="failed", result="failed (autotune_level_0: timed out after 50 s)")
    flags["json"]["settings"]["autotune_level_0"].update(
        status="failed", first_step_s=None, tokens_per_s=None)
    flags["json"]["settings"]["triton_gemm_off"]["tokens_per_s"] = None
    got = by_target(check)
    assert (got[COMPILE]["verdict"], got[COMPILE]["measured"]) == (
        "short", "60.7 s, the first step of f32+jit (stopped after it)")
    assert (got[FLAGS]["verdict"], got[FLAGS]["measured"], got[FLAGS]["why"]) == (
        "shown", "triton_gemm_off 1st 21.4 s (stopped after it); autotune_level_0 no first "
                 "step (failed)", "compile_flags failed (autotune_level_0: timed out after 50 s)")
    pair["json"]["started"][0]["first_step_s"] = None
    flags["json"]["settings"]["triton_gemm_off"]["first_step_s"] = None
    got = by_target(check)
    assert (got[COMPILE]["verdict"], got[COMPILE]["why"]) == (
        "not measured", "pair_enwik8_base failed (timed out after 95 s; so far: ...): no "
                        "json.started['f32+jit'].first_step_s")
    assert got[FLAGS]["why"] == (
        "compile_flags failed (autotune_level_0: timed out after 50 s): no setting's first "
        "step done: triton_gemm_off no first step (ok); autotune_level_0 no first step (failed)")
    flags["json"]["settings"]["triton_gemm_off"].update(first_step_s=3.0, json={
        "environment": {"gpus": []}})
    assert by_target(check)[FLAGS]["why"] == "taken on cpu, not on the GPU"


def test_a_figure_past_its_threshold_is_short():
    check = met_check()
    part(check, "pair_enwik8_base")["json"]["results"][1]["tokens_per_s"] = 77000.0  # 1.99x
    part(check, "serving_long_memory")["json"]["rows"][0]["per_token_ms"] = 0.781
    part(check, "serving_long_memory")["json"]["rows"][1]["table_over_own"] = 1.21
    part(check, "serving_evaluation")["json"]["rows"][5]["over_bound"] = 0.89  # b16 score
    part(check, "parity")["details"]["max_abs_diff"] = 1.1e-4
    part(check, "losses")["details"]["checked"][2] = math.nan  # a diverged run
    part(check, "serving_soak")["json"]["differing_sessions"] = [7]
    got = by_target(check)
    short = {t for t, r in got.items() if r["verdict"] == "short"}
    assert short == {TF32, DECODE_B1, TABLE, EVAL_B16,
                     "GPU vs CPU log-probs (enwik8_base, TF32 off) <= 1e-4",
                     "seeded losses GPU vs CPU: first 10 steps <= 1e-4 (the check's bound)",
                     "a short soak on the GPU: every session gets what it gets alone"}
    assert got[EVAL_B16]["measured"] == "0.89x the bound graph (score 0.89x, step 0.93x)"
    assert got["a short soak on the GPU: every session gets what it gets alone"][
        "measured"] == "1 of 32 sessions differ from the session run alone"


def test_a_failed_part_is_judged_only_where_its_figures_hold():
    check = met_check()
    pair = part(check, "pair_enwik8_base")
    pair.update(status="failed", result="failed (timed out after 90 s; so far: ...)")
    pair["json"]["results"][2]["error"] = "the reference worker exited (1)"  # paper bf16
    del pair["json"]["results"][2]["tokens_per_s"]
    evaluation = part(check, "serving_evaluation")
    evaluation.update(status="failed", result="failed (error: the NLLs of step (batch 16) "
                                              "differ from the bound's by 3.0e-02)")
    part(check, "parity").update(status="failed", result="failed (timed out after 30 s)")
    del part(check, "parity")["details"]
    part(check, "train").update(status="failed", result="failed (steps [21] got other "
                                                        "batches after the resume)")
    got = by_target(check)
    assert (got[TF32]["verdict"], got[TF32]["why"]) == (
        "met", "pair_enwik8_base failed (timed out after 90 s; so far: ...)")
    assert (got[BF16]["verdict"], got[BF16]["why"]) == (
        "not measured", "pair_enwik8_base failed (timed out after 90 s; so far: ...): the "
                        "paper's code failed: the reference worker exited (1)")
    assert got[EVAL_B16]["verdict"] == "not measured"  # its speeds shown, not judged
    assert got[EVAL_B16]["why"] == ("serving_evaluation failed (error: the NLLs of step "
                                    "(batch 16) differ from the bound's by 3.0e-02)")
    assert got[EVAL_B16]["measured"].startswith("0.93x the bound graph")
    parity = got["GPU vs CPU log-probs (enwik8_base, TF32 off) <= 1e-4"]
    assert (parity["verdict"], parity["why"]) == (
        "not measured", "parity failed (timed out after 30 s): no details in the row")
    assert (got[RESUME]["verdict"], got[RESUME]["measured"]) == (
        "short", "failed (steps [21] got other batches after the resume)")
    for stopped in ("failed (stopped by SIGTERM after 12 s)",
                    "failed (timed out after 70 s (resuming; the first run at step 23, ...))"):
        part(check, "train")["result"] = stopped
        assert by_target(check)[RESUME]["why"] == f"train {stopped}: no verdict"


def test_a_check_stopped_early_skipped_parts_and_parts_not_run():
    check = met_check()
    check["partial"] = True  # killed outright while pair_wt103_base ran
    check["parts"] = check["parts"][:6]
    got = by_target(check)
    assert got[TF32]["verdict"] == "met"
    assert (got[TABLE]["verdict"], got[TABLE]["why"]) == (
        "not measured", "the check stopped before serving_long_memory (a partial file)")
    check["partial"] = False  # the same rows in a finished file: not in --parts
    assert by_target(check)[TABLE]["why"] == "serving_long_memory did not run (not in --parts)"
    check = met_check()  # SIGTERM while bf16+jit ran: the rows done so far are judged
    pair = part(check, "pair_enwik8_base")
    pair.update(status="failed", result="failed (stopped by SIGTERM after 80 s; so far: ...)")
    pair["json"]["results"] = pair["json"]["results"][:3]  # paper bf16 done
    pair["json"]["started"] = [{"shape": "enwik8_base", "variant": "bf16+jit",
                                "first_step_s": 40.1}]
    del pair["json"]["environment"]  # written at the end only
    got = by_target(check)
    assert (got[TF32]["verdict"], got[TF32]["why"]) == (
        "met", "pair_enwik8_base failed (stopped by SIGTERM after 80 s; so far: ...)")
    assert (got[BF16]["verdict"], got[BF16]["why"]) == (
        "not measured", "pair_enwik8_base failed (stopped by SIGTERM after 80 s; so far: ...): "
                        "bf16+jit not done (stopped while it ran)")
    check = met_check()
    part(check, "serving_float16").update(status="skipped", result="skipped (needs "
                                                                   "--serving_exports)")
    part(check, "serving_long_memory").update(
        status="skipped", result="skipped (the check was stopped by SIGTERM)")
    got = by_target(check)
    assert got[TABLE]["why"] == ("serving_long_memory skipped (the check was stopped by "
                                 "SIGTERM)")
    assert got["decode step, batch 1, the float16 export option: <= 0.78 ms a token"][
        "why"] == "serving_float16 skipped (needs --serving_exports)"
    assert got[TABLE]["measured"] is None


def test_a_missing_or_wrong_field_is_not_measured_and_says_which():
    check = met_check()
    del part(check, "serving_long_memory")["json"]["rows"][0]["per_token_ms"]
    part(check, "serving_long_memory")["json"]["rows"][1]["table_over_own"] = "fast"
    part(check, "serving_parity")["json"] = {"not_copied": "/tmp/p.json holds 9,000,000 bytes"}
    del part(check, "serving_evaluation")["json"]["rows"][3]["tokens_per_s"]  # b1 paper
    part(check, "serving_evaluation")["json"]["rows"][3]["absent"] = "no --reference_dir"
    del part(check, "pair_wt103_base")["json"]  # the part wrote no file
    part(check, "serving_soak")["json"]["settings"]["device"] = "cpu"  # no CUDA after all
    got = by_target(check)
    why = {t: r["why"] for t, r in got.items() if r["verdict"] == "not measured"}
    assert why == {
        DECODE_B1: "no json.rows[onnx, batch 1].per_token_ms",
        TABLE: "json.rows[onnx, batch 16].table_over_own is not a number: 'fast'",
        "decode step parity to the CPU (float32): <= 1e-5":
            "its JSON was not copied: /tmp/p.json holds 9,000,000 bytes",
        "evaluation, batch 1: the API and the bound graph >= 2x the paper's code":
            "the paper's code absent: no --reference_dir",
        "evaluation, batch 1, TF32 matmuls: the API and the bound graph >= 2x the paper's code "
        "(its parity stated)": "the paper's code absent: no --reference_dir",
        **{f"wt103_base pair, {v}": "its JSON is not in the row"
           for v in ("f32+jit", "bf16+jit", "f16+jit")},
        "a short soak on the GPU: every session gets what it gets alone":
            "taken on cpu, not on the GPU"}


@pytest.mark.parametrize("device, tiny, why", [("cpu", True, "CPU run"), ("cpu", False, "CPU run"),
                                               ("gpu", True, "--tiny run")])
def test_a_cpu_or_tiny_run_is_never_judged(device, tiny, why):
    check = dict(met_check(), device=device, tiny=tiny)
    part(check, "pair_enwik8_base")["json"]["results"][1]["tokens_per_s"] = 1.0
    rows = it.judge(check)
    assert {r["verdict"] for r in rows} == {"not judged"}
    assert {r["why"] for r in rows} == {why}
    assert by_target(check)[TF32]["measured"].startswith("0.00x")  # shown all the same
    assert it.table(rows).splitlines()[-1] == f"targets: {len(rows)} not judged"


def test_the_json_of_a_tiny_cpu_run():
    """`python -m benchmarks.gpu_check --device=cpu --tiny` (all parts; its
    output tails and commands dropped): nothing judged, the figures read
    from the fields its parts write; as if from a GPU, the serving rows
    taken on the CPU are still not judged."""
    check = json.loads(FIXTURE.read_text())
    assert check["partial"] is False and not check["failed"]
    got = by_target(check)
    assert {r["verdict"] for r in got.values()} == {"not judged"}
    measured = {t for t, r in got.items() if r["measured"] is not None}
    assert measured == {
        RESUME, "txl-train: the first step's compile seconds",
        "GPU vs CPU log-probs (enwik8_base, TF32 off) <= 1e-4",
        "seeded losses GPU vs CPU: first 10 steps <= 1e-4 (the check's bound)",
        "fit under MirroredStrategy (one GPU) == one device: <= 1e-5", TABLE, DECODE_B1,
        "decode step, batch 16 (float32): <= 2x the bound",
        "evaluation, batch 1: the runtime API (memory on the device) >= 0.9x the graph with "
        "bound buffers", EVAL_B16,
        "a short soak on the GPU: every session gets what it gets alone", FLAGS}
    assert got[TF32]["why"] == "CPU run (and: no f32+jit row in its JSON)"  # tiny runs f32
    assert re.fullmatch(r"triton_gemm_off 1st \d+\.\d s, [\d,]+ tok/s; autotune_level_0 1st "
                        r"\d+\.\d s, [\d,]+ tok/s; llvm_parallel 1st \d+\.\d s, [\d,]+ tok/s",
                        got[FLAGS]["measured"]), got[FLAGS]
    as_gpu = dict(copy.deepcopy(check), device="gpu", tiny=False)
    got = by_target(as_gpu)
    for target in (TABLE, DECODE_B1, EVAL_B16, FLAGS):
        assert (got[target]["verdict"], got[target]["why"]) == (
            "not measured", "taken on cpu, not on the GPU")
    assert got[TF32]["why"] == "no f32+jit row in its JSON"


def test_the_command_prints_the_table_or_one_error_line(tmp_path, capsys):
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps(met_check()))
    it.main([str(path)])
    out = capsys.readouterr().out
    assert out == it.table(it.judge(met_check())) + "\n"
    for text, error in [
            (None, f"error: {tmp_path}/none.json: no such file (the GPU check writes "
                   "gpu_check.json, --output)"),
            ('{"parts": [', "error: {path}: not readable as JSON (JSONDecodeError: Expecting "
                            "value: line 1 column 12 (char 11))"),
            ("[1]", "error: {path} is not a GPU check's JSON (not an object)"),
            ('{"parts": []}', "error: {path} is not a GPU check's JSON (no device, tiny, "
                              "partial; python -m benchmarks.gpu_check writes one)"),
            ('{"parts": [], "device": "cuda", "tiny": false, "partial": false}',
             "error: {path}: its device is not gpu or cpu, or its tiny or partial not true or "
             "false"),
            ('{"parts": [{"part": "gpu"}], "device": "gpu", "tiny": false, "partial": false}',
             "error: {path}: its parts are not rows with a part and a status of ok, failed "
             "or skipped")]:
        name = tmp_path / ("none.json" if text is None else "bad.json")
        if text is not None:
            name.write_text(text)
        with pytest.raises(SystemExit) as exited:
            it.main([str(name)])
        captured = capsys.readouterr()
        assert exited.value.code == 2 and captured.out == ""
        assert captured.err == error.replace("{path}", str(name)) + "\n"
    it.main(["--help"])
    assert capsys.readouterr().out.startswith("python -m benchmarks.issue_targets gpu_check.json")
    with pytest.raises(SystemExit):
        it.main([])
    assert capsys.readouterr().err == ("error: usage: python -m benchmarks.issue_targets "
                                       "GPU_CHECK_JSON\n")


def test_the_check_stores_the_targets_after_every_part(tmp_path):
    """`write_result` keeps the targets in the check's JSON, partial or not;
    a document the judging cannot read keeps its rows and says why."""
    check = met_check()
    path = str(tmp_path / "check.json")
    gc.write_result(path, check["parts"][:3], True, device="gpu", tiny=False)
    saved = json.loads(open(path, encoding="utf-8").read())
    assert saved["targets"]["rows"] == it.judge(saved)
    assert by_target(saved)[TABLE]["why"] == ("the check stopped before serving_long_memory "
                                              "(a partial file)")
    assert saved["targets"]["table"] == it.table(saved["targets"]["rows"])
    gc.write_result(path, check["parts"], False)  # no device: not a check's JSON
    saved = json.loads(open(path, encoding="utf-8").read())
    assert saved["targets"] == {"error": "the check's JSON is not a GPU check's JSON (no "
                                         "device, tiny; python -m benchmarks.gpu_check "
                                         "writes one)"}
    assert len(saved["parts"]) == len(check["parts"])


def test_the_train_parts_compile_seconds():
    output = "step 1/40 loss 5.6\nstep 2/40 loss 5.5 3,126 tok/s compile 10.9s (XLA)\n"
    assert gc.compile_seconds(output) == 10.9
    assert gc.compile_seconds("step 1/40\n", [{"step": 1}, {"step": 2, "compile_s": 7.25}]) == 7.25
    assert gc.compile_seconds("step 1/40\n") is None


def _paths(node, path=()):
    """Every key path of a JSON document's values."""
    yield path
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    for key, value in items:
        yield from _paths(value, path + (key,))


def test_any_value_of_a_part_replaced_is_a_verdict_never_an_exception():
    """Each value under the parts (a row, a field, a list item) replaced by
    something of another kind: every target still gets a verdict."""
    check = met_check()
    paths = [p for p in _paths(check["parts"]) if p]
    assert len(paths) > 150
    for path in paths:
        for odd in (None, "x", [], {}, 0, -1.0, math.nan, True, [[1]]):
            changed = copy.deepcopy(check)
            node = changed["parts"]
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = odd
            try:
                rows = it.judge(changed)
            except it.TargetsError:  # a row without its part or status
                assert len(path) <= 2 and (len(path) == 1 or path[1] in ("part", "status"))
                continue
            assert len(rows) == len(it.TARGETS), (path, odd)
            assert {r["verdict"] for r in rows} <= set(it.VERDICTS), (path, odd)
            it.table(rows)


def test_a_threshold_is_written_with_every_digit():
    """`number_text` is shown in the table and passed to a part as its
    `--tolerance`: it reads back as the threshold (1.5e-4 was once "1e-4")."""
    for value, text in [(1e-4, "1e-4"), (1.5e-4, "1.5e-4"), (2.5e-3, "2.5e-3"), (0.78, "0.78"),
                        (2.0, "2"), (0, "0"), (0.05, "0.05")]:
        assert it.number_text(value) == text and float(text) == value
    for name in it.THRESHOLDS:
        assert float(it.number_text(it.limit_of(name))) == it.limit_of(name)


def test_a_tokens_parts_are_shown_and_their_absence_said():
    """The decode step's parts (step graph, write, host) shown per batch size
    from the speed part's rows; a row without them is not measured, saying
    why."""
    check = met_check()
    got = by_target(check)
    b1 = "decode step, batch 1 (float32): a token's parts, ms"
    assert (got[b1]["verdict"], got[b1]["measured"]) == (
        "shown", "0.780 ms a token: step graph 0.624, write 0.078, host 0.078 "
                 "(enwik8_base, memory 2100)")
    before = got["decode step, batch 1 (float32), the same export stepped as before "
                 "decode_token (step, then write): a token's parts, ms"]
    assert (before["verdict"], before["value"]) == ("shown", pytest.approx(1.014)), before
    del part(check, "serving_long_memory")["json"]["rows"][0]["token_parts"]
    got = by_target(check)[b1]
    assert got["verdict"] == "not measured" and "no token parts" in got["why"], got
