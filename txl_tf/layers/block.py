"""One Transformer-XL layer: attention of the config's `attn_type`, then the
feed-forward."""
import keras

from txl_tf.layers.absolute_attention import AbsoluteMultiHeadAttention
from txl_tf.layers.attention import RelativeMultiHeadAttention
from txl_tf.layers.learnable_attention import LearnableRelativeAttention
from txl_tf.layers.feedforward import PositionwiseFeedForward


@keras.saving.register_keras_serializable(package="txl_tf")
class TransformerXLBlock(keras.layers.Layer):
    """`ff(attn(inputs, memory))` with the sizes of one decoder layer; the
    attention of the paper's `attn_type` 0 (`RelativeMultiHeadAttention`),
    1 (`LearnableRelativeAttention`) or 2 and 3 (`AbsoluteMultiHeadAttention`)."""

    def __init__(self, d_model, n_head, d_head, d_inner, *, dropout=0.0, dropatt=0.0,
                 pre_lnorm=False, init_std=0.02, layer_norm_epsilon=1e-12, attn_type=0,
                 **kwargs):
        super().__init__(**kwargs)
        self.sizes = dict(d_model=int(d_model), n_head=int(n_head), d_head=int(d_head),
                          d_inner=int(d_inner), dropout=float(dropout),
                          dropatt=float(dropatt), pre_lnorm=bool(pre_lnorm),
                          init_std=float(init_std),
                          layer_norm_epsilon=float(layer_norm_epsilon),
                          attn_type=int(attn_type))
        with keras.name_scope(self.name):  # unique variable paths per layer
            s = self.sizes
            attention = {0: RelativeMultiHeadAttention, 1: LearnableRelativeAttention,
                         2: AbsoluteMultiHeadAttention,
                         3: AbsoluteMultiHeadAttention}[s["attn_type"]]
            self.rel_attn = attention(
                s["d_model"], s["n_head"], s["d_head"], dropout=s["dropout"],
                dropatt=s["dropatt"], pre_lnorm=s["pre_lnorm"], init_std=s["init_std"],
                layer_norm_epsilon=s["layer_norm_epsilon"], dtype=self.dtype_policy,
                name="rel_attn")
            self.ff = PositionwiseFeedForward(
                s["d_model"], s["d_inner"], dropout=s["dropout"], pre_lnorm=s["pre_lnorm"],
                init_std=s["init_std"], layer_norm_epsilon=s["layer_norm_epsilon"],
                dtype=self.dtype_policy, name="ff")
        self.built = True

    def call(self, inputs, pos_emb, memory, visible, r_w_bias, r_r_bias, training=None):
        hidden = self.rel_attn(inputs, pos_emb, memory, visible, r_w_bias, r_r_bias,
                               training=training)
        return self.ff(hidden, training=training)

    def memory_keys_values(self, memory):
        """See `RelativeMultiHeadAttention.memory_keys_values`."""
        return self.rel_attn.memory_keys_values(memory)

    def call_with_cache(self, inputs, keys, values, positions, visible, r_w_bias, r_r_bias,
                        at_slot=None, write=None):
        """Inference over cached keys and values: `(outputs, keys, values)`;
        see `RelativeMultiHeadAttention.call_with_cache`."""
        hidden_states, keys, values = self.rel_attn.call_with_cache(
            inputs, keys, values, positions, visible, r_w_bias, r_r_bias, at_slot=at_slot,
            write=write)
        return self.ff.call_with_cache(hidden_states), keys, values

    def get_config(self):
        return {**super().get_config(), **self.sizes}
