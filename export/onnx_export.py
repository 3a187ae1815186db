"""Converts the `step` computation to ONNX with tf2onnx.

tf2onnx would freeze the weights into constants and copy them several times
(GraphDef, grappler, its own graph, the ModelProto), which does not fit in
memory at the paper's sizes. So the function converted takes the weights as
extra *inputs*: the converted graph is tiny, and its weight inputs are then
turned into initializers written from the core's arrays one at a time.
onnxruntime constant-folds what tf2onnx would have folded (weight transposes)
when it opens the session.
"""
import contextlib
import logging
import os
import re
from typing import NamedTuple

import keras
import numpy as np
import onnx
import tensorflow as tf
from onnx import TensorProto, helper, numpy_helper

from export import decode_interface as decode
from export.canonical import canonical_graph
from export.metadata import (DECODE_FILES, DECODE_TOKEN_FILE, INPUT_NAMES, OUTPUT_NAMES,
                             WEIGHT_PREFIX, export_metadata, external_data_file,
                             weights_quantization)
from export.saved_model import (LOG_PROBS_MODES, check_memory_layout, interface_specs,
                                serve_step)
from txl_tf.checks.numpy_checks import check_count
from txl_tf.errors import TxlError
from txl_tf.layers.onnx_forms import for_onnx_runtime
from txl_tf.layers.ring_cache import WRITE_ROWS_SCOPE

log = logging.getLogger(__name__)

DEFAULT_OPSET = 17
# Protobuf cannot serialise 2 GiB; leave room for the graph itself.
EXTERNAL_DATA_THRESHOLD = 2 ** 31 - 2 ** 26
_ALIGN = 4096


class WeightsFile(NamedTuple):
    """An ONNX external data file that holds each weight of a core once, for
    several graphs to read: `places` maps a weight input's name to its
    `(offset, length)` in bytes in `path`."""
    path: str
    places: dict


def write_weights_file(variables, path):
    """Writes each of a core's `variables` once to `path` (page-aligned ONNX
    external data), for the graphs of one export to share (`export_onnx`
    and `export_decode_onnx` with `weights_file=`).

    Returns:
        The `WeightsFile`.
    """
    with open(path, "wb") as data:
        places = {f"{WEIGHT_PREFIX}{i:04d}": _append_aligned(data, variable)
                  for i, variable in enumerate(variables)}
    log.info("ONNX weights written to %s (external data)", path)
    return WeightsFile(path, places)


def export_onnx(core, path, mem_len, log_probs="all", zero_filled=False,
                opset=DEFAULT_OPSET, external_data_threshold=EXTERNAL_DATA_THRESHOLD,
                memory_layout="layer_major", weights_file=None, cache_dtype="float32",
                decode_dtype="float32"):
    """Writes `step` as an ONNX model.

    Inputs `token_ids` int32 `[B, T]` (range-checked in the graph), `mems`,
    `mem_mask`; outputs in this order: `log_probs`, `new_mems`,
    `new_mem_mask`; batch and segment axes dynamic; config and memory geometry
    in `metadata_props`. `step` is float32.

    Args:
        core: the `TransformerXL` to export.
        path: the `.onnx` file to write (its folder is made when missing).
        mem_len: memory slots, an int >= 0.
        log_probs: `"all"` (`[B, T, n_token]`) or `"last"` (`[B, n_token]`).
        zero_filled: whether fresh memories are zero states (recorded).
        opset: the ONNX opset (default 17).
        external_data_threshold: weights above this many bytes go to
            `external_data_file(path)` beside the model (ONNX external data).
        memory_layout: `"layer_major"` (`mems` `[n_layer, B, M, d_model]`,
            the only one `open_runtime` reads) or `"batch_major"`
            (`[B, n_layer, M, d_model]`, the Triton repository's model).
        weights_file: None, or a `write_weights_file` result the model reads
            its weights from.
        cache_dtype: recorded for the decode graphs beside it
            (`export_decode_onnx`).
        decode_dtype: likewise.

    Returns:
        The list of files written.

    Raises:
        TxlError: a bad `log_probs`, `mem_len` or `memory_layout`.
    """
    check_memory_layout(memory_layout)
    if log_probs not in LOG_PROBS_MODES:
        raise TxlError(f"log_probs must be one of {LOG_PROBS_MODES}, got {log_probs!r}")
    mem_len = check_count("mem_len", mem_len)
    # Its folder is made first (as `export_saved_model` makes its own): not
    # found only when the converted graph is written, it cost the conversion.
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    cfg = core.config
    model = _convert(core, mem_len, log_probs, opset, memory_layout)
    weight_inputs = [i.name for i in model.graph.input][len(INPUT_NAMES):]
    got_in = [i.name for i in model.graph.input][:len(INPUT_NAMES)]
    if got_in != list(INPUT_NAMES) or sorted(o.name for o in model.graph.output) != \
            sorted(OUTPUT_NAMES) or not all(n.startswith(WEIGHT_PREFIX) for n in weight_inputs):
        raise RuntimeError(f"unexpected ONNX interface: inputs {got_in} + "
                           f"{len(weight_inputs)} weights, outputs "
                           f"{[o.name for o in model.graph.output]}")
    order_outputs(model, OUTPUT_NAMES)
    add_id_range_check(model, "token_ids", cfg.n_token)
    _declare_shapes(model, cfg, mem_len, log_probs, memory_layout)
    helper.set_model_props(model, export_metadata(cfg, mem_len, log_probs, zero_filled,
                                                  memory_layout, cache_dtype, decode_dtype,
                                                  weights_quantization(core)))
    model.doc_string = ("Transformer-XL step: (token_ids, mems, mem_mask) -> "
                        "(log_probs, new_mems, new_mem_mask)")
    return save_with_weights(model, path, core.weights, len(INPUT_NAMES),
                             external_data_threshold, weights_file)



def export_decode_onnx(core, folder, mem_len, weights_file, opset=DEFAULT_OPSET,
                       interfaces=None, cache_dtype="float32", decode_dtype="float32",
                       zero_filled=False):
    """Writes the cached decode interface (`export.decode_interface`) as
    ONNX models in `folder` (`DECODE_FILES`; only those named in
    `interfaces` when given), each with the config and its interface in
    `metadata_props` and its weights read from `weights_file`
    (`write_weights_file` of the float32 `core`'s weights, shared with
    `model.onnx`), the cache's keys and values in `cache_dtype`
    (`CACHE_DTYPES`), computing in `decode_dtype` (`DECODE_DTYPES`; float16
    needs a float16 cache); `zero_filled` is recorded as `model.onnx`'s (the
    memory a new stream starts from); returns the files."""
    cfg, mem_len = core.config, int(mem_len)
    decode.check_cache_dtype(cache_dtype)
    if decode_dtype != "float32" and cache_dtype != decode_dtype:
        raise TxlError(f"decode graphs computing in {decode_dtype} keep their keys and values "
                       f"in {decode_dtype}, not {cache_dtype}")
    quantization = weights_quantization(core)
    core = decode.decode_core(core, decode_dtype)
    parts = {
        "decode_init": (lambda mems, mem_mask: decode.decode_init(core, mems, mem_mask,
                                                                  cache_dtype),
                        decode.memory_specs(cfg, mem_len), decode.INIT_INPUTS,
                        decode.INIT_OUTPUTS),
        "decode_step": (lambda *args: decode.decode_step(core, *args),
                        decode.step_specs(cfg, mem_len, cache_dtype),
                        decode.step_inputs(cfg.n_layer), decode.STEP_OUTPUTS),
        "decode_read": (lambda *args: decode.decode_read(core, *args),
                        decode.read_specs(cfg, mem_len, cache_dtype), decode.READ_INPUTS,
                        decode.READ_OUTPUTS),
        "decode_token": (lambda *args: decode.decode_token(core, *args),
                         decode.token_specs(cfg, mem_len, cache_dtype),
                         decode.token_inputs(cfg.n_layer), decode.token_outputs(cfg.n_layer)),
    }
    shapes = decode.cache_shapes(cfg, mem_len)
    layer_shapes = {f"{kind}_{i}": shapes[kind][1:] for kind in ("keys", "values")
                    for i in range(cfg.n_layer)}
    token = {f"token_{name}": [cfg.n_layer, "batch", cfg.n_head, cfg.d_head]
             for name in ("keys", "values")}
    shapes.update({f"new_{name}": shapes[name] for name in decode.CACHE_NAMES})
    shapes.update({f"new_{name}": shape for name, shape in layer_shapes.items()})
    shapes.update(layer_shapes, **token, token_mems=[cfg.n_layer, "batch", cfg.d_model],
                  token_ids=["batch"], stopped=["batch"], log_probs=["batch", cfg.n_token],
                  mems=[cfg.n_layer, "batch", mem_len, cfg.d_model],
                  mem_mask=["batch", mem_len])
    # A slab's step reads its first rows; the stacked layer inputs, whose
    # rows are not their first axis, are bound whole (`device_cache.FixedStep`).
    slab_mems = [cfg.n_layer, "capacity"] + shapes["cache_mems"][2:]
    interface_shapes = {"decode_read": {"token_ids": ["batch", "seq_len"]},
                        "decode_token": {"cache_mems": slab_mems, "new_cache_mems": slab_mems}}
    written = []
    for interface, (fn, specs, inputs, outputs) in parts.items():
        if interfaces is not None and interface not in interfaces:
            continue
        model = convert_with_weight_inputs(fn, specs, core.weights, opset)
        got = [i.name for i in model.graph.input][:len(inputs)]
        if got != list(inputs) or sorted(o.name for o in model.graph.output) != sorted(outputs):
            raise RuntimeError(f"unexpected ONNX {interface} interface: inputs {got}, outputs "
                               f"{[o.name for o in model.graph.output]}")
        order_outputs(model, outputs)
        if "token_ids" in inputs and interface not in UNCHECKED_IDS:
            add_id_range_check(model, "token_ids", cfg.n_token,
                               refuse_empty=interface not in ELEMENTWISE_IDS)
        declare_shapes(model, {**shapes, **interface_shapes.get(interface, {})})
        keep_batch_axis(model)
        helper.set_model_props(model, {**export_metadata(cfg, mem_len, "last", zero_filled,
                                                         cache_dtype=cache_dtype,
                                                         decode_dtype=decode_dtype,
                                                         quantization=quantization),
                                       "interface": interface, "inputs": ",".join(inputs),
                                       "outputs": ",".join(outputs)})
        model.doc_string = f"Transformer-XL {interface}: see export.decode_interface"
        files = {**DECODE_FILES, "decode_token": DECODE_TOKEN_FILE}
        written += save_with_weights(model, os.path.join(folder, files[interface]),
                                     core.weights, len(inputs), weights_file=weights_file)
    return written


def save_with_weights(model, path, variables, n_inputs,
                      external_data_threshold=EXTERNAL_DATA_THRESHOLD, weights_file=None):
    """Checks `model` (from `convert_with_weight_inputs`, `n_inputs` interface
    inputs) and writes it with `variables` as initializers: read from
    `weights_file` when given, else in the model's file, or in its own
    external data file when they are above `external_data_threshold` bytes.

    Returns:
        The files written (the model, and the data file it wrote, if any).
    """
    # Checked while the weights are still graph inputs: checking the file would
    # parse all of a single-file model's weights (twice their size in memory).
    onnx.checker.check_model(model)
    weights = _weight_tensors(model, variables, n_inputs)
    written = [path]
    if weights_file is None:
        n_bytes = sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in variables)
        if n_bytes <= external_data_threshold:
            _save_with_weights(model, path, weights)
            return written
        with open(external_data_file(path), "wb") as data:
            weights_file = WeightsFile(data.name, {header.name: _append_aligned(data, variable)
                                                   for header, variable in weights})
        written.append(weights_file.path)
    _refer_to(model, weights, weights_file, os.path.dirname(os.path.abspath(path)))
    onnx.save_model(model, path)
    del model
    onnx.checker.check_model(path)  # reads only the graph; the data file must be beside it
    return written


def _convert(core, mem_len, log_probs, opset, memory_layout):
    """tf2onnx ModelProto of `step(token_ids, mems, mem_mask, *weights)`."""
    return convert_with_weight_inputs(
        lambda token_ids, mems, mem_mask: serve_step(core, token_ids, mems, mem_mask,
                                                     log_probs, memory_layout),
        interface_specs(core.config, mem_len, memory_layout), core.weights, opset)


def convert_with_weight_inputs(fn, specs, variables, opset=DEFAULT_OPSET):
    """tf2onnx ModelProto of `fn(*interface)` where the Keras `variables` it
    reads are extra graph inputs named `txl_weight_NNNN` after the `specs`
    inputs (see the module doc; `save_with_weights` makes them initializers),
    its nodes and names made independent of the conversion (`canonical_graph`)."""
    with _restored_environment("TF_CPP_MIN_LOG_LEVEL"):  # tf2onnx.convert sets it to 3
        import tf2onnx.convert  # heavy import, only when converting

    variables = list(variables)
    n_inputs = len(specs)
    specs = list(specs) + [tf.TensorSpec(v.shape, v.dtype, name=f"{WEIGHT_PREFIX}{i:04d}")
                           for i, v in enumerate(variables)]

    @tf.function(input_signature=specs, autograph=False)
    def run(*args):
        with keras.StatelessScope(state_mapping=list(zip(variables, args[n_inputs:]))):
            return fn(*args[:n_inputs])

    def convert():
        handlers = {op: (_nan_safe_select, []) for op in ("Select", "SelectV2")}
        # (tf2onnx's old handler API takes the ONNX op first, then the arguments.)
        handlers["TensorScatterUpdate"] = (_scatter_rows, ["ScatterND", {}])
        with for_onnx_runtime():  # the forms whose weight-only parts ONNX Runtime folds at load
            return tf2onnx.convert.from_function(run, input_signature=specs, opset=opset,
                                                 custom_op_handlers=handlers)[0]
    try:
        with _environment(TF2ONNX_CATCH_ERRORS="FALSE"), _without_global_pools():
            model = convert()
    except Exception:  # noqa: BLE001  an optimizer failed: again, with the copies that skip it
        log.info("tf2onnx failed without its graph copies; converting with them")
        with _without_global_pools():
            model = convert()
    return canonical_graph(model)  # the same bytes for the same function and weights


@contextlib.contextmanager
def _without_global_pools():
    """tf2onnx without its optimizer that turns a mean over the last axis of
    a 3-D tensor into a `GlobalAveragePool`: a layer norm's mean must stay a
    `ReduceMean` for ONNX Runtime to fuse it (`txl_tf.layers.layer_norm`).
    tf2onnx's `from_function` takes no list of optimizers; its table is
    restored after the block."""
    from tf2onnx import optimizer
    saved = optimizer._optimizers  # pylint: disable=protected-access
    optimizer._optimizers = type(saved)(
        (name, step) for name, step in saved.items() if name != "global_pool_optimizer")
    try:
        yield
    finally:
        optimizer._optimizers = saved


@contextlib.contextmanager
def _restored_environment(*names):
    """Gives the environment variables `names` back the values (or the
    absence) they had before the block, whatever the block did to them.

    Importing `tf2onnx.convert` writes `TF_CPP_MIN_LOG_LEVEL=3` into
    `os.environ`: left there, every process started afterwards would hide
    TensorFlow's C++ errors.
    """
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _environment(**values):
    """Sets environment variables for the block, then restores them.

    `TF2ONNX_CATCH_ERRORS` (any value: tf2onnx 1.17 compares the variable's
    name, not its value, to "TRUE") stops tf2onnx from deep-copying the whole
    graph before each of its optimizers, so that one that fails can be
    skipped; the copies are most of its optimizing time. A conversion that
    fails that way is done again with them.
    """
    with _restored_environment(*values):
        os.environ.update(values)
        yield


def _nan_safe_select(ctx, node, name, args):
    """`tf.where` as ONNX `Where`: tf2onnx's default `c * x + (1 - c) * y`
    turns a NaN or inf in the branch not taken into NaN (e.g. in invalid
    memory slots)."""
    from tf2onnx.onnx_opset.controlflow import Select
    node.set_attr("handles_nan", True)
    Select.version_9(ctx, node)


def _scatter_rows(ctx, node, name, args):
    """`ring_cache.write_rows`' scatter as ONNX `ScatterElements` along the
    ring's slot axis (named in its scope): one kernel, which runs in place
    where the output is bound to the ring's buffer, and takes its indices
    as kernel arguments (ScatterND copies its shape from the host at each
    run, which a replayed CUDA graph would not repeat). Its indices are the
    slot coordinate of tf's element coordinates, taken once for every
    scatter that shares them (`args[0]`: a cache). Any other
    TensorScatterUpdate converts as tf2onnx has it."""
    from tf2onnx.onnx_opset.tensor import TensorScatterUpdate
    found = re.search(rf"{WRITE_ROWS_SCOPE}(\d+)(?:_\d+)?/", node.name)  # tf numbers a repeat
    if found is None:
        return TensorScatterUpdate.version_11(ctx, node)
    axis, ring, coords, update = int(found.group(1)), *node.input
    cache = args[0]
    if (coords, axis) not in cache:
        slots = _stacked_input(ctx, coords, axis)
        if slots is None:
            slots = ctx.make_node("Gather", [coords, ctx.make_const(
                f"{node.name}_axis", np.array(axis, np.int64)).output[0]],
                attr={"axis": -1}).output[0]
        cache[coords, axis] = _unsqueeze(ctx, slots, axis, f"{node.name}_slots")
    node.type = "ScatterElements"
    node.set_attr("axis", axis)
    ctx.replace_inputs(node, [ring, cache[coords, axis],
                              _unsqueeze(ctx, update, axis, f"{node.name}_update")])


def _stacked_input(ctx, stacked, i):
    """The `i`th tensor `tf.stack(..., -1)` stacked into `stacked`, as
    tf2onnx converts a stack (each one unsqueezed, then concatenated), or
    None where `stacked` was made otherwise. Read from there, the other
    coordinates `row_write` stacks with it are left to no reader (tf2onnx
    drops them)."""
    concat = ctx.get_node_by_output(stacked)
    if concat is None or concat.type != "Concat" or concat.get_attr_value("axis") not in (
            -1, len(concat.input) - 1) or len(concat.input) <= i:
        return None
    unsqueeze = ctx.get_node_by_output(concat.input[i])
    if unsqueeze is None or unsqueeze.type != "Unsqueeze":
        return None
    return unsqueeze.input[0]


def _unsqueeze(ctx, tensor, axis, name):
    """The output name of `tensor` with a new axis `axis` (opset 13's Unsqueeze)."""
    axes = ctx.make_const(f"{name}_axes", np.array([axis], np.int64)).output[0]
    return ctx.make_node("Unsqueeze", [tensor, axes]).output[0]


def order_outputs(model, names):
    """Puts the graph's outputs in the order `names` (tf2onnx sorts dict keys)."""
    by_name = {o.name: onnx.ValueInfoProto() for o in model.graph.output}
    for o in model.graph.output:
        by_name[o.name].CopyFrom(o)
    del model.graph.output[:]
    model.graph.output.extend(by_name[n] for n in names)


# The decode graphs without the in-graph id check: `decode_token` runs only
# inside a runtime, which checks every id on the host first (prompts, and the
# ids of `decode_step`; sampled ids are in range), and it is the graph a GPU
# replays, where the check cannot work (ONNX Runtime's CUDA Gather gives 0 for
# an index out of range instead of failing) and would cost 6 kernels a token.
UNCHECKED_IDS = ("decode_token",)
# The decode graphs whose id check reads the ids one by one, without the flag
# of an empty input: `decode_step`, which a GPU replays where an export has no
# `decode_token` or that one is not captured (the flag and its reduction would
# cost 2 kernels a token). A step of no rows passes the check.
ELEMENTWISE_IDS = ("decode_step",)


def id_check_node_name(n_token, refuse_empty=True):
    """The name of the node that fails on bad ids (and on no ids with
    `refuse_empty`); onnxruntime prints it."""
    empty = "empty or " if refuse_empty else ""
    return f"token_ids {empty}out of range: valid ids are 0 to {n_token - 1}"


def onnx_constant(name, value, dtype=TensorProto.INT32):
    """A Constant node whose output is `name`."""
    return helper.make_node("Constant", [], [name], name=name,
                            value=helper.make_tensor(name, dtype, np.shape(value),
                                                     np.ravel(value).tolist()))


def add_id_range_check(model, ids_name, n_token, refuse_empty=True):
    """Makes the graph fail on ids outside `[0, n_token)` (negative ones too),
    and on no ids with `refuse_empty` (`add_input_guard` with bad = ids < 0
    or ids >= n_token)."""
    c = "txl_id_check/"
    nodes = [
        onnx_constant(c + "zero", 0),
        onnx_constant(c + "n_token", n_token),
        helper.make_node("Less", [ids_name, c + "zero"], [c + "negative"], name=c + "negative"),
        helper.make_node("GreaterOrEqual", [ids_name, c + "n_token"], [c + "too_large"],
                         name=c + "too_large"),
        helper.make_node("Or", [c + "negative", c + "too_large"], [c + "bad"], name=c + "bad"),
    ]
    add_input_guard(model, ids_name, nodes, c + "bad", id_check_node_name(n_token, refuse_empty),
                    c, refuse_empty)


def add_input_guard(model, input_name, bad_nodes, bad_name, message, prefix,
                    refuse_empty=True):
    """Makes the graph fail when any element of the bool tensor `bad_name`
    (computed by `bad_nodes` from the raw input) is True.

    any(bad) indexes a 1-element constant, so a bad input is a Gather out of
    bounds in a node named `message` (onnxruntime prints it); the gathered 0
    is added to the int32 input the model reads, so no optimiser can drop
    the check. An empty input is bad too: the reduction is over the flags (0
    or 1) and a constant -2, an index out of bounds that is the largest only
    for an empty input (a reduction of an empty set is undefined before opset
    18; a flag read from the input's Size would be a value on the host under
    ONNX Runtime's CUDA provider, copied back each call). Without
    `refuse_empty` the flags index the constant one by one (no reduction,
    2 kernels less), and an empty input passes. Node names start with
    `prefix`.
    """
    checked = f"{input_name}_checked"
    for node in model.graph.node:
        node.input[:] = [checked if name == input_name else name for name in node.input]
    c = prefix
    nodes = list(bad_nodes) + [onnx_constant(c + "guard_data", [0])]
    if refuse_empty:
        nodes += [
            onnx_constant(c + "guard_flat", [-1], TensorProto.INT64),
            onnx_constant(c + "guard_empty", [-2], TensorProto.INT64),
            helper.make_node("Reshape", [bad_name, c + "guard_flat"], [c + "bad_flat"],
                             name=c + "bad_flat"),
            helper.make_node("Cast", [c + "bad_flat"], [c + "bad_int"], name=c + "bad_int",
                             to=TensorProto.INT64),
            helper.make_node("Concat", [c + "bad_int", c + "guard_empty"], [c + "flags"],
                             name=c + "flags", axis=0),
            helper.make_node("ReduceMax", [c + "flags"], [c + "any_bad"], name=c + "any_bad",
                             keepdims=0),
        ]
        index = c + "any_bad"
    else:
        nodes.append(helper.make_node("Cast", [bad_name], [c + "bad_int"], name=c + "bad_int",
                                      to=TensorProto.INT64))
        index = c + "bad_int"
    nodes += [
        helper.make_node("Gather", [c + "guard_data", index], [c + "zero_if_valid"],
                         name=message, axis=0),
        helper.make_node("Add", [input_name, c + "zero_if_valid"], [checked], name=c + "add"),
    ]
    existing = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes + existing)


def _weight_tensors(model, variables, n_inputs):
    """`(TensorProto header without data, variable)` per weight input of `model`,
    whose weight inputs (after the `n_inputs` interface inputs) are removed."""
    names = {i.name for i in model.graph.input[n_inputs:]}
    names &= _consumed(model.graph)  # tf2onnx keeps inputs that nothing reads
    keep = list(model.graph.input[:n_inputs])
    del model.graph.input[:]
    model.graph.input.extend(keep)
    headers = []
    for i, variable in enumerate(variables):
        name = f"{WEIGHT_PREFIX}{i:04d}"
        if name in names:  # a weight nothing reads gets no initializer
            header = TensorProto(name=name, dims=list(variable.shape), data_type=
                                 helper.np_dtype_to_tensor_dtype(np.dtype(variable.dtype)))
            headers.append((header, variable))
    return headers


def _consumed(graph):
    """Names read by any node of `graph` or of its subgraphs (Loop, If bodies)."""
    names = set()
    for node in graph.node:
        names.update(node.input)
        for attribute in node.attribute:
            for sub in [attribute.g] + list(attribute.graphs):
                names |= _consumed(sub)
    return names


def _save_with_weights(model, path, weights):
    """Saves `model` with the `weights` (`_weight_tensors`) as initializers
    streamed into the protobuf file, one array in memory at a time."""
    # A ModelProto is its fields in any order; repeated fields may be split. So the
    # file is: the model without its graph, then the graph field, whose bytes are the
    # graph without weights followed by one `initializer` entry per weight.
    entries = [(h.SerializeToString(), int(np.prod(h.dims, dtype=np.int64)) *
                np.dtype(v.dtype).itemsize, v) for h, v in weights]
    sizes = [len(head) + _field_len(_RAW_DATA, n) for head, n, _ in entries]
    graph = model.graph.SerializeToString()
    graph_len = len(graph) + sum(_field_len(_INITIALIZER, size) for size in sizes)
    model.ClearField("graph")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
        f.write(_key(_GRAPH) + _varint(graph_len) + graph)
        for (head, n_bytes, variable), size in zip(entries, sizes):
            array = _little_endian(variable)
            f.write(_key(_INITIALIZER) + _varint(size) + head)
            f.write(_key(_RAW_DATA) + _varint(n_bytes))
            _write_array(f, array)


def _little_endian(variable):
    """The variable's values as a contiguous array in ONNX's byte order
    (little-endian; no copy on little-endian machines)."""
    return np.ascontiguousarray(variable.numpy(),
                                dtype=np.dtype(variable.dtype).newbyteorder("<"))


# Protobuf field numbers: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
_GRAPH, _INITIALIZER, _RAW_DATA = 7, 5, 9


def _varint(value):
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _key(field):
    """The key of a length-delimited field (wire type 2)."""
    return _varint(field << 3 | 2)


def _field_len(field, size):
    return len(_key(field)) + len(_varint(size)) + size


def _append_aligned(data, variable):
    """Writes `variable` at the next page boundary of the open file `data`;
    returns its `(offset, length)`."""
    array = _little_endian(variable)
    data.seek(-data.tell() % _ALIGN, os.SEEK_CUR)
    offset = data.tell()
    _write_array(data, array)
    return offset, array.nbytes


def _write_array(f, array):
    """Writes `array`'s bytes (C order) to the open binary file `f`: through
    `f.write`, whose full disk is an `OSError` saying so (numpy's `tofile`
    says only how many bytes it wrote)."""
    f.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def _refer_to(model, weights, weights_file, folder):
    """Adds the `weights` (`_weight_tensors`) to `model` as initializers read
    from `weights_file` (its location relative to the model's `folder`)."""
    location = os.path.relpath(os.path.abspath(weights_file.path), folder)
    for header, _ in weights:
        offset, length = weights_file.places[header.name]
        tensor = model.graph.initializer.add()
        tensor.CopyFrom(header)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", offset), ("length", length)):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)


def _declare_shapes(model, config, mem_len, log_probs, memory_layout):
    """Writes the interface's shapes: named `batch` / `seq_len` axes, fixed geometry
    (tf2onnx leaves some output axes as anonymous `unk__N` dims)."""
    geometry = [config.n_layer, "batch", int(mem_len), config.d_model]
    if memory_layout == "batch_major":
        geometry[:2] = geometry[1::-1]
    shapes = {"token_ids": ["batch", "seq_len"], "mems": geometry,
              "mem_mask": ["batch", int(mem_len)], "new_mems": geometry,
              "new_mem_mask": ["batch", int(mem_len)],
              "log_probs": (["batch", "seq_len", config.n_token] if log_probs == "all"
                            else ["batch", config.n_token])}
    declare_shapes(model, shapes)


def keep_batch_axis(model):
    """Rewrites each reshape of `model` to a constant `[-1, s, ...]` whose
    input's other axes are known and hold as many elements as `s, ...` as a
    reshape to `[0, s, ...]` (0: the input's first axis), the same reshape,
    so that ONNX's shape inference keeps the first axis's name (`batch`)
    through it: ONNX Runtime's `SkipLayerNormFusion` takes only residual adds
    whose inputs' batch axes have one name (`layers.layer_norm`)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {value.name: value.type.tensor_type.shape.dim
              for value in list(inferred.graph.value_info) + list(inferred.graph.input)}
    constants = {tensor.name: tensor for tensor in model.graph.initializer}
    replaced = set()
    for node in model.graph.node:
        if (node.op_type != "Reshape" or node.input[1] not in constants
                or any(attr.name == "allowzero" and attr.i for attr in node.attribute)):
            continue
        target = numpy_helper.to_array(constants[node.input[1]])
        dims = shapes.get(node.input[0], [])
        if (target.ndim != 1 or len(target) < 2 or target[0] != -1 or (target[1:] <= 0).any()
                or len(dims) < 2 or not all(dim.HasField("dim_value") for dim in dims[1:])
                or np.prod([dim.dim_value for dim in dims[1:]]) != np.prod(target[1:])):
            continue
        name = f"{node.input[1]}__batch_kept"
        if name not in constants:
            constants[name] = numpy_helper.from_array(np.concatenate([[0], target[1:]]).astype(
                target.dtype), name)
            model.graph.initializer.append(constants[name])
        replaced.add(node.input[1])
        node.input[1] = name
    # The shapes now unused (ONNX Runtime warns of each at load).
    used = {name for node in model.graph.node for name in node.input}
    for tensor in [constants[name] for name in replaced - used]:
        model.graph.initializer.remove(tensor)


def declare_shapes(model, shapes):
    """Sets the shapes of the graph inputs and outputs named in `shapes`
    (`{name: [int or axis name, ...]}`)."""
    for value in list(model.graph.input) + list(model.graph.output):
        if value.name not in shapes:
            continue
        shape = value.type.tensor_type.shape
        del shape.dim[:]
        for size in shapes[value.name]:
            dim = shape.dim.add()
            if isinstance(size, str):
                dim.dim_param = size
            else:
                dim.dim_value = size
