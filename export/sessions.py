"""Serving many concurrent streams: a session table over one runtime.

```python
table = SessionTable(open_runtime("out/model.onnx"), max_batch=16)
table.open("alice", prompt_ids, max_new_tokens=64, temperature=0.8, seed=1, stop_ids=[eos])
table.open("bob", other_ids, max_new_tokens=32, temperature=0)
while table.active():
    new = table.step()              # {session id: new id} for up to max_batch sessions
table.reset("bob", next_document)   # bob's memory forgotten, the next document read
out = table.close("alice")          # a txl_tf.Generation of one row
```
Each session keeps its own memory, sampling settings, seed, stop ids and
counters; a session's ids are exactly what it gets alone
(`runtime.generate([prompt], n, ...)` with its seed), whoever shares its
batches, up to float32 round-off (a sampled draw within ~1e-6 of the
boundary between two ids can take the other one). Prompts are read when a
session opens, alone.

A table may be used from several threads (request threads opening and
closing sessions, one loop stepping): each method holds the table's lock
while it reads or changes the sessions, the queue and the slab; a prompt
is read (`open`, `reset`) without it, so a step need not wait for one.

On a runtime with the cached decode interface (an export made with it) the
table keeps the running sessions' decode caches in one slab
(`export.slab.CacheSlab`; `export.slab.DeviceSlab`, in
device buffers, where the runtime keeps its caches on the device): a
session joins it when a row is free, in the order
the sessions opened, and leaves when it is done; a step reads and writes the
slab in place, so a step costs what a step of the runtime's own batch costs
(no cache is copied per step, no memory projected again). Elsewhere (the
compiled `Decoder`, an older export) a step gathers up to `max_batch` live
sessions' memories into one batch (round robin), runs `step_last` and splits
the new memory back, through the host.
"""
import collections
import itertools
import threading
from typing import NamedTuple

import numpy as np

from export.runtime import generation_backend
from txl_tf.checks.numpy_checks import NonFiniteMemoryError, check_finite_outputs
from txl_tf.errors import TxlError
from txl_tf.generation.flow import prefill
from txl_tf.generation.nan_rows import NonFiniteLogProbsError
from txl_tf.generation.request import (MAX_NEW_TOKENS, Generation, DecodeState, HeldCache,
                                       check_count, check_pad_id, check_prompts, make_rows,
                                       seen_mask)
from txl_tf.generation.sampling_settings import Sampling
from txl_tf.generation.sampling_numpy import choose


class _Session(NamedTuple):
    state: DecodeState
    budget: int
    ids: list
    log_probs: list


class SessionTable:
    """Sessions keyed by id over an export `Runtime` or a `txl_tf.Decoder`.

    Args:
        backend: an export `Runtime` or a `txl_tf.Decoder`.
        max_batch: the most sessions one step runs, an int >= 1 (default 16).
        segment_len: prompt positions read per call (None: the config's
            `tgt_len`).

    Raises:
        TxlError: a bad `max_batch` or `segment_len`.
    """

    def __init__(self, backend, max_batch=16, segment_len=None):
        # The runtime's `GenerationBackend`: the one its states' caches name,
        # so `runtime.generate(..., resume=table.close(id).state)` goes on from it.
        self.backend = generation_backend(backend)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise TxlError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.max_batch = max_batch
        config = getattr(backend, "config", None) or backend.core.config
        self.segment_len = check_count(
            "segment_len", config.tgt_len if segment_len is None else segment_len, low=1)
        self._sessions = {}
        # Live session ids: next served first (on the slab: waiting to join it).
        self._queue = collections.deque()
        self._slab = None
        if getattr(backend, "use_decode_cache", False):
            if not getattr(backend, "device_cache", False):  # a device slab is not host memory
                _check_slab_fits(backend, max_batch)
            self._slab = self.backend.cache_slab(max_batch)
        # Held while the sessions, the queue or the slab are read or changed.
        self._lock = threading.RLock()
        # (the served sessions' `Rows`, joined): their settings, fixed for a
        # session's life, change only as sessions join or leave.
        self._joined_rows = ((), None)

    def open(self, session_id, prompt, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
             repetition_penalty=1.0, seed=0, stop_ids=(), pad_id=0, memory=None):
        """Reads `prompt` for a new session.

        Args:
            session_id: a new key (any hashable).
            prompt: 1-D ids, non-empty.
            max_new_tokens: the most ids it generates (0: none).
            temperature: as in `txl_tf.Sampling` (1.0; 0 is greedy).
            top_k: as in `txl_tf.Sampling` (0: no limit).
            top_p: as in `txl_tf.Sampling` (1.0: no limit).
            repetition_penalty: as in `txl_tf.Sampling` (1.0).
            seed: the session's random stream, an int.
            stop_ids: ids that end the session (included in its output).
            pad_id: the id after a stop in its `Generation`.
            memory: one stream's memory to read on (e.g. a `Generation`'s
                or `step`'s: a text read once that many sessions go on
                from); None: an empty memory.

        Raises:
            TxlError: the id is already open (also by another thread while
                this prompt was read), or a bad prompt or setting.
        """
        self._check_new(session_id)
        n_token = self.backend.n_token
        prompts = check_prompts([prompt], n_token)
        budget = check_count("max_new_tokens", max_new_tokens, high=MAX_NEW_TOKENS)
        rows = make_rows(n_token, 1, seed, stop_ids, Sampling(temperature, top_k, top_p,
                                                             repetition_penalty))
        fresh = memory is None
        if fresh:
            memory = self.backend.initial_memory(1)
        try:
            log_probs, memory = prefill(self.backend, prompts, memory, self.segment_len)
        except NonFiniteMemoryError as err:  # named by the session, not as row 0
            raise (NonFiniteLogProbsError([session_id], [0]) if fresh  # the model made them
                   else err.in_batch([session_id])) from None
        # `done` means stopped by a stop id: a session that used its budget
        # can go on from `close(id).state`.
        state = DecodeState(log_probs, memory, seen_mask(prompts, n_token),
                            np.zeros(1, np.int64), np.array([False]), rows,
                            check_pad_id(pad_id, n_token))
        with self._lock:
            self._check_new(session_id)
            self._sessions[session_id] = _Session(state, budget, [], [])
            if budget:
                self._queue.append(session_id)

    def __repr__(self):
        # Not waiting for the lock: a step in another thread holds it for the
        # whole step (a log line or a debugger's view would wait on it).
        kind = "slab" if self._slab is not None else "round robin"
        sessions = "stepping"
        if self._lock.acquire(blocking=False):
            try:
                generating = sum(map(self._goes_on, self._sessions))
                sessions = f"{len(self._sessions)} open, {generating} generating"
            finally:
                self._lock.release()
        return (f"<SessionTable: {sessions}, max_batch={self.max_batch}, {kind} over "
                f"{getattr(self.backend, 'runtime', self.backend)!r}>")

    def _check_new(self, session_id):
        _check_hashable(session_id)
        with self._lock:
            if session_id in self._sessions:
                raise TxlError(f"session {session_id!r} is already open")

    @property
    def slab(self):
        """The running sessions' `CacheSlab` (rows in `slab.keys` order), or
        None when the backend has no cached decode interface."""
        return self._slab

    def active(self):
        """The sessions still generating.

        Returns:
            A list of their ids.
        """
        with self._lock:
            self._settle()
            return (self._slab.keys if self._slab is not None else []) + list(self._queue)

    def step(self):
        """One batched step for up to `max_batch` live sessions.

        Returns:
            `{session id: new id}` (empty when no session is live).
        """
        with self._lock:
            return self._step()

    def _step(self):
        # An interrupt (Ctrl-C, a cancelled task) anywhere in a step leaves the
        # table as before it (the sessions' states, the slab's rows) or with the
        # step taken for every served session; the next step goes on from there.
        self._settle()
        served = self._serve()
        if not served:
            return {}
        states = [self._sessions[s].state for s in served]
        lengths = [len(self._sessions[sid].ids) for sid in served]
        log_probs = None  # set once the step is taken
        taken = self._slab.taken[0] if self._slab is not None else None

        def record(i):  # the i-th served session's step (the same when repeated)
            sid, state = served[i], states[i]._replace(
                next_log_probs=log_probs[i:i + 1], seen=seen[i:i + 1],
                counters=counters[i:i + 1], done=stopped[i:i + 1])
            session = self._sessions[sid]
            self._sessions[sid] = session._replace(
                state=state if memories[i] is None else state._replace(memory=memories[i]))
            del session.ids[lengths[i]:], session.log_probs[lengths[i]:]
            session.ids.append(new_ids[i])
            session.log_probs.append(new_log_probs[i])

        recorded = 0
        try:
            ids, chosen, seen, counters, stopped = choose(
                np.concatenate([s.next_log_probs for s in states]),
                self._batch_rows(states),
                np.concatenate([s.seen for s in states]),
                np.concatenate([s.counters for s in states]), np.zeros(len(served), np.bool_),
                0)
            new_ids, new_log_probs = ids.tolist(), chosen.tolist()  # Python ints and floats
            memories = [None] * len(served)
            if self._slab is None:
                log_probs, memories = self._step_memories(served, states, ids)
            else:
                ending = stopped | (np.array(lengths) + 1 >= [self._sessions[s].budget
                                                              for s in served])
                log_probs = self._step_slab(served, ids, ending)
            for recorded in range(len(served)):
                record(recorded)
        except BaseException:
            # Interrupted (or failed) before the step was taken: nothing changed
            # (a slab's step is taken back). After: it is recorded for every
            # served session first.
            if log_probs is None and self._slab is not None and self._slab.taken[0] != taken:
                log_probs = self._slab.taken[1]  # taken as the slab's step returned
            if log_probs is not None:
                for i in range(recorded, len(served)):
                    record(i)
            raise
        # Behind the others (round robin); `_settle` takes out those that are done.
        if self._slab is None:
            self._queue.rotate(-len(served))
        self._settle()
        return dict(zip(served, new_ids))

    def reset(self, session_id, prompt, max_new_tokens=None):
        """Starts a new document in a session: its memory is forgotten (as a
        document boundary clears a row's memory in training, the other
        sessions keep theirs) and `prompt` (1-D ids) is read from an empty
        memory. Its sampling settings, random stream, stop ids and the ids
        it generated so far stay.

        Args:
            session_id: an open session.
            prompt: 1-D ids, non-empty.
            max_new_tokens: the most ids it generates from here (None: what
                is left of its budget).

        Raises:
            TxlError: no such session, a bad prompt or count, or the session
                closed or reset by another thread while this prompt was read.
        """
        _check_hashable(session_id)
        n_token = self.backend.n_token
        prompts = check_prompts([prompt], n_token)
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise TxlError(f"no open session {session_id!r}")
            more = session.budget - len(session.ids) if max_new_tokens is None else \
                check_count("max_new_tokens", max_new_tokens, high=MAX_NEW_TOKENS)
            live = session_id in self._queue
            if self._slab is not None and session_id in self._slab.keys:
                live = True
                self._leave_slab(session_id)  # kept in its state until the prompt is read
            if session_id in self._queue:
                self._queue.remove(session_id)
            session = self._sessions[session_id]
        # Neither queued nor in the slab: no step serves it while its prompt is read.
        try:
            log_probs, memory = prefill(self.backend, prompts, self.backend.initial_memory(1),
                                        self.segment_len)
        except BaseException:  # interrupted or refused: the session goes on as it was
            with self._lock:
                if live and self._sessions.get(session_id) is session and \
                        session_id not in self._queue:
                    self._queue.append(session_id)
            raise
        state = session.state._replace(next_log_probs=log_probs, memory=memory,
                                       seen=seen_mask(prompts, n_token),
                                       done=np.array([False]), cache=None)
        with self._lock:
            if self._sessions.get(session_id) is not session:
                raise TxlError(f"session {session_id!r} was closed or reset by another "
                               "thread while reset read its prompt")
            self._sessions[session_id] = session._replace(state=state,
                                                          budget=len(session.ids) + more)
            if more:
                self._queue.append(session_id)

    def run(self):
        """Steps until every session is done."""
        while self.active():
            self.step()

    def close(self, session_id):
        """Removes a session.

        Args:
            session_id: an open session.

        Returns:
            Its `Generation` (one row, the ids so far; `state` goes on
            with the backend's `generate(..., resume=...)`).

        Raises:
            TxlError: no such session.
        """
        _check_hashable(session_id)
        with self._lock:
            if session_id not in self._sessions:
                raise TxlError(f"no open session {session_id!r}")
            if self._slab is not None and session_id in self._slab.keys:
                self._leave_slab(session_id)
            session = self._sessions.pop(session_id)
            if session_id in self._queue:
                self._queue.remove(session_id)
        n = len(session.ids)
        return Generation(np.array([session.ids], np.int32).reshape(1, n),
                          np.array([session.log_probs], np.float32).reshape(1, n),
                          np.array([n], np.int32), session.state.memory, session.state)

    # --------------------------------------------------------------- helpers
    def _goes_on(self, session_id):
        session = self._sessions[session_id]
        return not session.state.done[0] and len(session.ids) < session.budget

    def _settle(self):
        """Takes the sessions that are done out of the queue and the slab
        (also what an interrupted step or settle left)."""
        for sid in [s for s in self._queue if not self._goes_on(s) or
                    (self._slab is not None and s in self._slab.keys)]:
            self._queue.remove(sid)
        if self._slab is not None:
            for sid in [s for s in self._slab.keys if not self._goes_on(s)]:
                self._leave_slab(sid)

    def _serve(self):
        """The ids of the sessions this step runs, in batch order (on the
        slab: the rows it holds once the waiting sessions joined; elsewhere:
        the first `max_batch` queued, which stay queued until the step is
        taken)."""
        if self._slab is None:  # round robin
            return list(itertools.islice(self._queue, self.max_batch))
        while self._queue and not self._slab.full():
            sid = self._queue[0]
            self._slab.admit(sid, self.backend.decode_init(self._sessions[sid].state.memory, 1))
            self._queue.popleft()
        return list(self._slab.keys)

    def _batch_rows(self, states):
        """The `Rows` of the sessions of `states`, in order: joined again
        only where a session's settings are not those of the last step's row."""
        parts, (joined_parts, joined) = tuple(s.rows for s in states), self._joined_rows
        if len(parts) != len(joined_parts) or any(a is not b for a, b in zip(parts,
                                                                             joined_parts)):
            joined = type(parts[0]).concat(parts)
            self._joined_rows = (parts, joined)
        return joined

    def _step_memories(self, served, states, ids):
        """`step_last` on the served sessions' memories; `(log-probs, one
        memory per session)`."""
        try:
            log_probs, memory = self.backend.step_last(
                ids[:, None], self.backend.concat([s.memory for s in states]))
        except NonFiniteMemoryError as err:  # the others wait for the next step
            for row in err.rows:
                self._queue.remove(served[row])
            raise self._stopped_by(err, served) from None
        return log_probs, self.backend.split(memory)

    def _step_slab(self, served, ids, ending):
        """One step on the slab, in place; its log-probs. Sessions whose
        log-probs are not finite leave the slab and the step is taken back
        for all (the others run it again at the next step); not those the
        step `ending` (bool `[len(served)]`: a stop id, the budget's last
        id), which draw nothing from them."""
        going_on = np.flatnonzero(~ending)

        def check(log_probs):
            try:
                check_finite_outputs(np.asarray(log_probs)[going_on])
            except NonFiniteMemoryError as err:
                raise err.in_batch(going_on) from None
            return log_probs
        try:
            return self._slab.step(ids, check)
        except NonFiniteMemoryError as err:
            for row in err.rows:
                self._leave_slab(served[row])
            raise self._stopped_by(err, served) from None

    def _stopped_by(self, err, served):
        """The error for the served sessions whose step's log-probs `err`
        found not finite (rows of the step's batch `served`): the id each
        could not draw next is the one after this step's."""
        sessions = [served[row] for row in err.rows]
        return NonFiniteLogProbsError(sessions, [len(self._sessions[sid].ids) + 1
                                                 for sid in sessions])

    def _leave_slab(self, session_id):
        """Takes a session's cache out of the slab into its state (the memory
        it holds, and the cache for a resume on this backend)."""
        cache = self._slab.evict(session_id)
        try:
            memory = self.backend.cache_memory(cache)
        except BaseException:  # interrupted: the row goes back (the next settle retries)
            self._slab.admit(session_id, cache)
            raise
        session = self._sessions[session_id]
        self._sessions[session_id] = session._replace(state=session.state._replace(
            memory=memory, cache=HeldCache(self.backend, cache)))


__all__ = ["SessionTable"]


def _check_hashable(session_id):
    """Raises a `TxlError` unless `session_id` can key the table."""
    try:
        hash(session_id)
    except TypeError:
        raise TxlError(f"session_id must be hashable (a str, an int, a tuple, ...), got "
                       f"{type(session_id).__name__} {session_id!r}") from None
    if session_id != session_id:  # NaN: a new NaN would never find its session again
        raise TxlError(f"session_id must equal itself, got {session_id!r}: the session "
                       "could not be stepped, reset or closed by that id")


def _check_slab_fits(runtime, max_batch):
    """Raises `MemoryBudgetError` unless the host slab of `max_batch` decode
    caches (allocated whole at the first session) fits in memory."""
    from export.slab import slab_row_bytes
    from txl_tf.checks.memory_budget import check_total
    row = slab_row_bytes(runtime.config, runtime.mem_len, runtime.info.cache_dtype)
    check_total(max_batch * row, lambda words: (
        f"max_batch {max_batch:,} needs at least {words} for the table's decode caches "
        f"({row:,} bytes a session, memory {runtime.mem_len})"), "lower max_batch")
