"""Converts the serving module's `step` function to ONNX with tf2onnx."""
import numpy as np
import onnx

from export.metadata import INPUT_NAMES, OUTPUT_NAMES, export_metadata
from export.serving_module import ServingModule

DEFAULT_OPSET = 17
_PROTOBUF_LIMIT = 2 ** 31 - 1


def export_onnx(core, path, mem_len, log_probs="all", zero_filled=False,
                opset=DEFAULT_OPSET):
    """Writes `step` as an ONNX model: inputs `token_ids` int32 `[B, T]`, `mems`,
    `mem_mask`; outputs `log_probs`, `new_mems`, `new_mem_mask`; batch and
    segment axes dynamic; config and memory geometry in `metadata_props`.
    Returns the checked `onnx.ModelProto`.
    """
    import tf2onnx  # heavy import, only when converting

    n_bytes = sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in core.weights)
    if n_bytes > _PROTOBUF_LIMIT:
        raise ValueError(f"the model's weights ({n_bytes / 2**30:.1f} GiB) exceed the 2 GiB "
                         "ONNX protobuf limit; export the SavedModel only")
    module = ServingModule(core, mem_len, log_probs, zero_filled)
    model, _ = tf2onnx.convert.from_function(
        module.step, input_signature=module.step.input_signature, opset=opset)
    got_in = [i.name for i in model.graph.input]
    got_out = sorted(o.name for o in model.graph.output)
    if got_in != list(INPUT_NAMES) or got_out != sorted(OUTPUT_NAMES):
        raise RuntimeError(f"unexpected ONNX interface: inputs {got_in}, outputs {got_out}")
    _declare_shapes(model, core.config, mem_len, log_probs)
    onnx.helper.set_model_props(
        model, export_metadata(core.config, mem_len, log_probs, zero_filled))
    model.doc_string = ("Transformer-XL step: (token_ids, mems, mem_mask) -> "
                        "(log_probs, new_mems, new_mem_mask)")
    onnx.checker.check_model(model)
    onnx.save_model(model, path)
    return model


def _declare_shapes(model, config, mem_len, log_probs):
    """Writes the interface's shapes: named `batch` / `seq_len` axes, fixed geometry
    (tf2onnx leaves some output axes as anonymous `unk__N` dims)."""
    geometry = [config.n_layer, "batch", int(mem_len), config.d_model]
    shapes = {"token_ids": ["batch", "seq_len"], "mems": geometry,
              "mem_mask": ["batch", int(mem_len)], "new_mems": geometry,
              "new_mem_mask": ["batch", int(mem_len)],
              "log_probs": (["batch", "seq_len", config.n_token] if log_probs == "all"
                            else ["batch", config.n_token])}
    for value in list(model.graph.input) + list(model.graph.output):
        shape = value.type.tensor_type.shape
        del shape.dim[:]
        for size in shapes[value.name]:
            dim = shape.dim.add()
            if isinstance(size, str):
                dim.dim_param = size
            else:
                dim.dim_value = size
