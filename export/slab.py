"""The session table's slab: many streams' decode caches in one batch that
steps advance in place, one row each, on one shared ring slot. `CacheSlab`
keeps the rows in host numpy; `DeviceSlab` keeps them in buffers on the
runtime's device (OrtValues), so that a step on a GPU moves no cache across
the bus. The two have the same methods and serve one thread at a time
(`one_thread_at_a_time`).

* A decode step takes one ring slot for every row of its batch. Streams
  that started at different times sit at different slots of their own
  rings; attention sees only each slot's distance from the free slot, so a
  stream's ring can be rotated to any slot without changing what it
  computes. The slab rotates each stream it admits to its own slot (one
  copy of that stream's cache), then every step reads and writes the slab's
  rows in place: no gather, no scatter, no copy of any cache per step. Rows
  are kept contiguous (an evicted row's place takes the last row), so a
  step's batch is a view of the slab's first rows.
* On the device, the slab's tensors hold `capacity` rows for its whole life
  (fixed addresses). A step reads and writes the first `len(slab)` rows in
  place (`device_cache.FixedStep`: each layer's rows, the flags' and the
  rows' slots are a prefix of their buffers), so it can be replayed as a
  CUDA graph, one per slab size.
* A session joining the device slab copies its one row in
  (`slab_put_model`: the row's rings rotated onto the slab's slot by a
  Gather, then scattered into its row in place); one leaving is taken out
  (`slab_take_model`) and the last row takes its place. Nothing of the slab
  comes to the host but the log-probs and, when a session joins, the two
  ring positions (scalars). The device slab is the `SessionTable`'s on a
  runtime that keeps its caches on the device (`OnnxRuntime(device_cache=...)`,
  by default on CUDA; forced on the CPU provider for tests and diagnosis).
* A step whose log-probs fail the caller's check is not taken: the host
  slab takes it back (`CacheSlab.undo`); on the device the ring's positions
  move on only after the check. (`decode_token`, where the export has it,
  has by then written each row's token into its free slot, which no read
  sees and the next step writes again; the step and the ring's write of an
  older export write nothing before it.)

The ring's bookkeeping (the write, the move of its positions) is
`export.decode_cache`'s on the host and `export.device_cache`'s on the
device, as for every step; this module holds only the rows' placement. The
device slab's graphs are built with `onnx.helper` at run time, as
`device_cache`'s are.
"""
import contextlib
import functools
import threading

import numpy as np

from export.decode_cache import BATCH_AXES, CACHE_NAMES, SLOT_AXES, host_empty, ring_axis, take_rows
from export.decode_cache import rows_view as _rows
from export.device_cache import (NUMPY_TYPES, DeviceCache, FixedStep, is_ortvalue, ortvalue,
                                 run_on_device)
from export.device_cache import small_model as _model
from txl_tf.errors import TxlError


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


class SlabRows:
    """What both slabs share: up to `capacity` streams, one a row, `keys`
    the stream in each row, in row order."""

    def __len__(self):
        return len(self.keys)

    def full(self):
        """True when every row of the slab holds a stream."""
        return len(self.keys) == self.capacity


class CacheSlab(SlabRows):
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
    (`next_cached`, no checks per token). On a device runtime the slab is a
    `DeviceSlab` (the same methods, its rows in device
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
    per_slot = config.d_model * 4 + 2 * heads * np.dtype(cache_dtype).itemsize
    return config.n_layer * size * per_slot + size + 4


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


# ------------------------------------------------------------ on the device
# The per-row tensors a session's row holds (`positions` and `slot` are shared).
ROW_NAMES = ("cache_mems", "keys", "values", "valid", "row_slot")
RANKS = {"cache_mems": 4, "keys": 5, "values": 5, "valid": 2, "row_slot": 1}


def _value_info(name, kind, rank):
    from onnx import TensorProto, helper
    types = {"valid": TensorProto.BOOL, "row_slot": TensorProto.INT32}
    return helper.make_tensor_value_info(name, types.get(kind, TensorProto.FLOAT),
                                         [None] * rank)


def slab_put_model(size):
    """The ONNX `ModelProto` putting one row into a slab of rings of `size`
    slots: inputs the slab's `ROW_NAMES` (all its rows), the row's
    (`row_<name>`, one row), `row` int64 `[1]` (where it goes) and `shift`
    int32 `[]` (how many slots its ring moves on: `np.roll`); outputs
    `new_<name>`, meant to be bound to the slab's own buffers (ScatterElements
    then writes the one row in place)."""
    from onnx import TensorProto, helper
    nodes = [
        helper.make_node("Constant", [], ["slots"], value=helper.make_tensor(
            "slots", TensorProto.INT64, [size], list(range(size)))),
        helper.make_node("Constant", [], ["size"], value=helper.make_tensor(
            "size", TensorProto.INT64, [], [size])),
        helper.make_node("Constant", [], ["size_32"], value=helper.make_tensor(
            "size_32", TensorProto.INT32, [], [size])),
        helper.make_node("Cast", ["shift"], ["shift_64"], to=TensorProto.INT64),
        # rolled[i] = row[(i - shift) mod size]
        helper.make_node("Sub", ["slots", "shift_64"], ["back"]),
        helper.make_node("Add", ["back", "size"], ["back_positive"]),
        helper.make_node("Mod", ["back_positive", "size"], ["order"]),
        helper.make_node("Add", ["row_row_slot", "shift"], ["moved_on"]),
        helper.make_node("Mod", ["moved_on", "size_32"], ["rolled_row_slot"]),
        helper.make_node("ScatterElements", ["row_slot", "row", "rolled_row_slot"],
                         ["new_row_slot"], axis=0),
    ]
    for name in ROW_NAMES[:-1]:
        rank = RANKS[name]
        nodes += [
            helper.make_node("Gather", [f"row_{name}", "order"], [f"rolled_{name}"],
                             axis=SLOT_AXES[name]),
            helper.make_node("Constant", [], [f"{name}_ones"], value=helper.make_tensor(
                f"{name}_ones", TensorProto.INT64, [rank], [1] * rank)),
            helper.make_node("Reshape", ["row", f"{name}_ones"], [f"{name}_row"]),
            helper.make_node("Shape", [f"rolled_{name}"], [f"{name}_shape"]),
            helper.make_node("Expand", [f"{name}_row", f"{name}_shape"], [f"{name}_index"]),
            helper.make_node("ScatterElements", [name, f"{name}_index", f"rolled_{name}"],
                             [f"new_{name}"], axis=BATCH_AXES[name]),
        ]
    inputs = ([_value_info(name, name, RANKS[name]) for name in ROW_NAMES]
              + [_value_info(f"row_{name}", name, RANKS[name]) for name in ROW_NAMES]
              + [helper.make_tensor_value_info("row", TensorProto.INT64, [1]),
                 helper.make_tensor_value_info("shift", TensorProto.INT32, [])])
    outputs = [_value_info(f"new_{name}", name, RANKS[name]) for name in ROW_NAMES]
    return _model(nodes, "txl_slab_put", inputs, outputs)


def slab_take_model():
    """The ONNX `ModelProto` taking rows out of a slab: inputs its
    `ROW_NAMES`, `slot` and `rows` int64 `[k]`; outputs `taken_<name>`, the
    cache tensors of those rows (`taken_slot` a copy of the slot)."""
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Gather", [name, "rows"], [f"taken_{name}"],
                              axis=BATCH_AXES[name]) for name in ROW_NAMES]
    nodes.append(helper.make_node("Identity", ["slot"], ["taken_slot"]))
    inputs = ([_value_info(name, name, RANKS[name]) for name in ROW_NAMES]
              + [helper.make_tensor_value_info("slot", TensorProto.INT32, []),
                 helper.make_tensor_value_info("rows", TensorProto.INT64, [None])])
    outputs = ([_value_info(f"taken_{name}", name, RANKS[name]) for name in ROW_NAMES]
               + [helper.make_tensor_value_info("taken_slot", TensorProto.INT32, [])])
    return _model(nodes, "txl_slab_take", inputs, outputs)


class DeviceSlab(SlabRows):
    """Up to `capacity` streams' device decode caches, one row each, on one
    shared ring slot, in device buffers (see the module's docstring).

    `sessions`: `{"step", "write", "move"}` or `{"token", "move"}` (`FixedStep`'s: the replay
    sessions where CUDA graphs are on) and `{"put", "take"}` (of
    `slab_put_model(size)` and `slab_take_model()`). Rows are kept
    contiguous (an evicted row's place takes the last row). One thread at a
    time, as `CacheSlab`; `lock` (None: none), held around each run of a
    step (not its `check`), is the runtime's for sessions replaying CUDA
    graphs (its other device steps run them too).
    """

    def __init__(self, capacity, sessions, device, n_token, lock=None):
        self._in_use, self._user = threading.Lock(), None  # `one_thread_at_a_time`
        self._lock = lock or contextlib.nullcontext()
        self.capacity = int(capacity)
        self.sessions, self.device, self.n_token = sessions, device, n_token
        self.keys = []  # the stream in each row, in row order
        self._tensors = None  # {name: OrtValue}, made at the first admit
        self._steps = {}  # {rows: FixedStep}
        self.taken = (0, None)  # as `CacheSlab.taken`
        # The ring slot, kept on the host (None: unknown, read at the next step):
        # an interrupted step tells from it whether its write was moved on.
        self._slot = None

    @one_thread_at_a_time
    def admit(self, key, cache):
        """Puts the one-row decode cache `cache` (OrtValues, or numpy) in the
        next row, rotated onto the slab's ring slot (an empty slab takes the
        row's own slot)."""
        cache = {name: value if is_ortvalue(value) else ortvalue(value, self.device)
                 for name, value in cache.items()}
        check_admission(self, key, cache["valid"].shape()[0])
        if self._tensors is None:
            self._tensors = self._allocate(cache)
        # The row's own free slot (a row that stopped kept it as the ring moved on).
        slot, size = _scalar(cache["row_slot"]), cache["valid"].shape()[1]
        if not self.keys:
            self._slot = None
            self._tensors["slot"].update_inplace(np.array(slot, np.int32))
        self._slot = _scalar(self._tensors["slot"])
        shift = (self._slot - slot) % size
        self._put(cache, len(self.keys), shift)
        self.keys.append(key)

    @one_thread_at_a_time
    def evict(self, key):
        """Removes `key`'s row; its one-row device cache (a copy). The last row
        moves into it; an interrupt while it moves puts the row back."""
        row, last = self.keys.index(key), len(self.keys) - 1
        cache = self._take([row])
        try:
            if row != last:
                self._put(self._take([last]), row, 0)
            # One change: the last key into the row, the list one shorter.
            self.keys[row:] = ([self.keys[last]] if row != last else []) + self.keys[row + 1:last]
        except BaseException:
            if row != last and self.keys[row] == key:
                self._put(cache, row, 0)
            raise
        return cache

    @one_thread_at_a_time
    def batch(self):
        """A device cache of the rows in use, in row order: a copy (steps of
        it leave the slab as it is; `step` advances the slab)."""
        return self._take(list(range(len(self.keys))))

    @one_thread_at_a_time
    def step(self, ids, check):
        """The log-probs of one step of every row (ids `[len(self)]`), the
        slab advanced in place, unless `check(log_probs)` raises: then the
        step is not taken (the ring moves on after the check; at most the
        rows' free slots are written, see the module's docstring) and the
        error goes on. Interrupted after the check, the step is finished
        (and `taken`) before the interrupt goes on."""
        rows = len(self.keys)
        if rows not in self._steps:
            self._steps[rows] = FixedStep(self.sessions, self.device, self._tensors, rows,
                                          self.n_token)
        steps = self._steps[rows]
        if self._slot is None:  # only after an interrupt the slab could not finish
            self._slot = _scalar(self._tensors["slot"])
        slot, count = self._slot, self.taken[0]
        with self._lock:  # each run; `check` (the caller's) outside it
            log_probs = steps.read(ids, np.zeros(rows, np.bool_))
        log_probs = check(log_probs)
        self._slot = None  # until the step is finished (an interrupt may land anywhere)
        try:
            with self._lock:
                steps.write()
                self.taken = (count + 1, log_probs)  # as `CacheSlab.taken`
            self._slot = (slot + 1) % self._size()
        except BaseException:
            self._finish(steps, slot, count, log_probs)
            raise
        return log_probs

    def _finish(self, steps, slot, count, log_probs):
        """Finishes a step interrupted in (or as it returns from) its
        `FixedStep.write`, which is its write then the move of the ring's
        positions (the move alone after `decode_token`), from `slot` (the
        ring's slot before it): the slot the slab holds tells whether the
        move ran; if not, `write` runs again (the write of the same token at
        the same slot writes the same values)."""
        if self.taken[0] == count:
            if _scalar(self._tensors["slot"]) == slot:
                with self._lock:
                    steps.write()
            self.taken = (count + 1, log_probs)
        self._slot = (slot + 1) % self._size()

    def _size(self):
        """The ring's number of slots."""
        return self._tensors["valid"].shape()[1]

    # --------------------------------------------------------------- helpers
    def _allocate(self, cache):
        """The slab's tensors: `capacity` rows of each of `ROW_NAMES`, the
        slot, and the first cache's `positions` (the same for every cache of
        a runtime, never written)."""
        import onnxruntime as ort
        tensors = {}
        for name in ROW_NAMES:
            value = cache[name]
            shape = value.shape()
            shape[BATCH_AXES[name]] = self.capacity
            tensors[name] = ort.OrtValue.ortvalue_from_shape_and_type(
                shape, NUMPY_TYPES[value.data_type()], self.device, 0)
        tensors["slot"] = ortvalue(np.zeros([], np.int32), self.device)
        tensors["positions"] = cache["positions"]
        return tensors

    def _put(self, cache, row, shift):
        put_row(self.sessions["put"], self.device, self._tensors, cache, row, shift)

    def _take(self, rows):
        return take_device_rows(self.sessions["take"], self.device, self._tensors, rows)


def put_row(session, device, tensors, cache, row, shift):
    """Writes the one-row device cache `cache` into row `row` of the device
    cache `tensors`, in place, its ring moved on by `shift` slots, with
    `session` (of `slab_put_model`)."""
    run_on_device(session, device,
                  {**{name: tensors[name] for name in ROW_NAMES},
                   **{f"row_{name}": cache[name] for name in ROW_NAMES},
                   "row": np.array([row], np.int64), "shift": np.array(shift, np.int32)},
                  in_place=ROW_NAMES)


def take_device_rows(session, device, tensors, rows):
    """A `DeviceCache` (a copy, on the device) of `rows` of the device cache
    `tensors`, with `session` (of `slab_take_model`)."""
    out = run_on_device(session, device,
                        {**{name: tensors[name] for name in ROW_NAMES + ("slot",)},
                         "rows": np.array(rows, np.int64)})
    cache = {name: out[f"taken_{name}"] for name in CACHE_NAMES if name != "positions"}
    return DeviceCache({**cache, "positions": tensors["positions"]})


def _scalar(value):
    """The int of a scalar (or one-element) OrtValue (one small copy to the host)."""
    return int(value.numpy().reshape(-1)[0])
