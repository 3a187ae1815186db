"""The runtime interface shared by the ONNX Runtime and SavedModel backends
(`Runtime`, `RuntimeMemory`: one public API, listed in
docs/export-and-serving.md; the names it replaced say so), the
checks of its inputs, done on shapes and values before any session runs
(`RuntimeInputError`), and where an export keeps its artefacts
(`choose_artefact`). `export.open_runtime` opens one.
"""
import logging
import os
import threading
import weakref
from typing import Any, NamedTuple

import numpy as np

from export.decode_cache import (cache_shapes, concat_rows, copy_cache, in_time_order, realign_rows,
                                 ring_axis, ring_positions, take_rows)
from export.slab import CacheSlab
from export.device_cache import DeviceCache
from export.generation_backend import GenerationBackend
from export.metadata import DECODE_CACHE_LAYOUT, DECODE_FILES
from txl_tf.app.deprecation import answers_removed_names
from txl_tf.app.reprs import fields_repr
from txl_tf.checks.memory_budget import check_memory_state
from txl_tf.checks.numpy_checks import (InputError, as_array, check_finite_outputs,
                                        check_id_array, check_rows)
from txl_tf.errors import ModelDirError, TxlError

log = logging.getLogger(__name__)


class RuntimeMemory(NamedTuple):
    """Recurrence memory in the backend's own tensors (OrtValue, tf.Tensor or
    numpy), so it can stay on the device between calls.

    Args:
        mems: float32 `[n_layer, B, M, d_model]`.
        mem_mask: bool `[B, M]`; True where a slot holds a real state.
    """

    mems: Any
    mem_mask: Any

    __repr__ = fields_repr

    def numpy(self):
        """The memory on the host (a copy, also of numpy values).

        Returns:
            `(mems, mem_mask)` as numpy arrays.
        """
        # Copies of numpy values too (`io_binding=False`): changing them leaves the memory.
        return tuple(np.array(v, copy=True) if isinstance(v, np.ndarray) else _to_numpy(v)
                     for v in self)


def _to_numpy(value):
    if hasattr(value, "data_type"):
        # An OrtValue's `numpy()` on the CPU is a view of its buffer that does
        # not keep the OrtValue alive: copy, or it dangles once the value goes.
        # On a device it is already a copy in host memory.
        array = value.numpy()
        return np.array(array, copy=True) if value.device_name().lower() == "cpu" else array
    if hasattr(value, "numpy"):
        return np.asarray(value.numpy())
    return np.asarray(value)


def _unpack(memory):
    if isinstance(memory, dict):
        keys = ("mems", "mem_mask")
        try:
            return memory[keys[0]], memory[keys[1]]
        except KeyError as missing:
            raise RuntimeInputError(f"memory dict needs keys {keys}, missing {missing}")
    if isinstance(memory, (tuple, list)) and len(memory) == 2:
        return memory[0], memory[1]
    raise RuntimeInputError("memory must be a (mems, mem_mask) pair, e.g. the Memory returned "
                            f"by initial_memory or step; got {type(memory).__name__}")


def _is_cache(state):
    """Whether `state` is a decode cache (a dict without the memory's `mems`)."""
    return isinstance(state, dict) and "mems" not in state


def generation_backend(backend):
    """What the generation flow drives for `backend`: a `Runtime`'s one
    `GenerationBackend`, anything else (the Keras `Decoder`, which implements
    the protocol itself) as it is."""
    return backend._generation if isinstance(backend, Runtime) else backend


@answers_removed_names("Runtime")
class Runtime:
    """Runs an exported Transformer-XL: memory in, memory out.

    ```python
    rt = open_runtime("exported/model.onnx")
    memory = rt.initial_memory(batch_size)
    log_probs, memory = rt.step(token_ids, memory)      # numpy [B, T, n_token]
    nll, memory = rt.score(token_ids, target_ids, memory)
    out = rt.generate([[5, 6, 7], [8]], 100, temperature=0.8, seed=1)  # txl_tf Generation
    cache = rt.decode_init(memory)                       # the cached decode interface
    log_probs, cache = rt.decode_step(next_ids, cache)   # one id per row, in place
    ```
    The public API is the list in docs/export-and-serving.md ("The runtime
    API"); a test holds the two together. Inputs are checked (integer ids in
    range, memory geometry and dtypes, the same batch in ids and memory)
    before the backend runs; problems raise `RuntimeInputError` (a
    ValueError). A memory whose valid slots hold NaN or inf raises
    `NonFiniteMemoryError` naming the streams (seen in the step's outputs, so
    the check costs no read of the memory). The generation flow drives the
    runtime through its `GenerationBackend` (`export.generation_backend`).

    Args:
        info: the export's `ExportInfo` (`open_runtime` reads it).

    Raises:
        TxlError: a batch-major export (the Triton repository's model).
    """

    backend = "abstract"

    def __init__(self, info):
        if info.memory_layout != "layer_major":
            raise TxlError(f"this model keeps the memory {info.memory_layout} (the Triton "
                           "repository's model.onnx); open_runtime reads the export's "
                           "plain model.onnx or saved_model/")
        self.info = info
        self.config = info.config
        self.mem_len = info.mem_len
        self._cache_shapes = cache_shapes(self.config, self.mem_len)  # what a cache must be
        self.log_probs_mode = info.log_probs
        self.device = "cpu"
        self._generation_lock = threading.Lock()
        self._generation_ref = None  # a weakref.ref

    @property
    def _generation(self):
        """The runtime's one `GenerationBackend` (a decode state's cache names
        it: `HeldCache`), for as long as anything holds it (a `SessionTable`,
        a cache); made again when nothing does. Held weakly, as the backend
        holds the runtime: a cycle would keep a dropped runtime's sessions,
        memory and open files until Python's next garbage collection."""
        with self._generation_lock:
            backend = self._generation_ref and self._generation_ref()
            if backend is None:
                backend = GenerationBackend(self)
                self._generation_ref = weakref.ref(backend)
            return backend

    # ------------------------------------------------------------- interface
    @property
    def n_token(self):
        """The vocabulary size: ids lie in `[0, n_token)`."""
        return self.config.n_token

    def initial_memory(self, batch_size):
        """A fresh memory.

        Args:
            batch_size: streams (rows), an integer >= 1.
        Returns:
            A `RuntimeMemory` in this runtime's tensors: empty, unless the
            export was made with a zero-filled start.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise RuntimeInputError(f"batch_size must be a positive integer, got {batch_size!r}")
        cfg = self.config
        check_memory_state(cfg.n_layer, cfg.d_model, int(batch_size), self.mem_len,
                           "initial_memory")
        mems = np.zeros([cfg.n_layer, int(batch_size), self.mem_len, cfg.d_model], np.float32)
        mem_mask = np.full([int(batch_size), self.mem_len], self.info.zero_filled, np.bool_)
        return self._to_backend(mems, mem_mask)

    def step(self, token_ids, memory=None):
        """Reads a segment.

        Args:
            token_ids: integer ids `[B, T]`.
            memory: a memory of B rows (`RuntimeMemory`, a `(mems, mem_mask)`
                pair or dict, any runtime's or numpy); None starts fresh.
        Returns:
            `(log_probs, new memory)`: log_probs numpy `[B, T, n_token]`
            (`[B, n_token]`, the last position's, on a `log_probs='last'`
            export).
        """
        ids, mems, mem_mask = self._checked(token_ids, memory)
        log_probs, memory = self._step(ids, mems, mem_mask)
        return check_finite_outputs(log_probs), memory

    def score(self, token_ids, target_ids, memory=None):
        """Scores `target_ids` given `token_ids`: on ONNX, of a
        `log_probs='all'` export (the SavedModel's `score` signature scores
        either).

        Args:
            token_ids, target_ids: integer ids `[B, T]`.
            memory: as for `step`.
        Returns:
            `(nll numpy [B, T], new memory)`.
        Raises:
            RuntimeInputError: bad ids or memory, or an ONNX
                `log_probs='last'` export.
        """
        ids, mems, mem_mask = self._checked(token_ids, memory)
        targets = check_ids(target_ids, self.config.n_token, name="target_ids")
        if targets.shape != ids.shape:
            raise RuntimeInputError(f"target_ids shape {targets.shape} differs from token_ids "
                                    f"shape {ids.shape}")
        nll, memory = self._score(ids, targets, mems, mem_mask)
        return check_finite_outputs(nll, "negative log-likelihoods"), memory

    def generate(self, prompts, max_new_tokens, segment_len=None, **options):
        """Continues `prompts` as `txl_tf.generation.decoder.Decoder.generate`
        does (same options, same sampler and seeds), one step per call: the
        new ids go in, the last position's log-probs come out, and the memory
        (or the decode cache) stays in the backend's tensors.

        Args:
            prompts: 1-D id sequences of any lengths, or a `[B, L]` array;
                None with `resume=` to go on from a state.
            max_new_tokens: new ids per row, in [0, 2**30].
            segment_len: prompt positions read per call (the config's `tgt_len`).
            **options: temperature, top_k, top_p, repetition_penalty, seed,
                stop_ids, pad_id, memory, resume, stream, stream_every.
        Returns:
            A `txl_tf.Generation` whose memory is a `RuntimeMemory`.
        """
        from txl_tf.generation.flow import generate
        segment_len = self.config.tgt_len if segment_len is None else segment_len
        return generate(self._generation, prompts, max_new_tokens, segment_len=segment_len,
                        **options)

    def take(self, state, rows):
        """Rows of a memory or of a decode cache (a copy; a device cache's
        stays on the device). `take(cache, range(batch))` is a copy of a
        cache that `decode_step` may advance while `cache` stays as it is.

        Args:
            state: a memory (as for `step`) or a decode cache (the dict
                `decode_init` returns).
            rows: row indices, in the order wanted (non-empty).
        Returns:
            A `RuntimeMemory` in this runtime's tensors, or a decode cache.
        """
        if _is_cache(state):
            batch = len(self._check_cache(state).row_slot)
            rows = check_rows(rows, batch, RuntimeInputError)
            if np.array_equal(rows, np.arange(batch)):
                return self._copy_cache(state)
            return self._take_cache(state, rows)
        return self._take_memory(state, check_rows(rows, self._check_memory(state),
                                                         RuntimeInputError))

    def concat(self, states):
        """The rows of several memories, or of several decode caches, in one.

        Args:
            states: a non-empty list of memories, or of decode caches at the
                same ring position (as `decode_read` leaves them).
        Returns:
            A `RuntimeMemory` in this runtime's tensors, or a decode cache.
        """
        if not isinstance(states, (list, tuple)) or not states:
            raise RuntimeInputError("concat takes a non-empty list of memories or of decode "
                                    f"caches, got {type(states).__name__}")
        caches = [_is_cache(s) for s in states]
        if any(caches) and not all(caches):
            raise RuntimeInputError("concat joins memories or decode caches, not a mix")
        checked = [(self._check_cache if _is_cache(state) else self._check_memory)(state)
                   for state in states]
        if all(caches):
            if len({positions.slot for positions in checked}) != 1:
                raise RuntimeInputError("decode caches at different ring positions cannot be "
                                        "joined")
            return self._concat_caches(states)
        return self._concat_memories(states)

    def describe(self):
        """A summary of the runtime.

        Returns:
            One line: backend, device/provider, memory geometry.
        """
        cfg = self.config
        return (f"{self.backend} on {self.device}: n_layer={cfg.n_layer} mem_len={self.mem_len} "
                f"d_model={cfg.d_model} n_token={cfg.n_token} log_probs={self.log_probs_mode}")

    def __repr__(self):
        try:
            return f"<{type(self).__name__} {self.describe()}>"
        except Exception:  # not opened (its __init__ failed): the default
            return object.__repr__(self)

    # ------------------------------------------ the cached decode interface
    @property
    def has_decode_cache(self):
        """Whether the export carries the cached decode interface
        (`export.decode_interface`); `generate` then uses it unless
        `use_decode_cache` is set False."""
        return False

    @property
    def use_decode_cache(self):
        """Whether `generate` and a `SessionTable` decode on the cache
        (settable; True by default where `has_decode_cache`)."""
        return self.has_decode_cache and getattr(self, "_use_decode_cache", True)

    @use_decode_cache.setter
    def use_decode_cache(self, value):
        self._use_decode_cache = bool(value)

    def decode_init(self, memory):
        """The decode cache of a memory: its keys and values projected once
        (`export.decode_interface`).

        Args:
            memory: as for `step`.
        Returns:
            The cache, a dict of numpy arrays (OrtValues on the device with
            `device_cache`).
        """
        return self._checked_decode_init(memory, None)

    def decode_step(self, token_ids, cache, stopped=None):
        """One id per row read on top of the cache, which is advanced **in
        place** (`take(cache, range(batch))` first keeps the old state).

        Args:
            token_ids: integer ids `[B]`.
            cache: a decode cache of B rows.
            stopped: bool `[B]`, rows that keep their cache (their log-probs
                mean nothing); None: none. A row may stop and later go on:
                it goes on from the cache it kept, as if taken out and
                stepped alone (its ring is first rotated onto the shared
                slot, one copy of its row).
        Returns:
            `(log_probs numpy [B, n_token], cache)`, the same dict.
        """
        ids = as_array(token_ids, "token_ids", RuntimeInputError)
        if ids.ndim > 2 or (ids.ndim == 2 and ids.shape[1] != 1):
            raise RuntimeInputError(f"token_ids must be one id per row, [batch], got shape "
                                    f"{ids.shape} (decode_read reads [batch, length])")
        ids = check_ids(ids.reshape(-1, 1), self.config.n_token)[:, 0]
        positions = self._check_cache(cache, ids.shape[0])
        stopped = np.zeros(ids.shape, np.bool_) if stopped is None else \
            check_flags(stopped, "stopped")
        if stopped.shape != ids.shape:
            raise RuntimeInputError(f"stopped must have shape {list(ids.shape)} (one flag per "
                                    f"row), got {list(stopped.shape)}")
        if not self._writable(cache):
            cache.update(self._copy_cache(cache))  # a cache of the caller's own arrays
        behind = positions.behind(stopped)
        if behind.size:
            self._realign(cache, behind, positions)
        log_probs = self._decode_step(ids, stopped, cache)
        return check_finite_outputs(log_probs), cache

    def decode_read(self, token_ids, cache):
        """A segment of ids per row read on the cache, as `step` reads it on
        the memory the cache holds, only the T new positions projected (a
        conversation's next turn). `cache` is left as it was.

        Args:
            token_ids: integer ids `[B, T]`.
            cache: a decode cache of B rows.
        Returns:
            `(log_probs numpy [B, n_token] after each row's last id, new cache)`.
        """
        ids = check_ids(token_ids, self.config.n_token)
        self._check_cache(cache, ids.shape[0])
        log_probs, cache = self._decode_read(ids, cache)
        return check_finite_outputs(log_probs), cache

    def cache_memory(self, cache):
        """The memory a decode cache holds.

        Args:
            cache: a decode cache.
        Returns:
            A `RuntimeMemory`, in time order.
        """
        self._check_cache(cache)
        mems, valid, row_slot = (_to_numpy(cache[k]) for k in ("cache_mems", "valid",
                                                              "row_slot"))
        return self._to_backend(in_time_order(mems, row_slot, ring_axis("cache_mems")),
                                in_time_order(valid, row_slot, ring_axis("valid")))

    # ----------------------------- what the GenerationBackend calls (no API)
    def _checked_step_last(self, token_ids, memory):
        """`(log-probs numpy [B, n_token] at the last position, new memory)`."""
        ids, mems, mem_mask = self._checked(token_ids, memory)
        log_probs, memory = self._step_last(ids, mems, mem_mask)
        return check_finite_outputs(log_probs), memory

    def _adopt(self, memory, batch_size):
        """`memory` checked and put in this runtime's tensors."""
        self._check_memory(memory, batch_size)
        return RuntimeMemory(*self._native(*_unpack(memory)))

    def _checked_decode_init(self, memory, batch_size):
        """The decode cache of `memory`, checked (against `batch_size` rows
        when given)."""
        self._require_decode_cache()
        self._check_memory(memory, batch_size)
        return self._decode_init(*self._native(*_unpack(memory)))

    def _take_memory(self, memory, rows):
        mems, mem_mask = (_to_numpy(v) for v in _unpack(memory))
        rows = np.asarray(rows)
        return self._to_backend(np.ascontiguousarray(mems[:, rows]), mem_mask[rows])

    def _split_memory(self, memory):
        mems, mem_mask = (_to_numpy(v) for v in _unpack(memory))
        return [self._to_backend(np.ascontiguousarray(mems[:, i:i + 1]), mem_mask[i:i + 1])
                for i in range(mem_mask.shape[0])]

    def _concat_memories(self, memories):
        parts = [[_to_numpy(v) for v in _unpack(m)] for m in memories]
        return self._to_backend(np.concatenate([p[0] for p in parts], 1),
                                np.concatenate([p[1] for p in parts], 0))

    def _take_cache(self, cache, rows):
        return take_rows(cache, rows)

    def _cache_slab(self, capacity):
        return CacheSlab(capacity, self._decode_step)

    def _concat_caches(self, caches):
        return concat_rows(caches)

    def _ring_positions(self, cache):
        """The cache's `RingPositions` (a device cache's: copied to the host)."""
        return ring_positions(_to_numpy(cache["slot"]), _to_numpy(cache["row_slot"]))

    def _realign(self, cache, rows, positions):
        """Rotates `rows` of the cache (in place) onto its shared slot
        (`positions.slot`), where a step reads them."""
        realign_rows(cache, rows, positions.slot)

    def _copy_cache(self, cache):
        return copy_cache(cache)

    @staticmethod
    def _writable(cache):
        """Whether steps may advance `cache` in place (the host's: numpy
        arrays the runtime made, not read-only ones a caller handed in)."""
        return all(isinstance(value, np.ndarray) and value.flags.writeable
                   for value in cache.values())

    def _usable_decode_graphs(self, present):
        """Whether decode graphs that are `present` in the export can be
        used: their cache must have this version's layout (an older export's
        decodes through the memory, with a warning once)."""
        if present and self.info.decode_cache_layout != DECODE_CACHE_LAYOUT:
            if not getattr(self, "_warned_layout", False):
                log.warning("this export's decode cache keeps keys as %s, not %s: it decodes "
                            "on the memory, without the cache; re-export it to use the cache",
                            self.info.decode_cache_layout, DECODE_CACHE_LAYOUT)
                self._warned_layout = True
            return False
        return present

    # --------------------------------------------------------------- helpers
    def _require_decode_cache(self):
        if not self.has_decode_cache:
            attn_type = getattr(self.config, "attn_type", 0)
            raise TxlError(f"this export has no cached decode interface: attn_type {attn_type} "
                           "reads the whole memory each step (step_last)" if attn_type else
                           "this export has no cached decode interface of this version "
                           "(re-export it with --decode_cache)")

    def _check_cache(self, cache, batch_size=None):
        """Raises `RuntimeInputError` unless `cache` is a decode cache of this
        export (of `batch_size` rows when given); returns its `RingPositions`."""
        self._require_decode_cache()
        shapes = self._cache_shapes
        # A `DeviceCache` remembers what passed: its tensors (OrtValues,
        # whose shapes never change) and ring positions are checked again
        # only where they changed since.
        remembers = isinstance(cache, DeviceCache)
        batch, names = cache.unchecked(shapes) if remembers else (None, shapes)
        if batch is None or "valid" in names or (batch_size is not None and batch != batch_size):
            names = shapes  # (`valid` holds the batch the others are checked against)
        if names:
            batch = check_decode_cache(cache, {name: shapes[name] for name in ("valid", *names)},
                                       batch_size, self.info.cache_dtype)
            if remembers:
                cache.mark_checked(shapes, batch)
        if remembers and cache.positions_checked():
            return cache.known_positions()
        positions = check_ring_positions(self._ring_positions(cache), shapes["valid"][1])
        if remembers:
            cache.remember(positions, checked=True)
        return positions

    def _check_memory(self, memory, batch_size=None):
        """Raises `RuntimeInputError` unless `memory` fits this export (and
        has `batch_size` rows when given); returns its batch size."""
        mems, mem_mask = _unpack(memory)
        if batch_size is None:
            shape = shape_and_dtype(mem_mask)[0]
            batch_size = shape[0] if shape else 0
        cfg = self.config
        check_memory(mems, mem_mask, cfg.n_layer, self.mem_len, cfg.d_model, batch_size)
        return batch_size

    def _checked(self, token_ids, memory):
        ids = check_ids(token_ids, self.config.n_token)
        if memory is None:
            memory = self.initial_memory(ids.shape[0])
        mems, mem_mask = _unpack(memory)
        cfg = self.config
        check_memory(mems, mem_mask, cfg.n_layer, self.mem_len, cfg.d_model, ids.shape[0])
        mems, mem_mask = self._native(mems, mem_mask)
        return ids, mems, mem_mask

    def _gather_nll(self, log_probs, targets):
        if self.log_probs_mode != "all":
            raise RuntimeInputError("score needs log-probs at every position; this model was "
                                    "exported with log_probs='last' (re-export with 'all')")
        return -np.take_along_axis(log_probs, targets[..., None].astype(np.int64), -1)[..., 0]

    # ------------------------------------------------------ backend-specific
    def _to_backend(self, mems, mem_mask):
        raise NotImplementedError

    def _native(self, mems, mem_mask):
        raise NotImplementedError

    def _step(self, ids, mems, mem_mask):
        raise NotImplementedError

    def _step_last(self, ids, mems, mem_mask):
        log_probs, memory = self._step(ids, mems, mem_mask)
        return (log_probs if self.log_probs_mode == "last" else log_probs[:, -1]), memory

    def _score(self, ids, targets, mems, mem_mask):
        log_probs, memory = self._step(ids, mems, mem_mask)
        return self._gather_nll(log_probs, targets), memory

    def _decode_init(self, mems, mem_mask):
        raise NotImplementedError("this export has no cached decode interface")

    def _decode_read(self, ids, cache):
        raise NotImplementedError("this export has no cached decode interface")

    def _decode_step(self, ids, stopped, cache):
        raise NotImplementedError("this export has no cached decode interface")


# ------------------------------------------------------------- input checks
class RuntimeInputError(InputError):
    """Token ids or memory handed to a runtime do not fit the exported model."""


def shape_and_dtype(value):
    """`(shape tuple, numpy dtype)` of a numpy array, tf.Tensor or OrtValue."""
    if hasattr(value, "data_type") and callable(getattr(value, "shape", None)):  # OrtValue
        onnx_type = value.data_type()
        dtype = _ONNX_TYPES.get(onnx_type)
        return tuple(value.shape()), np.dtype(dtype) if dtype else onnx_type
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        dtype = getattr(value.dtype, "as_numpy_dtype", value.dtype)
        return tuple(int(d) for d in value.shape), np.dtype(dtype)
    array = np.asarray(value)
    return array.shape, array.dtype


_ONNX_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
               "tensor(float16)": np.float16, "tensor(bool)": np.bool_,
               "tensor(int32)": np.int32, "tensor(int64)": np.int64}


def check_flags(flags, name):
    """`flags` as a bool numpy array, or `RuntimeInputError` unless they are
    bools or the integers 0 and 1 (a cast made 0.5, 2 and NaN True)."""
    array = as_array(flags, name, RuntimeInputError)
    # 0 and 1 are the ints their bools equal (cheaper than np.isin: 49b19d7)
    if array.dtype != np.bool_ and (array.dtype.kind not in "iu"
                                    or not (array.astype(np.bool_) == array).all()):
        raise RuntimeInputError(f"{name} must be bool [batch] (True: the row stops), got "
                                f"{flags!r}")
    return array.astype(np.bool_, copy=False)


def check_ids(token_ids, n_token, name="token_ids"):
    """Returns the ids as an int32 numpy array `[B, T]` or raises `RuntimeInputError`."""
    return check_id_array(token_ids, n_token, name, RuntimeInputError)


def check_memory(mems, mem_mask, n_layer, mem_len, d_model, batch_size):
    """Raises `RuntimeInputError` unless mems are float32 `[n_layer, B, M, d_model]`
    and mem_mask is bool `[B, M]` with the exported M and the ids' batch B."""
    m_shape, s_dtype = shape_and_dtype(mems)
    v_shape, v_dtype = shape_and_dtype(mem_mask)
    if s_dtype != np.float32:
        raise RuntimeInputError(f"mems must be float32, got {s_dtype}")
    if v_dtype != np.bool_:
        raise RuntimeInputError(f"mem_mask must be bool, got {v_dtype}")
    want = (n_layer, batch_size, mem_len, d_model)
    if len(m_shape) == 4 and m_shape[1] != batch_size and (
            m_shape[0], m_shape[2], m_shape[3]) == (n_layer, mem_len, d_model):
        raise RuntimeInputError(f"batch mismatch: token_ids have batch {batch_size} but the "
                                f"memory has batch {m_shape[1]}")
    if tuple(m_shape) != want:
        raise RuntimeInputError(
            f"mems must have shape [n_layer, batch, mem_len, d_model] = {list(want)}"
            f" for this export (mem_len fixed at {mem_len}), got {list(m_shape)}")
    if tuple(v_shape) != (batch_size, mem_len):
        raise RuntimeInputError(f"mem_mask must have shape [batch, mem_len] = "
                                f"{[batch_size, mem_len]}, got {list(v_shape)}")


_CACHE_DTYPES = {"valid": np.bool_, "slot": np.int32, "row_slot": np.int32}


def check_decode_cache(cache, expected_shapes, batch_size=None, cache_dtype="float32"):
    """Raises `RuntimeInputError` unless `cache` is a decode cache of this
    export: a dict with every name of `expected_shapes` (`decode_interface.
    cache_shapes` with the batch axis named "batch"), each of that shape and
    dtype (float32 but for `valid` bool, `slot` and `row_slot` int32, and
    `keys` and `values` in the export's `cache_dtype`) and
    one batch (the ids' when `batch_size` is given); its values are not read
    (`check_ring_positions`). Returns the batch size."""
    if not isinstance(cache, dict):
        raise RuntimeInputError(f"a decode cache is the dict decode_init returns, got "
                                f"{type(cache).__name__}")
    missing = [name for name in expected_shapes if name not in cache]
    if missing:
        raise RuntimeInputError(f"decode cache is missing {missing} (pass the dict "
                                f"decode_init or decode_step returned)")
    shapes = {name: shape_and_dtype(cache[name]) for name in expected_shapes}
    batch = shapes["valid"][0][0] if len(shapes["valid"][0]) == 2 else None
    if batch_size is not None and batch is not None and batch != batch_size:
        raise RuntimeInputError(f"batch mismatch: token_ids have batch {batch_size} but the "
                                f"decode cache has batch {batch}")
    dtypes = {**_CACHE_DTYPES, "keys": np.dtype(cache_dtype), "values": np.dtype(cache_dtype)}
    for name, want in expected_shapes.items():
        (shape, dtype), want = shapes[name], tuple(batch if d == "batch" else d for d in want)
        if tuple(shape) != want:
            raise RuntimeInputError(f"decode cache {name} has shape {list(shape)}, this export "
                                    f"needs {list(want)} (a cache of another model or memory "
                                    f"length?)")
        if dtype != dtypes.get(name, np.float32):
            raise RuntimeInputError(f"decode cache {name} must be "
                                    f"{np.dtype(dtypes.get(name, np.float32))}, got {dtype}")
    return batch


def check_ring_positions(positions, size):
    """Returns `positions` (`RingPositions`) or raises `RuntimeInputError`
    unless they lie inside a ring of `size` slots."""
    for name in ("slot", "row_slot"):
        value = np.asarray(getattr(positions, name))
        if value.size and (value.min() < 0 or value.max() >= size):
            raise RuntimeInputError(f"decode cache {name} must lie in [0, {size}) (the ring's "
                                    f"slots), got {value.tolist()}")
    return positions


# ---------------------------------------------------- finding the artefacts
ONNX_FILE = "model.onnx"
SAVED_MODEL_DIR = "saved_model"


def choose_artefact(path, backend="auto"):
    """`("onnx" | "saved_model", its path)` for an export at `path` (see
    `open_runtime`; `auto` prefers ONNX); FileNotFoundError when absent."""
    if backend not in ("auto", "onnx", "saved_model"):
        raise TxlError(f"backend must be auto, onnx or saved_model, got {backend!r}")
    path = os.fspath(path)  # a pathlib.Path too
    onnx_path, saved_model_path = _locate(path)
    if backend == "auto" and not (onnx_path or saved_model_path):
        raise FileNotFoundError(f"no export at {path!r}: neither an ONNX model nor a SavedModel "
                                "(open a .onnx file, a SavedModel folder or an export's folder; "
                                "a model directory is exported first, by txl-export)")
    if backend == "auto":
        backend = "onnx" if onnx_path else "saved_model"
    if backend == "onnx" and not onnx_path:
        raise FileNotFoundError(f"no ONNX model at {path!r}")
    if backend == "saved_model" and not saved_model_path:
        raise FileNotFoundError(f"no SavedModel at {path!r}")
    return backend, onnx_path if backend == "onnx" else saved_model_path


# The options each backend's runtime takes besides `path` and `device`
# (`open_runtime`'s **options), and the names an error gives the backends.
BACKEND_OPTIONS = {
    "onnx": ("io_binding", "session_options", "fixed_shapes", "device_cache", "tf32",
             "cuda_graph", "low_memory", "single_stream"),
    "saved_model": (),
}
_BACKEND_NAMES = {"onnx": ("ONNX", "OnnxRuntime"),
                  "saved_model": ("SavedModel", "SavedModelRuntime")}


def check_options(backend, found, options):
    """Raises `TxlError` unless the runtime of `backend` takes every name in
    `options`: the error names the backend an option belongs to, or what
    each backend takes.

    Args:
        backend: "onnx" or "saved_model" (`choose_artefact`'s).
        found: the path it opens (named in the error).
        options: `open_runtime`'s **options.
    """
    wrong = sorted(set(options) - set(BACKEND_OPTIONS[backend]))
    if not wrong:
        return
    (other,) = set(BACKEND_OPTIONS) - {backend}
    if set(wrong) <= set(BACKEND_OPTIONS[other]):
        verb = "is an option" if len(wrong) == 1 else "are options"
        name, runtime = _BACKEND_NAMES[other]
        raise TxlError(f"open_runtime: {', '.join(wrong)} {verb} of the {name} backend "
                       f"({runtime}), not of the {_BACKEND_NAMES[backend][0]} one that opens "
                       f"{found}")
    unknown = [option for option in wrong if option not in BACKEND_OPTIONS[other]]
    onnx, saved = (", ".join(BACKEND_OPTIONS[b]) or "none" for b in ("onnx", "saved_model"))
    raise TxlError(f"open_runtime: unknown option{'s' if len(unknown) > 1 else ''} "
                   f"{', '.join(unknown)}; the ONNX backend takes {onnx}, the SavedModel one "
                   f"{saved}")


def _locate(path):
    if os.path.isfile(path):
        name = os.path.basename(path)
        if name in DECODE_FILES.values():
            raise ModelDirError(
                f"{path} is one of the cached decode interface's graphs, which the runtime "
                f"opens itself beside {ONNX_FILE}: open "
                f"{os.path.join(os.path.dirname(path) or '.', ONNX_FILE)} or its folder")
        return (path if path.endswith(".onnx") else None), None
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path!r} is neither an ONNX file nor a directory")
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return None, path
    onnx_path = os.path.join(path, ONNX_FILE)
    saved = os.path.join(path, SAVED_MODEL_DIR)
    return (onnx_path if os.path.isfile(onnx_path) else None,
            saved if os.path.isfile(os.path.join(saved, "saved_model.pb")) else None)
