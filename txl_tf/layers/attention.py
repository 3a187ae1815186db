"""Relative multi-head attention with segment memory (Dai et al., 2019, §3.3)."""
import keras
import tensorflow as tf

from txl_tf.layers.init import normal
from txl_tf.layers.rel_shift import rel_shift


@keras.saving.register_keras_serializable(package="txl_tf")
class RelativeMultiHeadAttention(keras.layers.Layer):
    """score(i, j) = (q_i + u)·k_j + (q_i + v)·W_r r_{i-j}, scaled by 1/sqrt(d_head).

    Keys and values come from `concat(memory, inputs)`; queries from the inputs.
    The fused `qkv` and the position projection `r` have no bias (as in the
    paper's code); `o` maps the heads back to `d_model`. Post-LayerNorm by
    default: `LN(inputs + attn)`; with `pre_lnorm`, `inputs + attn(LN(·))`.
    u and v (`r_w_bias`, `r_r_bias`, `[n_head, d_head]`) are passed in by the
    caller because they may be shared by all layers.
    """

    def __init__(self, d_model, n_head, d_head, dropout=0.0, dropatt=0.0,
                 pre_lnorm=False, init_std=0.02, layer_norm_epsilon=1e-12, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.n_head, self.d_head = int(d_model), int(n_head), int(d_head)
        self.dropout, self.dropatt = float(dropout), float(dropatt)
        self.pre_lnorm = bool(pre_lnorm)
        self.init_std = float(init_std)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.scale = 1.0 / self.d_head ** 0.5
        with keras.name_scope(self.name):  # unique variable paths per layer
            self.layer_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="LayerNorm")
            self.attn_dropout = keras.layers.Dropout(self.dropatt, dtype=self.dtype_policy)
            self.out_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.build()

    def build(self, input_shape=None):
        heads = self.n_head * self.d_head
        init = normal(self.init_std)
        self.qkv_kernel = self.add_weight(name="qkv_kernel", shape=(self.d_model, 3 * heads),
                                          initializer=init)
        self.r_kernel = self.add_weight(name="r_kernel", shape=(self.d_model, heads),
                                        initializer=init)
        self.o_kernel = self.add_weight(name="o_kernel", shape=(heads, self.d_model),
                                        initializer=init)
        self.layer_norm.build((None, None, self.d_model))
        self.built = True

    def _w(self, variable):
        return tf.cast(variable, self.compute_dtype)

    def call(self, inputs, pos_emb, memory, visible, r_w_bias, r_r_bias, training=None):
        """inputs `[B, T, d]`, pos_emb `[K, d]`, memory `[B, M, d]` (K = M + T),
        visible `[B, 1, T, K]` bool, biases `[n_head, d_head]` → `[B, T, d]`."""
        qlen = tf.shape(inputs)[1]
        cat = tf.concat([tf.cast(memory, inputs.dtype), inputs], axis=1)
        if self.pre_lnorm:
            cat = self.layer_norm(cat)
        # Queries only for the current segment (memory positions ask nothing);
        # keys and values for all of concat(memory, inputs). Same kernel,
        # split by columns: q | k | v.
        # tf.slice with explicit sizes: its gradient is a Pad, and tf2onnx
        # mis-converts a size -1 slice with a dynamic begin.
        heads = self.n_head * self.d_head
        qkv_kernel = self._w(self.qkv_kernel)
        q_kernel = tf.slice(qkv_kernel, [0, 0], [self.d_model, heads])
        kv_kernel = tf.slice(qkv_kernel, [0, heads], [self.d_model, 2 * heads])
        shape = tf.shape(cat)
        rows = tf.slice(cat, tf.stack([0, shape[1] - qlen, 0]),
                        tf.stack([shape[0], qlen, self.d_model]))
        q = tf.matmul(rows, q_kernel)
        k, v = tf.split(tf.matmul(cat, kv_kernel), 2, axis=-1)
        q = tf.reshape(q, [shape[0], qlen, self.n_head, self.d_head])
        k = tf.reshape(k, [shape[0], shape[1], self.n_head, self.d_head])
        v = tf.reshape(v, [shape[0], shape[1], self.n_head, self.d_head])
        r = tf.reshape(tf.matmul(pos_emb, self._w(self.r_kernel)),
                       [-1, self.n_head, self.d_head])

        content = tf.einsum("bihd,bjhd->bhij", q + self._w(r_w_bias), k)
        position = rel_shift(tf.einsum("bihd,jhd->bhij", q + self._w(r_r_bias), r))
        score = tf.cast(content + position, tf.float32) * self.scale
        score = tf.where(visible, score, tf.constant(-1e30, tf.float32))
        prob = tf.cast(tf.nn.softmax(score, axis=-1), self.compute_dtype)
        prob = self.attn_dropout(prob, training=training)

        vec = tf.einsum("bhij,bjhd->bihd", prob, v)
        vec = tf.reshape(vec, [shape[0], qlen, self.n_head * self.d_head])
        out = self.out_dropout(tf.matmul(vec, self._w(self.o_kernel)), training=training)
        if self.pre_lnorm:
            return inputs + out
        return self.layer_norm(inputs + out)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "n_head": self.n_head,
                "d_head": self.d_head, "dropout": self.dropout, "dropatt": self.dropatt,
                "pre_lnorm": self.pre_lnorm, "init_std": self.init_std,
                "layer_norm_epsilon": self.layer_norm_epsilon}
