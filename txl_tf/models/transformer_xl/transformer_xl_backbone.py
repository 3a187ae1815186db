"""`TransformerXLBackbone`: the pure core as a `keras_hub.models.Backbone`."""
import dataclasses

import keras
import keras_hub
import tensorflow as tf

from txl_tf.checks.inputs import NumpyInputsChecked, dense
from txl_tf.config import ConfigError, TransformerXLConfig
from txl_tf.core import TransformerXL
from txl_tf.keras_support.keras_compat import resolve_policy_maps
from txl_tf.layers.padding import padding_first

CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(TransformerXLConfig))


class SequenceReader(keras.layers.Layer):
    """Reads right-padded rows (`token_ids`, `padding_mask` `[B, T]`) from an
    empty memory with the core it holds: the final hidden states `[B, T,
    d_model]`. Padded positions are never attended (their outputs are
    finite and meaningless). With `same_length` the memory has the config's
    `mem_len` empty slots, which set how far back a query looks (as a fresh
    `initial_memory` does); without it, no slots. `attn_type` 2 and 3 count
    absolute positions from the last key, so their rows are read with the
    padding first (`layers.padding.padding_first`): each row as it reads alone."""

    def __init__(self, core, **kwargs):
        super().__init__(dtype=core.dtype_policy, **kwargs)
        self.core = core
        self.built = True

    def call(self, token_ids, padding_mask, training=None):
        cfg = self.core.config
        token_ids = dense(token_ids)  # a ragged one: an error that says so
        # No slots would leave a same_length query only itself to see.
        memory = self.core.initial_memory(tf.shape(token_ids)[0],
                                          mem_len=cfg.mem_len if cfg.same_length else 0,
                                          zero_filled=False)
        token_mask = tf.cast(padding_mask, tf.bool)
        if cfg.attn_type in (2, 3):
            order, inverse = padding_first(token_mask)
            token_ids = tf.gather(token_ids, order, batch_dims=1)
            token_mask = tf.gather(token_mask, order, batch_dims=1)
        hidden, _ = self.core.hidden_states(token_ids, memory, training=training,
                                            token_mask=token_mask)
        if cfg.attn_type in (2, 3):
            hidden = tf.gather(hidden, inverse, batch_dims=1)
        return hidden

    def compute_output_shape(self, token_ids_shape, padding_mask_shape=None):
        return tuple(token_ids_shape) + (self.core.config.d_model,)


@keras.saving.register_keras_serializable(package="txl_tf")
class TransformerXLBackbone(NumpyInputsChecked, keras_hub.models.Backbone):
    """Transformer-XL (Dai et al., 2019) as a keras-hub backbone.

    The constructor takes the paper's hyper-parameters, the fields of
    `txl_tf.TransformerXLConfig` (`n_token`, `n_layer`, `d_model`, `n_head`,
    `d_head`, `d_inner`, `cutoffs`, `div_val`, `mem_len`, `clamp_len`,
    `same_length`, ...). Called on `{"token_ids", "padding_mask"}` (`[B,
    T]`, right-padded), it returns the final hidden states `[B, T, d_model]`
    of the rows read from an empty memory. The core itself, with its
    memory and decode cache, is `backbone.transformer`; its variable paths
    (`transformer/layer_0/...`) are the ones the weight importers use.

    ```python
    backbone = TransformerXLBackbone(n_token=256, n_layer=4, d_model=128,
                                     n_head=4, d_head=32, d_inner=512)
    hidden = backbone({"token_ids": ids, "padding_mask": ids >= 0})
    ```

    Args:
        n_token: the vocabulary size.
        dtype: a Keras dtype policy (None: the global one).
        **kwargs: the other fields of `TransformerXLConfig`, and `name`,
            `trainable`.

    Raises:
        ConfigError: an argument that is no config field, or a bad value.
    """

    int32_ids = True  # a functional model: Keras casts the ids to its int32 input

    def __init__(self, n_token, dtype=None, **kwargs):
        fields = {name: kwargs.pop(name) for name in CONFIG_FIELDS if name in kwargs}
        unknown = sorted(set(kwargs) - {"name", "trainable"})
        if unknown:  # Keras's functional model would drop them silently
            raise ConfigError(f"TransformerXLBackbone got unknown arguments {unknown}: not "
                              f"fields of TransformerXLConfig ({', '.join(CONFIG_FIELDS)})")
        config = TransformerXLConfig(n_token=n_token, **fields)
        core = TransformerXL(config, dtype=dtype, name="transformer")
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        hidden = SequenceReader(core, name="sequence_reader")(token_ids, padding_mask)
        super().__init__(inputs={"token_ids": token_ids, "padding_mask": padding_mask},
                         outputs=hidden, dtype=dtype, **kwargs)
        self.transformer = core
        self.token_embedding = core.word_emb
        resolve_policy_maps(self)  # a loaded quantized model saves again

    @property
    def config(self):
        """The core's `TransformerXLConfig`."""
        return self.transformer.config

    @classmethod
    def from_core(cls, core, **kwargs):
        """A backbone holding a copy of `core`'s weights (same config).

        Args:
            core: a `TransformerXL`.
            **kwargs: constructor arguments (`dtype`, `name`, ...).

        Returns:
            A `TransformerXLBackbone`.
        """
        from txl_tf.weights import checkpoints
        backbone = cls(**core.config.to_dict(), **kwargs)
        checkpoints.set_weights(backbone.transformer, checkpoints.get_weights(core))
        return backbone

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """A backbone from a keras-hub preset folder, a model directory of
        this library, or one of the paper's named configurations (see
        `txl_tf.models.transformer_xl.presets`).

        Args:
            preset: a keras-hub preset folder, a model directory, or a name
                in `txl_tf.PRESETS` (with `load_weights=False`).
            load_weights: False builds the architecture with random weights.
            **kwargs: constructor overrides (e.g. `dtype`).

        Returns:
            A `TransformerXLBackbone`.
        """
        from txl_tf.models.transformer_xl import presets
        found = presets.local_source(preset, load_weights)
        if found is None:
            with presets.keras_hub_errors(preset):
                return super().from_preset(preset, load_weights=load_weights, **kwargs)
        return presets.backbone_from(cls, found, **kwargs)

    def save_to_preset(self, preset_dir, **kwargs):
        """Saves a keras-hub preset folder (keras-hub's `save_to_preset`)
        through a temporary folder, `config.json` last (`presets.save_staged`).
        The save holds one extra copy of the weights file in memory
        (`wt103_large`: about 1.05 GiB); a sharded save (`max_shard_size`)
        writes its shards straight to disk.

        Args:
            preset_dir: the folder.
            **kwargs: keras-hub's (`max_shard_size`).
        """
        from txl_tf.models.transformer_xl import presets
        presets.save_staged(lambda folder: super(TransformerXLBackbone, self).save_to_preset(
            folder, **kwargs), preset_dir)

    def get_config(self):
        """keras-hub's config (name, trainable, dtype) and the config's fields.
        After `quantize` the dtype is a policy map of the quantized layers
        over the backbone's policy: keras-hub's has no default policy, so
        loading took the global one (float32 for a mixed_bfloat16 model),
        and writing it renamed the live layers' policies "None"."""
        policy = self.dtype_policy
        quantized = {layer.path: layer.dtype_policy for layer in self._flatten_layers()
                     if layer.quantization_mode is not None}
        if quantized and not isinstance(policy, keras.dtype_policies.DTypePolicyMap):
            policy = keras.dtype_policies.DTypePolicyMap(default_policy=policy)
            for path, layer_policy in quantized.items():
                policy[path] = layer_policy
        return {"name": self.name, "trainable": self.trainable,
                "dtype": keras.dtype_policies.serialize(policy), **self.config.to_dict()}
