"""Standard multi-head attention over `concat(memory, inputs)`: the paper's
PyTorch `MultiHeadAttn`, which its `attn_type=2` (absolute sinusoid added to
the input) and `3` build their layers from."""
import keras
import tensorflow as tf

from txl_tf.errors import TxlError
from txl_tf.layers.attention import RelativeMultiHeadAttention, _heads_first
from txl_tf.layers.layer_norm import fused_layer_norm


@keras.saving.register_keras_serializable(package="txl_tf")
class AbsoluteMultiHeadAttention(RelativeMultiHeadAttention):
    """score(i, j) = q_i·k_j / sqrt(d_head): positions reach the attention
    only through what was added to its inputs and memory. The same
    projections, LayerNorm and dropouts as the relative layer, without the
    position projection and the u, v biases.

    As in the paper's code, with `pre_lnorm` the keys and values are
    projected from the normalized `concat(memory, inputs)` but the queries
    from the inputs as they are (its `q_net(h)`; the relative layer
    normalizes both).
    """

    position_projection = False

    def _rows_keys_values(self, inputs, memory, fused=False):
        cat = tf.concat([tf.cast(memory, inputs.dtype), inputs], axis=1)
        if self.pre_lnorm:
            cat = fused_layer_norm(self.layer_norm, cat) if fused else self.layer_norm(cat)
        k, v = self._keys_values(cat)
        return inputs, k, v

    def _scores(self, rows, k, pos_emb, visible, r_w_bias, r_r_bias):
        """float32 scores `[B, H, T, K]`; `pos_emb` and the biases are unused."""
        shape = tf.shape(rows)
        q = self.query(tf.reshape(rows, [-1, self.d_model]))
        q = _heads_first(q, shape[0], shape[1], self.n_head, self.d_head)
        content = tf.matmul(q * self.scale, k, transpose_b=True)
        hidden = tf.where(visible, tf.constant(0.0), tf.constant(-1e30))
        return tf.cast(content, tf.float32) + hidden

    def call_with_cache(self, *args, **kwargs):
        raise TxlError("attn_type 2 adds each memory slot's absolute position anew at every "
                       "segment, so its keys cannot be cached: read with the core's call")
