"""Reads the `.keras` files of the subclassed `TransformerXLLM` that came
before it became a `TransformerXLCausalLM`: their variables sit under
`core/...`, where the causal LM has its backbone."""
import keras

from txl_tf.core import TransformerXL, as_config


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


def load_legacy_core(path):
    """The `TransformerXL` of an old `TransformerXLLM` `.keras` file."""
    with keras.saving.custom_object_scope({"txl_tf>TransformerXLLM": _LegacyLM}):
        return keras.saving.load_model(path, compile=False).core


def is_legacy(path):
    """Whether the `.keras` file at `path` holds an old `TransformerXLLM`."""
    import json
    import zipfile
    with zipfile.ZipFile(path) as archive:
        saved = json.loads(archive.read("config.json"))
    return saved.get("class_name") == "TransformerXLLM" and \
        saved.get("config", {}).get("format") is None
