"""Documents of different lengths as right-aligned, segment-aligned rows."""
import numpy as np
import tensorflow as tf

from txl_tf.checks.inputs import InputError


def check_lengths(lengths, token_ids):
    """Returns `lengths` as int32 `[B]`, or raises unless `1 <= lengths[b] <= L`
    for `token_ids` `[B, L]` (eagerly with the first bad row named; in a graph
    as an assertion, which XLA drops: callers that compile check up front)."""
    if not lengths.dtype.is_integer:
        raise InputError(f"lengths must be integers, got dtype {lengths.dtype.name}")
    if lengths.shape.rank is not None and lengths.shape.rank != 1:
        raise InputError(f"lengths must be [batch] (one length per document), got shape "
                         f"{lengths.shape}")
    batch = token_ids.shape[0]
    if lengths.shape[0] is not None and batch is not None and lengths.shape[0] != batch:
        raise InputError(f"lengths has {lengths.shape[0]} entries but token_ids have "
                         f"{batch} rows")
    # Range-checked before the int32 cast, which would wrap 2**32 + 5 to 5.
    if tf.executing_eagerly():
        problem = lengths_message(lengths.numpy(), int(token_ids.shape[1]))
        if problem:
            raise InputError(problem)
        return tf.cast(lengths, tf.int32)
    width = tf.shape(token_ids)[1]
    wide = tf.cast(lengths, tf.int64)  # uint64 above 2**63 turns negative: still caught
    ok = tf.reduce_all(wide >= 1) & tf.reduce_all(wide <= tf.cast(width, tf.int64)) & \
        tf.equal(tf.size(lengths), tf.shape(token_ids)[0])
    check = tf.debugging.Assert(
        ok, ["lengths must be one per row of token_ids, each in [1, L] with L =", width,
             "; got min", tf.reduce_min(wide), "max", tf.reduce_max(wide)],
        name="check_lengths")
    with tf.control_dependencies([check]):
        return tf.cast(lengths, tf.int32)


def lengths_message(lengths, width):
    """Names the first length outside `[1, width]` of a numpy array, or None."""
    bad = np.flatnonzero((lengths < 1) | (lengths > width))
    if not bad.size:
        return None
    row = int(bad[0])
    return (f"lengths[{row}] = {int(lengths[row])} is out of range: a document has 1 to L "
            f"= {width} tokens (token_ids[b, :lengths[b]] is row b's document)")


def right_align(token_ids, lengths, segment_len, width=None):
    """`(ids, token_mask)`, both `[B, n * segment_len]`: row b's document
    `token_ids[b, :lengths[b]]` moved to the end of its row and left-padded
    (with id 0, mask False), `n` the fewest segments that hold the longest
    document (at least 1), or, with `width` (a Python int), the fewest that
    hold `width` ids (a static shape). Cut into segments from the left,
    every document then ends at the last position, and its real tokens sit
    at the same place in their segments whatever the batch's other lengths."""
    source_width = tf.shape(token_ids)[1]
    if width is None:
        n_seg = tf.maximum((tf.reduce_max(lengths) + segment_len - 1) // segment_len, 1)
    else:
        n_seg = max(-(-int(width) // segment_len), 1)
    total = n_seg * segment_len
    source = tf.range(total)[None, :] - total + lengths[:, None]  # [B, total]
    mask = source >= 0
    ids = tf.gather(token_ids, tf.clip_by_value(source, 0, source_width - 1), batch_dims=1)
    return tf.where(mask, ids, tf.zeros([], ids.dtype)), mask
