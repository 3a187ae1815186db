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



def _embedding_mul_shape(embedding, onnx):
    """The static shape of the Mul by the embedding's scale in its trace on
    ids `[None]` (the table's where the scaled table is gathered, the rows'
    where the gathered rows are scaled)."""
    ids = tf.TensorSpec([None], tf.int32)
    with for_onnx_runtime() if onnx else contextlib.nullcontext():
        graph = tf.function(embedding, autograph=False).get_concrete_function(ids).graph
    muls = [op for op in graph.get_operations() if op.type == "Mul"]
    assert len(muls) == 1, [op.type for op in graph.get_operations()]
    return muls[0].outputs[0].shape.as_list()


def test_a_small_tables_scale_is_taken_on_the_table_for_onnx_only_with_the_same_numbers(
        monkeypatch):
    """Traced for ONNX, the embedding gathers its rows from the scaled table
    (ONNX Runtime folds it at load: no Mul in the step), the same products
    bit for bit; for TensorFlow, and for a table over the bound, it scales
    the rows it gathered."""
    import keras

    from txl_tf.layers import adaptive_embedding
    from txl_tf.layers.adaptive_embedding import AdaptiveEmbedding
    keras.utils.set_random_seed(4)
    embedding = AdaptiveEmbedding(50, 8, 8, init_std=0.7)
    ids = tf.constant([3, 49, 0, 3])
    plain = embedding(ids).numpy()
    with for_onnx_runtime():
        np.testing.assert_array_equal(embedding(ids).numpy(), plain)
    assert _embedding_mul_shape(embedding, onnx=True) == [50, 8]
    assert _embedding_mul_shape(embedding, onnx=False) == [None, 8]
    monkeypatch.setattr(adaptive_embedding, "SCALED_TABLE_MAX_BYTES", 50 * 8 * 4 - 1)
    assert _embedding_mul_shape(embedding, onnx=True) == [None, 8]


@pytest.mark.parametrize("kind", ["float16", "projected"])
def test_a_float16_or_projected_embedding_scales_its_rows_for_onnx_too(kind):
    """A float16 step's scale stays on the rows (ONNX Runtime's CPU provider
    runs its Mul unrounded, in float32), and so does a projected table's
    (the scale after the projection)."""
    import keras

    from txl_tf.layers.adaptive_embedding import AdaptiveEmbedding
    embedding = AdaptiveEmbedding(
        50, 8 if kind == "float16" else 4, 8,
        dtype=keras.DTypePolicy("mixed_float16") if kind == "float16" else None)
    assert _embedding_mul_shape(embedding, onnx=True) == [None, 8]


def _feed_forward():
    import keras

    from txl_tf.layers.feedforward import PositionwiseFeedForward
    keras.utils.set_random_seed(5)
    ff = PositionwiseFeedForward(32, 64, init_std=0.3)
    rng = np.random.default_rng(1)
    for w in ff.weights:  # non-zero biases and betas, gammas off 1
        w.assign(w.numpy() + 0.1 * rng.standard_normal(w.shape).astype(np.float32))
    return ff


def _layer_2_product_consumers(ff, onnx):
    """The op types reading the second feed-forward layer's product in the
    trace of a token's rows."""
    rows = tf.TensorSpec([None, 32], tf.float32)
    with for_onnx_runtime() if onnx else contextlib.nullcontext():
        graph = tf.function(ff.call_with_cache, autograph=False).get_concrete_function(
            rows).graph
    matmuls = [op for op in graph.get_operations() if op.type == "MatMul"]
    assert len(matmuls) == 2, [op.type for op in graph.get_operations()]
    return [op.type for op in matmuls[1].outputs[0].consumers()]


def test_a_tokens_feed_forward_bias_goes_into_its_norm_for_onnx_only():
    """Traced for ONNX, the second feed-forward layer's bias is added after
    the rows are made 3-D (ONNX Runtime takes it into SkipLayerNormalization:
    no Gemm); for TensorFlow the bias is added to the product, as before,
    where Grappler fuses it into the matmul (a graph's numbers as before, bit
    for bit, and no extra kernel)."""
    from txl_tf.layers.layer_norm import fused_add_layer_norm
    ff = _feed_forward()
    assert _layer_2_product_consumers(ff, onnx=True) == ["ExpandDims"]
    assert _layer_2_product_consumers(ff, onnx=False) == ["AddV2"]

    def before(x):
        core = tf.nn.relu(tf.matmul(x, ff.layer_1.kernel) + ff.layer_1.bias)
        return fused_add_layer_norm(ff.layer_norm, x,
                                    tf.matmul(core, ff.layer_2.kernel) + ff.layer_2.bias)
    x = tf.constant(np.random.default_rng(2).standard_normal([3, 32]), tf.float32)
    np.testing.assert_array_equal(tf.function(ff.call_with_cache)(x).numpy(),
                                  tf.function(before)(x).numpy())
    with for_onnx_runtime():
        np.testing.assert_allclose(ff.call_with_cache(x).numpy(), before(x).numpy(), atol=1e-6)
