"""The recurrence memory: cached layer inputs of earlier segments and which slots are real."""
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from txl_tf.app.reprs import fields_repr
from txl_tf.checks.numpy_checks import InputError, check_flag
from txl_tf.errors import TxlError


class Memory(NamedTuple):
    """Segment-level recurrence state, batch-major.

    Args:
        mems: float32 `[n_layer, B, M, d_model]`; `mems[i]` holds the inputs
            of layer i (layer 0: the embedding output) at the last M
            positions.
        mem_mask: bool `[B, M]`; True where a slot holds a real state.
            Invalid slots are never attended, so an all-invalid memory is
            exactly "no history".
    """

    mems: tf.Tensor
    mem_mask: tf.Tensor

    __repr__ = fields_repr

    @property
    def mem_len(self):
        return self.mems.shape[2]

    def reset_rows(self, rows, zero_filled=False):
        """This memory with the rows where `rows` (bool `[B]`) is True
        forgotten, the others unchanged: a new document starts there.

        Args:
            rows: bool `[B]`, True for the rows to clear.
            zero_filled: the cleared rows become zero states that are
                attended (a zero-filled fresh memory's start) instead of
                empty slots.

        Returns:
            The new `Memory`.
        """
        rows = row_flags(rows, self.mem_mask)
        zero_filled = check_flag("zero_filled", zero_filled)
        mems = tf.where(rows[None, :, None, None], tf.zeros([], self.mems.dtype), self.mems)
        mem_mask = tf.where(rows[:, None], tf.constant(bool(zero_filled)), self.mem_mask)
        return Memory(mems, mem_mask)


def row_flags(rows, mask):
    """`rows` as a bool tensor, or `InputError` unless it is bool `[B]`, B
    the batch (axis 0) of `mask` (static shapes: nothing in the graph)."""
    try:
        rows = tf.convert_to_tensor(rows)
    except (TypeError, ValueError):  # None, rows of other lengths
        raise InputError(f"rows must be bool [batch] ({mask.shape[0]}), True for the rows to "
                         f"clear; got a {type(rows).__name__}") from None
    if rows.dtype != tf.bool or not rows.shape.is_compatible_with(mask.shape[:1]):
        raise InputError(f"rows must be bool [batch] ({mask.shape[0]}), True for the rows to "
                         f"clear; got {rows.dtype.name} of shape {rows.shape}")
    return rows


def initial_memory(n_layer, batch_size, mem_len, d_model, zero_filled=False):
    """A fresh memory: empty (nothing attended) or, with `zero_filled`, the
    paper code's start of zero states that are attended."""
    mems = tf.zeros([n_layer, batch_size, mem_len, d_model], tf.float32)
    mem_mask = tf.fill([batch_size, mem_len], bool(zero_filled))
    return Memory(mems, mem_mask)


def clear_invalid_slots(memory):
    """The memory with invalid slots zeroed, so whatever they held (NaN, inf)
    cannot reach an output: masked attention still multiplies their values
    by 0, and they are carried into the new memory."""
    if not memory.mem_mask.shape.is_compatible_with(memory.mems.shape[1:3]):
        raise InputError(f"mem_mask must be [batch, mem_len] {memory.mems.shape[1:3]} as mems "
                         f"{memory.mems.shape} are, got shape {memory.mem_mask.shape}")
    mems = tf.where(memory.mem_mask[None, :, :, None], memory.mems,
                    tf.zeros([], memory.mems.dtype))
    return Memory(mems, memory.mem_mask)


def update_memory(memory, layer_inputs, token_valid=None, keep_gradient=False,
                  row_lengths=None):
    """Keeps the last M positions of `concat(memory, layer_inputs)`.

    `layer_inputs` is `[n_layer, B, T, d_model]`; new positions are real
    unless `token_valid` (bool `[B, T]`) is False there, which makes them
    invalid slots. With `row_lengths` (int `[B]`, right-padded rows: row b's
    real positions are its first `row_lengths[b]`), row b keeps the M
    positions ending at its last real one instead (its memory as it was for
    a row of padding alone). The result has the memory's geometry and carries
    no gradient (the paper's rule), unless `keep_gradient`: then a later
    segment's loss reaches the weights through it.
    """
    layer_inputs = tf.convert_to_tensor(layer_inputs)
    n_layer, batch, _, d_model = memory.mems.shape if memory.mems.shape.rank == 4 else [None] * 4
    if not layer_inputs.shape.is_compatible_with([n_layer, batch, None, d_model]):
        raise InputError(f"layer_inputs must be [n_layer, batch, T, d_model] as the memory's "
                         f"{memory.mems.shape} are, got shape {layer_inputs.shape}")
    if token_valid is not None:
        token_valid = tf.convert_to_tensor(token_valid)
        if token_valid.dtype != tf.bool or not token_valid.shape.is_compatible_with(
                layer_inputs.shape[1:3]):
            raise InputError(f"token_valid must be bool [batch, T] {layer_inputs.shape[1:3]}, "
                             f"got {token_valid.dtype.name} of shape {token_valid.shape}")
    mems = tf.concat([memory.mems, tf.cast(layer_inputs, tf.float32)], axis=2)
    if token_valid is None:
        batch, qlen = tf.shape(layer_inputs)[1], tf.shape(layer_inputs)[2]
        token_valid = tf.ones([batch, qlen], tf.bool)
    mem_mask = tf.concat([memory.mem_mask, token_valid], axis=1)
    mem_len = tf.shape(memory.mems)[2]
    if row_lengths is None:
        if memory.mems.shape.rank == 4 and memory.mems.shape[2] is not None:
            # A static M (an export's): a slice by constants, which takes no
            # shape arithmetic and which onnxruntime's symbolic_shape_infer sizes.
            last = slice(-memory.mems.shape[2], None) if memory.mems.shape[2] else slice(0, 0)
            mems, mem_mask = mems[:, :, last], mem_mask[:, last]
        else:
            mems, mem_mask = keep_last(mems, 2, mem_len), keep_last(mem_mask, 1, mem_len)
    else:  # row b: the slots [row_lengths[b], row_lengths[b] + M) of the concatenation
        row_lengths = tf.cast(row_lengths, tf.int32)
        message = "row_lengths must be in [0, T] (T: the new positions)"
        with tf.control_dependencies([  # XLA drops them: there the gather clamps
                tf.debugging.assert_non_negative(row_lengths, message=message),
                tf.debugging.assert_less_equal(row_lengths, tf.shape(layer_inputs)[2],
                                               message=message)]):
            window = tf.identity(row_lengths)[:, None] + tf.range(mem_len)[None, :]
        mems = tf.transpose(tf.gather(tf.transpose(mems, [1, 0, 2, 3]), window, axis=2,
                                      batch_dims=1), [1, 0, 2, 3])
        mem_mask = tf.gather(mem_mask, window, axis=1, batch_dims=1)
    new_mems = mems if keep_gradient else tf.stop_gradient(mems)
    new_mem_mask = tf.stop_gradient(mem_mask)
    new_mems.set_shape(memory.mems.shape)
    new_mem_mask.set_shape(memory.mem_mask.shape)
    return Memory(new_mems, new_mem_mask)


def keep_last(tensor, axis, count):
    """The last `count` entries of `tensor` on `axis` (a slice with explicit
    sizes: tf2onnx mis-converts a size -1 slice with a dynamic begin, and
    writes an open end as a large constant that onnxruntime's
    `symbolic_shape_infer` takes for a size). Begin and sizes are slices of
    the tensor's shape, not its unstacked dims: the tool carries no values
    through a Split."""
    shape, rank = tf.shape(tensor), tensor.shape.rank
    count = tf.reshape(tf.cast(count, tf.int32), [1])
    begin = tf.concat([tf.zeros([axis], tf.int32), shape[axis:axis + 1] - count,
                       tf.zeros([rank - axis - 1], tf.int32)], 0)
    return tf.slice(tensor, begin, tf.concat([shape[:axis], count, shape[axis + 1:]], 0))


def as_memory(value):
    """Accepts a `Memory`, a `(mems, mem_mask)` pair or a dict with those keys."""
    if isinstance(value, Memory):
        return value
    if isinstance(value, dict):
        try:
            return Memory(value["mems"], value["mem_mask"])
        except KeyError as missing:
            raise TxlError(f"memory dict needs keys 'mems' and 'mem_mask', missing {missing}")
    if isinstance(value, (tuple, list)) and len(value) == 2:
        # Nested lists as arrays: Keras takes only tensors positionally.
        return Memory(*(np.asarray(v) if isinstance(v, list) else v for v in value))
    raise TxlError(
        "memory must be a txl_tf.Memory (mems [n_layer, B, M, d_model], mem_mask [B, M]); "
        f"got {type(value).__name__}")
