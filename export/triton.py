"""A Triton Inference Server model repository (onnxruntime backend): the
step model, the cached model beside it, and their `config.pbtxt` text.

```
repo_dir/txl/config.pbtxt         sequence batching, memory as implicit state
repo_dir/txl/1/model.onnx         (+ model.onnx.data past 2 GB of weights)
repo_dir/txl/initial_state/       only for a zero-filled start (mem_mask all True)
repo_dir/txl_cached/config.pbtxt  sequence batching, keys and values as implicit state
repo_dir/txl_cached/1/model.onnx
```
**The step model.** Triton keeps each sequence's memory (`mems` →
`new_mems`, `mem_mask` → `new_mem_mask`) between its requests; a client
sends only `token_ids` `[1, T]` with a correlation id (and the start flag on
a new stream) and gets `log_probs`. With `max_batch_size > 0` Triton batches
a state along its first axis, so this model takes the memory batch-major,
`mems` `[B, n_layer, M, d_model]` (`export_onnx(...,
memory_layout="batch_major")`, the same core transposed at the graph's
edges), and the sequence batcher's `oldest` strategy runs up to
`max_batch_size` streams' steps in one batch. A new stream starts from the
initial state: zeros with `mem_mask` all False (empty memory), or all True
for a zero-filled export.

**The cached model** (`txl_cached/`): the memory held as its attention keys
and values, so a request projects only its own tokens (the step model
projects the keys and values of every remembered position again at every
request). Its state is, per layer, the memory's keys and values
`[H, M, d_head]` in time order (`keys_i` → `new_keys_i`, `values_i` →
`new_values_i`) and the validity of each slot (`mem_mask` →
`new_mem_mask`): `TransformerXL.call_with_cache` on a `KeysValues` memory.
There is no ring, so streams batched together need nothing in common, and
Triton batches every state along its first axis as it is. Its cost:
Triton's onnxruntime backend gives a state back only as a new output, so
the graph writes all of it every request (a read of the keys and values for
attention, then a copy into the new state), where the runtimes'
`decode_step` writes one slot in place. A new stream starts from zeros with
every slot invalid (the empty memory); a zero-filled export has no cached
model (its memory's keys are not zeros).
"""
import os

import numpy as np
import tensorflow as tf
from onnx import helper

from export.metadata import ExportInfo, export_metadata, weights_quantization
from export.onnx_export import (DEFAULT_OPSET, EXTERNAL_DATA_THRESHOLD, add_id_range_check,
                                convert_with_weight_inputs, declare_shapes, export_onnx,
                                order_outputs, save_with_weights)
from export.parity import ParityError, check_tolerance, largest_difference, max_differences
from export.saved_model import LOG_PROBS_MODES
from export.staging import staged_folders
from txl_tf.checks.numpy_checks import check_count
from txl_tf.errors import TxlError
from txl_tf.layers.ring_cache import KeysValues

DEFAULT_MODEL_NAME = "txl"
CONFIG_FILE = "config.pbtxt"
VERSION = "1"
MODEL_FILE = "model.onnx"
INITIAL_STATE_DIR = "initial_state"  # Triton's fixed name for `data_file` initial states
MASK_ALL_TRUE_FILE = "mem_mask_all_true"


def triton_model_config(config, mem_len, model_name=DEFAULT_MODEL_NAME, log_probs="all",
                        zero_filled=False, max_batch_size=16, max_candidate_sequences=None,
                        max_queue_delay_microseconds=0,
                        max_sequence_idle_microseconds=60_000_000, expose_memory=False):
    """The `config.pbtxt` text of the batch-major step model of `config`.

    Dims leave the batch axis out (`max_batch_size > 0`); -1 is the dynamic
    segment length.

    Args:
        config: the model's `TransformerXLConfig`.
        mem_len: memory slots, >= 1.
        model_name: the Triton model name (default `"txl"`).
        log_probs: `"all"` (`[T, n_token]` a row) or `"last"` (`[n_token]`).
        zero_filled: fresh memories are zero states (every slot valid).
        max_batch_size: Triton's, > 0 (default 16).
        max_candidate_sequences: streams holding a state slot per model
            instance (more wait in Triton's backlog; None: 4 ×
            `max_batch_size`).
        max_queue_delay_microseconds: the sequence batcher's.
        max_sequence_idle_microseconds: a stream idle this long is dropped
            with its memory (default 60 s).
        expose_memory: list `new_mems` / `new_mem_mask` as outputs too (a
            client may then request them; Triton keeps the state either way).

    Returns:
        The text.
    """
    check_triton_options(mem_len, model_name, log_probs, max_batch_size,
                         max_candidate_sequences, max_queue_delay_microseconds,
                         max_sequence_idle_microseconds)
    if max_candidate_sequences is None:
        max_candidate_sequences = 4 * int(max_batch_size)
    mems = [config.n_layer, int(mem_len), config.d_model]
    mask = [int(mem_len)]
    log_probs_dims = [-1, config.n_token] if log_probs == "all" else [config.n_token]
    outputs = [("log_probs", "TYPE_FP32", log_probs_dims)]
    if expose_memory:
        outputs += [("new_mems", "TYPE_FP32", mems), ("new_mem_mask", "TYPE_BOOL", mask)]
    mask_start = (f'data_file: "{MASK_ALL_TRUE_FILE}"' if zero_filled else "zero_data: true")
    states = [state_text("mems", "new_mems", "TYPE_FP32", mems, "zero_data: true",
                         "zero memory"),
              state_text("mem_mask", "new_mem_mask", "TYPE_BOOL", mask, mask_start,
                         "zero-filled memory" if zero_filled else "no valid slot")]
    return config_text(model_name, max_batch_size, outputs, states, max_candidate_sequences,
                       max_queue_delay_microseconds, max_sequence_idle_microseconds)


def write_triton_repository(core, repo_dir, mem_len, model_name=DEFAULT_MODEL_NAME,
                            log_probs="all", zero_filled=False, opset=DEFAULT_OPSET,
                            external_data_threshold=EXTERNAL_DATA_THRESHOLD, cached=True,
                            **config_options):
    """Writes `repo_dir/model_name/` (config, version 1's batch-major
    `model.onnx`, the initial-state file of a zero-filled start) and, with
    `cached`, `repo_dir/model_name_cached/` (the cached model).

    Args:
        core: the `TransformerXL` to export.
        repo_dir: the Triton model repository folder.
        mem_len: memory slots, >= 1.
        model_name: the model's folder name (default `"txl"`).
        log_probs: `"all"` or `"last"`, as for `export_onnx`.
        zero_filled: fresh memories are zero states.
        opset: the ONNX opset (default 17).
        external_data_threshold: as for `export_onnx`.
        cached: write the cached model too (not for a zero-filled start,
            nor for `attn_type` 1-3, whose keys the cache cannot hold).
        **config_options: go to `triton_model_config`.

    Returns:
        The list of files written.
    """
    text = triton_model_config(core.config, mem_len, model_name, log_probs,
                                      zero_filled, **config_options)
    name = model_name + SUFFIX
    with_cached = cached and not zero_filled and core.config.attn_type == 0
    # The model folders are replaced together (a re-export leaves no file of
    # the one before, e.g. a cached model of other weights beside a
    # zero-filled one), and a kill never pairs an old folder with a new one.
    names = [model_name, name] if with_cached else [model_name]
    with staged_folders(repo_dir, names, drop=[] if with_cached else [name]) as folders:
        model_dir = folders[model_name]
        os.makedirs(os.path.join(model_dir, VERSION))
        written = export_onnx(core, os.path.join(model_dir, VERSION, MODEL_FILE), mem_len,
                              log_probs=log_probs, zero_filled=zero_filled, opset=opset,
                              external_data_threshold=external_data_threshold,
                              memory_layout="batch_major")
        if zero_filled:
            os.makedirs(os.path.join(model_dir, INITIAL_STATE_DIR), exist_ok=True)
            path = os.path.join(model_dir, INITIAL_STATE_DIR, MASK_ALL_TRUE_FILE)
            np.ones([int(mem_len)], np.bool_).tofile(path)  # TYPE_BOOL: one byte a slot
            written.append(path)
        written = [_write_text(os.path.join(model_dir, CONFIG_FILE), text)] + written
        written = [os.path.join(repo_dir, model_name, os.path.relpath(p, model_dir))
                   for p in written]
        if with_cached:
            cached_dir = folders[name]
            os.makedirs(os.path.join(cached_dir, VERSION))
            files = [_write_text(os.path.join(cached_dir, CONFIG_FILE),
                                 cached_config(core.config, mem_len, name, log_probs,
                                               **config_options))]
            files += export_cached_onnx(
                core, os.path.join(cached_dir, VERSION, MODEL_FILE), mem_len, log_probs,
                opset, external_data_threshold)
            written += [os.path.join(repo_dir, name, os.path.relpath(p, cached_dir))
                        for p in files]
    return written


def _write_text(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def sequence_outputs(model_path, segments, providers=("CPUExecutionProvider",)):
    """Runs the repository's `model.onnx` with onnxruntime as Triton's sequence
    batcher does (each row a stream, the state carried from the initial state)
    and returns per segment `(log_probs, mems, mem_mask)` with `mems` back in
    the core's layout `[n_layer, B, M, d_model]` (what `parity.core_outputs`
    gives)."""
    import onnxruntime as ort
    session = ort.InferenceSession(model_path, providers=list(providers))
    info = ExportInfo(session.get_modelmeta().custom_metadata_map)
    if info.memory_layout != "batch_major":
        raise TxlError(f"{model_path!r} is not a Triton repository's model (memory layout "
                       f"{info.memory_layout!r})")
    cfg, batch = info.config, segments[0].shape[0]
    mems = np.zeros([batch, cfg.n_layer, info.mem_len, cfg.d_model], np.float32)
    mem_mask = np.full([batch, info.mem_len], info.zero_filled, np.bool_)
    names = [o.name for o in session.get_outputs()]
    results = []
    for ids in segments:
        out = dict(zip(names, session.run(None, {"token_ids": ids, "mems": mems,
                                                 "mem_mask": mem_mask})))
        mems, mem_mask = out["new_mems"], out["new_mem_mask"]
        results.append((out["log_probs"], np.transpose(mems, [1, 0, 2, 3]), mem_mask))
    return results


INT32_MAX = 2 ** 31 - 1


def check_triton_options(mem_len, model_name=DEFAULT_MODEL_NAME, log_probs="all",
                         max_batch_size=16, max_candidate_sequences=None,
                         max_queue_delay_microseconds=0,
                         max_sequence_idle_microseconds=60_000_000, expose_memory=False):
    """Raises ValueError (TypeError for an unknown option) on settings that
    make no repository; takes `triton_model_config`'s options."""
    for name, value in (("max_batch_size", max_batch_size),
                        ("max_candidate_sequences", max_candidate_sequences),
                        ("max_queue_delay_microseconds", max_queue_delay_microseconds),
                        ("max_sequence_idle_microseconds", max_sequence_idle_microseconds)):
        if value is not None and (isinstance(value, (bool, np.bool_))
                                  or not isinstance(value, (int, np.integer))):
            raise TxlError(f"{name} must be an integer, got {value!r}")  # not int()'d
    if max_candidate_sequences is None:
        max_candidate_sequences = 4 * int(max_batch_size)
    if check_count("mem_len", mem_len) < 1:
        raise TxlError(f"a Triton repository needs mem_len >= 1 (the memory is its "
                       f"state), got {mem_len}")
    if not model_name or os.sep in model_name or model_name in (".", "..") or any(
            c in '"\\' or not c.isprintable() for c in model_name):
        # A quote, a backslash or a control character is not written as
        # itself in config.pbtxt's `name: "..."`, which must match the folder.
        raise TxlError(f"model_name must be a plain folder name (no quote, backslash or "
                       f"control character), got {model_name!r}")
    if log_probs not in LOG_PROBS_MODES:
        raise TxlError(f"log_probs must be one of {LOG_PROBS_MODES}, got {log_probs!r}")
    if int(max_batch_size) < 1:
        raise TxlError(f"max_batch_size must be >= 1 (the state is batched on its first "
                       f"axis), got {max_batch_size}")
    for name, value in (("max_batch_size", max_batch_size),
                        ("max_candidate_sequences", max_candidate_sequences)):
        if int(value) > INT32_MAX:  # config.pbtxt's fields are int32: Triton could not load it
            raise TxlError(f"{name} must be at most {INT32_MAX} (an int32 in config.pbtxt; "
                           f"max_candidate_sequences defaults to 4 x max_batch_size), got {value}")
    if int(max_candidate_sequences) < int(max_batch_size):
        raise TxlError(f"max_candidate_sequences ({max_candidate_sequences}) must be at "
                       f"least max_batch_size ({max_batch_size}) to fill a batch")
    for name, value in (("max_queue_delay_microseconds", max_queue_delay_microseconds),
                        ("max_sequence_idle_microseconds", max_sequence_idle_microseconds)):
        if int(value) < 0:
            raise TxlError(f"{name} must be >= 0, got {value}")


def model_file(repo_dir, model_name=DEFAULT_MODEL_NAME):
    """`repo_dir/model_name/1/model.onnx`."""
    return os.path.join(repo_dir, model_name, VERSION, MODEL_FILE)


def check_triton_model(reference, model_path, segments, tol=1e-4):
    """`parity.max_differences` of the repository's model (run by
    `sequence_outputs`) from `reference` (`parity.core_outputs` on the same
    `segments`), or `ParityError` beyond `tol`."""
    check_tolerance(tol)
    diff = max_differences(reference, sequence_outputs(model_path, segments))
    if diff["log_probs"] > tol or diff["mems"] > tol or not diff["mem_mask_equal"]:
        raise ParityError(f"the Triton repository's model differs from the Keras core: "
                          f"{diff} (tolerance {tol})")
    return diff


# --------------------------------------------------------- the cached model
SUFFIX = "_cached"
MEMORY_LAYOUT = "keys_values"


def state_names(n_layer):
    """`[(input, output)]` of the states, in input order."""
    names = [f"{kind}_{i}" for kind in ("keys", "values") for i in range(n_layer)]
    return [(name, f"new_{name}") for name in names + ["mem_mask"]]


def state_shapes(config, mem_len):
    """`{state input: dims without the batch axis}`."""
    layer = [config.n_head, int(mem_len), config.d_head]
    return {name: ([int(mem_len)] if name == "mem_mask" else layer)
            for name, _ in state_names(config.n_layer)}


def cached_config(config, mem_len, model_name, log_probs="all", max_batch_size=16,
                  max_candidate_sequences=None, max_queue_delay_microseconds=0,
                  max_sequence_idle_microseconds=60_000_000, expose_memory=False):
    """The cached model's `config.pbtxt` text (options as
    `triton_model_config`'s; `expose_memory` lists the new states as
    outputs too)."""
    if max_candidate_sequences is None:
        max_candidate_sequences = 4 * int(max_batch_size)
    shapes = state_shapes(config, mem_len)
    outputs = [("log_probs", "TYPE_FP32",
                [-1, config.n_token] if log_probs == "all" else [config.n_token])]
    states = []
    for name, new in state_names(config.n_layer):
        data_type = "TYPE_BOOL" if name == "mem_mask" else "TYPE_FP32"
        states.append(state_text(name, new, data_type, shapes[name], "zero_data: true",
                                 "no valid slot" if name == "mem_mask" else "zeros"))
        if expose_memory:
            outputs.append((new, data_type, shapes[name]))
    return config_text(model_name, max_batch_size, outputs, states, max_candidate_sequences,
                       max_queue_delay_microseconds, max_sequence_idle_microseconds)


def serve_segment(core, log_probs_mode, token_ids, *state):
    """`{"log_probs", "new_keys_i", ..., "new_mem_mask"}` of a segment read
    on the state (`state_names` order)."""
    n_layer = core.config.n_layer
    hidden, (keys, values, mem_mask) = core.call_with_cache(
        token_ids, KeysValues(state[:n_layer], state[n_layer:2 * n_layer], state[-1]))
    out = {"log_probs": core.crit(hidden if log_probs_mode == "all" else hidden[:, -1]),
           "new_mem_mask": mem_mask}
    out.update({f"new_keys_{i}": k for i, k in enumerate(keys)})
    out.update({f"new_values_{i}": v for i, v in enumerate(values)})
    return out


def export_cached_onnx(core, path, mem_len, log_probs="all", opset=DEFAULT_OPSET,
                       external_data_threshold=EXTERNAL_DATA_THRESHOLD):
    """Writes the cached model's `model.onnx` (batch axis first everywhere);
    returns the files written."""
    cfg = core.config
    shapes = state_shapes(cfg, mem_len)
    states = state_names(cfg.n_layer)
    specs = [tf.TensorSpec([None, None], tf.int32, name="token_ids")] + [
        tf.TensorSpec([None] + shapes[name], tf.bool if name == "mem_mask" else tf.float32,
                      name=name) for name, _ in states]
    inputs = ["token_ids"] + [name for name, _ in states]
    outputs = ["log_probs"] + [new for _, new in states]
    model = convert_with_weight_inputs(lambda ids, *state: serve_segment(core, log_probs, ids,
                                                                          *state),
                                       specs, core.weights, opset)
    if [i.name for i in model.graph.input][:len(inputs)] != inputs:
        raise RuntimeError(f"unexpected ONNX inputs {[i.name for i in model.graph.input]}")
    order_outputs(model, outputs)
    add_id_range_check(model, "token_ids", cfg.n_token)
    declared = {"token_ids": ["batch", "seq_len"],
                "log_probs": (["batch", "seq_len", cfg.n_token] if log_probs == "all"
                              else ["batch", cfg.n_token])}
    for name, new in states:
        declared[name] = declared[new] = ["batch"] + shapes[name]
    declare_shapes(model, declared)
    # Its keys are per layer [H, M, d_head]: rows, not the decode graphs' columns.
    helper.set_model_props(model, {**export_metadata(cfg, mem_len, log_probs,
                                                     memory_layout=MEMORY_LAYOUT,
                                                     quantization=weights_quantization(core)),
                                   "decode_cache_layout": "keys_as_rows",
                                   "inputs": ",".join(inputs), "outputs": ",".join(outputs)})
    model.doc_string = "Transformer-XL, memory as keys and values: see export.triton"
    return save_with_weights(model, path, core.weights, len(inputs), external_data_threshold)


def sequence_log_probs(model_path, segments, providers=("CPUExecutionProvider",)):
    """Runs the cached model with onnxruntime as Triton's sequence batcher
    does (each row a stream, its state carried from the zero initial
    state); the log-probs of each segment."""
    import onnxruntime as ort
    session = ort.InferenceSession(model_path, providers=list(providers))
    info = ExportInfo(session.get_modelmeta().custom_metadata_map)
    if info.memory_layout != MEMORY_LAYOUT:
        raise TxlError(f"{model_path!r} is not a Triton repository's cached model")
    batch = segments[0].shape[0]
    shapes = state_shapes(info.config, info.mem_len)
    state = {name: np.zeros([batch] + shapes[name], np.bool_ if name == "mem_mask"
                            else np.float32) for name, _ in state_names(info.config.n_layer)}
    results = []
    for ids in segments:
        out = dict(zip([o.name for o in session.get_outputs()],
                       session.run(None, {"token_ids": ids, **state})))
        state = {name: out[new] for name, new in state_names(info.config.n_layer)}
        results.append(out["log_probs"])
    return results


def check_cached_model(reference, model_path, segments, tol=1e-4):
    """`{"log_probs": largest difference}` of the cached model (run by
    `sequence_log_probs`) from `reference` (`parity.core_outputs` on the
    same `segments`), or `ParityError` beyond `tol`."""
    check_tolerance(tol)
    got = sequence_log_probs(model_path, segments)
    if len(got) != len(reference):
        raise ParityError(f"the Triton repository's cached model gave {len(got)} segments' "
                          f"log-probs for {len(reference)} segments")
    for g, want in zip(got, reference):
        if np.shape(g) != np.shape(want[0]):
            raise ParityError(f"the Triton repository's cached model's log-probs are "
                              f"{np.shape(g)}, the Keras core's {np.shape(want[0])}")
    diff = max(largest_difference(want[0], g) for g, want in zip(got, reference))
    if diff > tol:
        raise ParityError(f"the Triton repository's cached model differs from the Keras "
                          f"core: log-probs by {diff} (tolerance {tol})")
    return {"log_probs": diff}


# ------------------------------------------------------------- config.pbtxt
def config_text(model_name, max_batch_size, outputs, states, max_candidate_sequences,
                max_queue_delay_microseconds, max_sequence_idle_microseconds):
    """A `config.pbtxt` of a sequence-batched onnxruntime model whose one
    input is `token_ids` `[-1]`; `outputs`: `(name, type, dims)`; `states`:
    `state_text`s."""
    lines = [
        f'name: "{model_name}"',
        'backend: "onnxruntime"',
        f"max_batch_size: {int(max_batch_size)}",
        "input [",
        tensor_text("token_ids", "TYPE_INT32", [-1]),
        "]",
        "output [",
        ",\n".join(tensor_text(*o) for o in outputs),
        "]",
        "sequence_batching {",
        f"  max_sequence_idle_microseconds: {int(max_sequence_idle_microseconds)}",
        "  oldest {",
        f"    max_candidate_sequences: {int(max_candidate_sequences)}",
        f"    max_queue_delay_microseconds: {int(max_queue_delay_microseconds)}",
        "  }",
        "  state [",
        ",\n".join(states),
        "  ]",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _dims(dims):
    return "[ " + ", ".join(str(int(d)) for d in dims) + " ]"


def tensor_text(name, data_type, dims):
    """One entry of `input [...]` or `output [...]`."""
    return f'  {{\n    name: "{name}"\n    data_type: {data_type}\n    dims: {_dims(dims)}\n  }}'


def state_text(input_name, output_name, data_type, dims, start, start_name):
    """One implicit state; `start`: its initial state's data line."""
    return "\n".join([
        "    {",
        f'      input_name: "{input_name}"',
        f'      output_name: "{output_name}"',
        f"      data_type: {data_type}",
        f"      dims: {_dims(dims)}",
        "      initial_state: {",
        f"        data_type: {data_type}",
        f"        dims: {_dims(dims)}",
        f"        {start}",
        f'        name: "{start_name}"',
        "      }",
        "    }"])
