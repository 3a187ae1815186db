"""Position-wise feed-forward sub-layer."""
import keras
import tensorflow as tf

from txl_tf.layers.dropout import Dropout
from txl_tf.layers.init import normal
from txl_tf.layers.layer_norm import fused_add_layer_norm, fused_layer_norm
from txl_tf.layers.onnx_forms import onnx_forms


@keras.saving.register_keras_serializable(package="txl_tf")
class PositionwiseFeedForward(keras.layers.Layer):
    """`LN(x + drop(W2 drop(relu(W1 x + b1)) + b2))`; with `pre_lnorm` the
    LayerNorm moves to the input of W1 and the residual is added last."""

    def __init__(self, d_model, d_inner, *, dropout=0.0, pre_lnorm=False, init_std=0.02,
                 layer_norm_epsilon=1e-12, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_inner = int(d_model), int(d_inner)
        self.dropout, self.pre_lnorm = float(dropout), bool(pre_lnorm)
        self.init_std, self.layer_norm_epsilon = float(init_std), float(layer_norm_epsilon)
        with keras.name_scope(self.name):  # unique variable paths per layer
            policy = self.dtype_policy
            self.layer_1 = keras.layers.Dense(self.d_inner, dtype=policy,
                                              kernel_initializer=normal(self.init_std),
                                              name="layer_1")
            self.layer_2 = keras.layers.Dense(self.d_model, dtype=policy,
                                              kernel_initializer=normal(self.init_std),
                                              name="layer_2")
            self.drop_1 = Dropout(self.dropout, dtype=policy)
            self.drop_2 = Dropout(self.dropout, dtype=policy)
            self.layer_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=policy, name="LayerNorm")
        self.build()

    def build(self, input_shape=None):
        self.layer_1.build((None, None, self.d_model))
        self.layer_2.build((None, None, self.d_inner))
        self.layer_norm.build((None, None, self.d_model))
        self.built = True

    def call(self, inputs, training=None):
        """`[B, T, d]` → `[B, T, d]`; in inference (`training` falsy) the
        layer norm is written as ONNX Runtime fuses it (`layers.layer_norm`)."""
        return self._forward(inputs, training, fused=not training)

    def call_with_cache(self, inputs):
        """`call` in inference, for the cached reads: the layer norm (with
        the residual add) written as ONNX Runtime fuses it (`layers.layer_norm`)."""
        return self._forward(inputs, False, fused=True)

    def _forward(self, inputs, training, fused):
        core = inputs
        if self.pre_lnorm:
            core = fused_layer_norm(self.layer_norm, inputs) if fused else self.layer_norm(inputs)
        core = self.drop_1(tf.nn.relu(self._affine(self.layer_1, core)), training=training)
        if fused and onnx_forms() and not self.pre_lnorm and inputs.shape.rank == 2 \
                and self.layer_2.quantization_mode is None and self.compute_dtype == "float32":
            # A token's rows traced for ONNX (the decode step): the bias added
            # in the norm (`fused_add_layer_norm`): no Gemm, whose bias ONNX
            # Runtime's CUDA provider broadcasts with a cuBLAS call of its
            # own. (float32: its CPU provider fuses no float16 norm, where the
            # bias would be an Add of its own.) TensorFlow's graphs keep the
            # bias on the product, which Grappler fuses into the matmul (its
            # numbers as before, and no add of its own).
            dtype = self.compute_dtype
            core = keras.ops.matmul(core, tf.cast(self.layer_2.kernel, dtype))
            return fused_add_layer_norm(self.layer_norm, inputs, core,
                                        tf.cast(self.layer_2.bias, dtype))
        core = self.drop_2(self._affine(self.layer_2, core), training=training)
        if self.pre_lnorm:
            return inputs + core
        if fused:
            return fused_add_layer_norm(self.layer_norm, inputs, core)
        return self.layer_norm(inputs + core)

    def _affine(self, dense, x):
        """`x W + b` with `dense`'s weights, the bias added by a plain add.
        Keras's `Dense` adds it with TensorFlow's `BiasAdd`, whose gradient
        on CPU sums a bfloat16 gradient in bfloat16: 3.8% error over the
        1,024 rows of a `small` training batch, where the add's gradient
        (a `Sum`) accumulates in float32 (`tests/test_gradients.py`). A
        quantized layer computes itself (Keras's int8 matmul)."""
        if dense.quantization_mode is not None:
            return dense(x)
        dtype = self.compute_dtype
        return keras.ops.matmul(x, tf.cast(dense.kernel, dtype)) + tf.cast(dense.bias, dtype)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_inner": self.d_inner,
                "dropout": self.dropout, "pre_lnorm": self.pre_lnorm,
                "init_std": self.init_std, "layer_norm_epsilon": self.layer_norm_epsilon}
