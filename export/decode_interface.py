"""The cached decode interface of the exports: the decode cache as explicit state.

`step` / `step_last` take the memory (layer inputs) and project the keys and
values of every memory slot again at every call. The decode interface keeps
them: its state is the decode cache of `TransformerXL.decode_cache`, a ring
of S = M + 1 slots (M = `mem_len`, fixed at export; B dynamic):

- `decode_init(mems, mem_mask)` → `cache_mems` float32 `[L, B, S, d_model]`,
  `keys`, `values` float32 `[L, B, H, S, d_head]`, `valid` bool `[B, S]`,
  `slot` int32 `[]` (the free slot), `row_slot` int32 `[B]` (each row's own
  free slot), `position_keys` float32 `[L, H, 2S, d_head]`: the memory's
  keys and values projected once.
- `decode_step(token_ids int32 [B], stopped bool [B], cache_mems, keys,
  values, valid, slot, row_slot, position_keys)` → `log_probs` float32
  `[B, n_token]` (the next-token distribution after each row's new token),
  `new_cache_mems`, `new_keys`, `new_values`, `new_valid`, `new_slot`,
  `new_row_slot`: one token per row, projecting only that token. Rows in
  `stopped` keep their cache (their log-probs are meaningless); a row that
  stopped stays stopped for the cache's life. `position_keys` never
  changes: pass `decode_init`'s every step.
- `decode_memory(cache_mems, valid, row_slot)` → `mems`, `mem_mask`
  `[B, M]`: the memory the cache holds, in time order (what `step` and
  training read).

A step equals `step_last` on `decode_memory(cache)` (tested for every format).
"""
import numpy as np
import tensorflow as tf

from txl_tf import Memory
from txl_tf.layers.ring_cache import DecodeCache, flat_cache, from_flat, ring_memory

CACHE_NAMES = ("cache_mems", "keys", "values", "valid", "slot", "row_slot")
INIT_INPUTS = ("mems", "mem_mask")
INIT_OUTPUTS = CACHE_NAMES + ("position_keys",)
STEP_INPUTS = ("token_ids", "stopped") + CACHE_NAMES + ("position_keys",)
STEP_OUTPUTS = ("log_probs",) + tuple(f"new_{name}" for name in CACHE_NAMES)
MEMORY_INPUTS = ("cache_mems", "valid", "row_slot")
MEMORY_OUTPUTS = ("mems", "mem_mask")


def cache_shapes(config, mem_len, batch="batch"):
    """`{name: [int or axis name, ...]}` of the cache tensors."""
    size, layers = int(mem_len) + 1, config.n_layer
    heads, d_head, d_model = config.n_head, config.d_head, config.d_model
    return {"cache_mems": [layers, batch, size, d_model],
            "keys": [layers, batch, heads, size, d_head],
            "values": [layers, batch, heads, size, d_head],
            "valid": [batch, size], "slot": [], "row_slot": [batch],
            "position_keys": [layers, heads, 2 * size, d_head]}


def cache_bytes(config, mem_len):
    """`{"per_stream": bytes, "shared": bytes}` of a decode cache: what each
    stream (row) holds (layer inputs, keys, values, valid flags; float32) and
    what all rows share (`position_keys`, `slot`)."""
    shapes = cache_shapes(config, mem_len, batch=1)
    sizes = {name: 4 for name in shapes}
    sizes["valid"] = 1
    total = {name: sizes[name] * int(np.prod(shape, dtype=np.int64))
             for name, shape in shapes.items()}
    shared = total["position_keys"] + total["slot"]
    return {"per_stream": sum(total.values()) - shared, "shared": shared}


def _spec(name, shape, dtype):
    return tf.TensorSpec([None if isinstance(n, str) else n for n in shape], dtype, name=name)


def step_specs(config, mem_len):
    """TensorSpecs of `decode_step`'s inputs, in `STEP_INPUTS` order."""
    shapes = cache_shapes(config, mem_len)
    dtypes = {"valid": tf.bool, "slot": tf.int32, "row_slot": tf.int32}
    return [tf.TensorSpec([None], tf.int32, name="token_ids"),
            tf.TensorSpec([None], tf.bool, name="stopped")] + [
        _spec(name, shapes[name], dtypes.get(name, tf.float32)) for name in STEP_INPUTS[2:]]


def memory_specs(config, mem_len):
    """TensorSpecs of `decode_init`'s inputs (the memory)."""
    return [tf.TensorSpec([config.n_layer, None, int(mem_len), config.d_model], tf.float32,
                          name="mems"),
            tf.TensorSpec([None, int(mem_len)], tf.bool, name="mem_mask")]


def cache_memory_specs(config, mem_len):
    """TensorSpecs of `decode_memory`'s inputs."""
    shapes = cache_shapes(config, mem_len)
    return [_spec("cache_mems", shapes["cache_mems"], tf.float32),
            _spec("valid", shapes["valid"], tf.bool),
            tf.TensorSpec([None], tf.int32, name="row_slot")]


def decode_init(core, mems, mem_mask):
    """`{INIT_OUTPUTS}`: the decode cache of a memory."""
    flat = flat_cache(core.decode_cache(Memory(mems, mem_mask)))
    flat["cache_mems"] = flat.pop("mems")
    return flat


def decode_step(core, token_ids, stopped, cache_mems, keys, values, valid, slot, row_slot,
                position_keys):
    """`{STEP_OUTPUTS}`: one token per row on the cache (ring written with
    masks, which every exporter converts)."""
    cache = from_flat(cache_mems, keys, values, valid, slot, row_slot, position_keys)
    hidden, new = core.cached_step(token_ids, cache, stopped=stopped, in_place=False)
    flat = flat_cache(new)
    flat["cache_mems"] = flat.pop("mems")
    return {"log_probs": core.crit(hidden),
            **{f"new_{name}": flat[name] for name in CACHE_NAMES}}


def decode_memory(cache_mems, valid, row_slot):
    """`{"mems", "mem_mask"}`: the memory a cache holds, in time order."""
    cache = DecodeCache(tuple(tf.unstack(cache_mems)), (), (), valid, None, row_slot, ())
    memory = ring_memory(cache)
    return {"mems": memory.mems, "mem_mask": memory.mem_mask}
