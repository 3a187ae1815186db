"""The decoding cache: the memory, its attention keys and values, held in a
ring of `M + 1` slots that one-token steps write into in place.

Appending a token to a memory kept in time order shifts every slot, a copy
of the whole memory (and of its keys and values) per token. In the ring,
the new token goes to one free slot and nothing else moves; the slot that
falls out of the memory becomes the next free slot. Attention does not care
where a key sits, only at what distance from the query, so the ring is
attention over `concat(memory, token)` with the keys permuted, provided
each slot gets the position encoding of its own distance (`slot_order`).
Under `jit_compile` XLA updates the ring in place inside a `tf.while_loop`.

A step reads the ring before its own token is written (`call_with_cache`
`write=False`): the
free slot's entries are stale and the new token's key and value stand in
for them there, so an exported step takes the ring read-only and returns
only the new token's entries, which the host writes into the slot in place
(`export.decode_interface`). `write_token` is the ring's write here, as
`export.decode_cache` has it in numpy and `export.device_cache` in ONNX
(`tests/test_ring_backends.py` holds the three together). A step may also
write first (`write="first"`): each layer's key and value go into its rings
(`write_rows`, a scatter an exported graph runs in place) before the read,
which then takes them from there like any other slot (`decode_token`, the
step a GPU replays).
"""
from typing import NamedTuple

import keras
import tensorflow as tf

from txl_tf.app.reprs import fields_repr
from txl_tf.layers.memory import Memory, keep_last, row_flags


class DecodeCache(NamedTuple):
    """State of a one-token-at-a-time decode (`TransformerXL.decode_cache`).

    mems, keys, values: one tensor per layer: layer inputs float32
        `[B, S, d_model]`, attention keys as columns `[B, n_head, d_head,
        S]` and values `[B, n_head, S, d_head]` (compute dtype), S = M + 1
        slots (`RING_AXES`: the slot axis of each).
    valid: bool `[B, S]`, slots holding a real state (the free slot's flag
        is stale until the next token is written there).
    slot: int32 scalar, the free slot the next token is written to.
    row_slot: int32 `[B]`, each row's own free slot: `slot` for rows that
        took every step, the slot a stopped row had when it stopped.
    positions: `[2S, d_model]` (compute dtype), the relative encodings of
        the distances M, ..., 0, twice over (`in_slot_order`; fixed for the
        cache's life, shared by every layer: each layer's position scores
        are its queries, taken through its `r` projection, against them).
    position_keys: each layer's keys of those encodings by distance
        (`TransformerXL.decode_position_keys`), made once for the cache's
        life by a decoding loop, which steps then score against; `()`
        (not made) by default.
    """

    mems: tuple
    keys: tuple
    values: tuple
    valid: tf.Tensor
    slot: tf.Tensor
    row_slot: tf.Tensor
    positions: tf.Tensor
    position_keys: tuple = ()

    __repr__ = fields_repr

    def reset_rows(self, rows):
        """This cache with the rows where `rows` (bool `[B]`) is True
        forgotten (every slot marked empty and its entries zeros: a row
        whose states went non-finite decodes again), the others unchanged.

        Args:
            rows: bool `[B]`, True for the rows to clear.

        Returns:
            The new `DecodeCache`.
        """
        rows = row_flags(rows, self.valid)

        def cleared(states):  # a hidden NaN still reaches the output: 0 * NaN in the values
            flags = tf.reshape(rows, [-1] + [1] * (states.shape.rank - 1))
            return tf.where(flags, tf.zeros([], states.dtype), states)

        return self._replace(mems=tuple(map(cleared, self.mems)),
                             keys=tuple(map(cleared, self.keys)),
                             values=tuple(map(cleared, self.values)),
                             valid=self.valid & ~rows[:, None])


# The slot axis of each ring of a `DecodeCache`: keys are kept as columns, so
# that a step's scores are a plain matmul of its query against them:
# TensorFlow's batch matmul reads a transposed operand at about half the speed
# (measured at 1c8ee66; docs/export-and-serving.md has the figures).
RING_AXES = {"mems": 1, "keys": 3, "values": 2}


def swap_key_layout(keys):
    """Keys `[B, H, len, d_head]` as columns `[B, H, d_head, len]`, and back
    (the same transpose)."""
    return tf.transpose(keys, [0, 1, 3, 2])


class KeysValues(NamedTuple):
    """A memory held as its attention keys and values alone, one per layer,
    `[B, n_head, M, d_head]` in time order, and `mem_mask` bool `[B, M]`:
    no layer inputs and no ring (the Triton repository's cached model).
    Keys of invalid slots must be finite (they are hidden, not cleared)."""

    keys: tuple
    values: tuple
    mem_mask: tf.Tensor

    __repr__ = fields_repr


class CachedToken(NamedTuple):
    """What one step writes into the ring's free slot, one tensor per layer
    (`TransformerXL.call_with_cache`, `write=False`): mems, the layer inputs `[B, d_model]`;
    keys, values `[B, n_head, d_head]` (compute dtype)."""

    mems: tuple
    keys: tuple
    values: tuple

    __repr__ = fields_repr


class RowWrite(NamedTuple):
    """Where `write_rows` puts an update: the coordinates in the ring of each
    of its elements (`indices`, int32 `[*update_shape, rank]`) and the ring's
    slot axis (`axis`), the one coordinate that is not the element's own
    (`row_write`)."""

    indices: tf.Tensor
    axis: int


# The name scope of `write_rows`' scatter, its slot axis after it: the ONNX
# export writes it as a ScatterElements along that axis (export.onnx_export).
WRITE_ROWS_SCOPE = "txl_write_rows_axis"


def row_write(update_shape, slots, axis, row_axis=0):
    """The `RowWrite` of an update of `update_shape` (a ring's shape without
    its slot axis `axis`) that puts row b's entries (the rows on the ring's
    `row_axis`) at slot `slots[b]`. Made once a step, shared by every
    layer's write of that shape. Built from the rows' slots and constants,
    with no shape arithmetic (which an exported graph would run on the host).

    Args:
        update_shape: the update's dims: None for the rows' (read from
            `slots`), ints for the others.
        slots: int32 `[B]`, each row's slot.
        axis: the ring's slot axis.
        row_axis: the ring's row axis (not `axis`).

    Returns:
        A `RowWrite`.
    """
    rank = len(update_shape) + 1
    update_axes = [a for a in range(rank) if a != axis]
    row = update_axes.index(row_axis)

    def along(values, j):  # `values` laid on the update's axis j
        return tf.reshape(values, [-1 if i == j else 1 for i in range(rank - 1)])

    slots = along(tf.cast(slots, tf.int32), row)
    # Broadcast to the update's shape by adding zeros of its other dims (the
    # export keeps only the slots' coordinate: one add).
    fill = tf.zeros([1 if i == row else d for i, d in enumerate(update_shape)], tf.int32)
    coords = []
    for a in range(rank):
        if a == axis:
            coords.append(slots if rank == 2 else slots + fill)
            continue
        j = update_axes.index(a)
        count = tf.shape(slots)[row] if j == row else update_shape[j]
        coords.append(along(tf.range(count), j) + slots * 0 + fill)
    return RowWrite(tf.stack(coords, -1), axis)


def write_rows(ring, update, where):
    """`ring` with `update` written where `where` (a `RowWrite`) says, cast
    to the ring's dtype: one scatter, which an exported graph runs in place
    where its output is bound to the ring's buffer."""
    with tf.name_scope(f"{WRITE_ROWS_SCOPE}{where.axis}"):
        return tf.tensor_scatter_nd_update(ring, where.indices, tf.cast(update, ring.dtype))


def write_slots(cache, stopped):
    """Each row's slot for a step that writes before it reads: the ring's
    free slot, a stopped row's own (`row_slot`: outside its memory, which
    stays as it was). int32 `[B]`."""
    if stopped is None:
        return tf.fill(tf.shape(cache.valid)[:1], cache.slot)
    return tf.where(stopped, cache.row_slot, cache.slot)


def with_free_slot(tensor, axis):
    """`tensor` with one zero slot appended on `axis` (the ring's free slot).
    The zeros' shape is sliced from the tensor's, not unstacked: an exported
    graph's tools carry slices of a shape, not a Split of one
    (onnxruntime's `symbolic_shape_infer`)."""
    shape = tf.shape(tensor)
    shape = tf.concat([shape[:axis], [1], shape[axis + 1:]], 0)
    return tf.concat([tensor, tf.zeros(shape, tensor.dtype)], axis)


def slot_order(slot, size):
    """Time index (0 = oldest, `size - 1` = the token in `slot`) of each slot."""
    # Non-negative operands (0 <= slot < size): tf2onnx's Mod is C's remainder.
    return tf.math.floormod(tf.range(size) + size - slot - 1, size)


def doubled_index(slot, size):
    """Each slot's row in a table of the ring's `size` distances written
    twice over (`[2 * size, ...]`: rows i and `i + size` the same, the
    entry of time index i): `size - 1 - slot + s` for slot s, which is
    `slot_order(slot, size)[s]` or that plus `size`, so a gather by it
    takes no mod (one subtraction in an exported step)."""
    return tf.range(size) + (size - 1) - slot


def in_slot_order(doubled, index):
    """`[size, d]`: row `index[s]` of a table written twice over for each
    slot s, `index` being `doubled_index(slot, size)`: gathered, not sliced
    (a slice that starts at a tensor's value makes ONNX Runtime copy that
    value to the host: no CUDA graph), by the index the step's visibility
    is gathered by, so that an exported step computes it once.

    Args:
        doubled: `[2 * size, d]`, row i the encoding of time index `i mod
            size` (distance `size - 1 - i mod size`).
        index: int32 `[size]`, `doubled_index(slot, size)`.

    Returns:
        `[size, d]`, each slot's row.
    """
    return tf.gather(doubled, index)


def after(value, anchor):
    """`value` (`[B, ...]`), computed only once `anchor` (`[B, d]`) is: a
    data dependency that orders a ring's write after the step's reads of
    it. Without it XLA may schedule the write first, so it copies the whole
    ring every step to keep the old one for the reads (measured at 73ca8e9,
    `enwik8_base`, memory 2,100). Adds
    `min(|sum(anchor)|, 0)`, zero unless `anchor` holds a NaN."""
    zero = tf.minimum(tf.abs(tf.reduce_sum(tf.cast(anchor, tf.float32), -1)), 0.0)
    return value + tf.reshape(tf.cast(zero, value.dtype), [-1] + [1] * (value.shape.rank - 1))


def write_slot(ring, update, slot, axis, keep):
    """`ring` with `update` (size 1 on `axis`) written at `slot` on `axis`,
    except for the rows (axis 0) in `keep`, whose slot stays as it was (a
    dynamic update slice: in place under XLA)."""
    begin = [0] * ring.shape.rank
    begin[axis] = slot
    size = tf.unstack(tf.shape(ring))
    size[axis] = 1
    old = tf.slice(ring, tf.stack(begin), tf.stack(size))
    keep = tf.reshape(keep, [-1] + [1] * (ring.shape.rank - 1))
    return keras.ops.slice_update(ring, begin, tf.where(keep, old, tf.cast(update, ring.dtype)))


def write_token(cache, token, stopped=None):
    """`cache` with `token` (a `CachedToken`) written into its free slot,
    for the rows not in `stopped` (bool `[B]`; their slots and `row_slot`
    stay as they were), and the ring moved on one slot."""
    keep = tf.zeros(tf.shape(cache.valid)[:1], tf.bool) if stopped is None else stopped
    slot, size = cache.slot, tf.shape(cache.valid)[1]
    ring = {name: tuple(write_slot(r, tf.expand_dims(t, axis), slot, axis, keep)
                        for r, t in zip(getattr(cache, name), getattr(token, name)))
            for name, axis in RING_AXES.items()}
    valid = write_slot(cache.valid, tf.ones_like(cache.valid[:, :1]), slot, 1, keep)
    new_slot = tf.math.floormod(slot + 1, size)
    return cache._replace(**ring, valid=valid, slot=new_slot,
                          row_slot=tf.where(keep, cache.row_slot, new_slot))


def flat_cache(cache):
    """A `DecodeCache` as the tensors an exported graph passes in and out:
    `{mems [L, B, S, d_model], keys [L, B, H, d_head, S], values [L, B, H, S,
    d_head], valid [B, S],
    slot int32 [], row_slot int32 [B], positions [2S, d_model]}`."""
    return {"mems": tf.stack(cache.mems), "keys": tf.stack(cache.keys),
            "values": tf.stack(cache.values), "valid": cache.valid, "slot": cache.slot,
            "row_slot": cache.row_slot, "positions": cache.positions}


def in_time_order(ring, cache, axis):
    """The M slots of `ring` (one of `cache`'s, slot axis `axis`) in time
    order, oldest first: each row read from its own free slot on."""
    if cache.valid.shape[1] == 1:
        # No memory (M = 0): an empty slice. tf2onnx writes the gather's
        # transposes of its empty axis as reshapes to a 0, which ONNX reads as
        # "copy this axis": with one head the new positions' keys and values
        # were joined by a stale slot's.
        return ring[(slice(None),) * axis + (slice(0, 0),)]
    # The coordinates are int64: TensorFlow keeps the int32 math of a GPU on
    # the host, which would copy them to the GPU (tests/test_gpu_kernels.py);
    # the shapes and ranges they come from stay int32, on the host.
    size = cache.valid.shape[1] or tf.shape(cache.valid)[1]
    index = tf.math.floormod(tf.cast(cache.row_slot, tf.int64)[:, None] + 1
                             + tf.cast(tf.range(size - 1), tf.int64)[None, :],
                             tf.cast(size, tf.int64))
    # Each entry's coordinates on the axes up to the slot's (row, ..., slot), not a
    # gather with batch_dims: ONNX's GatherND with batch_dims is one that
    # onnxruntime's symbolic_shape_infer gives the wrong shape.
    slots = tf.reshape(index, tf.concat([tf.shape(index)[:1], tf.ones([axis - 1], tf.int32),
                                         tf.shape(index)[1:]], 0))
    sizes = [tf.shape(index)[0]] + [ring.shape[a] or tf.shape(ring)[a] for a in range(1, axis)]
    coords = [tf.reshape(tf.cast(tf.range(sizes[a]), tf.int64),
                         [-1 if i == a else 1 for i in range(axis + 1)]) for a in range(axis)]
    zeros = slots * 0
    for coord in coords[1:]:  # zeros of the shape [B, ..., M]
        zeros += coord * 0
    coords = [coord + zeros for coord in coords] + [slots + zeros]
    return tf.gather_nd(ring, tf.stack(coords, -1))


def ring_memory(cache):
    """The cache's memory in time order (`Memory`, M slots, oldest first).
    The mask is gathered as int32: a GPU has no `GatherNd` of bool, which
    TensorFlow would run on the CPU, copying the mask there and back."""
    valid = in_time_order(tf.cast(cache.valid, tf.int32), cache, 1)
    return Memory(tf.stack([in_time_order(m, cache, 1) for m in cache.mems]),
                  tf.cast(valid, tf.bool))
