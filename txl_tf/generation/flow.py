"""The generation flow every backend shares: check the request, read the
prompts (`prefill`), then run the backend's decode loop.

A backend (the compiled Keras `Decoder`; for an export `Runtime`, its
`export.generation_backend.GenerationBackend`) provides `n_token`,
`initial_memory(B)`, `check_memory(memory, B)` (raises unless a caller's
memory fits B rows), `step_last(ids, memory) -> (log_probs numpy [B, V],
memory)`, `take(memory, rows)`, `split(memory)` (one memory per row),
`concat(memories)` and `decode(state, n, stream, stream_every) -> (ids,
log_probs, state)` (raising `nan_rows.NonFiniteLogProbsError` for a row
whose log-probs are no distribution), and may name its `compute_dtype`;
for next turns on a decode cache, `read_cached(ids, cache)`,
`take_cache(cache, rows)` and `concat_caches(caches)`.

Prompts of different lengths: rows of one length are read together, in
segments aligned on the right (`right_aligned_segments`), then the batch's
memory is put together in the callers' row order. A shorter row's memory then
holds invalid slots (`mem_mask` False) where a longer row has its older
tokens: the left padding lives in the memory, never in a segment, so every
row computes exactly what it computes alone (up to float summation order),
the core needs no per-token mask, and the exported graphs are used as they
are.
"""
import numpy as np

from txl_tf.checks.memory_budget import check_new_ids
from txl_tf.checks.numpy_checks import NonFiniteMemoryError, check_finite_outputs
from txl_tf.errors import TxlError
from txl_tf.generation.nan_rows import NonFiniteLogProbsError
from txl_tf.generation.request import (MAX_DRAWS, MAX_NEW_TOKENS, DecodeState, Generation,
                                       HeldCache, check_count, check_pad_id, check_prompts,
                                       held_cache, make_rows, right_aligned_segments,
                                       seen_mask)
from txl_tf.generation.sampling_settings import Sampling


def generate(backend, prompts, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
             repetition_penalty=1.0, seed=0, stop_ids=(), pad_id=0, memory=None, resume=None,
             stream=None, stream_every=8, segment_len=64):
    """See `Decoder.generate` (the arguments are the same for every backend)."""
    n = check_count("max_new_tokens", max_new_tokens, high=MAX_NEW_TOKENS)
    segment_len = check_count("segment_len", segment_len, low=1)
    if stream is not None and not callable(stream):
        raise TxlError(f"stream must be callable, got {type(stream).__name__}")
    if isinstance(stream_every, bool) or not isinstance(stream_every, int) or stream_every < 1:
        raise TxlError(f"stream_every must be an integer >= 1, got {stream_every!r}")
    # A compiled decode loop's buffer (the `Decoder`'s), beside the outputs.
    loop_buffer = getattr(backend, "loop_buffer", None)
    buffer = loop_buffer(n, stream, stream_every) if loop_buffer is not None else 0
    if resume is not None:
        if memory is not None:
            raise TxlError("pass either a memory or resume (which holds one), not both")
        if not isinstance(resume, DecodeState):
            raise TxlError("resume must be the .state of an earlier Generation")
        state = resume
        check_new_ids(len(state.done), n, buffer=buffer)  # before a next turn is read
        if prompts is not None:
            state = next_turn(backend, resume, check_prompts(prompts, backend.n_token),
                              segment_len)
    else:
        prompts = check_prompts(prompts, backend.n_token)
        check_new_ids(len(prompts), n, buffer=buffer)  # before the prompts are read
        rows = make_rows(backend.n_token, len(prompts), seed, stop_ids,
                         Sampling(temperature, top_k, top_p, repetition_penalty))
        pad_id = check_pad_id(pad_id, backend.n_token)
        fresh = memory is None
        if fresh:
            memory = backend.initial_memory(len(prompts))
        else:  # before prompts of several lengths take rows of it
            backend.check_memory(memory, len(prompts))
        try:
            log_probs, memory = prefill(backend, prompts, memory, segment_len)
        except NonFiniteMemoryError as err:
            if not fresh:  # the caller's memory may hold them: that error says so
                raise
            # Nothing but the model's weights and the prompts made them.
            raise NonFiniteLogProbsError(err.rows, [0] * len(err.rows),
                                         dtype=getattr(backend, "compute_dtype", None)) from None
        batch = len(prompts)
        state = DecodeState(log_probs, memory, seen_mask(prompts, backend.n_token),
                            np.zeros(batch, np.int64), np.zeros(batch, np.bool_), rows, pad_id)
    if n and int(np.max(state.counters)) + n > MAX_DRAWS:
        raise TxlError(f"a row has made {int(np.max(state.counters))} draws: "
                       f"{n} more would pass the sampler's {MAX_DRAWS} (2**32) draws per "
                       "row, after which its draws repeat; start a new decode instead of "
                       "resuming")
    ids, log_probs, new_state = backend.decode(state, n, stream, stream_every)
    lengths = (new_state.counters - state.counters).astype(np.int32)
    return Generation(ids, log_probs, lengths, new_state.memory, new_state)


def next_turn(backend, state, prompts, segment_len):
    """`state` after reading a next turn's prompts on its memory (a
    conversation): every row goes on (also one that stopped), its sampler
    stream and draw count continue. The prompts are read in segments, as a
    prompt on `memory=` is. On the state's decode cache (an export runtime
    that decoded it) the segments are read on the cache (`read_cached`):
    only the turn's positions are projected and the decode goes on from
    the new cache."""
    if len(prompts) != len(state.done):
        raise TxlError(f"a next turn needs one prompt per row of the state "
                       f"({len(state.done)}), got {len(prompts)}")
    cache = held_cache(state, backend)
    held = None
    if cache is None:
        log_probs, memory = prefill(backend, prompts, state.memory, segment_len)
    else:  # the decode gives the memory back from the cache
        log_probs, cache = prefill(CachedReading(backend), prompts, cache, segment_len)
        memory, held = None, HeldCache(backend, cache, private=True)
    seen = state.seen | seen_mask(prompts, backend.n_token)
    return DecodeState(log_probs, memory, seen, state.counters.copy(),
                       np.zeros_like(state.done), state.rows, state.pad_id, held)


class CachedReading:
    """A backend's decode cache in the shape `prefill` reads with: segments
    read on a cache (`read_cached`) in place of a memory."""

    def __init__(self, backend):
        self.backend = backend

    def step_last(self, ids, cache):
        log_probs, cache = self.backend.read_cached(ids, cache)
        return check_finite_outputs(log_probs), cache

    def take(self, cache, rows):
        return self.backend.take_cache(cache, rows)

    def concat(self, caches):
        return self.backend.concat_caches(caches)


def prefill(backend, prompts, memory, segment_len):
    """Reads every prompt into `memory`; `(log-probs after each prompt numpy
    [B, V], memory)`. Rows of equal length share calls."""
    lengths = np.array([len(p) for p in prompts])
    order, parts, last = [], [], []
    for length in np.unique(lengths):
        rows = np.flatnonzero(lengths == length)
        part = memory if len(rows) == len(prompts) else backend.take(memory, rows)
        ids = np.stack([prompts[i] for i in rows])
        for segment in right_aligned_segments(int(length), segment_len):
            try:
                log_probs, part = backend.step_last(ids[:, segment], part)
            except NonFiniteMemoryError as err:
                raise err.in_batch(rows) from None
        order.append(rows)
        parts.append(part)
        last.append(np.asarray(log_probs))
    if len(parts) == 1:
        return last[0], parts[0]
    inverse = np.argsort(np.concatenate(order))
    return np.concatenate(last)[inverse], backend.take(backend.concat(parts), inverse)
