"""Whether the decode step is traced in the forms ONNX Runtime folds
(`onnx_forms`): computations on weights alone (the query, key and value
kernels joined side by side, the position kernel's per-head transpose, a
small embedding table scaled), which ONNX Runtime computes once, at load,
into weights of their own; and a token's second feed-forward bias added in
its layer norm (`layers.feedforward`), which ONNX Runtime takes into
`SkipLayerNormalization` (TensorFlow's graphs fuse it into the matmul).

TensorFlow's graphs (a SavedModel, eager, `tf.function`) would compute them
again at every step, copying the kernels: there a token takes forms that
read each kernel as it is (three projections; one matmul over a
block-diagonal query for the positions). The ONNX export traces its graphs
inside `for_onnx_runtime()`.
"""
import contextlib
import threading

_STATE = threading.local()


@contextlib.contextmanager
def for_onnx_runtime():
    """Within it (on this thread), decode steps are traced in the forms
    ONNX Runtime folds (`onnx_forms`)."""
    before = onnx_forms()
    _STATE.on = True
    try:
        yield
    finally:
        _STATE.on = before


def onnx_forms():
    """Whether decode steps are traced in ONNX Runtime's forms here (`for_onnx_runtime`)."""
    return getattr(_STATE, "on", False)
