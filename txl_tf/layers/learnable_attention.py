"""Attention with learnable relative position embeddings (Shaw et al.): the
paper's PyTorch `RelLearnableMultiHeadAttn`, its `attn_type=1`."""
import keras
import tensorflow as tf

from txl_tf.layers.attention import RelativeMultiHeadAttention, _heads_first, _by_head
from txl_tf.layers.rel_shift import rel_shift_padded, with_pad_row


@keras.saving.register_keras_serializable(package="txl_tf")
class LearnableRelativeAttention(RelativeMultiHeadAttention):
    """score(i, j) = ((q_i + u)·k_j + q_i·e_{i-j} + b_{i-j}) / sqrt(d_head),
    with e (`[K, n_head, d_head]`) and b (`[K, n_head]`) one learned
    embedding and bias per distance, in the order of the keys (the farthest
    first), passed in by the caller (they are per layer; see
    `TransformerXL.learnable_positions`) in place of `pos_emb` and
    `r_r_bias`; u is `r_w_bias`. The same projections, LayerNorm and
    dropouts as the relative layer, without its position projection.
    """

    position_projection = False

    def _scores(self, rows, k, pos_emb, visible, r_w_bias, r_r_bias):
        """float32 scores `[B, H, T, K]`; `pos_emb` the embeddings `[K, H,
        d_head]`, `r_r_bias` the biases `[K, H]` by key."""
        shape = tf.shape(rows)
        q = self.query(tf.reshape(rows, [-1, self.d_model]))
        q = _heads_first(q, shape[0], shape[1], self.n_head, self.d_head) * self.scale
        u = tf.reshape(self._w(r_w_bias), [self.n_head, 1, self.d_head]) * self.scale
        content = tf.matmul(q + u, k, transpose_b=True)  # [B, H, T, K]
        embeddings = tf.transpose(self._w(pos_emb), [1, 0, 2])  # [H, K, d_head]
        biases = tf.transpose(self._w(r_r_bias))[:, None, :] * self.scale  # [H, 1, K]
        # Zeros first on the distance axis: the scores come with the shift's pad.
        position = rel_shift_padded(_by_head(q, with_pad_row(embeddings, 1))
                                    + with_pad_row(biases, 2))
        hidden = tf.where(visible, tf.constant(0.0), tf.constant(-1e30))
        return tf.cast(content + position, tf.float32) + hidden
