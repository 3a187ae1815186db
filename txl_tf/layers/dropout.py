"""Dropout that draws 16 random bits per element instead of 32, and under
XLA draws them from a hash of the element's index."""
import keras
import tensorflow as tf

from txl_tf.layers.counter_hash import hashed_words
from txl_tf.layers.xla_context import compiling_with_xla

_LEVELS = 1 << 16


@keras.saving.register_keras_serializable(package="txl_tf")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` whose mask costs half the random numbers.

    Each 32-bit random word decides two elements with 16 bits each, so the
    generator, the costliest part of dropout on CPU (benchmarks/NOTES.md),
    runs half as often. The words come from the counter-based generator
    Keras's stateless dropout uses (Philox), one kernel; under XLA, which
    expands Philox into fusions of its own at every dropout, from a keyed
    hash of each word's index (`counter_hash`), which fuses into the mask's
    consumer. So the same seed drops other elements with XLA than without.
    The rate is rounded to a multiple of 2^-16 (0.1 becomes 0.100006) and
    the kept values are scaled by 1 / (1 - that rate), so the expectation
    is kept (exactly up to the compute dtype's rounding of the scale: in
    bfloat16 1.1111 is 1.1094, as in Keras's own Dropout).
    Seeds come from the layer's Keras seed generator, as in Keras's own
    Dropout. `noise_shape` is not used by this library; with one, Keras's Dropout runs.
    """

    def call(self, inputs, training=False):
        if not training or self.rate <= 0 or self.noise_shape is not None:
            return super().call(inputs, training=training)
        threshold = min(round(self.rate * _LEVELS), _LEVELS - 1)  # a rate < 1 keeps some
        seed = tf.cast(tf.math.floormod(tf.cast(self.seed_generator.next(), tf.int64),
                                        2 ** 31 - 1), tf.int32)  # as Keras does, for XLA
        size = tf.size(inputs)
        if compiling_with_xla():
            words = hashed_words(seed, (size + 1) // 2)
        else:
            words = tf.random.stateless_uniform([(size + 1) // 2], seed=seed, minval=None,
                                                maxval=None, dtype=tf.uint32)
        draws = tf.concat([tf.bitwise.bitwise_and(words, _LEVELS - 1),
                           tf.bitwise.right_shift(words, 16)], axis=0)
        keep = tf.reshape(draws[:size] >= threshold, tf.shape(inputs))
        scale = tf.cast(_LEVELS / (_LEVELS - threshold), inputs.dtype)
        return tf.where(keep, inputs * scale, tf.zeros((), inputs.dtype))
