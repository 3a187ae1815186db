"""`compile()` as the project's Keras models do it, and its restore from `.keras`."""
import keras

from txl_tf.errors import TxlError
from txl_tf.keras_support.keras_compat import build_optimizer, counting_loss_scale
from txl_tf.keras_support.precision import choose as choose_precision, xla_spans_devices


class RestoresCompile:
    """Mixin for a `keras.Model` whose `compile()` is its own (keras-hub's,
    `AutoJitCompile`'s): `keras.models.load_model` calls it with the saved
    arguments (Keras skips a custom `compile()` with a warning, leaving a
    keras-hub task on its default Adam(2e-5)) and builds the optimizer so
    that Keras then loads its slots and step; `load_weights` builds it too,
    so that a weights file's optimizer state is read, not skipped with a
    warning. A saved `jit_compile=True` (what Keras's "auto" chose where it
    was saved) is restored as False under a strategy over several devices,
    where XLA cannot run (`precision.xla_spans_devices`)."""

    def compile_from_config(self, config):
        """Called by `load_model` before the file's variables are read.

        Args:
            config: `get_compile_config()`'s dict.
        """
        config = keras.saving.deserialize_keras_object(config)
        if config.get("jit_compile") is True and xla_spans_devices(self.distribute_strategy):
            # Keras saves what its "auto" chose (XLA on any GPU); not possible here.
            config["jit_compile"] = False
        self.compile(**config)
        self._build_optimizer()

    def _build_optimizer(self):
        if getattr(self, "optimizer", None) is not None:
            build_optimizer(self)

    def load_weights(self, filepath, *args, **kwargs):
        """Keras's `load_weights`, with the optimizer built first (as
        `keras.callbacks.BackupAndRestore` does): a compiled model reads the
        optimizer's state (Adam's slots, its step) from a file that holds
        it, where Keras would skip it with a warning.

        Args:
            filepath: the weights file.
            *args, **kwargs: those of `keras.Model.load_weights`.
        """
        self._build_optimizer()
        return super().load_weights(filepath, *args, **kwargs)


class XlaOnOneDevice(RestoresCompile):
    """Mixin for a `keras.Model` whose `compile()` is its parent's (Keras's,
    keras-hub's): under a strategy over several devices
    (`precision.xla_spans_devices`) `jit_compile="auto"` means off and
    `jit_compile=True` raises `TxlError` (a saved True that `load_model`
    restores there is off); elsewhere the parent's "auto" is untouched."""

    def compile(self, *args, jit_compile="auto", **kwargs):
        spans = xla_spans_devices(self.distribute_strategy)  # made under it, or the current one
        if spans and jit_compile == "auto":
            jit_compile = False
        elif spans and jit_compile:
            raise TxlError(f"jit_compile=True under {type(self.distribute_strategy).__name__}: "
                           f"{spans}; use jit_compile='auto' (off there)")
        super().compile(*args, jit_compile=jit_compile, **kwargs)


class AutoJitCompile(XlaOnOneDevice):
    """Mixin for a `keras.Model`: `compile(jit_compile="auto")` follows
    `txl_tf.keras_support.precision.choose()` (XLA on GPUs and TPUs, not on CPUs, where it
    was measured slower for these models in bfloat16; Keras's own "auto"
    would turn it on; nor under a strategy over several devices, where
    `jit_compile=True` raises `TxlError`: `precision.xla_spans_devices`),
    and `keras.models.load_model` restores the compile
    arguments and the optimizer's state, so `fit` goes on where it stopped.
    Under "mixed_float16" the loss scaling Keras adds counts skipped steps
    (`txl_tf.keras_support.keras_compat.CountingLossScaleOptimizer`), so
    `optimizer.iterations` counts the batches trained on."""

    def compile(self, *args, jit_compile="auto", **kwargs):
        if jit_compile == "auto":
            jit_compile = choose_precision(self.distribute_strategy).jit_compile
        super().compile(*args, jit_compile=jit_compile, **kwargs)
        self.optimizer = counting_loss_scale(self.optimizer)
