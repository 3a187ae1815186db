"""The Triton repository's cached model: the memory held as its attention keys
and values, so a request projects only its own tokens.

```
repo_dir/txl_cached/config.pbtxt     sequence batching, keys and values as implicit state
repo_dir/txl_cached/1/model.onnx
```
The step model beside it (`export.triton`) holds the memory as layer inputs
and projects the keys and values of every remembered position again at
every request. This one's state is, per layer, the memory's keys and values
`[H, M, d_head]` in time order (`keys_i` → `new_keys_i`, `values_i` →
`new_values_i`) and the validity of each slot (`mem_mask` → `new_mem_mask`):
`TransformerXL.call_with_cache` on a `KeysValues` memory. There is no ring, so streams batched
together need nothing in common, and Triton batches every state along its
first axis as it is. Its cost: Triton's onnxruntime backend gives a state
back only as a new output, so the graph writes all of it every request
(a read of the keys and values for attention, then a copy into the new
state), where the runtimes' `decode_step` writes one slot in place. A new
stream starts from zeros with every slot invalid (the empty memory); a
zero-filled export has no cached model (its memory's keys are not zeros).
"""
import numpy as np
import tensorflow as tf
from onnx import helper

from export.metadata import ExportInfo, export_metadata
from export.onnx_export import (DEFAULT_OPSET, EXTERNAL_DATA_THRESHOLD, add_id_range_check,
                                convert_with_weight_inputs, declare_shapes, order_outputs,
                                save_with_weights)
from export.parity import ParityError
from export.triton_config import config_text, state_text
from txl_tf.errors import TxlError
from txl_tf.layers.ring_cache import KeysValues

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
    `triton.triton_model_config`'s; `expose_memory` lists the new states as
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
    helper.set_model_props(model, {**export_metadata(cfg, mem_len, log_probs,
                                                     memory_layout=MEMORY_LAYOUT),
                                   "inputs": ",".join(inputs), "outputs": ",".join(outputs)})
    model.doc_string = "Transformer-XL, memory as keys and values: see export.triton_cached"
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
    got = sequence_log_probs(model_path, segments)
    diff = max(float(np.max(np.abs(np.asarray(g) - np.asarray(want[0]))))
               for g, want in zip(got, reference))
    if diff > tol:
        raise ParityError(f"the Triton repository's cached model differs from the Keras "
                          f"core: log-probs by {diff} (tolerance {tol})")
    return {"log_probs": diff}
