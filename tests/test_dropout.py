"""The 16-bit dropout: rate, scale, independence, determinism, dtypes."""
import numpy as np
import pytest
import tensorflow as tf

from txl_tf.layers.dropout import Dropout


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dropout_keeps_the_expectation_at_the_rate(dtype):
    layer = Dropout(0.1, seed=3, dtype="float32" if dtype == "float32" else "mixed_bfloat16")
    x = tf.ones([63, 127, 129], dtype)  # odd size: the last word's second half is unused
    y = tf.cast(layer(x, training=True), tf.float32).numpy()
    kept = y != 0
    assert abs(1 - kept.mean() - 0.1) < 0.003  # 1.03 M draws: 4 sigma is 0.0012
    scale = 65536 / (65536 - round(0.1 * 65536))
    np.testing.assert_allclose(y[kept], scale, rtol=1e-2 if dtype == "bfloat16" else 1e-6)
    # Elements i and i + n/2 share a 32-bit word (its low and high halves):
    # their decisions must be uncorrelated.
    flat = kept.reshape(-1).astype(np.float64)
    half = flat.size // 2
    assert abs(np.corrcoef(flat[:half], flat[half:2 * half])[0, 1]) < 0.01


def test_dropout_draws_a_new_mask_each_call_and_is_off_in_inference():
    layer = Dropout(0.5, seed=7)
    x = tf.ones([1000])
    a, b = layer(x, training=True).numpy(), layer(x, training=True).numpy()
    assert (a != b).any()
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    same_seed = Dropout(0.5, seed=7)
    np.testing.assert_array_equal(same_seed(x, training=True).numpy(), a)


def test_dropout_gradient_is_the_mask_times_the_scale():
    layer = Dropout(0.25, seed=1)
    x = tf.random.normal([8, 33])

    @tf.function
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            total = tf.reduce_sum(y)
        return y, tape.gradient(total, x)

    y, grad = run(x)
    mask = (y.numpy() != 0)
    np.testing.assert_allclose(grad.numpy(), mask * 65536 / (65536 - 16384), rtol=1e-6)


def test_a_rate_just_below_one_keeps_one_level_not_a_division_by_zero():
    """A rate within 2^-17 of 1 (the config takes any rate < 1) rounded to
    all 2^16 levels dropped and divided by zero."""
    y = Dropout(0.999995, seed=1)(tf.ones([4096]), training=True).numpy()
    assert np.isfinite(y).all() and set(np.unique(y)) <= {0.0, 65536.0}


def test_a_draw_equal_to_the_threshold_is_kept():
    """Rate 65535/65536 drops 65,535 levels and keeps draws of the last one
    (1 in 65,536: ~16 of 2^20 elements), each scaled by 65536. Keeping only
    draws above the threshold would keep none and, at any rate, bias the
    expectation by one level against the scale."""
    y = Dropout(65535 / 65536, seed=1)(tf.ones([1 << 20]), training=True).numpy()
    kept = y[y != 0]
    assert 1 <= kept.size <= 60
    assert (kept == 65536).all()
