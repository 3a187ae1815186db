"""Serving many concurrent streams: a session table over one runtime.

```python
table = SessionTable(open_runtime("out/model.onnx"), max_batch=16)
table.open("alice", prompt_ids, max_new_tokens=64, temperature=0.8, seed=1, stop_ids=[eos])
table.open("bob", other_ids, max_new_tokens=32, temperature=0)
while table.active():
    new = table.step()              # {session id: new id} for up to max_batch sessions
out = table.close("alice")          # a txl_tf.Generation of one row
```
Each session keeps its own memory, sampling settings, seed, stop ids and
counters. A step gathers up to `max_batch` live sessions' rows into one
batch (round robin), samples with the shared sampler, runs one backend step
and scatters the new memory back; a session's ids are exactly what it gets
alone (`runtime.generate([prompt], n, ...)` with its seed), whoever shares
its batches. Prompts are read when a session opens, alone. The memory goes
through the host on every gather (numpy); a GPU server would keep a
device-resident slab and gather rows inside the graph.
"""
import collections
from typing import NamedTuple

import numpy as np

from txl_tf.checks.inputs import NonFiniteMemoryError
from txl_tf.errors import TxlError
from txl_tf.generation.flow import prefill
from txl_tf.generation.request import (Generation, DecodeState, check_count, check_pad_id,
                                   check_prompts, make_rows, seen_mask)
from txl_tf.generation.sampling import Sampling
from txl_tf.generation.sampling_numpy import choose


class _Session(NamedTuple):
    state: DecodeState
    budget: int
    ids: list
    log_probs: list


class SessionTable:
    """Sessions keyed by id over a backend with the generation interface (an
    export `Runtime` or a `txl_tf.Decoder`)."""

    def __init__(self, backend, max_batch=16, segment_len=None):
        self.backend = backend
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise TxlError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.max_batch = max_batch
        config = getattr(backend, "config", None) or backend.core.config
        self.segment_len = int(segment_len or config.tgt_len)
        self._sessions = {}
        self._queue = collections.deque()  # live session ids, next served first

    def open(self, session_id, prompt, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
             repetition_penalty=1.0, seed=0, stop_ids=(), pad_id=0):
        """Reads `prompt` (1-D ids) for a new session."""
        if session_id in self._sessions:
            raise TxlError(f"session {session_id!r} is already open")
        n_token = self.backend.n_token
        prompts = check_prompts([prompt], n_token)
        budget = check_count("max_new_tokens", max_new_tokens)
        rows = make_rows(n_token, 1, seed, stop_ids, Sampling(temperature, top_k, top_p,
                                                             repetition_penalty))
        log_probs, memory = prefill(self.backend, prompts, self.backend.initial_memory(1),
                                    self.segment_len)
        # `done` means stopped by a stop id: a session that used its budget
        # can go on from `close(id).state`.
        state = DecodeState(log_probs, memory, seen_mask(prompts, n_token),
                            np.zeros(1, np.int64), np.array([False]), rows,
                            check_pad_id(pad_id, n_token))
        self._sessions[session_id] = _Session(state, budget, [], [])
        if budget:
            self._queue.append(session_id)

    def active(self):
        """Ids of the sessions still generating."""
        return list(self._queue)

    def step(self):
        """One batched step for up to `max_batch` live sessions; `{id: new id}`."""
        served = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
        if not served:
            return {}
        states = [self._sessions[s].state for s in served]
        batch = DecodeState(np.concatenate([s.next_log_probs for s in states]),
                            self.backend.concat([s.memory for s in states]),
                            np.concatenate([s.seen for s in states]),
                            np.concatenate([s.counters for s in states]),
                            np.zeros(len(served), np.bool_),
                            type(states[0].rows).concat([s.rows for s in states]), 0)
        ids, chosen, seen, counters, stopped = choose(
            batch.next_log_probs, batch.rows, batch.seen, batch.counters, batch.done, 0)
        try:
            log_probs, memory = self.backend.step_last(ids[:, None], batch.memory)
        except NonFiniteMemoryError as err:  # the others wait for the next step
            self._queue.extendleft(reversed([s for i, s in enumerate(served)
                                             if i not in err.rows]))
            raise err.in_batch(served) from None
        memories = self.backend.split(memory)
        for i, sid in enumerate(served):
            session = self._sessions[sid]
            session.ids.append(int(ids[i]))
            session.log_probs.append(float(chosen[i]))
            self._sessions[sid] = session._replace(state=session.state._replace(
                next_log_probs=log_probs[i:i + 1], memory=memories[i],
                seen=seen[i:i + 1], counters=counters[i:i + 1], done=stopped[i:i + 1]))
            if not stopped[i] and len(session.ids) < session.budget:
                self._queue.append(sid)
        return {sid: int(token) for sid, token in zip(served, ids)}

    def run(self):
        """Steps until every session is done."""
        while self._queue:
            self.step()

    def close(self, session_id):
        """Removes a session; its `Generation` (one row, ids so far)."""
        session = self._sessions.pop(session_id)
        if session_id in self._queue:
            self._queue.remove(session_id)
        n = len(session.ids)
        return Generation(np.array([session.ids], np.int32).reshape(1, n),
                          np.array([session.log_probs], np.float32).reshape(1, n),
                          np.array([n], np.int32), session.state.memory, session.state)


__all__ = ["SessionTable"]
