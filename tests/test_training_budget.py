"""`training.budget` (the benchmarks' time-budgeted runs): the probe reads
the training job's own log, and the budget sizes the run's schedule."""
import math

import pytest

from job_helpers import write_text_corpus
from training import budget


def test_the_probe_times_steps_from_the_jobs_log(tmp_path):
    corpus = write_text_corpus(tmp_path / "corpus.txt", 5_000)
    options = dict(dataset="text", data_dir=str(corpus), preset="tiny",
                   cache_dir=str(tmp_path / "cache"), strategy="one_device", batch_size=2)
    per_step = budget.seconds_per_step(options, probe_steps=5)
    assert 0 < per_step < 60 and math.isfinite(per_step)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "corpus.txt"]


def test_the_budget_sizes_steps_warmup_checkpoints_and_the_time_limit(monkeypatch, tmp_path):
    runs = []
    monkeypatch.setattr(budget, "seconds_per_step", lambda options, probe_steps: 0.5)
    monkeypatch.setattr(budget.train, "run", lambda **o: runs.append(o) or {"step": 1})
    result, steps, per_step, _ = budget.train_within(100, {"preset": "tiny"}, str(tmp_path))
    assert (result, steps, per_step) == ({"step": 1}, 184, 0.5)  # 100 s * 0.92 / 0.5 s
    assert {k: runs[0][k] for k in ("train_steps", "warmup_steps", "checkpoint_every",
                                    "max_time_s", "preset", "model_dir")} == {
        "train_steps": 184, "warmup_steps": 18, "checkpoint_every": 46,
        "max_time_s": pytest.approx(115.0),
        "preset": "tiny", "model_dir": str(tmp_path)}
    assert budget.steps_for_budget(0.1, {}) == (1, 0.5)  # at least one step
