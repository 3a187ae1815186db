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
- `decode_token(token_ids int32 [B], stopped bool [B], valid, slot,
  row_slot, positions, cache_mems, keys_0, ..., values_{L-1})` →
  `log_probs`, `new_cache_mems`, `new_keys_i`, `new_values_i`, `new_valid`,
  `new_slot`, `new_row_slot` (ONNX only): the step and the write in one
  graph, for a caller that binds each ring's `new_` output to its input's
  buffer (`device_cache.FixedStep`): each layer's key and value go into its
  rings first (ScatterElements, in place) and are read there, each row at
  its `ring_cache.write_slots` slot; the flags are written before the read
  sees them, the ring's positions move on into outputs of their own.
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

`cache_dtype` (an export option, default float32; `CACHE_DTYPES`): the dtype
the graphs take and return `keys`, `values` (and each layer's, and the
token's) in. A float16 cache halves what a stream's keys and values hold;
the graphs cast them to float32 where they read them and back where they
return them, so the step computes as the float32 export's does on keys and
values rounded to 16 bits (`docs/export-and-serving.md` states the parity).
The layer inputs (`cache_mems`, `mems`) stay float32.

`decode_dtype` (an export option, default float32; `DECODE_DTYPES`): the
dtype the graphs compute in. float16 exports them from `decode_core`, the
core under Keras's `mixed_float16` policy: its float32 weights (the file
`model.onnx` shares) are cast to float16 in the graph, which ONNX Runtime
folds into float16 weights once, when it opens the session; keys and values
are float16 (`cache_dtype`), read by the step's matmuls as they are; layer
norms and softmax keep their statistics in float32 (ONNX Runtime's
`LayerNormalization` computes them so in any dtype; the scores are cast to
float32 for the softmax, the one cast pair a layer adds); the interface's
other tensors (`mems`, `cache_mems`, `positions`, `log_probs`) stay float32.
"""
import keras
import numpy as np
import tensorflow as tf

# The interface's names and shapes live with the host's half (no TensorFlow).
from export.decode_cache import (CACHE_NAMES, CHANGING_NAMES, INIT_INPUTS,  # noqa: F401
                                 INIT_OUTPUTS, READ_INPUTS, READ_OUTPUTS, STEP_OUTPUTS,
                                 cache_shapes, step_inputs, token_inputs, token_outputs)
from export.metadata import CACHE_DTYPES, DECODE_DTYPES
from txl_tf import Memory, TransformerXL
from txl_tf.errors import TxlError
from txl_tf.layers.init import skip_random_init
from txl_tf.layers.ring_cache import (DecodeCache, flat_cache, ring_memory, row_write,
                                      write_rows, write_slots)
from txl_tf.weights.checkpoints import adapted_layers


def check_cache_dtype(cache_dtype):
    """Returns `cache_dtype` as a `tf.DType`, or raises `TxlError` unless it is
    one of `CACHE_DTYPES`."""
    name = getattr(cache_dtype, "name", cache_dtype)
    if name not in CACHE_DTYPES:
        raise TxlError(f"cache_dtype must be one of {list(CACHE_DTYPES)}, got {name!r}")
    return tf.as_dtype(name)


def decode_core(core, decode_dtype="float32"):
    """The core the decode graphs are exported from: `core` itself for
    float32, else a copy of it under the `mixed_<decode_dtype>` policy
    (float32 weights, the same ones in the same order; compute in
    `decode_dtype`). A core with LoRA or quantized layers has no such copy
    (`TxlError`).

    Args:
        core: a float32 `TransformerXL`.
        decode_dtype: one of `DECODE_DTYPES`.

    Returns:
        A `TransformerXL`.
    """
    if decode_dtype not in DECODE_DTYPES:
        raise TxlError(f"decode_dtype must be one of {list(DECODE_DTYPES)}, got "
                       f"{decode_dtype!r}")
    if decode_dtype == core.compute_dtype:
        return core
    adapted = adapted_layers(core)
    if adapted:  # the copy below, built from the config, would have neither
        kinds = " and ".join(sorted({kind for _, kind in adapted}))
        raise TxlError(f"{decode_dtype} decode graphs are converted from a copy of the core "
                       f"built from its config, which cannot hold its {kinds} layers "
                       f"({len(adapted)}, e.g. {adapted[0][0]}): export them with "
                       "decode_dtype='float32'")
    with skip_random_init():  # every weight is copied next
        copy = TransformerXL(core.config, name=core.name,
                             dtype=keras.DTypePolicy(f"mixed_{decode_dtype}"))
    # The exports map each weight to the shared file's by this order.
    if [(w.path, w.shape) for w in copy.weights] != [(w.path, w.shape) for w in core.weights]:
        raise RuntimeError(f"the {decode_dtype} decode core's weights are not the core's")
    for mine, theirs in zip(copy.weights, core.weights):
        mine.assign(theirs)
    return copy


def _spec(name, shape, dtype):
    return tf.TensorSpec([None if isinstance(n, str) else n for n in shape], dtype, name=name)


def step_specs(config, mem_len, cache_dtype="float32"):
    """TensorSpecs of `decode_step`'s inputs, in `step_inputs` order (keys
    and values in `cache_dtype`)."""
    shapes, kv_dtype = cache_shapes(config, mem_len), check_cache_dtype(cache_dtype)
    layer = {name: _spec(name, shapes[name][1:], kv_dtype) for name in ("keys", "values")}
    return ([tf.TensorSpec([None], tf.int32, name="token_ids"),
             _spec("valid", shapes["valid"], tf.bool), _spec("slot", [], tf.int32),
             _spec("positions", shapes["positions"], tf.float32)]
            + [tf.TensorSpec(layer[kind].shape, kv_dtype, name=f"{kind}_{i}")
               for kind in ("keys", "values") for i in range(config.n_layer)])


def read_specs(config, mem_len, cache_dtype="float32"):
    """TensorSpecs of `decode_read`'s inputs, in `READ_INPUTS` order (keys
    and values in `cache_dtype`)."""
    shapes, kv_dtype = cache_shapes(config, mem_len), check_cache_dtype(cache_dtype)
    dtypes = {"valid": tf.bool, "slot": tf.int32, "row_slot": tf.int32,
              "keys": kv_dtype, "values": kv_dtype}
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


def _to(dtype, tensors):
    return tuple(tf.cast(t, dtype) for t in tensors)


def _interface_dtypes(flat, kv_dtype):
    """The cache tensors `flat` (`flat_cache`) in the interface's dtypes:
    keys and values in `kv_dtype`, the other floats in float32."""
    return {name: tf.cast(t, kv_dtype if name in ("keys", "values") else tf.float32)
            if t.dtype.is_floating else t for name, t in flat.items()}


def decode_init(core, mems, mem_mask, cache_dtype="float32"):
    """`{INIT_OUTPUTS}`: the decode cache of a memory (keys and values in `cache_dtype`)."""
    kv_dtype = check_cache_dtype(cache_dtype)
    flat = flat_cache(core.decode_cache(Memory(mems, mem_mask)))
    flat["cache_mems"] = flat.pop("mems")
    return _interface_dtypes(flat, kv_dtype)


def decode_step(core, token_ids, valid, slot, positions, *keys_values):
    """`{STEP_OUTPUTS}`: one token per row read on the ring, which is not
    written (see the module's docstring); the token's keys and values in
    the ring's dtype."""
    n_layer, kv_dtype, dtype = core.config.n_layer, keys_values[0].dtype, core.compute_dtype
    keys_values = _to(dtype, keys_values)
    cache = DecodeCache((), keys_values[:n_layer], keys_values[n_layer:], valid,
                        slot, None, tf.cast(positions, dtype))
    hidden, token = core.call_with_cache(token_ids, cache, write=False)
    return {"log_probs": core.crit(hidden),
            "token_mems": tf.cast(tf.stack(token.mems), tf.float32),
            "token_keys": tf.cast(tf.stack(token.keys), kv_dtype),
            "token_values": tf.cast(tf.stack(token.values), kv_dtype)}


def decode_token(core, token_ids, stopped, valid, slot, row_slot, positions, cache_mems,
                 *keys_values):
    """`{token_outputs}`: one token per row written into the ring and read
    there (see the module's docstring): the rings, the flags and each row's
    slot written where the token goes (`ring_cache.write_slots`: a stopped
    row's own free slot, outside its memory); the ring's positions moved
    on into outputs of their own."""
    cfg, dtype = core.config, core.compute_dtype
    slots = write_slots(DecodeCache((), (), (), valid, slot, row_slot, None), stopped)
    # The flags first, read through the written ones: nothing reads the
    # input after its write, which runs in place.
    valid = write_rows(valid, tf.logical_not(stopped), row_write([None], slots, 1))
    cache = DecodeCache((), keys_values[:cfg.n_layer], keys_values[cfg.n_layer:], valid,
                        slot, row_slot, tf.cast(positions, dtype))
    hidden, token = core.call_with_cache(token_ids, cache, stopped=stopped, write="first",
                                         flags_written=True)
    mems = write_rows(cache_mems, tf.cast(tf.stack(token.mems), tf.float32),
                      row_write([cfg.n_layer, None, cfg.d_model], slots, 2, row_axis=1))
    # The next slot from a table of them (one gather; a floor mod is three kernels).
    size = valid.shape[1]
    new_slot = tf.gather(tf.constant(np.roll(np.arange(size, dtype=np.int32), -1)), slot)
    return {"log_probs": core.crit(hidden), "new_cache_mems": mems,
            **{f"new_keys_{i}": ring for i, ring in enumerate(token.keys)},
            **{f"new_values_{i}": ring for i, ring in enumerate(token.values)},
            "new_valid": valid, "new_slot": new_slot,
            "new_row_slot": tf.where(stopped, row_slot, new_slot)}


def token_specs(config, mem_len, cache_dtype="float32"):
    """TensorSpecs of `decode_token`'s inputs, in `token_inputs` order."""
    shapes, step = cache_shapes(config, mem_len), step_specs(config, mem_len, cache_dtype)
    return (step[:1] + [tf.TensorSpec([None], tf.bool, name="stopped")] + step[1:3]
            + [tf.TensorSpec([None], tf.int32, name="row_slot"), step[3],
               _spec("cache_mems", shapes["cache_mems"], tf.float32)] + step[4:])


def decode_read(core, token_ids, cache_mems, keys, values, valid, slot, row_slot, positions):
    """`{READ_OUTPUTS}`: a segment read on the cache (`TransformerXL.call_with_cache`);
    its new keys and values in the dtype of `keys`."""
    kv_dtype, dtype = keys.dtype, core.compute_dtype
    cache = DecodeCache(tuple(tf.unstack(cache_mems)), _to(dtype, tf.unstack(keys)),
                        _to(dtype, tf.unstack(values)), valid, slot, row_slot,
                        tf.cast(positions, dtype))
    hidden, new = core.call_with_cache(token_ids, cache)
    flat = flat_cache(new)
    flat["cache_mems"] = flat.pop("mems")
    flat = _interface_dtypes(flat, kv_dtype)
    return {"log_probs": core.crit(hidden[:, -1]),
            **{f"new_{name}": flat[name] for name in CHANGING_NAMES}}


def decode_memory(cache_mems, valid, row_slot):
    """`{"mems", "mem_mask"}`: the memory a cache holds, in time order."""
    cache = DecodeCache(tuple(tf.unstack(cache_mems)), (), (), valid, None, row_slot, None)
    memory = ring_memory(cache)
    return {"mems": memory.mems, "mem_mask": memory.mem_mask}
