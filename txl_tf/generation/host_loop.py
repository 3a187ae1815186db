"""The decode loop on the host, for backends that run one step per call (an
export runtime's `GenerationBackend`: `adopt`, `next_log_probs`, `take`,
`concat`; on the cache `decode_init`, `copy_cache`, `next_cached`,
`cache_memory`): `sampling_numpy.choose` (the mirror of the compiled
decoder's sampler) picks each id, only the new ids go in and only the last
log-probs come out, and the memory stays in the backend's tensors. A row
that stops leaves the batch (its memory is set aside, frozen), so later
steps run on the live rows only.

`host_decode_cached` runs the same loop on a backend's decode cache (its
memory's keys and values projected once, then one token per step): stopped
rows stay in the batch, their token not written into the cache. The
cache goes on in the returned state: a resume on the same backend goes on
from it.

A live row whose log-probs are no distribution (NaN or +inf: `choose` draws
nothing for it) stops drawing there, as the compiled decoder's loop stops
it; the other rows go on, and the loop ends with a
`txl_tf.generation.nan_rows.NonFiniteLogProbsError` where the decoder's
does: at the end of the streamed chunk (before it is streamed) or of the
call, naming the same rows and steps.
"""
import numpy as np

from txl_tf.generation.nan_rows import raise_for_rows
from txl_tf.generation.request import DecodeState, HeldCache, held_cache
from txl_tf.generation.sampling_numpy import choose


def host_decode(backend, state, num_tokens, stream=None, stream_every=1):
    """`(ids [B, n], log_probs [B, n], new DecodeState)`; see `generation`."""
    batch = len(state.done)
    ids = np.full([batch, num_tokens], state.pad_id, np.int32)
    chosen = np.zeros([batch, num_tokens], np.float32)
    log_probs = np.array(state.next_log_probs, np.float32, copy=True)
    seen, counters = state.seen.copy(), state.counters.copy()
    done = state.done.copy()
    live = np.flatnonzero(~done)
    start = backend.adopt(state.memory, batch)  # checked once; the steps are not
    frozen = [] if live.size == batch else [(np.flatnonzero(done),
                                              backend.take(start, np.flatnonzero(done)))]
    memory = start if live.size == batch else (backend.take(start, live) if live.size else None)
    broken = np.zeros(batch, np.bool_)  # rows whose log-probs are no distribution
    streamed = 0
    for t in range(num_tokens):
        if not live.size:
            break
        every = live.size == batch  # then no row copies: the loop's cost is the model's
        rows = state.rows if every else state.rows.take(live)
        token, lp, new_seen, new_counters, stopped = choose(
            log_probs if every else log_probs[live], rows, seen if every else seen[live],
            counters if every else counters[live], np.zeros(live.size, np.bool_),
            state.pad_id)
        refused = new_counters == (counters if every else counters[live])  # (`choose`)
        if every:
            seen, counters = new_seen, new_counters
        else:
            seen[live], counters[live] = new_seen, new_counters
        ids[live, t], chosen[live, t] = token, lp
        log_probs[live], memory = backend.next_log_probs(token[:, None], memory)
        left = stopped | refused
        if left.any():
            done[live[stopped]] = True
            broken[live[refused]] = True
            frozen.append((live[left], backend.take(memory, np.flatnonzero(left))))
            live = live[~left]
            memory = backend.take(memory, np.flatnonzero(~left)) if live.size else None
        if stream is not None and (t + 1 - streamed == stream_every or t + 1 == num_tokens
                                   or not live.size):
            raise_for_rows(broken, counters, state.counters, ids, state.pad_id)
            stream(ids[:, streamed:t + 1])
            streamed = t + 1
    raise_for_rows(broken, counters, state.counters, ids, state.pad_id)
    parts = frozen + ([(live, memory)] if live.size else [])
    if len(parts) == 1 and parts[0][0].size == batch and (parts[0][0] == np.arange(batch)).all():
        memory = parts[0][1]
    else:
        order = np.argsort(np.concatenate([rows for rows, _ in parts]))
        memory = backend.take(backend.concat([m for _, m in parts]), order)
    return ids, chosen, DecodeState(log_probs, memory, seen, counters, done, state.rows,
                                    state.pad_id)


def host_decode_cached(backend, state, num_tokens, stream=None, stream_every=1):
    """`host_decode` on the backend's decode cache (`decode_init`,
    `next_cached`, `cache_memory`): the same ids and log-probs."""
    batch = len(state.done)
    ids = np.full([batch, num_tokens], state.pad_id, np.int32)
    chosen = np.zeros([batch, num_tokens], np.float32)
    log_probs = np.array(state.next_log_probs, np.float32, copy=True)
    seen, counters, done = state.seen.copy(), state.counters.copy(), state.done.copy()
    cache = held_cache(state, backend)
    # Steps advance the cache in place: never a state's own that a caller
    # holds (it may resume from that state again), a copy of it.
    if cache is None:
        cache = backend.decode_init(state.memory, batch)  # checked once; the steps are not
    elif not state.cache.private:
        cache = backend.copy_cache(cache)
    broken = np.zeros(batch, np.bool_)  # rows whose log-probs are no distribution
    streamed = 0
    for t in range(num_tokens):
        if (done | broken).all():
            break
        was_done = done
        token, lp, new_seen, new_counters, done = choose(log_probs, state.rows, seen, counters,
                                                         was_done, state.pad_id)
        broken |= (new_counters == counters) & ~was_done  # (`choose`)
        seen, counters = new_seen, new_counters
        ids[:, t], chosen[:, t] = token, lp
        # Broken rows keep their cache and log-probs: `choose` refuses them again.
        step_log_probs = backend.next_cached(token, was_done | broken, cache)
        log_probs = np.where((was_done | broken)[:, None], log_probs, step_log_probs)
        if stream is not None and (t + 1 - streamed == stream_every or t + 1 == num_tokens
                                   or (done | broken).all()):
            raise_for_rows(broken, counters, state.counters, ids, state.pad_id)
            stream(ids[:, streamed:t + 1])
            streamed = t + 1
    raise_for_rows(broken, counters, state.counters, ids, state.pad_id)
    return ids, chosen, DecodeState(log_probs, backend.cache_memory(cache), seen, counters,
                                    done, state.rows, state.pad_id, HeldCache(backend, cache))
