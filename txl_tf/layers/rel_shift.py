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
    return rel_shift_padded(tf.pad(x, [[0, 0], [0, 0], [0, 0], [1, 0]]))


def rel_shift_padded(x):
    """`rel_shift` of scores that come with their pad column: `x` is
    `[B, H, qlen, klen + 1]`, column 0 the pad, columns 1.. the scores
    `rel_shift` takes. The pad's values reach only the garbage entries
    above the causal diagonal, so any finite values do: scores against
    position keys with one more row first (`with_pad_row`) come out this
    way, and no pass over the scores pads them.

    Args:
        x: `[B, H, qlen, klen + 1]` scores, the first column the pad.

    Returns:
        `[B, H, qlen, klen]`, as `rel_shift` returns.
    """
    static = x.shape[:3].concatenate([None if x.shape[3] is None else x.shape[3] - 1])
    shape = tf.shape(x)
    batch, heads, qlen, width = shape[0], shape[1], shape[2], shape[3]
    x = tf.reshape(x, [batch, heads, width, qlen])
    # tf.slice, not x[:, :, 1:]: the gradient of Slice is a Pad, that of
    # StridedSlice a generic StridedSliceGrad, far slower on CPU
    # (benchmarks/NOTES.md has the measured share of a training step).
    # Explicit sizes: tf2onnx mis-converts some size -1 slices.
    x = tf.slice(x, [0, 0, 1, 0], tf.stack([batch, heads, width - 1, qlen]))
    x = tf.reshape(x, [batch, heads, qlen, width - 1])
    x.set_shape(static)
    return x


def with_pad_row(keys, axis):
    """`keys` with a row of zeros first on `axis` (the distance axis of
    position keys or biases): their scores, the queries' products with
    them, are `rel_shift_padded`'s input, its pad column exactly zero.

    Args:
        keys: a tensor whose `axis` runs over the distances.
        axis: that axis (non-negative).

    Returns:
        `keys` with one more entry on `axis`, zeros, first.
    """
    padding = [[0, 0]] * len(keys.shape)
    padding[axis] = [1, 0]
    return tf.pad(keys, padding)
