"""The learning-rate schedule is the paper's warm-up + cosine decay and serialises."""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf.errors import TxlError
from txl_tf.learning.schedule import MAX_DEFAULT_WARMUP, WarmupCosineDecay, default_warmup_steps


def paper_lr(step, peak=1e-3, total=1000, warmup=100, alpha=0.004):
    """The paper's TF code: linear warm-up, then tf.train.cosine_decay(alpha)."""
    if step < warmup:
        return peak * step / warmup
    span = max(total - warmup, 1)  # warm-up over every step: the minimum right after
    progress = min(step - warmup, span) / span
    return peak * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * progress)) + alpha)


@pytest.mark.parametrize("step", [0, 1, 50, 99, 100, 101, 400, 550, 999, 1000, 1500])
def test_matches_the_paper(step):
    schedule = WarmupCosineDecay(1e-3, total_steps=1000, warmup_steps=100, min_lr_ratio=0.004)
    assert float(schedule(step)) == pytest.approx(paper_lr(step), rel=1e-5, abs=1e-12)


def test_no_warmup_starts_at_the_peak_and_ends_at_min_ratio():
    schedule = WarmupCosineDecay(2.5e-4, total_steps=400, warmup_steps=0, min_lr_ratio=0.004)
    assert float(schedule(0)) == pytest.approx(2.5e-4)
    assert float(schedule(400)) == pytest.approx(2.5e-4 * 0.004)
    assert float(schedule(200)) == pytest.approx(2.5e-4 * (0.004 + 0.996 * 0.5))


def test_warmup_defaults_to_a_tenth_of_the_steps_capped():
    assert WarmupCosineDecay(1e-3, total_steps=1500).warmup_steps == 150
    assert float(WarmupCosineDecay(1e-3, total_steps=1500)(0)) == 0.0
    assert WarmupCosineDecay(1e-3, total_steps=400_000).warmup_steps == MAX_DEFAULT_WARMUP
    assert default_warmup_steps(9) == 0  # too short a run for a warm-up step


def test_serialization_round_trip():
    schedule = WarmupCosineDecay(3e-4, total_steps=500, warmup_steps=20, min_lr_ratio=0.1)
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule))
    assert isinstance(restored, WarmupCosineDecay)
    assert restored.get_config() == schedule.get_config()
    for step in (0, 10, 20, 300, 500):
        assert float(restored(step)) == pytest.approx(float(schedule(step)))


def formula_float32(step, peak, total, warmup, alpha):
    """The paper's schedule written out in float32 TF ops (txl_tf's own
    implementation before it moved onto Keras's CosineDecay)."""
    step = tf.cast(step, tf.float32)
    progress = tf.clip_by_value((step - warmup) / float(max(total - warmup, 1)), 0.0, 1.0)
    decayed = peak * ((1.0 - alpha) * 0.5 * (1.0 + tf.cos(math.pi * progress)) + alpha)
    if warmup == 0:
        return decayed
    return tf.where(step < warmup, peak * step / warmup, decayed)


SETTINGS = [(1e-3, 1000, 100, 0.004), (2.5e-4, 400, 0, 0.004), (3e-4, 500, 20, 0.1),
            (1e-2, 50, 50, 0.0), (5e-4, 37, 3, 1.0), (1e-3, 1, 0, 0.5), (7e-4, 10, 1, 0.004)]


@pytest.mark.parametrize("peak,total,warmup,alpha", SETTINGS)
def test_keras_cosine_decay_with_warmup_equals_the_formula_at_every_step(peak, total, warmup,
                                                                          alpha):
    """Keras's CosineDecay(warmup_target=peak) equals the formula within 1 float32
    ulp at every step (bitwise after warm-up; warm-up rounds peak * (step / W)
    where the formula rounds (peak * step) / W)."""
    keras_schedule = keras.optimizers.schedules.CosineDecay(
        0.0 if warmup else peak, max(total - warmup, 1), alpha=alpha,
        warmup_target=peak if warmup else None, warmup_steps=warmup)
    ours = WarmupCosineDecay(peak, total, warmup, alpha)
    steps = np.arange(total + 25)
    formula = np.array([float(formula_float32(s, peak, total, warmup, alpha)) for s in steps],
                       np.float32)
    for schedule in (keras_schedule, ours):
        got = np.array([float(schedule(s)) for s in steps], np.float32)
        np.testing.assert_array_max_ulp(got, formula, maxulp=1)
        np.testing.assert_array_equal(got[warmup:], formula[warmup:])
        np.testing.assert_allclose(got, [paper_lr(s, peak, total, warmup, alpha) for s in steps],
                                   rtol=1e-5, atol=peak * 1e-7)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="warmup_steps must be an integer in"):
        WarmupCosineDecay(1e-3, total_steps=10, warmup_steps=20)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        WarmupCosineDecay(1e-3, total_steps=10, min_lr_ratio=2.0)


@pytest.mark.parametrize("peak", [float("nan"), float("inf")])
def test_rejects_a_peak_that_is_not_finite(peak):
    """NaN passed `<= 0` (a NaN rate, NaN weights after the first step), as
    did inf."""
    with pytest.raises(TxlError, match=r"learning rate must be a finite number > 0, got "):
        WarmupCosineDecay(peak, total_steps=10)


@pytest.mark.parametrize("total", [float("nan"), float("inf"), 10.5])
def test_rejects_total_steps_that_are_not_an_integer(total):
    """Were int()'s ValueError and OverflowError (10.5: cut to 10)."""
    with pytest.raises(TxlError, match=r"total_steps must be an integer > 0, got "):
        WarmupCosineDecay(1e-3, total_steps=total)


def test_rejects_warmup_steps_that_are_not_an_integer():
    """10.5 was cut to 10 (as total_steps was)."""
    with pytest.raises(TxlError, match=r"warmup_steps must be an integer in \[0, total_steps=20\], "
                                       r"got 10\.5"):
        WarmupCosineDecay(1e-3, total_steps=20, warmup_steps=10.5)


@pytest.mark.parametrize("job", ["training.train", "training.train_lstm"])
def test_the_jobs_warmup_help_states_the_default_they_use(job):
    """Both jobs leave `--warmup_steps` None to `default_warmup_steps`: their
    help says its cap (train_lstm's said a tenth of the steps alone)."""
    import importlib
    spec = {name: (default, text)
            for _, name, default, text, _ in importlib.import_module(job).SPEC}
    default, text = spec["warmup_steps"]
    assert default is None and default_warmup_steps(10 * MAX_DEFAULT_WARMUP + 10) == 4000
    assert "a tenth of" in text and f"at most {MAX_DEFAULT_WARMUP:,}" in text
