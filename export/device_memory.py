"""Memory that stays where the runtime computes: the small ONNX graphs with
which `export.onnx_runtime.OnnxRuntime` takes rows of memories, joins them
and scores targets on its device, so that a memory (OrtValues in a
`RuntimeMemory`) handed from call to call never crosses to the host, and a
score brings only the negative log-likelihoods there, not the log-probs.
Built with `onnx.helper` at run time (as `export.decode_cache`'s graphs).
"""
from export.decode_cache import small_model as _model


def _memory_values(prefix="", suffix=""):
    from onnx import TensorProto, helper
    return [helper.make_tensor_value_info(f"{prefix}mems{suffix}", TensorProto.FLOAT,
                                          [None] * 4),
            helper.make_tensor_value_info(f"{prefix}mem_mask{suffix}", TensorProto.BOOL,
                                          [None] * 2)]


def memory_take_model():
    """Inputs `mems` `[L, B, M, d]`, `mem_mask` `[B, M]`, `rows` int64
    `[k]`; outputs `taken_mems`, `taken_mem_mask`: those rows, in order."""
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Gather", ["mems", "rows"], ["taken_mems"], axis=1),
             helper.make_node("Gather", ["mem_mask", "rows"], ["taken_mem_mask"], axis=0)]
    return _model(nodes, "txl_memory_take",
                  _memory_values() + [helper.make_tensor_value_info("rows", TensorProto.INT64,
                                                                    [None])],
                  _memory_values("taken_"))


def memory_concat_model(count):
    """Inputs `mems_i`, `mem_mask_i` for i < `count`; outputs `mems`,
    `mem_mask`: their rows, one memory after the other."""
    from onnx import helper
    nodes = [helper.make_node("Concat", [f"mems_{i}" for i in range(count)], ["mems"], axis=1),
             helper.make_node("Concat", [f"mem_mask_{i}" for i in range(count)], ["mem_mask"],
                              axis=0)]
    inputs = [value for i in range(count) for value in _memory_values(suffix=f"_{i}")]
    return _model(nodes, "txl_memory_concat", inputs, _memory_values())


def nll_model():
    """Inputs `log_probs` `[B, T, V]`, `targets` int32 `[B, T]`; output
    `nll` `[B, T]`, each target's negative log-probability."""
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Constant", [], ["last"], value=helper.make_tensor(
                 "last", TensorProto.INT64, [1], [-1])),
             helper.make_node("Cast", ["targets"], ["targets_64"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["targets_64", "last"], ["index"]),
             helper.make_node("GatherElements", ["log_probs", "index"], ["picked"], axis=2),
             helper.make_node("Squeeze", ["picked", "last"], ["log_prob"]),
             helper.make_node("Neg", ["log_prob"], ["nll"])]
    return _model(nodes, "txl_nll",
                  [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, [None] * 3),
                   helper.make_tensor_value_info("targets", TensorProto.INT32, [None] * 2)],
                  [helper.make_tensor_value_info("nll", TensorProto.FLOAT, [None] * 2)])
