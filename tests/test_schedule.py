"""The learning-rate schedule is the paper's warm-up + cosine decay and serialises."""
import math

import keras
import pytest

from txl_tf.schedule import WarmupCosineDecay


def paper_lr(step, peak=1e-3, total=1000, warmup=100, alpha=0.004):
    """The paper's TF code: linear warm-up, then tf.train.cosine_decay(alpha)."""
    if step < warmup:
        return peak * step / warmup
    progress = min(step - warmup, total - warmup) / (total - warmup)
    return peak * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * progress)) + alpha)


@pytest.mark.parametrize("step", [0, 1, 50, 99, 100, 101, 400, 550, 999, 1000, 1500])
def test_matches_the_paper(step):
    schedule = WarmupCosineDecay(1e-3, total_steps=1000, warmup_steps=100, min_lr_ratio=0.004)
    assert float(schedule(step)) == pytest.approx(paper_lr(step), rel=1e-5, abs=1e-12)


def test_no_warmup_starts_at_the_peak_and_ends_at_min_ratio():
    schedule = WarmupCosineDecay(2.5e-4, total_steps=400, min_lr_ratio=0.004)
    assert float(schedule(0)) == pytest.approx(2.5e-4)
    assert float(schedule(400)) == pytest.approx(2.5e-4 * 0.004)
    assert float(schedule(200)) == pytest.approx(2.5e-4 * (0.004 + 0.996 * 0.5))


def test_serialization_round_trip():
    schedule = WarmupCosineDecay(3e-4, total_steps=500, warmup_steps=20, min_lr_ratio=0.1)
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule))
    assert isinstance(restored, WarmupCosineDecay)
    assert restored.get_config() == schedule.get_config()
    for step in (0, 10, 20, 300, 500):
        assert float(restored(step)) == pytest.approx(float(schedule(step)))


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="warmup_steps must be in"):
        WarmupCosineDecay(1e-3, total_steps=10, warmup_steps=20)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        WarmupCosineDecay(1e-3, total_steps=10, min_lr_ratio=2.0)
