"""`TransformerXLLM`: `TransformerXLCausalLM` built from a config, over stream
batches of a fixed size (the training job's model, and the stateful model of
code written before the causal LM)."""
import numbers
import os

import keras
import tensorflow as tf

from txl_tf.checks.numpy_checks import check_flag
from txl_tf.core import as_config
from txl_tf.errors import TxlError
from txl_tf.keras_support.compile_mixin import AutoJitCompile
from txl_tf.keras_support.precision import choose as choose_precision
from txl_tf.models.transformer_xl.transformer_xl_backbone import TransformerXLBackbone
from txl_tf.models.transformer_xl.transformer_xl_causal_lm import TransformerXLCausalLM

# `get_config` marks the files written by this class; a `.keras` file without
# it holds the subclassed model of before, whose variables sit elsewhere.
_FORMAT = 2


@keras.saving.register_keras_serializable(package="txl_tf")
class TransformerXLLM(AutoJitCompile, TransformerXLCausalLM):
    """A `TransformerXLCausalLM` whose every batch continues the streams of
    the previous one, with the memory of `batch_size` rows per replica.

    `fit` / `evaluate` / `predict` take `(token_ids, labels)` or
    `(token_ids, labels, weights)` batches, `token_ids` a tensor `[B, T]`
    or a dict with `document_start` (see
    `TransformerXLCausalLM.document_dataset`); `model(token_ids)` and
    `predict` read on the training memory (carried, like a stateful RNN's
    state; `reset_memory()` forgets it), `evaluate` on a memory of its own
    that starts empty at every call. Under `tf.distribute` each replica
    keeps the memory of its own rows.

    Args:
        config: a `TransformerXLConfig` (or its dict).
        batch_size: rows per replica (batch with `drop_remainder=True`).
        mem_len: memory slots per row (default the config's).
        zero_filled: an empty memory is attended zeros (default the
            config's `zero_filled_memory`).
        **kwargs: `dtype` (a dtype policy, or "auto":
            `txl_tf.keras_support.precision.choose()`), `name`, ...
    """

    # Not a preset class: keras-hub's `CausalLM.from_preset` picks its task
    # class among those of the backbone's class.
    backbone_cls = None
    _memory_saved = True  # `mems`, `mem_mask`: saved and loaded with the weights

    def __init__(self, config, batch_size, mem_len=None, zero_filled=None, **kwargs):
        dtype = kwargs.pop("dtype", None)
        if dtype == "auto":  # the fastest policy on this hardware
            dtype = choose_precision(tf.distribute.get_strategy()).policy
        kwargs.pop("format", None)
        backbone = TransformerXLBackbone(**as_config(config).to_dict(), dtype=dtype)
        super().__init__(backbone, mem_len=mem_len, dtype=dtype, **kwargs)
        if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or \
                batch_size < 1:
            raise TxlError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = int(batch_size)
        self.zero_filled = (self.config.zero_filled_memory if zero_filled is None
                            else check_flag("zero_filled", zero_filled))  # "no" is truthy
        self._size_streams(self.batch_size, self.zero_filled)
        self._set_streaming(True)
        training = self._streams.value[0]
        self.mems, self.mem_mask = training.mems, training.mem_mask  # tracked: saved

    @property
    def config(self):
        return self.core.config

    @property
    def memory(self):
        """The current training `Memory` (this replica's, inside a replica context)."""
        return self._streams.value[0].read()

    @property
    def input_spec(self):
        """None: ids arrive as a tensor or as a dict (`call`)."""
        return None

    @input_spec.setter
    def input_spec(self, value):
        pass

    def _call_memory(self, training):
        return self._streams.value[0]

    def is_stream(self, x):
        """Every batch continues the streams here (the parent's test for a
        `document_start` does not apply).

        Args:
            x: a dataset or arrays (not looked at).

        Returns:
            True.
        """
        return True

    def call(self, inputs, training=None, mask=None):
        """Reads `inputs` on the training memory, which it updates.

        Args:
            inputs: int ids `[B, T]`, or a dict of `token_ids`,
                `document_start` (see `TransformerXLCausalLM.document_dataset`).
            training: Keras's flag (dropout on when True).
            mask: unused (Keras's).

        Returns:
            Log-probs `[B, T, n_token]`.
        """
        return self._read_streams(inputs, self._streams.value[0], training=training)

    def compute_output_spec(self, inputs, training=None, mask=None):
        """The spec of `call`'s log-probs (a symbolic call, `keras.Input`):
        float32 `[B, T, n_token]` of ids `[B, T]` (or a dict's
        `token_ids`), not the parent's functional graph, whose inputs are a
        dict."""
        token_ids = inputs["token_ids"] if isinstance(inputs, dict) else inputs
        return keras.KerasTensor(tuple(token_ids.shape) + (self.config.n_token,), "float32")

    def _stream_batch_size(self, x, batch_size, method):
        from txl_tf.models.transformer_xl.stream_memory import checked_batch_size
        replicas = self.distribute_strategy.num_replicas_in_sync
        expected = self.batch_size * replicas
        fix = (f"this model holds memory for batches of {expected} streams (batch_size="
               f"{self.batch_size} per replica x {replicas}); batch the data in "
               f"{expected}s with drop_remainder=True, or build the model with the batch "
               "size of the data (a new memory)")
        return checked_batch_size(x, batch_size, expected, method, fix)

    def get_config(self):
        return {"name": self.name, "trainable": self.trainable,
                # The backbone's: after `quantize`, its map of the int8 layers.
                "dtype": self.backbone.get_config()["dtype"],
                "config": self.config.to_dict(), "batch_size": self.batch_size,
                "mem_len": self.mem_len, "segment_len": self.segment_len,
                "zero_filled": self.zero_filled, "format": _FORMAT}

    def load_weights(self, filepath, *args, **kwargs):
        """Keras's `load_weights`, which refuses by name the `.weights.h5`
        file of the `TransformerXLLM` before it became a
        `TransformerXLCausalLM` (before 0.3.0; Keras would list every layer it
        could not load).

        Args:
            filepath: the weights file.
            *args, **kwargs: those of `keras.Model.load_weights`.

        Raises:
            TxlError: such a file (names how to read its weights).
        """
        from txl_tf.weights.legacy_keras import is_legacy_weights
        if os.fspath(filepath).endswith(".weights.h5") and is_legacy_weights(filepath):
            raise TxlError(
                f"{filepath} holds the weights of a TransformerXLLM written before it became "
                "a TransformerXLCausalLM (before 0.3.0): read them with "
                "txl_tf.weights.legacy_keras.load_legacy_core(path, config, batch_size), then "
                "set_weights on this model's core")
        return super().load_weights(filepath, *args, **kwargs)

    @classmethod
    def from_config(cls, config):
        """The model `get_config` describes (Keras loading).

        Args:
            config: `get_config`'s dict.

        Returns:
            A `TransformerXLLM`.

        Raises:
            TxlError: a config of the TransformerXLLM before it became a
                `TransformerXLCausalLM` (names how to read its weights).
        """
        if config.get("format") != _FORMAT:
            raise TxlError(
                "this .keras file holds a TransformerXLLM written before it became a "
                "TransformerXLCausalLM: read its weights with "
                "txl_tf.weights.legacy_keras.load_legacy_core(path), then "
                "TransformerXLLM(core.config, batch_size) and set_weights, or "
                "TransformerXLCausalLM(TransformerXLBackbone.from_core(core))")
        config = dict(config)
        config["dtype"] = keras.saving.deserialize_keras_object(config.get("dtype"))
        return cls(**config)
