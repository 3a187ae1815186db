"""Reading the model directory that training writes: a thin layer over
`txl_tf.weights.model_dir` (one loader for every job).

```
model_dir/
  config.json    TransformerXLConfig JSON
  weights.npz    weights keyed by the paper's TF variable names (no pickle)
  vocab/         optional: plain-text vocabulary files, shipped as assets
```
A training run directory works too (its `export/`, else its newest
checkpoint). `--weights` may also name a `.keras` file of a `TransformerXLLM`.
"""
import os
import shutil
from typing import NamedTuple, Optional

from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf import weights
from txl_tf.weights import checkpoints
from txl_tf.weights import model_dir as loader
from txl_tf.weights.model_dir import ModelDirError

CONFIG_FILE = checkpoints.CONFIG_FILE
WEIGHTS_FILE = checkpoints.WEIGHTS_FILE
VOCAB_DIR = checkpoints.VOCAB_DIR

__all__ = ["LoadedModel", "ModelDirError", "load_core_weights", "load_model",
           "save_core_weights", "save_model_dir"]


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
    kind = "keras" if path.endswith(".keras") else "npz"
    source = loader.ModelSource(None, path, kind, None)
    loader.load_weights(core, source)


def save_model_dir(core, model_dir, vocab_dir=None):
    """Writes `config.json` and `weights.npz` (and copies `vocab_dir`)."""
    weights.save_pretrained(core, model_dir)
    if vocab_dir:
        shutil.copytree(vocab_dir, os.path.join(model_dir, VOCAB_DIR), dirs_exist_ok=True)
    return model_dir


def load_model(model_dir=None, config_path=None, weights_path=None, vocab_dir=None):
    """Builds a core from a model (or training run) directory or from explicit
    config/weights paths; explicit paths override the directory's files.
    Without any weights the call fails: exporting random weights by accident
    is never wanted. Raises `ModelDirError`."""
    core, source = loader.load(model_dir, config_path=config_path, weights_path=weights_path,
                               vocab_dir=vocab_dir)
    return LoadedModel(core, core.config, source.config_path, source.vocab_dir)
