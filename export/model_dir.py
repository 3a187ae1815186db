"""Reading the model directory that training writes (see `txl_tf.checkpoints`).

```
model_dir/
  config.json    TransformerXLConfig JSON
  weights.npz    weights keyed by the paper's TF variable names (no pickle)
  vocab/         optional: plain-text vocabulary files, shipped as assets
```
`--weights` may also name a `.keras` file of a `TransformerXLLM`.
"""
import os
import shutil
from typing import NamedTuple, Optional

from txl_tf import TransformerXL, TransformerXLConfig, checkpoints

CONFIG_FILE = checkpoints.CONFIG_FILE
WEIGHTS_FILE = checkpoints.WEIGHTS_FILE
VOCAB_DIR = checkpoints.VOCAB_DIR


class ModelDirError(ValueError):
    """A model directory, config or weights file is missing or unreadable."""


class LoadedModel(NamedTuple):
    """A core with its config and where its files came from."""

    core: TransformerXL
    config: TransformerXLConfig
    config_path: str
    vocab_dir: Optional[str]


def save_core_weights(core, path):
    """Writes the core's weights (`.npz` keyed by TF names)."""
    checkpoints.save_weights(core, path)


def load_core_weights(core, path):
    """Loads a `weights.npz`, or the core of a `.keras` `TransformerXLLM`."""
    if path.endswith(".keras"):
        import keras
        model = keras.saving.load_model(path, compile=False)
        source = getattr(model, "core", None)
        if source is None:
            raise ModelDirError(f"{path} holds no model with a `.core` Transformer-XL")
        checkpoints.set_weights(core, checkpoints.get_weights(source))
        return
    checkpoints.load_weights(core, path)


def save_model_dir(core, model_dir, vocab_dir=None):
    """Writes `config.json` and `weights.npz` (and copies `vocab_dir`)."""
    checkpoints.save_pretrained(core, model_dir)
    if vocab_dir:
        shutil.copytree(vocab_dir, os.path.join(model_dir, VOCAB_DIR), dirs_exist_ok=True)
    return model_dir


def load_model(model_dir=None, config_path=None, weights_path=None, vocab_dir=None):
    """Builds a core from a model directory or from explicit config/weights paths.

    Explicit paths override the directory's files. Without any weights the
    call fails: exporting random weights by accident is never wanted.
    """
    if model_dir is not None and not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory {model_dir!r} does not exist")
    if config_path is None and model_dir is not None:
        config_path = os.path.join(model_dir, CONFIG_FILE)
    if weights_path is None and model_dir is not None:
        weights_path = os.path.join(model_dir, WEIGHTS_FILE)
    if vocab_dir is None and model_dir is not None:
        candidate = os.path.join(model_dir, VOCAB_DIR)
        vocab_dir = candidate if os.path.isdir(candidate) else None
    for name, path in (("config", config_path), ("weights", weights_path)):
        if path is None:
            raise ModelDirError(f"no {name} file: pass a model directory or a {name} path")
        if not os.path.isfile(path):
            raise ModelDirError(f"{name} file {path!r} does not exist")
    config = TransformerXLConfig.from_json(config_path)
    core = TransformerXL(config)
    try:
        load_core_weights(core, weights_path)
    except ModelDirError:
        raise
    except (ValueError, KeyError, OSError) as error:
        raise ModelDirError(f"cannot load weights {weights_path!r} into a core built from "
                            f"{config_path!r}: {error}") from error
    return LoadedModel(core, config, config_path, vocab_dir)
