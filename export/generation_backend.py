"""What the generation flow drives on an export runtime: the backend
protocol of `txl_tf.generation.flow` (the one the Keras `Decoder`
implements itself), the host decode loops (`txl_tf.generation.host_loop`)
and `export.sessions.SessionTable`, over one `export.runtime.Runtime`.

The loops' verbs live here, not on the runtime: a runtime's users get one
public API (`docs/export-and-serving.md`), and the loops get the unchecked
calls they make once per token (`next_log_probs`, `next_cached`) with the
memory or cache checked once, where it comes in (`adopt`, `decode_init`,
`step_last`). Each runtime has one `GenerationBackend` at a time (held
weakly, made again when nothing holds it): a decode state's cache names the
backend that holds it (`txl_tf.generation.request.HeldCache`, compared by
identity), so a resume through `runtime.generate` or a `SessionTable` finds it.
"""
import numpy as np


class GenerationBackend:
    """The generation protocol over `runtime` (its private, backend-specific
    methods: nothing here copies or checks per token)."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.config = runtime.config
        self.n_token = runtime.config.n_token

    @property
    def use_decode_cache(self):
        """Whether decodes run on the runtime's decode cache."""
        return self.runtime.use_decode_cache

    # ------------------------------------------------- memory (flow.prefill)
    def initial_memory(self, batch_size):
        return self.runtime.initial_memory(batch_size)

    def check_memory(self, memory, batch_size):
        self.runtime._check_memory(memory, batch_size)

    def step_last(self, token_ids, memory):
        """`(log-probs numpy [B, n_token] at the last position, new memory)`,
        ids and memory checked (a caller's memory comes in here)."""
        return self.runtime._checked_step_last(token_ids, memory)

    def take(self, memory, rows):
        """The memory of `rows` (through the host)."""
        return self.runtime._take_memory(memory, rows)

    def split(self, memory):
        """The memory of each row, in order (one copy through the host)."""
        return self.runtime._split_memory(memory)

    def concat(self, memories):
        """One memory of the rows of `memories`, in order."""
        return self.runtime._concat_memories(memories)

    # ---------------------------------------------- the decode loop (host_loop)
    def decode(self, state, num_tokens, stream=None, stream_every=1):
        """`(ids, log_probs, new DecodeState)`: the host loop, on the decode
        cache when the runtime uses it."""
        from txl_tf.generation.host_loop import host_decode, host_decode_cached
        loop = host_decode_cached if self.runtime.use_decode_cache else host_decode
        return loop(self, state, num_tokens, stream, stream_every)

    def adopt(self, memory, batch_size):
        """`memory` (any runtime's or numpy) checked against the model and put
        in the runtime's tensors: what the loop's unchecked steps start from."""
        return self.runtime._adopt(memory, batch_size)

    def next_log_probs(self, token_ids, memory):
        """`step_last` unchecked: int32 ids `[B, 1]`, a memory from `adopt`
        or a step."""
        return self.runtime._step_last(token_ids, memory.mems, memory.mem_mask)

    # ------------------------------------------------------ the decode cache
    def decode_init(self, memory, batch_size):
        """The checked decode cache of `memory` (`batch_size` rows)."""
        return self.runtime._checked_decode_init(memory, batch_size)

    def next_cached(self, token_ids, stopped, cache):
        """The log-probs of one unchecked step of `cache` (advanced in place):
        ids `[B]`, bool `stopped [B]`, a cache from `decode_init` or a copy."""
        return self.runtime._decode_step(token_ids, stopped, cache)

    def read_cached(self, token_ids, cache):
        """`(log-probs [B, n_token], new cache)` of a segment read unchecked
        on `cache` (a next turn)."""
        return self.runtime._decode_read(np.asarray(token_ids, np.int32), cache)

    def cache_slab(self, capacity):
        """An empty slab of `capacity` rows for decode caches
        (`slab.CacheSlab`; a `slab.DeviceSlab` where the
        runtime keeps its caches on the device)."""
        return self.runtime._cache_slab(capacity)

    def take_cache(self, cache, rows):
        """The decode cache of `rows` (a copy, where `cache` is kept)."""
        return self.runtime._take_cache(cache, rows)

    def concat_caches(self, caches):
        """One decode cache of the rows of `caches`, in order."""
        return self.runtime._concat_caches(caches)

    def copy_cache(self, cache):
        """A copy of `cache` that steps may advance."""
        return self.runtime._copy_cache(cache)

    def cache_memory(self, cache):
        """The memory `cache` holds, in time order (`RuntimeMemory`)."""
        return self.runtime.cache_memory(cache)
