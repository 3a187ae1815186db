"""Relative sinusoid position encoding of Transformer-XL."""
import keras
import tensorflow as tf


def relative_positions(klen, clamp_len=-1):
    """Distances `klen-1, ..., 1, 0` (float32), clamped at `clamp_len` if > 0.

    Row k of the encoding belongs to the distance `klen - 1 - k`, which is what
    the relative shift expects.
    """
    pos_seq = tf.range(tf.cast(klen, tf.float32) - 1.0, -1.0, -1.0)
    if clamp_len > 0:
        pos_seq = tf.minimum(pos_seq, float(clamp_len))
    return pos_seq


def sinusoid_encoding(pos_seq, d_model):
    """`[len(pos_seq), d_model]`: sin half then cos half (concatenated)."""
    inv_freq = 1.0 / (10000.0 ** (tf.range(0, d_model, 2, dtype=tf.float32) / d_model))
    angles = pos_seq[:, None] * inv_freq[None, :]
    return tf.concat([tf.sin(angles), tf.cos(angles)], axis=-1)


@keras.saving.register_keras_serializable(package="txl_tf")
class RelativePositionalEncoding(keras.layers.Layer):
    """Maps a key length `klen` to the `[klen, d_model]` relative encodings."""

    def __init__(self, d_model, *, clamp_len=-1, **kwargs):
        super().__init__(**kwargs)
        self.d_model = int(d_model)
        self.clamp_len = int(clamp_len)

    def call(self, klen):
        encoding = sinusoid_encoding(relative_positions(klen, self.clamp_len), self.d_model)
        return tf.cast(encoding, self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "clamp_len": self.clamp_len}
