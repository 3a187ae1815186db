"""Reads the `.keras` files of the subclassed `TransformerXLLM` that came
before it became a `TransformerXLCausalLM`: their variables sit under
`core/...`, where the causal LM has its backbone."""
import os

import keras

from txl_tf.app.files import parse_json
from txl_tf.core import TransformerXL, as_config
from txl_tf.errors import TxlError


class _LegacyLM(keras.Model):
    """The variable layout of the old `TransformerXLLM` (core, then the
    memory's two variables), to read its weights into."""

    def __init__(self, config, batch_size, mem_len=None, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if k in ("name", "dtype", "trainable")}
        super().__init__(**kwargs)
        self.core = TransformerXL(as_config(config), dtype=self.dtype_policy, name="transformer")
        cfg = self.core.config
        mem_len = cfg.mem_len if mem_len is None else int(mem_len)
        self.mems = keras.Variable(initializer="zeros", name="mems", trainable=False,
                                   shape=(cfg.n_layer, int(batch_size), mem_len, cfg.d_model))
        self.mem_mask = keras.Variable(initializer="zeros", name="mem_mask", trainable=False,
                                       shape=(int(batch_size), mem_len))
        self.built = True


def load_legacy_core(path, config=None, batch_size=None, mem_len=None):
    """The `TransformerXL` of an old `TransformerXLLM` file.

    Args:
        path: its `.keras` file, or a `.weights.h5` file its `save_weights`
            wrote.
        config: for a `.weights.h5` file (which holds no config), the model's
            `TransformerXLConfig` (or its dict).
        batch_size: for a `.weights.h5` file, the model's batch size.
        mem_len: for a `.weights.h5` file, its memory length if not the
            config's.

    Returns:
        The `TransformerXL` with the file's weights.

    Raises:
        TxlError: a `.weights.h5` file without `config` and `batch_size`, or
            one that is not of the old `TransformerXLLM`.
    """
    if os.fspath(path).endswith(".weights.h5"):
        if config is None or batch_size is None:
            raise TxlError(f"{path}: a .weights.h5 file holds no config: pass the model's "
                           "config and batch_size")
        if not is_legacy_weights(path):
            raise TxlError(f"{path} is not a weights file of the TransformerXLLM before 0.3.0 "
                           "(its variables are not under core/): read it with the model's own "
                           "load_weights")
        model = _LegacyLM(config, batch_size, mem_len)
        model.load_weights(path)
        return model.core
    with keras.saving.custom_object_scope({"txl_tf>TransformerXLLM": _LegacyLM}):
        return keras.saving.load_model(path, compile=False).core


def is_legacy_weights(path):
    """Whether the `.weights.h5` file at `path` was saved by an old
    `TransformerXLLM` (its variables under `core/`, not `layers/`)."""
    import h5py
    try:
        with h5py.File(path, "r") as f:
            return "core" in f and "layers" not in f
    except OSError:
        return False  # not an HDF5 file: Keras says so


def is_legacy(path):
    """Whether the `.keras` file at `path` holds an old `TransformerXLLM`."""
    import zipfile
    with zipfile.ZipFile(path) as archive:
        saved = parse_json(archive.read("config.json"))
    return saved.get("class_name") == "TransformerXLLM" and \
        saved.get("config", {}).get("format") is None
