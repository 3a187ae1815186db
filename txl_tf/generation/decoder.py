"""The compiled decoder: a whole decode in one `tf.function` (`tf.while_loop`),
sampling in the graph, memory carried, only the last position's log-probs.

```python
decoder = Decoder(core, mem_len=640)
out = decoder.generate([[5, 6, 7], [8]], 100, temperature=0.8, top_p=0.95, seed=1,
                       stop_ids=[eos])
out.ids, out.log_probs, out.lengths        # [B, n], [B, n], [B]
more = decoder.generate(None, 50, resume=out.state)      # as one longer call
reply = decoder.generate(user_ids, 50, memory=out.memory)  # a conversation goes on
```
"""
import numpy as np
import tensorflow as tf

from txl_tf.checks.inputs import check_finite_outputs, check_memory
from txl_tf.checks.numpy_checks import check_flag, check_id_array, check_rows
from txl_tf.core import TransformerXL
from txl_tf.errors import TxlError
from txl_tf.generation import flow as generation
from txl_tf.generation.request import (DecodeState, HeldCache, Rows, check_count,
                                       held_cache)
from txl_tf.generation.nan_rows import raise_for_rows
from txl_tf.generation.sampling import choose, usable_rows
from txl_tf.keras_support.placement import kept_on, on_device, weights_device
from txl_tf.layers.memory import Memory


class Decoder:
    """Generates from a `TransformerXL` core.

    Args:
        core: the `TransformerXL` to decode with (a Keras model's is its
            `.core`).
        mem_len: memory looked back on (None: the config's `mem_len`).
        segment_len: how much of a prompt is read per call (None: the
            config's `tgt_len`).
        jit_compile: compile with XLA the whole decode loop (once per batch
            size, memory length, ids buffer and span of the memory in use:
            powers of two >= 8) and the first segment of new prompts (once
            per batch size and power of two of lengths); other reads stay
            uncompiled. False compiles nothing whole (the ring's in-place
            slot writes still run as small XLA kernels).

    Raises:
        TxlError: `core` is not a `TransformerXL` or has no decode cache
            (`attn_type` other than 0), or a bad count or flag.
    """

    def __init__(self, core, mem_len=None, segment_len=None, jit_compile=True):
        if not isinstance(core, TransformerXL):
            raise TxlError(f"core must be a txl_tf.TransformerXL (a Keras model's is its "
                           f".core), got {type(core).__name__}")
        core._check_cacheable()  # raised while tracing, it would be a StagingError
        self.core = core
        self.n_token = core.config.n_token
        self.mem_len = core.config.mem_len if mem_len is None else check_count("mem_len", mem_len)
        self.segment_len = check_count(
            "segment_len", core.config.tgt_len if segment_len is None else segment_len, low=1)
        jit_compile = bool(check_flag("jit_compile", jit_compile))  # "no" would compile
        device = weights_device(core)  # where XLA must run to read the weights
        # The graphs read nothing of a Decoder but its core: the Decoders of
        # a core share them (kept on the core), since TensorFlow keeps every
        # XLA program it compiles, and a Decoder made per call compiled anew.
        # New ones once its weights change (`enable_lora`, `quantize`).
        shared = kept_on(core, "_txl_decoder_graphs", dict)
        graphs = shared.get((jit_compile, device))
        if graphs is None:
            def compiled(function, **options):  # traced as written, as the exports are
                return on_device(tf.function(function, autograph=False, **options), device)

            graphs = shared[(jit_compile, device)] = {
                "_last": compiled(self._last_graph, reduce_retracing=True),
                "_first": compiled(self._fresh_graph, jit_compile=jit_compile),
                "_decode": compiled(self._decode_graph, jit_compile=jit_compile),
                "_project": compiled(self._project_graph, jit_compile=jit_compile),
                "_position_keys": compiled(self.core.decode_position_keys,
                                           jit_compile=jit_compile),
                "_read_cached": compiled(self._read_cached_graph, reduce_retracing=True)}
        self.__dict__.update(graphs)

    def generate(self, prompts, max_new_tokens, **options):
        """Continues each prompt by up to `max_new_tokens` ids.

        Args:
            prompts: a list of 1-D id sequences of any lengths (or a `[B, L]`
                array; None with `resume`); each row gets what it would get
                alone.
            max_new_tokens: the most ids added to each row, in [0, 2**30]
                (what one call's ids buffer holds; a row's sampler makes at
                most 2**32 draws in all, resumes included).
            **options: see below.

        Returns:
            A `Generation`: `ids` and `log_probs` `[B, max_new_tokens]`,
            `lengths` `[B]`, `memory`, `state`.

        Options:
        segment_len (the decoder's: prompt positions read per call);
        temperature (1.0; 0 is greedy), top_k (0), top_p (1.0),
        repetition_penalty (1.0): see `txl_tf.generation.sampling.Sampling`;
        seed: an int (row i uses `seed + i`, each in [0, 2**63 - 1]) or one
        per row, so a row's draws depend only on its seed; stop_ids: ids that
        end a row (included in its output, then `pad_id`); pad_id (0): an id
        in `[0, n_token)`; memory: continue from this memory (a conversation);
        resume: a `Generation.state` to go on exactly as one longer call
        (prompts None), or with prompts, a next turn read on its memory
        (every row goes on, its sampler too); stream: `callback(ids [B, c])`
        called with each chunk of `stream_every` (8) new ids: the decode then
        runs as one compiled call per chunk, with the same result.
        """
        options.setdefault("segment_len", self.segment_len)
        if options.get("memory") is not None:  # a (mems, mem_mask) pair of arrays too
            options["memory"] = _tensors(options["memory"])
        return generation.generate(self, prompts, max_new_tokens, **options)

    # --------------------------------------------------- backend interface
    @property
    def compute_dtype(self):
        """The core's compute dtype (named when its log-probs overflow)."""
        return self.core.compute_dtype

    def initial_memory(self, batch_size):
        """A fresh memory of `mem_len` slots: empty (no valid slot), or zero
        states that are attended under the config's `zero_filled_memory`.

        Args:
            batch_size: rows, an int.

        Returns:
            A `Memory` (`TransformerXL.initial_memory`): `mems`
            `[n_layer, B, mem_len, d_model]`, `mem_mask` `[B, mem_len]`.
        """
        return self.core.initial_memory(batch_size, mem_len=self.mem_len)

    def check_memory(self, memory, batch_size):
        """Raises a `TxlError` unless `memory` fits the core and `batch_size`.

        Args:
            memory: a `Memory` (or `(mems, mem_mask)`).
            batch_size: the rows it must have.
        """
        cfg = self.core.config
        check_memory(_tensors(memory), cfg.n_layer, cfg.d_model, batch_size)

    def step_last(self, ids, memory):
        """Reads a segment on `memory`; only the last position is projected.

        Args:
            ids: `[B, T]` int ids.
            memory: a `Memory` of `B` rows.

        Returns:
            `(log_probs, memory)`: numpy `[B, V]` log-probs after each row's
            last id, and the new `Memory`.
        """
        ids = check_id_array(ids, self.n_token, "ids")
        memory = _tensors(memory)
        self.check_memory(memory, len(ids))  # the graph cannot name it
        if not memory.mem_mask.numpy().any():
            return self._read_fresh(ids, memory)
        log_probs, memory = self._last(tf.constant(ids, tf.int32), memory)
        return check_finite_outputs(log_probs.numpy()), memory

    def _read_fresh(self, ids, memory):
        """`step_last` onto a memory with no valid slot (a new prompt's first
        segment), compiled once per batch size and power of two of lengths:
        the ids are left-padded to that power of two and masked."""
        batch, length = ids.shape
        padded_len = _bucket(length)
        padded = np.zeros([batch, padded_len], np.int32)
        padded[:, padded_len - length:] = ids
        mask = np.broadcast_to(np.arange(padded_len) >= padded_len - length, padded.shape)
        log_probs, memory = self._first(tf.constant(padded), memory, tf.constant(mask))
        return check_finite_outputs(log_probs.numpy()), memory  # as a runtime's prompt

    @staticmethod
    def take(memory, rows):
        """The memory of `rows` (ints, in that order), as one `Memory`.

        Args:
            memory: a `Memory` (or `(mems, mem_mask)`).
            rows: row indices.

        Returns:
            A `Memory` of `len(rows)` rows.
        """
        memory = _tensors(memory)
        rows = tf.constant(check_rows(rows, memory.mem_mask.shape[0]), tf.int32)
        return Memory(tf.gather(memory.mems, rows, axis=1), tf.gather(memory.mem_mask, rows))

    @staticmethod
    def split(memory):
        """The memory of each row, in order.

        Args:
            memory: a `Memory` (or `(mems, mem_mask)`) of `B` rows.

        Returns:
            A list of `B` one-row `Memory`s.
        """
        memory = _tensors(memory)
        rows = memory.mem_mask.shape[0]
        return [Memory(*part) for part in zip(tf.split(memory.mems, rows, axis=1),
                                              tf.split(memory.mem_mask, rows, axis=0))]

    @staticmethod
    def concat(memories):
        """Memories joined along the batch axis (the inverse of `split`).

        Args:
            memories: `Memory`s (or `(mems, mem_mask)`s) of the same slots.

        Returns:
            One `Memory`.
        """
        if not memories:
            raise TxlError("concat needs at least one Memory")
        memories = [_tensors(memory) for memory in memories]
        return Memory(tf.concat([m.mems for m in memories], 1),
                      tf.concat([m.mem_mask for m in memories], 0))

    def decode(self, state, num_tokens, stream=None, stream_every=8):
        """Samples `num_tokens` ids per row from a `DecodeState` (the compiled
        loop; `generate` calls it).

        Args:
            state: the `DecodeState` to go on from.
            num_tokens: ids to sample per row.
            stream: None, or `callback(ids [B, c])` called with each chunk.
            stream_every: ids per chunk when streaming.

        Returns:
            `(ids, log_probs, state)`: numpy `[B, num_tokens]` ids (rows done
            early padded with `pad_id`) and their log-probs (0 there), and
            the `DecodeState` to go on from.
        """
        rows = Rows(*(tf.constant(a) for a in state.rows))
        # The decode cache: the state's own (a resume or a next turn goes on
        # from it: the compiled loop writes into a copy of it), else the
        # memory's keys and values projected once; every chunk goes on from it.
        cache = held_cache(state, self)
        if cache is None:
            mems, mem_mask = _tensors(state.memory)
            cache = self._project(mems, mem_mask, _filled(mem_mask.numpy()))
        if not cache.position_keys:  # once for the cache's life (resumes, next turns)
            cache = cache._replace(position_keys=self._position_keys(cache))
        loop = [tf.constant(state.next_log_probs, tf.float32), cache,
                tf.constant(state.seen), tf.constant(state.counters, tf.int64),
                tf.constant(state.done)]
        chunk = num_tokens if stream is None else stream_every
        ids, log_probs, done_tokens = [], [], 0
        while done_tokens < num_tokens or not ids:
            size = min(chunk, num_tokens - done_tokens)
            counters = loop[3]
            new_ids, new_lps, *loop = self._decode(*loop, rows, tf.constant(state.pad_id),
                                                   tf.constant(size), _bucket(size))
            ids.append(new_ids.numpy()[:, :size])
            log_probs.append(new_lps.numpy()[:, :size])
            done_tokens += size
            # One flag per row comes to the host, not the [B, V] log-probs: a
            # row not done whose next log-probs are no distribution stopped
            # drawing at the step that made them (its counter tells which).
            # A row that drew all `size` ids is judged at its next draw (the
            # next chunk's, the next call's), as the host loops judge it.
            broken = (~(usable_rows(loop[0]) | loop[-1]) & (loop[3] - counters < size)).numpy()
            if broken.any():
                raise_for_rows(broken, loop[3].numpy(), state.counters, np.concatenate(ids, 1),
                               state.pad_id, self.compute_dtype)
            if stream is not None and size:
                stream(ids[-1])
            if loop[-1].numpy().all():
                break
        batch = len(state.done)
        ids = _pad_to(np.concatenate(ids, 1), num_tokens, state.pad_id)
        log_probs = _pad_to(np.concatenate(log_probs, 1), num_tokens, 0.0)
        lp, cache, seen, counters, done = loop
        assert ids.shape == (batch, num_tokens)
        return ids, log_probs, DecodeState(lp.numpy(), self.core.cache_memory(cache),
                                           seen.numpy(), counters.numpy(), done.numpy(),
                                           state.rows, state.pad_id,
                                           HeldCache(self, cache))

    @staticmethod
    def loop_buffer(num_tokens, stream=None, stream_every=8):
        """The positions per row of the ids and log-probs buffer that the
        compiled loop of `decode` fills (a power of two >= each call's
        ids), besides the outputs: `check_new_ids` counts them (also before
        a `Decoder` is made: `python -m training.generate`).

        Args:
            num_tokens: ids to sample per row.
            stream: None, or the streaming callback (anything else: streamed).
            stream_every: ids per chunk when streaming.

        Returns:
            The positions.
        """
        return _bucket(min(num_tokens if stream is None else stream_every, num_tokens))

    # ---------------------------------------- the decode cache (generation.flow)
    def read_cached(self, ids, cache):
        """A segment read on a decode cache (`TransformerXL.call_with_cache`).

        Args:
            ids: `[B, T]` int ids.
            cache: the decode cache of `B` rows.

        Returns:
            `(log_probs, cache)`: numpy `[B, V]` log-probs after each row's
            last id, and the new cache.
        """
        ids = check_id_array(ids, self.n_token, "ids")  # as `step_last`: tf.constant cast
        log_probs, cache = self._read_cached(tf.constant(ids), cache)  # durations, bools
        return log_probs.numpy(), cache

    @staticmethod
    def take_cache(cache, rows):
        """The decode cache of `rows` (ints, in that order).

        Args:
            cache: a decode cache.
            rows: row indices.

        Returns:
            A decode cache of `len(rows)` rows.
        """
        rows = tf.constant(check_rows(rows, cache.valid.shape[0]), tf.int32)
        return _rows_of([cache], lambda parts: tf.gather(parts[0], rows))

    @staticmethod
    def concat_caches(caches):
        """Decode caches joined along the batch axis.

        Args:
            caches: decode caches of the same slots.

        Returns:
            One decode cache.
        """
        if not caches:
            raise TxlError("concat_caches needs at least one decode cache")
        return _rows_of(caches, lambda parts: tf.concat(parts, 0))

    def cache_memory(self, cache):
        """The `Memory` a decode cache holds (`TransformerXL.cache_memory`).

        Args:
            cache: a decode cache.

        Returns:
            A `Memory`.
        """
        return self.core.cache_memory(cache)

    # -------------------------------------------------------------- graphs
    def _last_graph(self, ids, memory, token_mask=None):
        hidden, memory = self.core.hidden_states(ids, memory, training=False,
                                                 token_mask=token_mask)
        return self.core.crit(hidden[:, -1]), memory

    def _fresh_graph(self, ids, memory, token_mask):
        """`_last_graph` for a memory with no valid slot: the read runs over
        at most as many empty slots as `ids` has positions (nothing before
        the prompt is attended, so the result is the same), then the other
        empty slots are put back in front."""
        mems, mem_mask = memory
        kept = mem_mask.shape[1] - min(ids.shape[1], mem_mask.shape[1])  # static
        log_probs, new = self._last_graph(ids, Memory(mems[:, :, kept:], mem_mask[:, kept:]),
                                          token_mask)
        empty = Memory(tf.zeros([mems.shape[0], tf.shape(ids)[0], kept, mems.shape[3]]),
                       mem_mask[:, :kept])
        return log_probs, _join_slots(empty, new)

    def _project_graph(self, mems, mem_mask, filled):
        """The decode cache of a memory; `filled` (a Python int, see
        `_filled`): how many of the newest memory slots can be valid."""
        return self.core.decode_cache(Memory(mems, mem_mask), filled=filled)

    def _read_cached_graph(self, ids, cache):
        hidden, cache = self.core.call_with_cache(ids, cache)
        return self.core.crit(hidden[:, -1]), cache

    def _decode_graph(self, log_probs, cache, seen, counters, done, rows, pad_id, num_tokens,
                      capacity):
        """Up to `num_tokens` steps in one `tf.while_loop`, ending early when
        every row is done; ids and log-probs `[B, capacity]` (`capacity >=
        num_tokens`, a Python int: the shapes stay static for XLA) and the
        state. The memory lives in the `DecodeCache` ring: each step
        projects only its token and writes it in place (its position scores
        against the cache's `position_keys`); rows that are done
        keep their memory as it was."""
        batch = tf.shape(done)[0]
        ids = tf.fill([capacity, batch], pad_id)
        chosen = tf.zeros([capacity, batch], tf.float32)

        def body(t, ids, chosen, log_probs, cache, seen, counters, done):
            # A row whose log-probs are no distribution (NaN or +inf: a weight
            # that holds NaN, a 16-bit step that overflowed) draws nothing
            # more, as a done row (`choose`: its counter stays); the loop
            # cannot raise. Such rows keep their log-probs (those after their
            # last step, as the host loops keep them), so that `decode` finds
            # them once the loop returns and names the row and the step.
            new_ids, new_lps, seen, new_counters, now_done = choose(log_probs, rows, seen,
                                                                    counters, done, pad_id)
            halted = new_counters == counters
            counters = new_counters
            hidden, cache = self.core.call_with_cache(new_ids, cache, stopped=halted)
            log_probs = tf.where(halted[:, None], log_probs,
                                 self.core.crit.log_probs(hidden, output_weights))
            ids = tf.tensor_scatter_nd_update(ids, [[t]], new_ids[None])
            chosen = tf.tensor_scatter_nd_update(chosen, [[t]], new_lps[None])
            return (t + 1, ids, chosen, log_probs, cache, seen, counters, now_done)

        def more(t, *loop):
            return (t < num_tokens) & ~tf.reduce_all(loop[-1])

        # The output bins transposed to [in, out] once, before the loop, at
        # batch 1 only: there XLA's step reads a large table faster that way
        # (wt103_base's 267,735 words, AVX2); at batch 4 and 16 it reads the
        # table faster as it is, and the transpose would cost every call
        # (measured at c1e5c01; benchmarks/NOTES.md).
        output_weights = self.core.crit.decode_weights() if log_probs.shape[0] == 1 else None
        _, ids, chosen, log_probs, cache, *state = tf.while_loop(
            more, body, [tf.constant(0), ids, chosen, log_probs, cache, seen, counters, done])
        return (tf.transpose(ids), tf.transpose(chosen), log_probs, cache, *state)


def _rows_of(caches, fn):
    """A `DecodeCache` whose per-row tensors (batch first) are `fn(parts)`,
    `parts` the same tensor of each of `caches` (ring positions shared)."""
    layers = {name: tuple(fn(parts) for parts in zip(*(getattr(c, name) for c in caches)))
              for name in ("mems", "keys", "values")}
    return caches[0]._replace(**layers, valid=fn([c.valid for c in caches]),
                              row_slot=fn([c.row_slot for c in caches]))


def _join_slots(older, newer):
    """One memory: the slots of `older`, then those of `newer`."""
    return Memory(tf.concat([older.mems, newer.mems], 2),
                  tf.concat([older.mem_mask, newer.mem_mask], 1))


def _bucket(size):
    """A power of two >= max(size, 8): calls of nearby sizes (ids buffers,
    prompt lengths) share one compiled program."""
    return max(8, 1 << max(0, size - 1).bit_length())


def _filled(mem_mask):
    """How many of the newest slots of `mem_mask` (numpy `[B, M]`) reach
    back to the oldest valid slot of any row, rounded up to a power of two
    (`_bucket`, at most M): a new prompt's memory is mostly empty slots,
    whose keys and values the decode need not project."""
    size = mem_mask.shape[1]
    valid = np.flatnonzero(mem_mask.any(0))
    return min(size, _bucket(size - int(valid[0]) if valid.size else 0))


def _tensors(memory):
    if not isinstance(memory, Memory) and not (isinstance(memory, (tuple, list))
                                               and len(memory) == 2):
        raise TxlError("memory must be a txl_tf.Memory (e.g. a Generation's .memory) or a "
                       f"(mems, mem_mask) pair, got {type(memory).__name__}")
    mems, mem_mask = memory
    return Memory(tf.convert_to_tensor(mems), tf.convert_to_tensor(mem_mask))


def _pad_to(array, width, value):
    if array.shape[1] >= width:
        return array[:, :width]
    pad = np.full([array.shape[0], width - array.shape[1]], value, array.dtype)
    return np.concatenate([array, pad], 1)
