"""The decode cache outside the graphs, as the host holds it: numpy (no
TensorFlow; the runtimes import only this side, `export.decode_interface`
holds the graphs and says what each tensor is). The same cache kept on the
runtime's device, its ring written by a small ONNX graph there, is
`export.device_cache`.

* The host's cache: the names, shapes and sizes of the cached decode
  interface's state, aligned buffers, and the host's half of a step
  (`step_feeds`, `write_token`).
* A row that stopped: a step reads every row from the shared free slot
  (`slot`); a row a step skipped (`stopped`) keeps its own (`row_slot`)
  while the ring moves on, and before it goes on its ring is rotated onto
  the shared slot (`realign_rows`; on the device, `Runtime.decode_step`
  puts the row back rotated with the slab's row graphs). Where each row
  stands is `RingPositions`.
* The slab (`CacheSlab`): many streams' caches in one batch that steps
  advance in place. A decode step takes one ring slot for every row of its
  batch. Streams that started at different times sit at different slots of
  their own rings; attention sees only each slot's distance from the free
  slot, so a stream's ring can be rotated to any slot without changing what
  it computes. The slab rotates each stream it admits to its own slot (one
  copy of that stream's cache), then every step reads and writes the slab's
  rows in place: no gather, no scatter, no copy of any cache per step. Rows
  are kept contiguous (an evicted row's place takes the last row), so a
  step's batch is a view of the slab's first rows. Its twin on the device
  is `export.device_slab.DeviceSlab`.
"""
import functools
import threading
from typing import NamedTuple

import numpy as np

from txl_tf.app.moved_modules import answers_moved_names
from txl_tf.errors import TxlError

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
            view = _rows(cache[name], name, row, row + 1)
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


# ----------------------------------------------------------------- the slab
def one_thread_at_a_time(method):
    """`method` of a slab, which serves one thread at a time: a call while
    another thread is inside one of its methods raises `TxlError` naming
    the slab and the rule (it would read or write rows the other thread is
    changing). A method calling another goes on."""
    @functools.wraps(method)
    def guarded(slab, *args, **kwargs):
        me = threading.get_ident()
        if slab._user == me:
            return method(slab, *args, **kwargs)
        if not slab._in_use.acquire(blocking=False):
            raise TxlError(f"{type(slab).__name__} is in use by another thread: a slab serves "
                           "one thread at a time (a SessionTable holds its lock around its "
                           "slab; elsewhere hold one around every use of it)")
        try:
            slab._user = me
            return method(slab, *args, **kwargs)
        finally:
            slab._user = None
            slab._in_use.release()
    return guarded


class CacheSlab:
    """Up to `capacity` streams' host decode caches (`decode_interface`), one
    row each, on one shared ring slot.

    ```python
    slab = CacheSlab(16)
    slab.admit("alice", runtime.decode_init(memory))   # a one-row cache
    log_probs, _ = runtime.decode_step(ids, slab.batch(), stopped)  # rows in slab.keys order
    cache = slab.evict("alice")                        # her one-row cache again
    ```
    A step advances the slab's rows in place. `export.sessions.SessionTable`
    steps it with `step`, through the runtime's `GenerationBackend`
    (`next_cached`, no checks per token). On a device runtime the slab is an
    `export.device_slab.DeviceSlab` (the same methods, its rows in device
    buffers). A slab serves one thread at a time: a call made while
    another thread is in one raises `TxlError` (`one_thread_at_a_time`).
    """

    def __init__(self, capacity, next_cached=None):
        self._in_use, self._user = threading.Lock(), None  # `one_thread_at_a_time`
        self.capacity = int(capacity)
        self._next_cached = next_cached  # (ids, stopped, cache) -> log-probs, for `step`
        self.keys = []  # the stream in each row, in row order
        self._arrays = None  # {name: array with `capacity` rows}, made at the first admit
        self._undo = None
        # (steps taken, the last one's log-probs): what an interrupted caller goes on from
        self.taken = (0, None)

    def __len__(self):
        return len(self.keys)

    def full(self):
        return len(self.keys) == self.capacity

    @one_thread_at_a_time
    def admit(self, key, cache):
        """Puts the one-row host cache `cache` in the next row, rotated onto
        the slab's ring slot (an empty slab takes the row's own slot)."""
        # A cache kept on the device (OrtValues) joins the host's slab as numpy.
        cache = {name: np.asarray(value.numpy()) if hasattr(value, "data_ptr") else value
                 for name, value in cache.items()}
        check_admission(self, key, cache["valid"].shape[0])
        if self._arrays is None:
            self._arrays = {name: host_empty(name, _with_rows(value, name, self.capacity),
                                             value.dtype)
                            for name, value in cache.items() if name in BATCH_AXES}
        # The row's own free slot (a row that stopped kept it as the ring moved on).
        row_slot, size = int(cache["row_slot"][0]), cache["valid"].shape[1]
        if not self.keys:  # shared by every row
            self._arrays["slot"] = np.array(row_slot, np.int32)
            self._arrays["positions"] = cache["positions"]
        shift = (int(self._arrays["slot"]) - row_slot) % size
        row = len(self.keys)
        for name in BATCH_AXES:
            target = _rows(self._arrays[name], name, row, row + 1)
            if name == "row_slot":
                target[...] = (cache[name] + shift) % size
            else:  # the ring moved on by `shift` slots
                target[...] = np.roll(cache[name], shift, ring_axis(name))
        self.keys.append(key)

    @one_thread_at_a_time
    def evict(self, key):
        """Removes `key`'s row; its one-row host cache (a copy). The last row
        moves into it; an interrupt while it moves puts the row back."""
        row = self.keys.index(key)
        cache = take_rows(self.batch(), [row])
        last = len(self.keys) - 1
        try:
            for name in BATCH_AXES:
                array = self._arrays[name]
                _rows(array, name, row, row + 1)[...] = _rows(array, name, last, last + 1)
            # One change: the last key into the row, the list one shorter.
            self.keys[row:] = ([self.keys[last]] if row != last else []) + self.keys[row + 1:last]
        except BaseException:
            if self.keys[row] == key:
                for name in BATCH_AXES:
                    _rows(self._arrays[name], name, row, row + 1)[...] = cache[name]
            raise
        return cache

    @one_thread_at_a_time
    def batch(self):
        """The host cache of the rows in use (views: steps advance the slab)."""
        views = {name: _rows(self._arrays[name], name, 0, len(self.keys)) for name in BATCH_AXES}
        return {**views, "slot": self._arrays["slot"], "positions": self._arrays["positions"]}

    @one_thread_at_a_time
    def step(self, ids, check):
        """The log-probs of one step of every row (ids `[len(self)]`), the
        slab advanced in place, unless `check(log_probs)` raises: then the
        step is taken back (`mark`, `undo`) and the error goes on. `taken`
        counts the steps and keeps the last one's log-probs (for a caller
        interrupted as this returns)."""
        self.mark()
        try:  # also when the step itself is interrupted half-way through its writes
            log_probs = self._next_cached(ids, np.zeros(len(self.keys), np.bool_),
                                          self.batch())
            log_probs = check(log_probs)
            self.taken = (self.taken[0] + 1, log_probs)  # nothing after it can fail
            return log_probs
        except BaseException:
            self.undo()
            raise

    @one_thread_at_a_time
    def mark(self):
        """Remembers the ring's position, so that `undo` can take back the next step."""
        n, slot = len(self.keys), int(self._arrays["slot"])
        self._undo = (slot, self._arrays["row_slot"][:n].copy(),
                      self._arrays["valid"][:n, slot].copy())

    @one_thread_at_a_time
    def undo(self):
        """Takes back the step since `mark`: it wrote only into the free slot,
        whose entries mean nothing until the ring moves onto it, so putting
        back the slot, the rows' slots and the free slot's flags is enough."""
        slot, row_slot, valid = self._undo
        n = len(self.keys)
        self._arrays["slot"][...] = slot
        self._arrays["row_slot"][:n] = row_slot
        self._arrays["valid"][:n, slot] = valid


def slab_row_bytes(config, mem_len, cache_dtype="float32"):
    """The bytes one row of a host `CacheSlab` holds: its rings of `mem_len + 1`
    slots (`cache_mems` float32, `keys` and `values` in `cache_dtype`,
    `valid`) and its `row_slot`.

    Args:
        config: the model's config (`n_layer`, `d_model`, `n_head`, `d_head`).
        mem_len: the export's memory length.
        cache_dtype: the keys' and values' dtype.

    Returns:
        An int.
    """
    size = int(mem_len) + 1
    heads = config.n_head * config.d_head
    return (config.n_layer * size * (config.d_model * 4 + 2 * heads * np.dtype(cache_dtype).itemsize)
            + size + 4)


def check_admission(slab, key, rows):
    """Raises `ValueError` unless `slab` (its `keys` and `capacity`) can
    admit a cache of `rows` rows as `key`'s stream."""
    if len(slab.keys) >= slab.capacity:
        raise ValueError(f"the slab holds {slab.capacity} streams already")
    if key in slab.keys:
        raise ValueError(f"the slab holds a stream {key!r} already")
    if rows != 1:
        raise ValueError(f"a slab admits one row at a time, not {rows}")


def _with_rows(value, name, rows):
    shape = list(value.shape)
    shape[BATCH_AXES[name]] = rows
    return shape


def _rows(array, name, start, stop):
    """The view of rows `start:stop` of the cache array `name`."""
    return array[(slice(None),) * BATCH_AXES[name] + (slice(start, stop),)]
