"""`benchmarks.long_memory --part=evaluation` at a tiny config, in this
process: its bad flags fail first, every path through the runtime API gives
the bound's NLLs (and a path that drops the memory fails the part), and the
JSON holds each batch's paths with their fields. (The speeds come from real
sizes: benchmarks/README.md.)"""
import json
import math
import re
import sys

import numpy as np
import pytest

from benchmarks import long_memory as lm
from export.onnx_runtime import OnnxRuntime
from export.runtime import Runtime, RuntimeMemory
from txl_tf import TransformerXL
from txl_tf.app.flagspec import defaults
from txl_tf.errors import TxlError

MEM_LEN = 8


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder holding `tiny/out`: model.onnx alone, as the part exports it."""
    root = tmp_path_factory.mktemp("evaluation")
    lm.export_random(TransformerXL(lm.preset_config("tiny", MEM_LEN)), str(root / "tiny"),
                     formats=("onnx",), decode_cache=False, log_probs="all")
    return root


def options(work, tmp_path, **changes):
    o = dict(defaults(lm.EVALUATION_SPEC), presets="tiny", mem_len=MEM_LEN, segment_len=6,
             batch_sizes="1,3", segments=2, repeats=2, reuse_exports=True, work_dir=str(work),
             output=str(tmp_path / "evaluation.json"))
    return {**o, **changes}


@pytest.mark.parametrize("changes, message", [
    (dict(batch_sizes="1,0"), "--batch_sizes must be comma-separated positive integers"),
    (dict(segments=1), "--segments must be >= 2, got 1"),
    (dict(segment_len=0), "--segment_len must be >= 1, got 0"),
    (dict(device="tpu"), "--device must be cpu, cuda or auto, got 'tpu'"),
    (dict(device="cuda"), "--device=cuda: this onnxruntime has no CUDAExecutionProvider"),
    (dict(reuse_exports=True, work_dir=None), "--reuse_exports needs --work_dir"),
    (dict(presets=" ,"), "--presets names no preset: ' ,'"),
    (dict(presets="tiny,nope"), "unknown preset 'nope'"),
    (dict(fixed_shapes="yes"), "--fixed_shapes must be auto, true, one_token or false"),
    (dict(tf32_rows="yes"), "--tf32_rows must be auto, true or false, got 'yes'"),
    (dict(), "--reuse_exports: no tiny export in "),
])
def test_bad_flags_fail_before_any_export(tmp_path, monkeypatch, changes, message):
    monkeypatch.setattr(lm, "_on_cuda", lambda device: False)  # as on a machine without CUDA
    with pytest.raises(TxlError, match=re.escape(message)):
        lm.run_evaluation(options(tmp_path / "none", tmp_path, **changes))
    assert not (tmp_path / "evaluation.json").exists()


def test_every_path_gives_the_bounds_nlls_and_the_json_has_its_fields(work, tmp_path, capsys):
    lm.run_evaluation(options(work, tmp_path))
    result = json.loads((tmp_path / "evaluation.json").read_text())
    assert result["device"] == "cpu" and result["api_target"] == 0.9
    assert result["settings"]["segment_len"] == 6
    rows = result["rows"]
    assert [(r["batch"], r["path"]) for r in rows] == [
        (batch, path) for batch in (1, 3) for path in lm.EVALUATION_PATHS + ("paper",)]
    for r in rows:
        assert (r["preset"], r["mem_len"], r["segment_len"]) == ("tiny", MEM_LEN, 6)
        if r["path"] == "paper":  # on the CPU: a column marked absent, with the reason
            assert r["tokens_per_s"] is None and r["absent"] == "timed on CUDA only", r
            continue
        assert r["tokens_per_s"] > 0 and len(r["seconds"]) == 2 and r["over_bound"] > 0, r
        assert r["nll_max_abs_diff"] == 0.0, r  # the same session: the same numbers
        assert r["memory_effect"] > 1e-5, r  # a dropped memory would show
        assert ("meets_target" in r) == (r["path"] in ("score", "step")), r
    assert {r["over_bound"] for r in rows if r["path"] == "bound"} == {1.0}
    out = capsys.readouterr().out.strip().splitlines()
    assert "| 3 | score_numpy |" in "\n".join(out)
    assert out[-1].startswith("evaluation on cpu, API ÷ bound (NLLs equal): tiny b1 bound "), \
        out[-1]
    assert "; tiny b3 bound " in out[-1] and out[-1].endswith("paper absent (timed on CUDA only)")


def test_tf32_rows_time_a_second_runtime_and_state_their_nlls(work, tmp_path, capsys,
                                                              monkeypatch):
    """`--tf32_rows=true` (on CUDA by default): the bound graph and score on a
    runtime opened with `tf32=True`, after the float32 paths; their NLLs'
    difference to the bound is stated, not held to --tolerance (on the CPU
    TF32 changes nothing: 0)."""
    opened = []
    real_open = lm.open_export

    def recording_open(*args, **options):
        opened.append(options.get("tf32", False))
        return real_open(*args, **options)
    monkeypatch.setattr(lm, "open_export", recording_open)
    lm.run_evaluation(options(work, tmp_path, batch_sizes="1", tf32_rows="true"))
    assert opened == [False, True]
    rows = json.loads((tmp_path / "evaluation.json").read_text())["rows"]
    assert [r["path"] for r in rows] == [*lm.EVALUATION_PATHS, *lm.TF32_PATHS, "paper"]
    for r in rows[len(lm.EVALUATION_PATHS):-1]:
        assert r["tokens_per_s"] > 0 and r["nll_max_abs_diff"] == 0.0, r
    assert ", score with TF32 " in capsys.readouterr().out.strip().splitlines()[-1]
    opened.clear()
    lm.run_evaluation(options(work, tmp_path, batch_sizes="1"))  # auto: on CUDA only
    assert opened == [False]


@pytest.mark.parametrize("device_cache", [False, True])
def test_the_bound_path_runs_the_runtimes_fixed_shape_session_where_it_has_one(work,
                                                                               device_cache):
    """With `fixed_shapes`, the bound path is the fixed-shape session (on the
    device path its fixed buffers, the memory fed back in them) and gives
    the dynamic-shape session's NLLs; segment by segment, the memory carried."""
    from export import open_runtime
    from export.device_memory import FixedSegment
    runtime = open_runtime(str(work / "tiny" / "out"), device="cpu", fixed_shapes=True,
                           device_cache=device_cache)
    rng = np.random.default_rng(0)
    segments = [(rng.integers(0, runtime.n_token, [2, 6], dtype=np.int32),
                 rng.integers(0, runtime.n_token, [2, 6], dtype=np.int32)) for _ in range(3)]
    memory = lm.full_memory(runtime.config, MEM_LEN, 2)
    nll = {True: [], False: []}
    for dynamic in nll:
        lm.bound_path(runtime, memory, segments, dynamic=dynamic)(nll[dynamic].append)
    assert isinstance(runtime._fixed[(2, 6)], FixedSegment) == device_cache
    np.testing.assert_allclose(np.stack(nll[False]), np.stack(nll[True]), atol=1e-6)
    fresh = lm.bound_path(runtime, memory, segments[1:2], dynamic=True)
    unfed = []
    fresh(unfed.append)
    assert np.abs(unfed[0] - nll[True][1]).max() > 1e-4  # the memory carried shows


@pytest.mark.parametrize("tf32_rows", ["false", "true"])
def test_a_path_that_drops_the_memory_fails_the_part(work, tmp_path, monkeypatch, tf32_rows):
    """Also beside TF32 rows that drop it too: their exemption from
    --tolerance hides no float32 path's error."""
    def score_keeping_the_memory(self, token_ids, target_ids, memory=None):
        nll = Runtime.score(self, token_ids, target_ids, memory)[0]
        return nll, RuntimeMemory(*memory)
    monkeypatch.setattr(OnnxRuntime, "score", score_keeping_the_memory, raising=False)
    with pytest.raises(TxlError, match=r"the NLLs of score \(batch 1\) differ from the bound's"):
        lm.run_evaluation(options(work, tmp_path, batch_sizes="1", tf32_rows=tf32_rows))
    rows = json.loads((tmp_path / "evaluation.json").read_text())["rows"]  # written first
    wrong = {r["path"] for r in rows if r.get("nll_max_abs_diff", 0) > 1e-5}
    assert wrong == {"score", "score_numpy", *(("score_tf32",) if tf32_rows == "true" else ())}, \
        rows


def test_a_memory_that_moves_no_nll_cannot_check_the_paths(work, tmp_path):
    with pytest.raises(TxlError, match="the check cannot tell a path that drops it"):
        lm.run_evaluation(options(work, tmp_path, batch_sizes="1", tolerance=100.0))


FAKE_WORKER = r'''
import json, sys
log = open(sys.argv[-1] + "/requests.jsonl", "a")
for line in sys.stdin:
    request = json.loads(line)
    log.write(line)
    log.flush()
    reply = {"ok": True} if "setup" in request else {"seconds": [0.5] * request["run"]}
    print(json.dumps(reply), flush=True)
'''


def test_the_papers_code_runs_on_cuda_in_float32_on_a_full_memory(tmp_path):
    """`paper_tokens_per_s` with a fake worker speaking `paper_reference.py`'s
    protocol (on a GPU the worker is the paper's code)."""
    (tmp_path / "worker.py").write_text(FAKE_WORKER)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'worker.py'} \"$@\"\n")
    python.chmod(0o755)
    o = dict(defaults(lm.EVALUATION_SPEC), segment_len=512, segments=2, repeats=3,
             reference_dir=str(tmp_path), reference_python=str(python))
    config = lm.preset_config("enwik8_base")
    assert lm.paper_tokens_per_s(o, config, 2100, [1, 16], "cuda") == {
        1: (512 / 0.5, None), 16: (16 * 512 / 0.5, None)}
    requests = [json.loads(line)
                for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(requests) == 6  # one worker, set up once per batch size
    for batch, (setup, warm, timed) in zip((1, 16), (requests[:3], requests[3:])):
        assert warm == {"run": 6} and timed == {"run": 6}  # 2,100 slots fill in 5 segments
        setup = setup["setup"]
        assert (setup["mode"], setup["device"], setup["precision"]) == ("eval", "cuda", "float32")
        assert (setup["tgt_len"], setup["mem_len"], setup["batch_size"]) == (512, 2100, batch)
        assert (setup["n_layer"], setup["d_model"], setup["n_token"]) == (12, 512, config.n_token)
    assert lm.paper_tokens_per_s(o, config, 2100, [1], "cpu") == {1: (None, "timed on CUDA only")}
    gone = dict(o, reference_python=str(tmp_path / "no_python"))
    [(tokens_per_s, why)] = lm.paper_tokens_per_s(gone, config, 2100, [1], "cuda").values()
    assert tokens_per_s is None and why.startswith("the paper's code did not run: "), why


@pytest.mark.parametrize("path", ["step", "score_tf32"])
def test_a_path_whose_nlls_are_not_finite_fails_the_part(work, tmp_path, monkeypatch, path):
    """NaN NLLs are no NLLs: a float32 path's fail the part (a NaN
    difference compared with `>` passed --tolerance), and so do a TF32
    path's (exempt from --tolerance, not from giving numbers)."""
    opened = []
    real_open, real_step, real_score = lm.open_export, Runtime.step, Runtime.score

    def recording_open(*args, **options):
        opened.append(real_open(*args, **options))
        return opened[-1]

    def nan_step(self, token_ids, memory=None):
        log_probs, new = real_step(self, token_ids, memory)
        return np.full_like(np.asarray(log_probs), np.nan), new

    def nan_score(self, token_ids, target_ids, memory=None):
        nll, new = real_score(self, token_ids, target_ids, memory)
        if self is opened[-1] and len(opened) == 2:  # the TF32 runtime's
            nll = np.full_like(np.asarray(nll), np.nan)
        return nll, new
    monkeypatch.setattr(lm, "open_export", recording_open)
    if path == "step":
        monkeypatch.setattr(OnnxRuntime, "step", nan_step, raising=False)
    else:
        monkeypatch.setattr(OnnxRuntime, "score", nan_score, raising=False)
    with pytest.raises(TxlError, match=rf"the NLLs of {path} \(batch 1\) .*nan"):
        lm.run_evaluation(options(work, tmp_path, batch_sizes="1", tf32_rows="true"))


def test_a_tf32_path_off_by_a_tenth_of_the_memorys_effect_fails_the_part():
    """TF32 paths are not held to --tolerance, but one whose NLLs move by a
    tenth of what the memory carried moves them (a dropped memory) fails."""
    rows = [{"path": "score", "batch": 1, "nll_max_abs_diff": 0.0, "memory_effect": 0.1},
            {"path": "score_tf32", "batch": 1, "nll_max_abs_diff": 2e-3, "memory_effect": 0.1}]
    lm.check_nll_rows(rows, 1e-5)  # TF32's round-off: stated, not failed
    rows[1]["nll_max_abs_diff"] = 0.01
    with pytest.raises(TxlError, match=r"the NLLs of score_tf32 \(batch 1\) differ from the "
                                       r"bound's by 1\.0e-02, a tenth or more of what the memory"):
        lm.check_nll_rows(rows, 1e-5)


def test_seconds_per_extra_token_pairs_the_two_lengths():
    """A loop's seconds a token come from the two lengths run back to back,
    the median of the pairs' differences: a machine slowing down (here each
    call slower by a fixed step) moves it by one step, as it would move the
    short runs' median against the long runs' by several were they timed
    all short, then all long (as `time_xla_from_state` did)."""
    calls = []

    def run(n):
        calls.append(n)
        return 0.5 + 0.002 * n + 0.01 * len(calls)
    short, long, per_token = lm.seconds_per_extra_token(run, 10, 42, pairs=5)
    assert calls == [10, 42] * 5
    assert per_token == pytest.approx((0.002 * 32 + 0.01) / 32)
    assert short == pytest.approx(0.5 + 0.02 + 0.05) and long == pytest.approx(0.5 + 0.084 + 0.06)


def test_a_loop_no_slower_for_more_tokens_gives_no_speed():
    """Noise larger than the extra tokens' time: the median of the pairs'
    differences is not above 0, and a negative ms a token met every target
    (review37); NaN meets none."""
    from benchmarks import issue_targets
    times = iter([0.50, 0.49, 0.51, 0.50, 0.50, 0.50, 0.52, 0.48, 0.50, 0.51])
    short, long, per_token = lm.seconds_per_extra_token(lambda n: next(times), 10, 42)
    assert short == 0.50 and long == 0.50 and math.isnan(per_token)
    assert issue_targets.compare("decode_ms_b1", -0.01 * 1e3 / 32)  # what a negative one did
    assert not issue_targets.compare("decode_ms_b1", per_token * 1e3)
