"""A Keras `LayerNormalization` written as ONNX Runtime fuses it.

Keras computes a layer norm as `x * inv + (beta - mean * inv)` with `inv =
rsqrt(var + eps) * gamma`; converted to ONNX that is a dozen nodes which ONNX
Runtime leaves apart (a dozen kernels each on a GPU). Written as
`(x - mean) / sqrt(mean((x - mean) ** 2) + eps) * gamma + beta`, the same
math, ONNX Runtime's `LayerNormFusion` makes it one `LayerNormalization`
node. The cached reads (`call_with_cache`, inference only) use it. (Its
`SkipLayerNormFusion` would take the residual add in too, but only where
both of the add's inputs are 3-D with one named batch axis, which the
converted graphs do not declare.)
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
    normed = centered / tf.sqrt(variance + tf.constant(layer.epsilon, dtype))
    out = normed * tf.cast(layer.gamma, dtype) + tf.cast(layer.beta, dtype)
    return tf.cast(out, layer.compute_dtype)
