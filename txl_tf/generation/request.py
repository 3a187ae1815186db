"""What a decode is asked to do, checked once for every backend: prompts,
per-row settings (`Rows`), and the loop state a later call resumes from."""
from typing import Any, NamedTuple

import numpy as np

from txl_tf.app.reprs import fields_repr
from txl_tf.checks.numpy_checks import (  # noqa: F401 (check_count re-exported)
    as_array, check_count, is_integer_dtype)
from txl_tf.errors import TxlError
from txl_tf.generation import sampling_numpy
from txl_tf.generation.sampling_settings import Sampling

MAX_SEED = 2 ** 63 - 1
# The compiled decode loop keeps a call's ids in a buffer rounded up to a power
# of two with int32 dimensions: 2**30 ids per row is the most one call holds.
MAX_NEW_TOKENS = 2 ** 30
# The sampler draws with the low 32 bits of a row's draw counter
# (`counter_rng.uniform`): past 2**32 draws a row's draws would repeat.
MAX_DRAWS = 2 ** 32


class Rows(NamedTuple):
    """Per-row settings, fixed for a decode. keys: int64 `[B]` stream keys;
    temperature, top_p, penalty: float32 `[B]`; top_k: int32 `[B]`; stop:
    bool `[B, V]`, True for the ids that end the row."""

    keys: np.ndarray
    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    penalty: np.ndarray
    stop: np.ndarray

    __repr__ = fields_repr

    def take(self, index):
        return Rows(*(np.asarray(a)[index] for a in self))

    @staticmethod
    def concat(parts):
        return Rows(*(np.concatenate(arrays) for arrays in zip(*parts)))


class DecodeState(NamedTuple):
    """Where a decode stopped: `generate(..., resume=state)` goes on exactly as
    one longer call would. next_log_probs: float32 `[B, V]`, the model's
    prediction after the last id read; seen: bool `[B, V]` (repetition
    penalty); counters: int64 `[B]`, draws made per row; done: bool `[B]`;
    cache: a `HeldCache`, the decode cache holding `memory` (export runtimes
    on their cached interface; None elsewhere), so that a resume on the same
    backend goes on from it without projecting the memory again."""

    next_log_probs: np.ndarray
    memory: Any
    seen: np.ndarray
    counters: np.ndarray
    done: np.ndarray
    rows: Rows
    pad_id: int
    cache: Any = None

    __repr__ = fields_repr


class HeldCache(NamedTuple):
    """A decode cache (`export.decode_interface`) and the backend whose
    tensors hold it: only that backend reads on from it. `private`: no
    caller can reach it (a next turn's new cache, before its decode), so
    the decode may advance it in place instead of a copy."""

    backend: Any
    tensors: Any
    private: bool = False

    __repr__ = fields_repr

    def on(self, backend):
        """The cache's tensors when `backend` holds them, else None."""
        return self.tensors if self.backend is backend else None


def held_cache(state, backend):
    """The decode cache of `state` that `backend` can read on from, or None
    (also when the backend's cached interface is turned off)."""
    if state.cache is None or not getattr(backend, "use_decode_cache", True):
        return None
    return state.cache.on(backend)


class Generation(NamedTuple):
    """ids: int32 `[B, n]`, `pad_id` after a row's stop id; log_probs: float32
    `[B, n]`, each id's log-prob under the model (0 after the stop); lengths:
    int32 `[B]`, new ids per row (stop id included); memory: everything read
    (prompt and every new id; frozen once a row stops); state: see
    `DecodeState`."""

    ids: np.ndarray
    log_probs: np.ndarray
    lengths: np.ndarray
    memory: Any
    state: DecodeState

    __repr__ = fields_repr


def _is_int(value):
    # numpy counts timedelta64 among its integers
    return isinstance(value, (int, np.integer)) and \
        not isinstance(value, (bool, np.bool_, np.timedelta64))


def check_prompts(prompts, n_token):
    """A list of non-empty int32 arrays from a `[B, L]` array or a list of
    1-D sequences of ids in `[0, n_token)`."""
    if isinstance(prompts, np.ndarray) and prompts.ndim == 2:
        prompts = list(prompts)
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TxlError("prompts must be a non-empty list of id sequences or a "
                       "[batch, length] array")
    rows = []
    for i, prompt in enumerate(prompts):
        ids = as_array(prompt, f"prompt {i}", TxlError,
                       "a prompt is a non-empty 1-D sequence of ids")
        if ids.ndim != 1 or ids.size == 0:
            raise TxlError(f"prompt {i} must be a non-empty 1-D sequence of ids, got shape "
                           f"{ids.shape}")
        if not is_integer_dtype(ids.dtype):
            raise TxlError(f"prompt {i} must hold integer ids, got dtype {ids.dtype}")
        bad = np.flatnonzero((ids < 0) | (ids >= n_token))
        if bad.size:
            raise TxlError(f"prompt {i}: id {int(ids[bad[0]])} at position {int(bad[0])} is "
                           f"out of range for a vocabulary of {n_token} tokens")
        rows.append(ids.astype(np.int32))
    return rows




def per_row(name, value, batch_size, low=0, high=MAX_SEED):
    """int64 `[B]` from one int (row i gets `value + i` for seeds, else
    `value`) or a sequence of B ints in `[low, high]`."""
    values = [value] * batch_size if _is_int(value) else list(np.ravel(value)) \
        if isinstance(value, (list, tuple, np.ndarray)) else None
    if values is None or len(values) != batch_size or not all(_is_int(v) for v in values):
        raise TxlError(f"{name} must be an integer or {batch_size} integers (one per "
                       f"prompt), got {value!r}")
    if not all(low <= v <= high for v in values):
        raise TxlError(f"{name} must be in [{low}, {high}], got {value!r}")
    if name == "seed" and _is_int(value):
        if int(value) + batch_size - 1 > high:  # int64 would wrap the last rows' seeds
            raise TxlError(f"seed must be in [{low}, {high - batch_size + 1}] for "
                           f"{batch_size} prompts (row i uses seed + i, at most {high}), "
                           f"got {value!r}; or pass one seed per prompt")
        return np.array(values, np.int64) + np.arange(batch_size)
    return np.array(values, np.int64)


def stop_mask(stop_ids, n_token, batch_size):
    """bool `[B, V]` from one list of stop ids for every row."""
    if isinstance(stop_ids, np.ndarray):  # masked entries: not dropped silently
        stop_ids = as_array(stop_ids, "stop_ids", TxlError)
    stop_ids = list(np.ravel(np.asarray(stop_ids, dtype=object))) if stop_ids is not None else []
    mask = np.zeros([batch_size, n_token], np.bool_)
    for s in stop_ids:
        if not _is_int(s) or not 0 <= s < n_token:
            raise TxlError(f"stop_ids must be ids in [0, {n_token}), got {s!r}")
        mask[:, int(s)] = True
    return mask


def make_rows(n_token, batch_size, seed, stop_ids, sampling):
    """`Rows` for one `Sampling` (or one per row), a seed and stop ids."""
    samplings = list(sampling) if isinstance(sampling, (list, tuple)) else [sampling] * batch_size
    if len(samplings) != batch_size:
        raise TxlError(f"got {len(samplings)} sampling settings for {batch_size} prompts")
    for s in samplings:
        s.checked(n_token)
    keys = sampling_numpy.row_key(per_row("seed", seed, batch_size))  # no TF dispatch
    return Rows(keys, np.array([s.temperature for s in samplings], np.float32),
                np.array([s.top_k for s in samplings], np.int32),
                np.array([s.top_p for s in samplings], np.float32),
                np.array([s.repetition_penalty for s in samplings], np.float32),
                stop_mask(stop_ids, n_token, batch_size))


def seen_mask(prompts, n_token):
    """bool `[B, V]`: the ids of each prompt."""
    seen = np.zeros([len(prompts), n_token], np.bool_)
    for i, ids in enumerate(prompts):
        seen[i, ids] = True
    return seen


def right_aligned_segments(length, segment_len):
    """Slices that cut `length` positions into segments of `segment_len`, the
    short one first: a prompt left-padded to any longer length is then cut at
    the same places, so its row computes what it computes alone."""
    first = length % segment_len or segment_len
    bounds = [0] + list(range(first, length + 1, segment_len))
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def check_pad_id(pad_id, n_token):
    if not _is_int(pad_id) or not 0 <= pad_id < n_token:
        raise TxlError(f"pad_id must be an id in [0, {n_token}), got {pad_id!r}")
    return int(pad_id)


__all__ = ["MAX_DRAWS", "MAX_NEW_TOKENS", "DecodeState", "Generation", "Rows", "Sampling",
           "check_count", "check_pad_id", "check_prompts", "make_rows", "per_row",
           "right_aligned_segments", "seen_mask", "stop_mask"]
