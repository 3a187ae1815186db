"""The exported cached decode step's graph (`decode_step.onnx`): its nodes by
op type, in total and per layer, as converted and as ONNX Runtime optimizes
it, and its CPU time (`python -m benchmarks.inference --part=decode_nodes`).

At batch 1 on a GPU a step costs about its kernel count times a launch, and
each node is at least one kernel, except the view ops (`VIEW_OPS`), which
ONNX Runtime's CUDA provider runs as aliases of their input.
"""
import collections
import os
import tempfile

import numpy as np

OPTIMIZATION_LEVELS = ("basic", "extended", "all")
VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten"})


def export_step(config, mem_len, folder, seed=0):
    """Writes the decode step of a core of `config` with random weights
    (`seed`) and memory `mem_len` as the export does, to `folder`; returns
    decode_step.onnx's path."""
    import keras

    from export.onnx_export import export_decode_onnx, write_weights_file
    from txl_tf import TransformerXL
    keras.utils.set_random_seed(seed)
    core = TransformerXL(config)
    os.makedirs(folder, exist_ok=True)
    weights = write_weights_file(core.weights, os.path.join(folder, "model.onnx.data"))
    export_decode_onnx(core, folder, mem_len, weights, interfaces=("decode_step",))
    return os.path.join(folder, "decode_step.onnx")


def node_counts(path, level=None):
    """`collections.Counter` of the op types of the ONNX graph at `path`, as
    written (`level` None) or after ONNX Runtime's CPU graph optimizations of
    `level` (one of `OPTIMIZATION_LEVELS`)."""
    import onnx
    import onnxruntime as ort
    if level is None:
        model = onnx.load(path, load_external_data=False)
        return collections.Counter(node.op_type for node in model.graph.node)
    levels = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = levels[level]
        options.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
        # Hardware-specific layouts (NCHWc) do not concern these graphs; the
        # warning ONNX Runtime gives for saving them is not wanted here.
        options.log_severity_level = 3
        ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        model = onnx.load(options.optimized_model_filepath, load_external_data=False)
    return collections.Counter(node.op_type for node in model.graph.node)


def kernels(counts):
    """How many of `counts`' nodes are not `VIEW_OPS`."""
    return sum(n for op, n in counts.items() if op not in VIEW_OPS)


def per_layer(one_layer, two_layers):
    """The nodes a layer adds: `two_layers - one_layer` by op type (the
    counts of one config's graphs with n and n + 1 layers, n >= 2: with one
    layer the stacked outputs take no `Concat`)."""
    ops = set(one_layer) | set(two_layers)
    return collections.Counter({op: two_layers[op] - one_layer[op] for op in ops
                                if two_layers[op] != one_layer[op]})


def step_feeds(config, mem_len, batch, seed=0):
    """Random inputs of `decode_step` (`export.decode_cache.step_inputs`
    order) at batch `batch`: every slot valid, the free slot mid-ring."""
    from export.decode_cache import cache_shapes, step_inputs
    rng = np.random.default_rng(seed)
    shapes = cache_shapes(config, mem_len)
    size = mem_len + 1

    def normal(shape):
        return rng.standard_normal([batch if d == "batch" else d for d in shape],
                                   dtype=np.float32)

    feeds = {"token_ids": rng.integers(0, config.n_token, batch, dtype=np.int32),
             "valid": np.ones([batch, size], bool), "slot": np.array(size // 2, np.int32),
             "positions": normal(shapes["positions"])}
    for kind in ("keys", "values"):
        for i in range(config.n_layer):
            feeds[f"{kind}_{i}"] = normal(shapes[kind][1:])
    assert list(feeds) == list(step_inputs(config.n_layer))
    return feeds
