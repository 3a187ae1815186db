"""The relative shift that aligns position scores with key positions."""
import tensorflow as tf


def rel_shift(x):
    """Aligns `x[..., i, k]` (k indexes the distance `klen - 1 - k`) to keys.

    Input and output are `[B, H, qlen, klen]`. Output `[..., i, j]` equals input
    `[..., i, j + qlen - 1 - i]`, the score of query i for the distance between
    query i (the last `qlen` keys are the queries) and key j. Entries with
    `j > i + klen - qlen` (above the causal diagonal) are garbage and must be
    masked. Pure pad / reshape / slice, so it traces, compiles and exports.
    """
    shape = tf.shape(x)
    batch, heads, qlen, klen = shape[0], shape[1], shape[2], shape[3]
    x = tf.pad(x, [[0, 0], [0, 0], [0, 0], [1, 0]])
    x = tf.reshape(x, [batch, heads, klen + 1, qlen])
    # tf.slice, not x[:, :, 1:]: the gradient of Slice is a Pad, that of
    # StridedSlice a generic StridedSliceGrad, far slower on CPU
    # (benchmarks/NOTES.md has the measured share of a training step).
    # Explicit sizes: tf2onnx mis-converts some size -1 slices.
    x = tf.slice(x, [0, 0, 1, 0], tf.stack([batch, heads, klen, qlen]))
    return tf.reshape(x, shape)
