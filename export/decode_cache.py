"""The decode cache outside the graphs, as the host holds it: numpy (no
TensorFlow; the runtimes import only this side, `export.decode_interface`
holds the graphs and says what each tensor is). The same cache kept on the
runtime's device, its ring written by a small ONNX graph there, is
`export.device_cache`; many streams' caches in one batch, the session
table's slab, `export.slab`.

* The host's cache: the names, shapes and sizes of the cached decode
  interface's state, aligned buffers, and the host's half of a step
  (`step_feeds`, `write_token`).
* A row that stopped: a step reads every row from the shared free slot
  (`slot`); a row a step skipped (`stopped`) keeps its own (`row_slot`)
  while the ring moves on, and before it goes on its ring is rotated onto
  the shared slot (`realign_rows`; on the device, `Runtime.decode_step`
  puts the row back rotated with the slab's row graphs). Where each row
  stands is `RingPositions`.
"""
from typing import NamedTuple

import numpy as np

from txl_tf.app.moved_modules import answers_moved_names

# A name that moved out of this module (`from export.decode_cache import
# DeviceCache`): an ImportError naming where it went.
__getattr__ = answers_moved_names(__name__)

CACHE_NAMES = ("cache_mems", "keys", "values", "valid", "slot", "row_slot", "positions")
# What a segment read changes (`positions` is fixed for the cache's life).
CHANGING_NAMES = CACHE_NAMES[:-1]
INIT_INPUTS = ("mems", "mem_mask")
INIT_OUTPUTS = CACHE_NAMES
STEP_OUTPUTS = ("log_probs", "token_mems", "token_keys", "token_values")
READ_INPUTS = ("token_ids",) + CACHE_NAMES
READ_OUTPUTS = ("log_probs",) + tuple(f"new_{name}" for name in CHANGING_NAMES)
# The slot axis of each ring (`txl_tf.layers.ring_cache.RING_AXES` plus the
# stacked layers' axis; tests/test_ring_backends.py holds the two together).
SLOT_AXES = {"cache_mems": 2, "keys": 4, "values": 3, "valid": 1}
# Byte alignment of the host's cache buffers (what TensorFlow and oneDNN like).
ALIGNMENT = 64


def step_inputs(n_layer):
    """`decode_step`'s input names, in order."""
    return (("token_ids", "valid", "slot", "positions")
            + tuple(f"keys_{i}" for i in range(n_layer))
            + tuple(f"values_{i}" for i in range(n_layer)))


def token_inputs(n_layer):
    """`decode_token`'s input names, in order."""
    return (("token_ids", "stopped", "valid", "slot", "row_slot", "positions", "cache_mems")
            + step_inputs(n_layer)[4:])


def token_outputs(n_layer):
    """`decode_token`'s output names, in order: each ring's, written in
    place of the input of the same name without `new_`."""
    return (("log_probs", "new_cache_mems")
            + tuple(f"new_{name}" for name in step_inputs(n_layer)[4:])
            + ("new_valid", "new_slot", "new_row_slot"))


def token_in_place(n_layer):
    """The inputs of `decode_token` that it writes in place: each is bound
    as the output `new_<name>` too (the flags, the layer inputs, each
    layer's rings; not the slots, which go to other buffers: `device_cache.MOVED`)."""
    return ("cache_mems", "valid") + step_inputs(n_layer)[4:]


def cache_shapes(config, mem_len, batch="batch"):
    """`{name: [int or axis name, ...]}` of the cache tensors."""
    size, layers = int(mem_len) + 1, config.n_layer
    heads, d_head, d_model = config.n_head, config.d_head, config.d_model
    return {"cache_mems": [layers, batch, size, d_model],
            "keys": [layers, batch, heads, d_head, size],
            "values": [layers, batch, heads, size, d_head],
            "valid": [batch, size], "slot": [], "row_slot": [batch],
            "positions": [2 * size, d_model]}


def cache_bytes(config, mem_len, cache_dtype="float32"):
    """`{"per_stream": bytes, "shared": bytes}` of a decode cache: what each
    stream (row) holds (layer inputs, valid flags, keys and values in
    `cache_dtype`; the rest float32) and what all rows share (`positions`, `slot`)."""
    shapes = cache_shapes(config, mem_len, batch=1)
    sizes = {name: 4 for name in shapes}
    sizes.update(valid=1, keys=np.dtype(cache_dtype).itemsize,
                 values=np.dtype(cache_dtype).itemsize)
    total = {name: sizes[name] * int(np.prod(shape, dtype=np.int64))
             for name, shape in shapes.items()}
    shared = total["positions"] + total["slot"]
    return {"per_stream": sum(total.values()) - shared, "shared": shared}


def host_cache(tensors):
    """The cache as the host holds it: `{name: numpy array}` of
    `decode_init`'s outputs (any array-likes), each copied into a fresh
    aligned buffer that `write_token` may write in place."""
    cache = {}
    for name in CACHE_NAMES:
        value = tensors[name]
        value = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        cache[name] = host_empty(name, value.shape, value.dtype)
        cache[name][...] = value
    return cache


def copy_cache(cache):
    """A copy of a host cache (`host_cache`) that steps may write."""
    return host_cache(cache)


def aligned_empty(shape, dtype):
    """An uninitialized numpy array whose data starts at an `ALIGNMENT` boundary."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def layer_aligned_empty(shape, dtype):
    """An uninitialized numpy array `[L, ...]` each of whose `[i]` starts at
    an `ALIGNMENT` boundary: every layer's bytes are padded up to a multiple
    of it (the array is then not contiguous, its layers are)."""
    dtype = np.dtype(dtype)
    strides, size = [], dtype.itemsize
    for dim in reversed(shape[1:]):
        strides.insert(0, size)
        size *= int(dim)
    layer_stride = -(-size // ALIGNMENT) * ALIGNMENT
    raw = np.empty(layer_stride * int(shape[0]) + ALIGNMENT, np.uint8)
    return np.ndarray(shape, dtype, buffer=raw, offset=-raw.ctypes.data % ALIGNMENT,
                      strides=[layer_stride] + strides)


def host_empty(name, shape, dtype):
    """An uninitialized array for the host cache's `name`. The rings stacked
    by layer (`LAYER_STACKED`) start every layer at an `ALIGNMENT` boundary:
    a step hands each layer to the graph on its own (`step_feeds`), and
    TensorFlow takes an aligned buffer without a copy. (Stacked tight, the
    layers of `wt103_base` at batch 1 start at odd multiples of 8 bytes:
    the SavedModel copied each one every step; measured at fc5160f.)"""
    if name in LAYER_STACKED:
        return layer_aligned_empty(shape, dtype)
    return aligned_empty(shape, dtype)


def take_rows(cache, rows):
    """The host cache of `rows` (a copy)."""
    rows = np.asarray(rows)
    return host_cache({name: (np.take(value, rows, BATCH_AXES[name]) if name in BATCH_AXES
                              else value)
                       for name, value in cache.items()})


def concat_rows(caches):
    """One host cache of the rows of `caches`, in order (ring positions
    alike: `slot` must be the same in all, as after a `decode_read`)."""
    if len({int(np.asarray(c["slot"])) for c in caches}) != 1:  # OrtValues too
        raise ValueError("caches with different ring positions cannot be joined")
    return host_cache({name: (np.concatenate([c[name] for c in caches], BATCH_AXES[name])
                              if name in BATCH_AXES else caches[0][name])
                       for name in CACHE_NAMES})


# The host cache's rings stacked by layer (`[L, ...]`).
LAYER_STACKED = ("cache_mems", "keys", "values")
# The batch axis of each per-row array of a host cache (the others are shared).
BATCH_AXES = {"cache_mems": 1, "keys": 1, "values": 1, "valid": 0, "row_slot": 0}


def ring_axis(name):
    """The slot axis of the host cache's ring `name` (`cache_mems`, `keys`,
    `values` or `valid`)."""
    return SLOT_AXES[name]


def step_feeds(cache):
    """`{input name: array}` of `decode_step` but `token_ids`: the ring's
    flags and position table, and each layer's keys and values as views of
    the stacked arrays (no copy)."""
    feeds = {name: cache[name] for name in ("valid", "slot", "positions")}
    for kind in ("keys", "values"):
        feeds.update({f"{kind}_{i}": layer for i, layer in enumerate(cache[kind])})
    return feeds


def write_token(cache, outputs, stopped):
    """Writes a step's token (`outputs`: `decode_step`'s, numpy) into the
    host cache's free slot in place, for the rows not in `stopped` (bool
    `[B]`; their slot and flags stay as they were), and moves the ring on:
    what `txl_tf.layers.ring_cache.write_token` does inside the graph."""
    slot, size = int(cache["slot"]), cache["valid"].shape[1]
    live = np.flatnonzero(~np.asarray(stopped, np.bool_))
    pairs = (("cache_mems", "token_mems"), ("keys", "token_keys"), ("values", "token_values"))
    if live.size == cache["valid"].shape[0]:
        for ring, token in pairs:
            _at_slot(cache[ring], ring, slot)[...] = outputs[token]
    else:
        for row in live:
            for ring, token in pairs:
                _at_slot(cache[ring], ring, slot)[:, row] = outputs[token][:, row]
    cache["valid"][live, slot] = True
    cache["row_slot"][live] = (slot + 1) % size
    cache["slot"][...] = (slot + 1) % size


class RingPositions(NamedTuple):
    """Where a decode cache's ring stands, on the host: `slot` (int, the
    shared free slot) and `row_slot` (int32 numpy `[B]`, each row's own:
    `slot` for a row that took every step, the slot it had when it stopped
    for a row that stopped)."""

    slot: int
    row_slot: np.ndarray

    def advanced(self, stopped, size):
        """The positions after a step in which the rows in `stopped` (bool
        `[B]`) took no token, in a ring of `size` slots (what `write_token`
        and the ring's write graph set)."""
        slot = (self.slot + 1) % size
        return RingPositions(slot, np.where(stopped, self.row_slot, slot).astype(np.int32))

    def behind(self, stopped):
        """The rows not in `stopped` whose own free slot is not the shared
        one (rows that stopped before): their indices."""
        late = self.row_slot != self.slot
        if not late.any():  # (every row at the shared slot: the usual step)
            return np.flatnonzero(late)
        return np.flatnonzero(~np.asarray(stopped, np.bool_) & late)

    def realigned(self, rows):
        """These positions once `rows` are rotated onto the shared slot."""
        row_slot = self.row_slot.copy()
        row_slot[rows] = self.slot
        return RingPositions(self.slot, row_slot)


def ring_positions(slot, row_slot):
    """`RingPositions` of a cache's `slot` and `row_slot` (numpy: copied)."""
    return RingPositions(int(slot), np.array(row_slot, np.int32))


def realign_rows(cache, rows, slot):
    """Rotates each of `rows` of the host cache (in place) onto the shared
    free slot `slot`: a row that stopped kept its own slot while the ring
    moved on, and a step reads every row from the shared one. Attention sees
    only each slot's distance from the free slot, so the rotated row holds
    the same memory (as `CacheSlab.admit` rotates a stream onto the slab's
    slot); one copy of each row's rings."""
    size = cache["valid"].shape[1]
    for row in np.asarray(rows).tolist():
        shift = (int(slot) - int(cache["row_slot"][row])) % size
        for name in SLOT_AXES:
            view = rows_view(cache[name], name, row, row + 1)
            view[...] = np.roll(view, shift, ring_axis(name))
        cache["row_slot"][row] = slot


def in_time_order(ring, row_slot, axis):
    """Each row's ring (batch on axis `axis - 1`, slots on `axis`) from its
    oldest slot to its newest, the free slot (`row_slot`) left out: a fresh
    contiguous array. Two slice copies a row, not a gather, which is
    slower (measured at c8df480)."""
    size = ring.shape[axis]
    shape = list(ring.shape)
    shape[axis] = size - 1
    out = np.empty(shape, ring.dtype)
    lead = (slice(None),) * (axis - 1)
    for row, slot in enumerate(np.asarray(row_slot).tolist()):
        newer = size - 1 - slot  # the slots after the free one are the oldest
        out[lead + (row, slice(0, newer))] = ring[lead + (row, slice(slot + 1, size))]
        out[lead + (row, slice(newer, size - 1))] = ring[lead + (row, slice(0, slot))]
    return out


def _at_slot(ring, name, slot):
    """The view of the ring `name` (`cache_mems`, `keys` or `values`) at one slot."""
    return ring[(slice(None),) * ring_axis(name) + (slot,)]


def rows_view(array, name, start, stop):
    """The view of rows `start:stop` of the cache array `name`."""
    return array[(slice(None),) * BATCH_AXES[name] + (slice(start, stop),)]
