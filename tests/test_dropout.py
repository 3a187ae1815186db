"""The 16-bit dropout: rate, scale, independence, determinism, dtypes."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf.layers.counter_hash import hashed_words
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


@pytest.mark.parametrize("jit_compile", [False, True])  # Philox's words; the hash's
def test_dropout_gradient_is_the_mask_times_the_scale(jit_compile):
    layer = Dropout(0.25, seed=1)
    x = tf.random.normal([8, 33])

    @tf.function(jit_compile=jit_compile)
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


# --------------------------------------------------------- under XLA: the hash
def numpy_hashed_words(seed, count):
    """The counter hash in numpy: two keyed rounds of murmur3's finalizer."""
    def mix(x):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x85EBCA6B)
        x = x ^ (x >> np.uint32(13))
        x = x * np.uint32(0xC2B2AE35)
        return x ^ (x >> np.uint32(16))

    with np.errstate(over="ignore"):
        low, high = np.asarray(seed, np.int32).view(np.uint32)
        outer = mix(high ^ mix(low))
        inner = mix(outer ^ np.uint32(0x9E3779B9))
        return mix(mix(np.arange(count, dtype=np.uint32) ^ inner) ^ outer)


def xla_masks(layer, x, calls):
    """`calls` successive training masks of `layer` on `x`, XLA-compiled."""
    run = tf.function(lambda x: layer(x, training=True), jit_compile=True)
    return [run(x).numpy() != 0 for _ in range(calls)]


def max_cross_correlation(a, b):
    """The largest |correlation| of two 0/1 vectors over all circular shifts."""
    a, b = a - a.mean(), b - b.mean()
    spectrum = np.fft.rfft(a) * np.conj(np.fft.rfft(b))
    return np.abs(np.fft.irfft(spectrum, a.size)).max() / (a.std() * b.std() * a.size)


def test_hashed_words_are_the_numpy_hash_and_xla_masks_are_its_16_bit_halves():
    seed = tf.constant([123456789, 2 ** 31 - 2], tf.int32)
    np.testing.assert_array_equal(hashed_words(seed, 1001).numpy(),
                                  numpy_hashed_words(seed.numpy(), 1001))
    layer = Dropout(0.3, seed=5)
    state = layer.seed_generator.state.numpy()
    x = tf.ones([7, 9, 11])
    mask, = xla_masks(layer, x, 1)
    size = x.shape.num_elements()
    words = numpy_hashed_words(np.mod(state.astype(np.int64), 2 ** 31 - 1), (size + 1) // 2)
    draws = np.concatenate([words & 0xFFFF, words >> 16])[:size]
    np.testing.assert_array_equal(mask.reshape(-1), draws >= round(0.3 * 65536))


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_under_xla_the_rate_holds_and_no_two_elements_of_a_mask_are_related(rate):
    """Over 2^20 elements: the share dropped within 5 sigma of the rate, and
    the mask's correlation with itself at every circular shift (neighbours,
    the word halves n/2 apart, rows) below 7 sigma (an independent mask's
    largest of 2^20 is about 5.3)."""
    x = tf.ones([1 << 20])
    mask, = xla_masks(Dropout(rate, seed=11), x, 1)
    n, level = mask.size, round(rate * 65536) / 65536
    assert abs((1 - mask.mean()) - level) < 5 * np.sqrt(level * (1 - level) / n)
    flat = mask.astype(np.float64)
    flat -= flat.mean()
    spectrum = np.abs(np.fft.rfft(flat)) ** 2
    autocorrelation = np.fft.irfft(spectrum, n) / (flat.var() * n)
    assert abs(autocorrelation[0] - 1) < 1e-9
    assert np.abs(autocorrelation[1:]).max() < 7 / np.sqrt(n)


def test_under_xla_masks_are_unrelated_across_steps_layers_and_seeds():
    """A layer's masks at consecutive steps (its seed one apart), two layers'
    at the same step and one layer's under two global seeds: no circular
    shift of one correlates with the other beyond 7 sigma; over 64 steps each
    element is dropped as often as independent draws make it (the variance
    of its count within 10% of the binomial's: a mask repeated or tied to
    its position fails)."""
    x = tf.ones([1 << 16])
    n = x.shape.num_elements()
    keras.utils.set_random_seed(0)
    first, second = Dropout(0.1), Dropout(0.1)
    steps = np.stack(xla_masks(first, x, 64)).astype(np.float64)
    other_layer, = xla_masks(second, x, 1)
    keras.utils.set_random_seed(1)
    other_seed, = xla_masks(Dropout(0.1), x, 1)
    pairs = [(steps[0], steps[1]), (steps[1], steps[2]), (steps[0], other_layer),
             (steps[0], other_seed)]
    for a, b in pairs:
        assert max_cross_correlation(a, b.astype(np.float64)) < 7 / np.sqrt(n)
    counts = steps.sum(0)
    kept = counts.mean() / 64
    assert abs(counts.var() / (64 * kept * (1 - kept)) - 1) < 0.1


def test_under_xla_the_same_seed_gives_the_same_masks():
    x = tf.ones([8, 33])
    a, b = Dropout(0.25, seed=4), Dropout(0.25, seed=4)
    np.testing.assert_array_equal(np.stack(xla_masks(a, x, 3)), np.stack(xla_masks(b, x, 3)))
