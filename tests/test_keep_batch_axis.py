"""`export.onnx_export.keep_batch_axis`: a reshape to `[-1, s...]` becomes one
to `[0, s...]` only where the -1 is the input's first axis."""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from export.onnx_export import keep_batch_axis


def _model():
    """x `[batch, 2, 3]` reshaped to `[-1, 6]` (the batch axis) and to
    `[-1, 3]` (twice the batch axis), each with its own shape."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 3])
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
               for name in ("rows", "pairs")]
    shapes = [numpy_helper.from_array(np.array(shape, np.int64), name)
              for name, shape in (("rows_shape", [-1, 6]), ("pairs_shape", [-1, 3]))]
    nodes = [helper.make_node("Reshape", ["x", "rows_shape"], ["rows"]),
             helper.make_node("Reshape", ["x", "pairs_shape"], ["pairs"])]
    graph = helper.make_graph(nodes, "reshapes", [x], outputs, shapes)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model, x):
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def test_only_the_batch_axis_reshape_is_rewritten_and_the_outputs_stay():
    model = _model()
    x = np.arange(4 * 6, dtype=np.float32).reshape(4, 2, 3)
    before = _run(model, x)
    keep_batch_axis(model)
    shapes = {t.name: numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    assert [shapes[node.input[1]] for node in model.graph.node] == [[0, 6], [-1, 3]]
    assert "rows_shape" not in shapes  # the unused shape is gone
    for got, want in zip(_run(model, x), before):
        np.testing.assert_array_equal(got, want)
