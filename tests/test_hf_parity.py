"""`benchmarks/hf_parity.py` without the port: one line, no work. (Its run
against `transformers`' `TransfoXLLMHeadModel` needs torch, which CI lacks;
its result is `benchmarks/results/hf_parity.json`.)"""
import json
from pathlib import Path

from benchmarks import hf_parity

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "hf_parity.json"


def test_without_the_port_the_run_is_skipped_with_one_line(jobs, tmp_path):
    out = tmp_path / "hf_parity.json"
    done = jobs.run("benchmarks.hf_parity", [f"--output={out}"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines() == [
        "skipped: no --hf_python (a Python with torch and transformers 4.x, whose "
        "TransfoXLLMHeadModel is the port)"]
    python = tmp_path / "python"  # an interpreter without transformers
    python.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named "
                      "'transformers'\" >&2\nexit 1\n")
    python.chmod(0o755)
    done = jobs.run("benchmarks.hf_parity", [f"--hf_python={python}", f"--output={out}"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines() == [
        f"skipped: {python} cannot import transformers' TransfoXLLMHeadModel "
        "(ModuleNotFoundError: No module named 'transformers')"]
    assert not out.exists()
    done = jobs.run("benchmarks.hf_parity", [f"--hf_python={tmp_path / 'none'}"])
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == \
        f"error: --hf_python={tmp_path / 'none'} is not an executable file"


def test_the_recorded_result_covers_the_cases_within_round_off():
    """Every case of the runner is in the recorded run; the port and the
    imported core agree to float32 round-off (relative to the log-probs'
    size) but in the one documented difference."""
    rows = json.loads(RESULTS.read_text(encoding="utf-8"))["rows"]
    assert [r["case"] for r in rows] == [c["name"] for c in hf_parity.CASES]
    for row in rows:
        worst = max(row["log_probs vs port f32"] + row["log_probs vs port f64"])
        if row["documented difference"]:
            continue
        assert worst <= 5e-6 * row["largest |log-prob|"], row["case"]
        assert row["memory vs port f64"] <= 1e-4 and row["from_preset vs txl-convert"] == 0
        assert row["whole state dict, no config, vs port f64"] <= 5e-6 * row["largest |log-prob|"]
        assert row["greedy ids equal"] == (row["note"] == ""), row["case"]
