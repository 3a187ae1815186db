"""Random words from a keyed hash of each element's index: the random bits of
dropout under XLA.

XLA expands TensorFlow's counter-based generator (Philox, ten rounds of
64-bit products) into code of its own at every dropout: the largest part of
a small training step's XLA compile (benchmarks/NOTES.md, section 14). A
hash of the index is a handful of 32-bit integer ops that XLA fuses into the
mask's consumer. Each word is two rounds of murmur3's 32-bit finalizer (a
bijection with full avalanche) over the index, each round keyed by a word
mixed from both halves of the seed, so that seeds one apart (a
Keras seed generator's next step) give unrelated words.
"""
import tensorflow as tf

_MURMUR3_FMIX = (0x85EBCA6B, 0xC2B2AE35)  # murmur3's finalizer multipliers
_GOLDEN = 0x9E3779B9  # 2^32 / the golden ratio: tells the two keys apart


def _mix(x):
    """murmur3's 32-bit finalizer on a uint32 tensor (a bijection)."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))
    x = x * tf.constant(_MURMUR3_FMIX[0], tf.uint32)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 13))
    x = x * tf.constant(_MURMUR3_FMIX[1], tf.uint32)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))


def hashed_words(seed, count):
    """`count` random 32-bit words of `seed`: word i is a keyed hash of i.

    Args:
        seed: an integer tensor of shape [2] (a Keras seed generator's
            state, as `tf.random.stateless_uniform` takes it).
        count: how many words (a scalar int32).

    Returns:
        A uint32 tensor of shape [count].
    """
    halves = tf.bitcast(tf.cast(seed, tf.int32), tf.uint32)
    outer = _mix(tf.bitwise.bitwise_xor(halves[1], _mix(halves[0])))
    inner = _mix(tf.bitwise.bitwise_xor(outer, tf.constant(_GOLDEN, tf.uint32)))
    index = tf.cast(tf.range(count), tf.uint32)
    return _mix(tf.bitwise.bitwise_xor(_mix(tf.bitwise.bitwise_xor(index, inner)), outer))
