"""A decoded token's weight-only computations (the query, key and value
kernels joined, the position kernel transposed by head) are traced only for
ONNX (`txl_tf.layers.onnx_forms`), which folds them at load: TensorFlow's
graphs (a SavedModel's decode step) would redo them at every step, copying
the kernels (measured at 590cccf: benchmarks/README.md, issue 53's CPU
before and after). Both forms give the same numbers."""
import contextlib

import numpy as np
import pytest
import tensorflow as tf

from txl_tf.layers.attention import RelativeMultiHeadAttention
from txl_tf.layers.onnx_forms import for_onnx_runtime, onnx_forms


def _layer():
    tf.random.set_seed(3)
    return RelativeMultiHeadAttention(d_model=24, n_head=3, d_head=5, init_std=0.3)


def _ops(fn, *args):
    """The op types of `fn(*args)` traced as a graph."""
    graph = tf.function(fn, autograph=False).get_concrete_function(*args).graph
    return [op.type for op in graph.get_operations()]


def test_the_forms_are_the_onnx_exports_only_and_give_the_same_numbers():
    layer = _layer()
    rng = np.random.default_rng(0)
    rows = tf.constant(rng.standard_normal([2, 24]), tf.float32)
    u, v = (tf.constant(rng.standard_normal([3, 5]), tf.float32) for _ in range(2))
    queries = tf.constant(rng.standard_normal([2, 3, 1, 5]), tf.float32)
    assert not onnx_forms()
    plain = layer._token_projections(rows, u, v) + (layer._through_r(queries),)
    with for_onnx_runtime():
        assert onnx_forms()
        folded = layer._token_projections(rows, u, v) + (layer._through_r(queries),)
    assert not onnx_forms()
    for a, b in zip(plain, folded):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("onnx", [False, True])
def test_tensorflows_trace_reads_each_kernel_as_it_is(onnx):
    """Traced for TensorFlow, a token's projections and position queries
    join, scale or transpose no kernel (no ConcatV2, no Transpose); traced
    for ONNX they do (ONNX Runtime folds them into weights at load)."""
    layer = _layer()
    rows = tf.TensorSpec([None, 24], tf.float32)
    bias = tf.TensorSpec([3, 5], tf.float32)
    queries = tf.TensorSpec([None, 3, 1, 5], tf.float32)
    with for_onnx_runtime() if onnx else contextlib.nullcontext():
        ops = _ops(layer._token_projections, rows, bias, bias) + _ops(layer._through_r, queries)
    assert (ops.count("ConcatV2") >= 1 and ops.count("Transpose") == 1) if onnx else \
        ("ConcatV2" not in ops and "Transpose" not in ops), ops

