"""Documents of different lengths as right-aligned, segment-aligned rows."""
import tensorflow as tf

# The lengths' checks live with the other input checks (`check_batch` uses them).
from txl_tf.checks.inputs import check_lengths, lengths_message  # noqa: F401


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


def padding_first(token_mask):
    """`(order, inverse)`, int32 `[B, T]`: gathering a row by `order` puts its
    padding (`token_mask` False) first and its real tokens after it, in their
    order; gathering by `inverse` puts them back. Absolute positions counted
    from a segment's last key (`attn_type` 2 and 3) then give a padded row's
    tokens the positions they have alone."""
    order = tf.argsort(tf.cast(token_mask, tf.int32), axis=1, stable=True)
    return order, tf.argsort(order, axis=1, stable=True)
