"""A Keras `LayerNormalization` written as ONNX Runtime fuses it.

Keras computes a layer norm as `x * inv + (beta - mean * inv)` with `inv =
rsqrt(var + eps) * gamma`; converted to ONNX that is a dozen nodes which ONNX
Runtime leaves apart (a dozen kernels each on a GPU). Written as
`(x - mean) / sqrt(mean((x - mean) ** 2) + eps) * gamma + beta`, the same
math, ONNX Runtime's `LayerNormFusion` makes it one `LayerNormalization`
node. Every inference path uses it (the layers' `call` with `training`
falsy, and the cached reads, `call_with_cache`; training keeps Keras's), and
`fused_add_layer_norm` for a residual add and its norm, which ONNX Runtime's
`SkipLayerNormFusion` makes one `SkipLayerNormalization` where both of the
add's inputs are 3-D with equal static inner axes and one named batch axis
(`export.onnx_export.keep_batch_axis` keeps the name through the step's
reshapes).
"""
import tensorflow as tf


def fused_layer_norm(layer, x):
    """`layer(x)` (a built `keras.layers.LayerNormalization` over the last
    axis, with its scale and offset), in the pattern ONNX Runtime fuses.

    Args:
        layer: the `LayerNormalization` whose `gamma`, `beta` and `epsilon`
            are used.
        x: the inputs `[..., d]`.

    Returns:
        The normalized `x`, in `layer`'s compute dtype (computed in float32
        at least, as Keras does).
    """
    dtype = tf.float32 if x.dtype in (tf.float16, tf.bfloat16) else x.dtype
    x = tf.cast(x, dtype)
    centered = x - tf.reduce_mean(x, -1, keepdims=True)
    variance = tf.reduce_mean(tf.pow(centered, tf.constant(2.0, dtype)), -1, keepdims=True)
    normed = tf.cast(centered / tf.sqrt(variance + tf.constant(layer.epsilon, dtype)),
                     layer.compute_dtype)
    return (normed * tf.cast(layer.gamma, layer.compute_dtype)
            + tf.cast(layer.beta, layer.compute_dtype))


def fused_add_layer_norm(layer, x, residual, bias=None):
    """`layer(x + residual)`, or `layer(x + (residual + bias))`, as
    `fused_layer_norm`, rows `[B, d]` added as `[B, 1, d]`: ONNX Runtime
    fuses only 3-D adds into its norm. A `bias` is added to the 3-D residual:
    ONNX Runtime takes it into the norm too, where a bias added to a matmul's
    rows would make them a `Gemm`, whose bias its CUDA provider broadcasts
    with a cuBLAS call of its own (a kernel per step).

    Args:
        layer: the `LayerNormalization` whose `gamma`, `beta` and `epsilon`
            are used.
        x, residual: the inputs `[..., d]`, of one shape.
        bias: None, or `[d]`, added to `residual`.

    Returns:
        The normalized sum, of `x`'s shape.
    """
    if x.shape.rank != 2:
        return fused_layer_norm(layer, x + (residual if bias is None else residual + bias))
    residual = tf.expand_dims(residual, 1)
    if bias is not None:
        residual += bias
    rows = tf.expand_dims(x, 1) + residual
    return tf.squeeze(fused_layer_norm(layer, rows), 1)
