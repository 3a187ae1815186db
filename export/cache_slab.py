"""Many streams' decode caches in one batch that steps advance in place.

A decode step (`export.decode_interface`) takes one ring slot for every row
of its batch. Streams that started at different times sit at different
slots of their own rings; attention sees only each slot's distance from the
free slot, so a stream's ring can be rotated to any slot without changing
what it computes. The slab rotates each stream it admits to its own slot
(one copy of that stream's cache), then every step reads and writes the
slab's rows in place: no gather, no scatter, no copy of any cache per step.

Rows are kept contiguous (an evicted row's place takes the last row), so a
step's batch is a view of the slab's first rows.
"""
import numpy as np

from export.host_cache import BATCH_AXES, host_empty, ring_axis, take_rows


class CacheSlab:
    """Up to `capacity` streams' host decode caches (`decode_interface`), one
    row each, on one shared ring slot.

    ```python
    slab = CacheSlab(16)
    slab.admit("alice", runtime.decode_init(memory))   # a one-row cache
    log_probs = runtime.next_cached(ids, stopped, slab.batch())  # rows in slab.keys order
    cache = slab.evict("alice")                        # her one-row cache again
    ```
    """

    def __init__(self, capacity):
        self.capacity = int(capacity)
        self.keys = []  # the stream in each row, in row order
        self._arrays = None  # {name: array with `capacity` rows}, made at the first admit
        self._undo = None

    def __len__(self):
        return len(self.keys)

    def full(self):
        return len(self.keys) == self.capacity

    def admit(self, key, cache):
        """Puts the one-row host cache `cache` in the next row, rotated onto
        the slab's ring slot (an empty slab takes the cache's slot)."""
        if self.full():
            raise ValueError(f"the slab holds {self.capacity} streams already")
        # A cache kept on the device (OrtValues) joins the host's slab as numpy.
        cache = {name: np.asarray(value.numpy()) if hasattr(value, "data_ptr") else value
                 for name, value in cache.items()}
        if self._arrays is None:
            self._arrays = {name: host_empty(name, _with_rows(value, name, self.capacity),
                                             value.dtype)
                            for name, value in cache.items() if name in BATCH_AXES}
        if not self.keys:  # shared by every row
            self._arrays["slot"] = np.array(cache["slot"], np.int32)
            self._arrays["positions"] = cache["positions"]
        size = cache["valid"].shape[1]
        shift = (int(self._arrays["slot"]) - int(cache["slot"])) % size
        row = len(self.keys)
        for name in BATCH_AXES:
            target = _rows(self._arrays[name], name, row, row + 1)
            if name == "row_slot":
                target[...] = (cache[name] + shift) % size
            else:  # the ring moved on by `shift` slots
                target[...] = np.roll(cache[name], shift, ring_axis(name))
        self.keys.append(key)

    def evict(self, key):
        """Removes `key`'s row; its one-row host cache (a copy)."""
        row = self.keys.index(key)
        cache = take_rows(self.batch(), [row])
        last = len(self.keys) - 1
        if row != last:
            for name in BATCH_AXES:
                array = self._arrays[name]
                _rows(array, name, row, row + 1)[...] = _rows(array, name, last, last + 1)
            self.keys[row] = self.keys[last]
        self.keys.pop()
        return cache

    def batch(self):
        """The host cache of the rows in use (views: steps advance the slab)."""
        views = {name: _rows(self._arrays[name], name, 0, len(self.keys)) for name in BATCH_AXES}
        return {**views, "slot": self._arrays["slot"], "positions": self._arrays["positions"]}

    def mark(self):
        """Remembers the ring's position, so that `undo` can take back the next step."""
        n, slot = len(self.keys), int(self._arrays["slot"])
        self._undo = (slot, self._arrays["row_slot"][:n].copy(),
                      self._arrays["valid"][:n, slot].copy())

    def undo(self):
        """Takes back the step since `mark`: it wrote only into the free slot,
        whose entries mean nothing until the ring moves onto it, so putting
        back the slot, the rows' slots and the free slot's flags is enough."""
        slot, row_slot, valid = self._undo
        n = len(self.keys)
        self._arrays["slot"][...] = slot
        self._arrays["row_slot"][:n] = row_slot
        self._arrays["valid"][:n, slot] = valid


def _with_rows(value, name, rows):
    shape = list(value.shape)
    shape[BATCH_AXES[name]] = rows
    return shape


def _rows(array, name, start, stop):
    """The view of rows `start:stop` of the cache array `name`."""
    return array[(slice(None),) * BATCH_AXES[name] + (slice(start, stop),)]
