"""The first-step benchmark's logic (`benchmarks/first_step.py`): a
measurement trains a tiny model with either arm of each comparison, and the
rows' medians, spreads and ratios are what the samples say. No timing is
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


def test_the_dropout_baseline_draws_philox_words_under_xla(monkeypatch):
    """The `philox` arm undoes the counter hash: its XLA-compiled mask is
    Philox's, as the eager one is; the library's XLA mask is another."""
    import numpy as np
    import tensorflow as tf
    from txl_tf.layers import dropout

    def masks():
        layer = dropout.Dropout(0.5, seed=3)
        x = tf.ones([4096])
        xla = tf.function(lambda x: layer(x, training=True), jit_compile=True)(x)
        eager = dropout.Dropout(0.5, seed=3)(x, training=True)
        return xla.numpy() != 0, eager.numpy() != 0

    xla, eager = masks()
    assert (xla != eager).any()
    monkeypatch.setattr(dropout, "compiling_with_xla", dropout.compiling_with_xla)
    bench.philox_dropout()
    xla, eager = masks()
    np.testing.assert_array_equal(xla, eager)


@pytest.mark.parametrize("arm", [arm for arms in bench.COMPARISONS.values() for arm in arms])
def test_a_measurement_trains_and_times_the_first_step_and_the_next(arm, monkeypatch):
    from txl_tf.layers import dropout
    monkeypatch.setattr(dropout, "compiling_with_xla", dropout.compiling_with_xla)
    found = bench.measure_once("tiny", "f32+jit", arm, tgt_len=8, batch_size=1, steps=2)
    assert set(found) == {"first_step_s", "step_s"}
    assert found["first_step_s"] > 0 and found["step_s"] > 0


@pytest.mark.parametrize("compare", sorted(bench.COMPARISONS))
def test_rows_hold_each_arms_median_spread_and_the_ratios(compare):
    baseline, library = arms = bench.COMPARISONS[compare]
    samples = {("tiny", "f32"): {
        baseline: [{"first_step_s": s, "step_s": 0.2} for s in (4.0, 6.0, 5.0)],
        library: [{"first_step_s": s, "step_s": 0.1} for s in (2.0, 3.0, 2.5)]}}
    (row,) = bench.rows_of(samples, arms)
    assert row[baseline] == {"first_step_s": 5.0, "first_step_min_s": 4.0,
                             "first_step_max_s": 6.0, "step_s": 0.2}
    assert row[library]["first_step_s"] == 2.5
    assert row["first_step_ratio"] == pytest.approx(2.0)
    assert row["step_ratio"] == pytest.approx(2.0)
    header, line = bench.table([row], arms).splitlines()
    assert f"{baseline} first s" in header and "5.00 [4.00, 6.00]" in line and "2.00" in line


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
