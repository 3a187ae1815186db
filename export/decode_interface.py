"""The cached decode interface of the exports: the decode cache as explicit state.

`step` / `step_last` take the memory (layer inputs) and project the keys and
values of every memory slot again at every call. The decode interface keeps
them: its state is the decode cache of `TransformerXL.decode_cache`, a ring
of S = M + 1 slots (M = `mem_len`, fixed at export; B dynamic), held by the
caller (the runtimes: numpy arrays in host memory):

- `decode_init(mems, mem_mask)` → the cache: `cache_mems` float32
  `[L, B, S, d_model]`, `keys` float32 `[L, B, H, d_head, S]` (each
  head's keys as columns: a query's scores are a plain matmul, which
  TensorFlow reads twice as fast as a transposed one), `values` float32
  `[L, B, H, S, d_head]`,
  `valid` bool `[B, S]`, `slot` int32 `[]` (the free slot), `row_slot`
  int32 `[B]` (each row's own free slot), `positions` float32
  `[2S, d_model]` (the relative encodings, fixed for the cache's life):
  the memory's keys and values projected once.
- `decode_step(token_ids int32 [B], valid, slot, positions, keys_0, ...,
  keys_{L-1}, values_0, ..., values_{L-1})` → `log_probs` float32
  `[B, n_token]` (the next-token distribution after each row's new token),
  `token_mems` `[L, B, d_model]`, `token_keys`, `token_values`
  `[L, B, H, d_head]`: one token per row, projecting only that token. The
  graph reads the ring and writes nothing: the caller writes the token into
  the free slot in place (`write_token`), so a step reads the cache once
  and copies none of it. Each layer's keys and values are inputs of their
  own (`keys[i]`, a view of the stacked array), because slicing a stacked
  input inside an ONNX graph copies it.
- `decode_read(token_ids int32 [B, T], cache_mems, keys, values, valid,
  slot, row_slot, positions)` → `log_probs` `[B, n_token]` (after each
  row's last id), `new_cache_mems`, `new_keys`, `new_values`, `new_valid`,
  `new_slot`, `new_row_slot`: a segment of T ids read on the cache as
  `step_last` reads it on the memory the cache holds, projecting only the
  T new positions (a conversation's next turn); the new cache holds its
  memory in time order (`positions` is unchanged).
- `decode_memory(cache_mems, valid, row_slot)` → `mems`, `mem_mask`
  `[B, M]`: the memory the cache holds, in time order (what `step` and
  training read).

A step equals `step_last` on `decode_memory(cache)` (tested for every format).
"""
import numpy as np
import tensorflow as tf

from txl_tf import Memory
from txl_tf.layers.ring_cache import RING_AXES, DecodeCache, flat_cache, ring_memory

CACHE_NAMES = ("cache_mems", "keys", "values", "valid", "slot", "row_slot", "positions")
# What a segment read changes (`positions` is fixed for the cache's life).
CHANGING_NAMES = CACHE_NAMES[:-1]
INIT_INPUTS = ("mems", "mem_mask")
INIT_OUTPUTS = CACHE_NAMES
STEP_OUTPUTS = ("log_probs", "token_mems", "token_keys", "token_values")
READ_INPUTS = ("token_ids",) + CACHE_NAMES
READ_OUTPUTS = ("log_probs",) + tuple(f"new_{name}" for name in CHANGING_NAMES)
MEMORY_INPUTS = ("cache_mems", "valid", "row_slot")
MEMORY_OUTPUTS = ("mems", "mem_mask")
# Byte alignment of the host's cache buffers (what TensorFlow and oneDNN like).
ALIGNMENT = 64


def step_inputs(n_layer):
    """`decode_step`'s input names, in order."""
    return (("token_ids", "valid", "slot", "positions")
            + tuple(f"keys_{i}" for i in range(n_layer))
            + tuple(f"values_{i}" for i in range(n_layer)))


def cache_shapes(config, mem_len, batch="batch"):
    """`{name: [int or axis name, ...]}` of the cache tensors."""
    size, layers = int(mem_len) + 1, config.n_layer
    heads, d_head, d_model = config.n_head, config.d_head, config.d_model
    return {"cache_mems": [layers, batch, size, d_model],
            "keys": [layers, batch, heads, d_head, size],
            "values": [layers, batch, heads, size, d_head],
            "valid": [batch, size], "slot": [], "row_slot": [batch],
            "positions": [2 * size, d_model]}


def cache_bytes(config, mem_len):
    """`{"per_stream": bytes, "shared": bytes}` of a decode cache: what each
    stream (row) holds (layer inputs, keys, values, valid flags; float32) and
    what all rows share (`positions`, `slot`)."""
    shapes = cache_shapes(config, mem_len, batch=1)
    sizes = {name: 4 for name in shapes}
    sizes["valid"] = 1
    total = {name: sizes[name] * int(np.prod(shape, dtype=np.int64))
             for name, shape in shapes.items()}
    shared = total["positions"] + total["slot"]
    return {"per_stream": sum(total.values()) - shared, "shared": shared}


def _spec(name, shape, dtype):
    return tf.TensorSpec([None if isinstance(n, str) else n for n in shape], dtype, name=name)


def step_specs(config, mem_len):
    """TensorSpecs of `decode_step`'s inputs, in `step_inputs` order."""
    shapes = cache_shapes(config, mem_len)
    layer = {name: _spec(name, shapes[name][1:], tf.float32) for name in ("keys", "values")}
    return ([tf.TensorSpec([None], tf.int32, name="token_ids"),
             _spec("valid", shapes["valid"], tf.bool), _spec("slot", [], tf.int32),
             _spec("positions", shapes["positions"], tf.float32)]
            + [tf.TensorSpec(layer[kind].shape, tf.float32, name=f"{kind}_{i}")
               for kind in ("keys", "values") for i in range(config.n_layer)])


def read_specs(config, mem_len):
    """TensorSpecs of `decode_read`'s inputs, in `READ_INPUTS` order."""
    shapes = cache_shapes(config, mem_len)
    dtypes = {"valid": tf.bool, "slot": tf.int32, "row_slot": tf.int32}
    return [tf.TensorSpec([None, None], tf.int32, name="token_ids")] + [
        _spec(name, shapes[name], dtypes.get(name, tf.float32)) for name in CACHE_NAMES]


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


def decode_step(core, token_ids, valid, slot, positions, *keys_values):
    """`{STEP_OUTPUTS}`: one token per row read on the ring, which is not
    written (see the module's docstring)."""
    n_layer = core.config.n_layer
    cache = DecodeCache((), tuple(keys_values[:n_layer]), tuple(keys_values[n_layer:]), valid,
                        slot, None, positions)
    hidden, token = core.cached_read(token_ids, cache)
    return {"log_probs": core.crit(hidden), "token_mems": tf.stack(token.mems),
            "token_keys": tf.stack(token.keys), "token_values": tf.stack(token.values)}


def decode_read(core, token_ids, cache_mems, keys, values, valid, slot, row_slot, positions):
    """`{READ_OUTPUTS}`: a segment read on the cache (`TransformerXL.cached_segment`)."""
    cache = DecodeCache(tuple(tf.unstack(cache_mems)), tuple(tf.unstack(keys)),
                        tuple(tf.unstack(values)), valid, slot, row_slot, positions)
    hidden, new = core.cached_segment(token_ids, cache)
    flat = flat_cache(new)
    flat["cache_mems"] = flat.pop("mems")
    return {"log_probs": core.crit(hidden[:, -1]),
            **{f"new_{name}": flat[name] for name in CHANGING_NAMES}}


def decode_memory(cache_mems, valid, row_slot):
    """`{"mems", "mem_mask"}`: the memory a cache holds, in time order."""
    cache = DecodeCache(tuple(tf.unstack(cache_mems)), (), (), valid, None, row_slot, None)
    memory = ring_memory(cache)
    return {"mems": memory.mems, "mem_mask": memory.mem_mask}


# ------------------------------------------------------------ the host's half
def host_cache(tensors):
    """The cache as the host holds it: `{name: numpy array}` of
    `decode_init`'s outputs (any array-likes), each copied into a fresh
    aligned buffer that `write_token` may write in place."""
    cache = {}
    for name in CACHE_NAMES:
        value = tensors[name]
        value = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        cache[name] = host_empty(name, value.shape, value.dtype)
        cache[name][...] = value
    return cache


def copy_cache(cache):
    """A copy of a host cache (`host_cache`) that steps may write."""
    return host_cache(cache)


def aligned_empty(shape, dtype):
    """An uninitialized numpy array whose data starts at an `ALIGNMENT` boundary."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def layer_aligned_empty(shape, dtype):
    """An uninitialized numpy array `[L, ...]` each of whose `[i]` starts at
    an `ALIGNMENT` boundary: every layer's bytes are padded up to a multiple
    of it (the array is then not contiguous, its layers are)."""
    dtype = np.dtype(dtype)
    strides, size = [], dtype.itemsize
    for dim in reversed(shape[1:]):
        strides.insert(0, size)
        size *= int(dim)
    layer_stride = -(-size // ALIGNMENT) * ALIGNMENT
    raw = np.empty(layer_stride * int(shape[0]) + ALIGNMENT, np.uint8)
    return np.ndarray(shape, dtype, buffer=raw, offset=-raw.ctypes.data % ALIGNMENT,
                      strides=[layer_stride] + strides)


def host_empty(name, shape, dtype):
    """An uninitialized array for the host cache's `name`. The rings stacked
    by layer (`LAYER_STACKED`) start every layer at an `ALIGNMENT` boundary:
    a step hands each layer to the graph on its own (`step_feeds`), and
    TensorFlow takes an aligned buffer without a copy. (Stacked tight, the
    layers of `wt103_base` at batch 1 start at odd multiples of 8 bytes:
    their copies cost the SavedModel 12 ms a step.)"""
    if name in LAYER_STACKED:
        return layer_aligned_empty(shape, dtype)
    return aligned_empty(shape, dtype)


def take_rows(cache, rows):
    """The host cache of `rows` (a copy)."""
    rows = np.asarray(rows)
    return host_cache({name: (np.take(value, rows, BATCH_AXES[name]) if name in BATCH_AXES
                              else value)
                       for name, value in cache.items()})


def concat_rows(caches):
    """One host cache of the rows of `caches`, in order (ring positions
    alike: `slot` must be the same in all, as after a `decode_read`)."""
    if len({int(c["slot"]) for c in caches}) != 1:
        raise ValueError("caches with different ring positions cannot be joined")
    return host_cache({name: (np.concatenate([c[name] for c in caches], BATCH_AXES[name])
                              if name in BATCH_AXES else caches[0][name])
                       for name in CACHE_NAMES})


# The host cache's rings stacked by layer (`[L, ...]`).
LAYER_STACKED = ("cache_mems", "keys", "values")
# The batch axis of each per-row array of a host cache (the others are shared).
BATCH_AXES = {"cache_mems": 1, "keys": 1, "values": 1, "valid": 0, "row_slot": 0}


def ring_axis(name):
    """The slot axis of the host cache's ring `name` (`cache_mems`, `keys`,
    `values` or `valid`): `RING_AXES`' plus the stacked layers' axis."""
    return 1 if name == "valid" else RING_AXES["mems" if name == "cache_mems" else name] + 1


def step_feeds(cache):
    """`{input name: array}` of `decode_step` but `token_ids`: the ring's
    flags and position table, and each layer's keys and values as views of
    the stacked arrays (no copy)."""
    feeds = {name: cache[name] for name in ("valid", "slot", "positions")}
    for kind in ("keys", "values"):
        feeds.update({f"{kind}_{i}": layer for i, layer in enumerate(cache[kind])})
    return feeds


def write_token(cache, outputs, stopped):
    """Writes a step's token (`outputs`: `decode_step`'s, numpy) into the
    host cache's free slot in place, for the rows not in `stopped` (bool
    `[B]`; their slot and flags stay as they were), and moves the ring on:
    what `TransformerXL.cached_step` does inside the graph."""
    slot, size = int(cache["slot"]), cache["valid"].shape[1]
    live = np.flatnonzero(~np.asarray(stopped, np.bool_))
    pairs = (("cache_mems", "token_mems"), ("keys", "token_keys"), ("values", "token_values"))
    if live.size == cache["valid"].shape[0]:
        for ring, token in pairs:
            _at_slot(cache[ring], ring, slot)[...] = outputs[token]
    else:
        for row in live:
            for ring, token in pairs:
                _at_slot(cache[ring], ring, slot)[:, row] = outputs[token][:, row]
    cache["valid"][live, slot] = True
    cache["row_slot"][live] = (slot + 1) % size
    cache["slot"][...] = (slot + 1) % size


def _at_slot(ring, name, slot):
    """The view of the ring `name` (`cache_mems`, `keys` or `values`) at one slot."""
    return ring[(slice(None),) * ring_axis(name) + (slot,)]
