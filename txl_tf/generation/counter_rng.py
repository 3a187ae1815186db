"""A counter-based random number generator: `uniform(key, counter)` is a pure
function of two integers, written in exact integer arithmetic.

Every decoder (the compiled Keras loop and the runtimes' host loops) draws the
uniform for row r at step t as `uniform(row_key(seed_r), t)`, so a seed gives
the same draws on any backend, in any batch, at any batch position. The
mixing is Chris Wellons' `lowbias32` hash on uint32 values held in int64,
with 32-bit products taken in 16-bit halves (no int64 overflow, so TF, XLA
and numpy agree bit for bit). `tests/test_sampling.py` checks it against a
numpy transcription.
"""
import tensorflow as tf

from txl_tf.generation.sampling_settings import GOLDEN, MULTIPLIERS, STEP_SALT

_MASK32 = 0xFFFFFFFF


def _shr(x, bits):
    return tf.bitwise.right_shift(x, tf.constant(bits, tf.int64))


def _mulmod32(x, m):
    """`(x * m) mod 2**32` for `x < 2**32`, exact in int64."""
    high = tf.bitwise.left_shift(tf.bitwise.bitwise_and(_shr(x, 16) * m, 0xFFFF),
                                 tf.constant(16, tf.int64))
    return tf.bitwise.bitwise_and(high + tf.bitwise.bitwise_and(x, 0xFFFF) * m, _MASK32)


def mix32(x):
    """lowbias32: a bijective avalanche hash of a uint32 (held in int64)."""
    x = tf.bitwise.bitwise_xor(x, _shr(x, 16))
    x = _mulmod32(x, MULTIPLIERS[0])
    x = tf.bitwise.bitwise_xor(x, _shr(x, 15))
    x = _mulmod32(x, MULTIPLIERS[1])
    return tf.bitwise.bitwise_xor(x, _shr(x, 16))


def row_key(seed):
    """The 32-bit stream key of a non-negative int64 `seed` (any shape)."""
    seed = tf.convert_to_tensor(seed, tf.int64)
    low = tf.bitwise.bitwise_and(seed, _MASK32)
    high = tf.bitwise.bitwise_and(_shr(seed, 32), _MASK32)
    return mix32(tf.bitwise.bitwise_xor(low, mix32(tf.bitwise.bitwise_xor(high, GOLDEN))))


def uniform(key, counter):
    """float32 in `[0, 1)` on a grid of 2**-24 (exact in float32), from the
    stream `key` (see `row_key`) and the draw's `counter` (int64, same shape)."""
    counter = tf.bitwise.bitwise_and(tf.convert_to_tensor(counter, tf.int64), _MASK32)
    bits = mix32(tf.bitwise.bitwise_xor(key, mix32(tf.bitwise.bitwise_xor(counter,
                                                                          STEP_SALT))))
    return tf.cast(_shr(bits, 8), tf.float32) * (2.0 ** -24)
