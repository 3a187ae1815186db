"""The first-step benchmark's logic (`benchmarks/first_step.py`): a
measurement trains a tiny model with either optimizer, and the rows'
medians, spreads and ratios are what the samples say. No timing is
asserted."""
import keras
import pytest

from benchmarks import first_step as bench
from txl_tf import ReplicaClippedAdam


def test_the_baseline_is_the_library_optimizer_with_kerass_update():
    baseline = bench.keras_update_adam()
    assert issubclass(baseline, ReplicaClippedAdam)
    assert baseline.update_step is keras.optimizers.Adam.update_step
    assert ReplicaClippedAdam.update_step is not keras.optimizers.Adam.update_step


@pytest.mark.parametrize("optimizer", bench.OPTIMIZERS)
def test_a_measurement_trains_and_times_the_first_step_and_the_next(optimizer):
    found = bench.measure_once("tiny", "f32", optimizer, tgt_len=8, batch_size=1, steps=2)
    assert set(found) == {"first_step_s", "step_s"}
    assert found["first_step_s"] > 0 and found["step_s"] > 0


def test_rows_hold_each_optimizers_median_spread_and_the_ratios():
    samples = {("tiny", "f32"): {
        "keras": [{"first_step_s": s, "step_s": 0.2} for s in (4.0, 6.0, 5.0)],
        "fused": [{"first_step_s": s, "step_s": 0.1} for s in (2.0, 3.0, 2.5)]}}
    (row,) = bench.rows_of(samples)
    assert row["keras"] == {"first_step_s": 5.0, "first_step_min_s": 4.0,
                            "first_step_max_s": 6.0, "step_s": 0.2}
    assert row["fused"]["first_step_s"] == 2.5
    assert row["first_step_ratio"] == pytest.approx(2.0)
    assert row["step_ratio"] == pytest.approx(2.0)
    lines = bench.table([row]).splitlines()
    assert len(lines) == 2 and "5.00 [4.00, 6.00]" in lines[1] and "2.00" in lines[1]


def test_a_worker_that_runs_past_its_time_is_one_benchmark_error(monkeypatch):
    """Was `subprocess.TimeoutExpired`'s traceback, not an `error:` line."""
    from benchmarks.common import BenchmarkError
    monkeypatch.setattr(bench, "WORKER_TIMEOUT_S", 0.01)
    with pytest.raises(BenchmarkError, match=r"tiny f32 fused: the worker did not finish in "):
        bench.run_worker("tiny", "f32", "fused", 8, 1, 1)


def test_a_worker_that_fails_is_named_with_its_last_line():
    from benchmarks.common import BenchmarkError
    with pytest.raises(BenchmarkError, match=r"nope f32 fused: the worker failed: KeyError"):
        bench.run_worker("nope", "f32", "fused", 8, 1, 1)
