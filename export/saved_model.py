"""Writes the serving module as a SavedModel with config and vocabulary as assets."""
import json
import os
import tempfile

import tensorflow as tf

from export.metadata import export_metadata
from export.serving_module import ServingModule

CONFIG_ASSET = "config.json"
METADATA_ASSET = "export_metadata.json"


def export_saved_model(core, path, mem_len, log_probs="all", zero_filled=False,
                       vocab_dir=None):
    """Saves `initial_memory`, `step` (= `serving_default`) and `score` signatures.

    `assets/config.json` holds the TransformerXLConfig, `assets/export_metadata.json`
    the memory geometry, and each file of `vocab_dir` is copied into `assets/`.
    Returns `path`.
    """
    module = ServingModule(core, mem_len, log_probs, zero_filled)
    with tempfile.TemporaryDirectory() as staging:
        config_file = os.path.join(staging, CONFIG_ASSET)
        core.config.to_json(config_file)
        metadata_file = os.path.join(staging, METADATA_ASSET)
        with open(metadata_file, "w", encoding="utf-8") as f:
            json.dump(export_metadata(core.config, mem_len, log_probs, zero_filled), f,
                      indent=2, sort_keys=True)
        module.config_file = tf.saved_model.Asset(config_file)
        module.metadata_file = tf.saved_model.Asset(metadata_file)
        module.vocab_files = [tf.saved_model.Asset(p) for p in _vocab_files(vocab_dir)]
        tf.saved_model.save(module, path, signatures=module.signatures())
    return path


def _vocab_files(vocab_dir):
    if not vocab_dir:
        return []
    names = sorted(os.listdir(vocab_dir))
    return [os.path.join(vocab_dir, n) for n in names
            if os.path.isfile(os.path.join(vocab_dir, n))]
