"""`compile()` as the project's Keras models do it, and its restore from `.keras`."""
import keras
import tensorflow as tf

from txl_tf.keras_support.keras_compat import counting_loss_scale
from txl_tf.keras_support.precision import choose as choose_precision


class AutoJitCompile:
    """Mixin for a `keras.Model`: `compile(jit_compile="auto")` follows
    `txl_tf.keras_support.precision.choose()` (XLA on GPUs and TPUs, not on CPUs, where it
    was measured slower for these models in bfloat16; Keras's own "auto"
    would turn it on), and `keras.models.load_model` restores the compile
    arguments and the optimizer's state, so `fit` goes on where it stopped.
    Under "mixed_float16" the loss scaling Keras adds counts skipped steps
    (`txl_tf.keras_support.keras_compat.CountingLossScaleOptimizer`), so
    `optimizer.iterations` counts the batches trained on."""

    def compile(self, *args, jit_compile="auto", **kwargs):
        if jit_compile == "auto":
            jit_compile = choose_precision(tf.distribute.get_strategy()).jit_compile
        super().compile(*args, jit_compile=jit_compile, **kwargs)
        self.optimizer = counting_loss_scale(self.optimizer)

    def compile_from_config(self, config):
        """Called by `load_model` before the file's variables are read: the
        optimizer is built here so that Keras then loads its slots and step."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        self.optimizer.build(self.trainable_variables)
