"""One loader for every form of model directory the jobs accept.

* a model directory: `config.json` + `weights.npz` [+ `vocab/`], as written
  by `txl_tf.weights.save_pretrained` (and training's `export/`);
* a training run directory (`training.train --model_dir`): its `export/`
  when present (with its `config.json`, which a save writes last), else its
  newest checkpoint in `checkpoints/` with its `config.json` (and
  `export/vocab/` when present);
* either, with an explicit training `checkpoint` (a `ckpt-N` prefix, or a
  name relative to the run's `checkpoints/`).

Explicit `config_path` / `weights_path` / `vocab_dir` override what the
directory holds. Every problem is a `ModelDirError` naming the path.
"""
import os
import sys
import zipfile
from typing import NamedTuple, Optional

from txl_tf.app.files import parse_json, stage
from txl_tf.config import ConfigError, TransformerXLConfig
from txl_tf.errors import ModelDirError  # also re-exported (export, training import it from here)
from txl_tf.errors import TxlError
from txl_tf.layers.init import skip_random_init
from txl_tf.text.model_vocab import check_vocab, load_vocab  # noqa: F401  (re-exported)
from txl_tf.weights import checkpoints
from txl_tf.weights.shipped import SHIPPED, shipped_model_dir

CONFIG_FILE = checkpoints.CONFIG_FILE
WEIGHTS_FILE = checkpoints.WEIGHTS_FILE
VOCAB_DIR = checkpoints.VOCAB_DIR
EXPORT_DIR = "export"
CHECKPOINT_DIR = "checkpoints"


class ModelSource(NamedTuple):
    """Where a model's parts are: `weights_kind` is npz, keras or checkpoint."""

    config_path: str
    weights_path: str
    weights_kind: str
    vocab_dir: Optional[str]


def _isfile(directory, name):
    return os.path.isfile(os.path.join(directory, name))


def _vocab_in(*directories):
    for directory in directories:
        candidate = os.path.join(directory, VOCAB_DIR)
        if os.path.isdir(candidate):
            return candidate
    return None


def _checkpoint_prefix(path, run_dir):
    """A checkpoint prefix for `path` (prefix, folder, or a name in the run's
    checkpoints/)."""
    import tensorflow as tf
    for candidate in (path, os.path.join(run_dir, CHECKPOINT_DIR, path)) if run_dir else (path,):
        if os.path.isdir(candidate):
            latest = tf.train.latest_checkpoint(candidate)
            if latest:
                return latest
        elif os.path.isfile(candidate + ".index"):
            return candidate
    folder = os.path.join(run_dir, CHECKPOINT_DIR) if run_dir else os.path.dirname(path)
    found = sorted((n[:-len(".index")] for n in os.listdir(folder) if n.endswith(".index")),
                   key=lambda n: (len(n), n)) if os.path.isdir(folder) else []
    existing = (f"; {folder} holds {', '.join(found)}" if found else
                f"; there are no checkpoints in {folder}" if folder else "")
    raise ModelDirError(f"checkpoint {path!r} not found (a ckpt-N prefix with its .index "
                        f"file, or a folder of training checkpoints){existing}")


def _warn_if_older_than_a_checkpoint(export, checkpoint_folder):
    """A `warning:` line on stderr when the run's newest checkpoint was
    written after `export/` (a resumed run stopped before its end): export/
    is still what the run directory gives, and `--checkpoint` the way to the
    newer weights."""
    def written(path):  # a checkpoint a running job deletes meanwhile counts as none
        try:
            return os.stat(path).st_mtime_ns
        except OSError:
            return -1
    indexes = [os.path.join(checkpoint_folder, n) for n in os.listdir(checkpoint_folder)
               if n.endswith(".index")] if os.path.isdir(checkpoint_folder) else []
    newest = max(indexes, key=written, default=None)
    if newest and written(newest) > written(os.path.join(export, WEIGHTS_FILE)):
        name = os.path.basename(newest)[:-len(".index")]
        print(f"warning: {export} is older than the run's newest checkpoint {name}: it holds "
              f"the weights of an earlier end of the run (a resumed run stopped before its "
              f"end?); reading {export} (training.evaluate and training.generate read the "
              f"checkpoint with --checkpoint={name})",
              file=sys.stderr, flush=True)


def resolve(model_dir=None, checkpoint=None, config_path=None, weights_path=None,
            vocab_dir=None):
    """The `ModelSource` of a model or training run directory (see module
    doc), or of a shipped model's name (`txl_tf.weights.shipped`)."""
    if model_dir is not None:
        model_dir = shipped_model_dir(model_dir) or model_dir
    if model_dir is not None and not os.path.isdir(model_dir):
        what = "is a file, not a directory" if os.path.exists(model_dir) else "does not exist"
        if not os.path.exists(model_dir) and not os.path.dirname(os.fspath(model_dir)):
            what += f", nor is it a shipped model's name (shipped: {', '.join(sorted(SHIPPED))})"
        raise ModelDirError(f"model directory {model_dir!r} {what}")
    kind = None
    if model_dir is not None and weights_path is None:
        export = os.path.join(model_dir, EXPORT_DIR)
        if checkpoint:
            kind, weights_path = "checkpoint", _checkpoint_prefix(checkpoint, model_dir)
            home = model_dir if _isfile(model_dir, CONFIG_FILE) else export
        elif _isfile(model_dir, WEIGHTS_FILE):
            home = model_dir
        elif _isfile(export, WEIGHTS_FILE) and (  # no config.json: a save cut short
                _isfile(export, CONFIG_FILE) or not os.path.isdir(
                    os.path.join(model_dir, CHECKPOINT_DIR))):
            home = export
            _warn_if_older_than_a_checkpoint(export, os.path.join(model_dir, CHECKPOINT_DIR))
        elif _isfile(model_dir, CONFIG_FILE) and os.path.isdir(
                os.path.join(model_dir, CHECKPOINT_DIR)):
            kind, home = "checkpoint", model_dir
            weights_path = _checkpoint_prefix(os.path.join(model_dir, CHECKPOINT_DIR), None)
        else:
            torch_files = [f for f in ("model.safetensors", "pytorch_model.bin")
                           if _isfile(model_dir, f)]
            config = (f" --config={os.path.join(model_dir, CONFIG_FILE)}"
                      if _isfile(model_dir, CONFIG_FILE) else "")  # optional for a state dict
            hint = (f"; its {torch_files[0]} is a PyTorch state dict (the Hugging Face port's "
                    f"folder?): convert it first, `txl-convert --source=pytorch --input="
                    f"{os.path.join(model_dir, torch_files[0])}{config} --output_dir=...`"
                    if torch_files else "")
            raise ModelDirError(
                f"{model_dir!r} is neither a model directory ({CONFIG_FILE} + {WEIGHTS_FILE}) "
                f"nor a training run directory ({EXPORT_DIR}/ or {CHECKPOINT_DIR}/ with a "
                f"{CONFIG_FILE}){hint}")
        weights_path = weights_path or os.path.join(home, WEIGHTS_FILE)
        config_path = config_path or os.path.join(home, CONFIG_FILE)
        vocab_dir = vocab_dir or _vocab_in(home, export)
    elif checkpoint and weights_path is None:
        kind, weights_path = "checkpoint", _checkpoint_prefix(checkpoint, None)
    elif model_dir is not None:
        config_path = config_path or os.path.join(model_dir, CONFIG_FILE)
        vocab_dir = vocab_dir or _vocab_in(model_dir)
    for name, path in (("config", config_path), ("weights", weights_path)):
        if path is None:
            raise ModelDirError(f"no {name} file: pass a model directory or a {name} path")
        if kind != "checkpoint" or name == "config":
            if not os.path.isfile(path):
                raise ModelDirError(f"{name} file {path!r} does not exist")
    if kind is None:
        kind = "keras" if weights_path.endswith(".keras") else "npz"
    return ModelSource(config_path, weights_path, kind, vocab_dir)


def load_config(source, **overrides):
    """The source's `TransformerXLConfig`, with `overrides` applied."""
    path = source.config_path
    try:
        config = TransformerXLConfig.from_json(path)
        return config.replace(**overrides) if overrides else config
    except (ConfigError, ValueError, TypeError, OSError) as err:
        raise ModelDirError(f"cannot read the config {path!r}: {err}") from None


def load_core(source, config=None, dtype=None, **overrides):
    """A `TransformerXL` built from the source's config (or `config`) with
    `overrides`, holding the source's weights, under the dtype policy
    `dtype` (a name or `keras.DTypePolicy`; default the global policy)."""
    from txl_tf.core import TransformerXL
    if config is None:
        config = load_config(source, **overrides)
    elif overrides:
        config = config.replace(**overrides)
    if source.weights_kind == "npz":
        _check_size(config, source)
    with skip_random_init():  # every weight is loaded next
        core = TransformerXL(config, dtype=dtype)
    load_weights(core, source)
    return core


def _check_size(config, source):
    """Refuses, before the model is built, a config of a model far larger
    than its .npz file (`checkpoints.far_larger`)."""
    import math
    try:
        held = sum(math.prod(shape) for shape, _ in
                   checkpoints.npz_headers(source.weights_path).values())
    except TxlError:
        return  # an unreadable file: load_weights names its problem
    too_large = checkpoints.far_larger(config, held)
    if too_large:
        raise ModelDirError(f"cannot load weights {source.weights_path!r} into a core built from "
                            f"{source.config_path!r}: {too_large}")


def load_weights(core, source):
    """Loads the source's weights (npz, .keras or training checkpoint) into `core`."""
    import tensorflow as tf
    path = source.weights_path
    try:
        _load_weights(core, source)
    except ModelDirError:
        raise
    except (ValueError, KeyError, OSError, EOFError, AssertionError, zipfile.BadZipFile,
            tf.errors.OpError) as err:
        built = f" into a core built from {source.config_path!r}" if source.config_path else ""
        raise ModelDirError(f"cannot load weights {path!r}{built}: {_one_line(err)}") from None


def _one_line(err):
    text = " ".join(str(err).split())
    return text[:500] + ("..." if len(text) > 500 else "") if text else type(err).__name__


def _load_weights(core, source):
    path = source.weights_path
    if source.weights_kind == "checkpoint":
        checkpoints.restore_weights(core, path)
    elif source.weights_kind == "keras":
        import keras
        from txl_tf.weights.legacy_keras import is_legacy, load_legacy_core
        if is_legacy(path):
            trained = load_legacy_core(path)
        else:
            trained = getattr(keras.saving.load_model(path, compile=False), "core", None)
        if trained is None:
            raise ModelDirError(f"{path} holds no model with a `.core` Transformer-XL")
        _refuse_quantized(trained, path)
        checkpoints.set_weights(core, checkpoints.get_weights(trained))
    else:
        checkpoints.load_weights(core, path)


def _refuse_quantized(core, path):
    """Raises `ModelDirError` if `core` (read from the .keras file `path`)
    has quantized layers: the core they are read into holds float weights."""
    quantized = [(name, kind) for name, kind in checkpoints.adapted_layers(core)
                 if kind != "LoRA"]
    if quantized:
        name, mode = quantized[0]
        raise ModelDirError(
            f"cannot load weights {path!r}: it holds an {mode}-quantized model ({name}), "
            f"and a job reads float weights into a core built from the config; pass the "
            f"model's file from before quantize()")


def load(model_dir=None, checkpoint=None, config_path=None, weights_path=None,
         vocab_dir=None, **overrides):
    """`(core, source)`: resolves `model_dir` (see `resolve`) and loads the
    core with config `overrides` (e.g. clamp_len, same_length)."""
    source = resolve(model_dir, checkpoint, config_path, weights_path, vocab_dir)
    return load_core(source, **overrides), source


def _drop_the_previous_saves_vocabulary(directory, files):
    """Drops (with the save's commit) the `vocab/` of `directory` that a
    save with a tokenizer wrote (the previous `config.json` records its
    fingerprint); a `vocab/` put there by hand is kept, with a `warning:`
    line (it is read, unchecked, as the model's vocabulary)."""
    vocab = os.path.join(directory, checkpoints.VOCAB_DIR)
    try:
        with open(os.path.join(directory, CONFIG_FILE), encoding="utf-8") as f:
            written_by_a_save = parse_json(f.read()).get("vocab_fingerprint") is not None
    except (OSError, ValueError, AttributeError):  # no previous config, or not one of ours
        written_by_a_save = False
    if written_by_a_save:
        files.drop(vocab)
    else:
        print(f"warning: {vocab} was not written by a save with a tokenizer: kept, and read "
              f"unchecked as this model's vocabulary (save with tokenizer= to pair them)",
              file=sys.stderr)


def save_pretrained(core, directory, tokenizer=None):
    """Writes `config.json` and `weights.npz` into `directory`.

    Args:
        core: the `TransformerXL` to save (a LoRA or int8 model is refused
            before anything is written).
        directory: the folder (made if missing).
        tokenizer: None, or the `txl_tf.text.Tokenizer` the model reads
            with: written as `vocab/`, its fingerprint into the config
            (every job then reads text with it, checked). Without one, the
            `vocab/` a previous save with a tokenizer wrote is deleted with
            that save (it would be read, unchecked, as this model's); one
            put there by hand is kept, with a `warning:` line.

    Returns:
        `directory`.
    """
    checkpoints.reference_names(core)  # a LoRA or int8 model is refused before anything is written
    if isinstance(directory, (str, os.PathLike)) and not os.fspath(directory):
        raise ModelDirError("save_pretrained needs a directory, got '' (the working directory "
                            "would get the files; pass '.' for it)")
    from txl_tf.text.base import Tokenizer
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise TxlError(f"tokenizer must be a txl_tf.text.Tokenizer or None, got "
                       f"{type(tokenizer).__name__}")
    config = core.config
    # Written under temporary names, then renamed in with config.json last: a
    # kill leaves the previous save or this one, never one's config beside
    # the other's weights (a folder without config.json is refused by name).
    with stage(os.path.join(directory, checkpoints.CONFIG_FILE)) as files:
        if tokenizer is not None:
            config = config.replace(vocab_fingerprint=tokenizer.fingerprint())
            tokenizer.save(files.path(os.path.join(directory, checkpoints.VOCAB_DIR)))
        elif os.path.lexists(os.path.join(directory, checkpoints.VOCAB_DIR)):
            _drop_the_previous_saves_vocabulary(directory, files)
        checkpoints.save_weights(core, files.path(os.path.join(directory,
                                                               checkpoints.WEIGHTS_FILE)))
        config.to_json(files.path(os.path.join(directory, checkpoints.CONFIG_FILE)))
    return directory


def load_pretrained(directory, **config_overrides):
    """A `TransformerXL` from a model directory.

    Args:
        directory: a model directory, a training run's directory (see
            `txl_tf.weights.model_dir`), or a shipped model's name.
        **config_overrides: config fields to change (e.g. `clamp_len`,
            `same_length` for evaluation), not the weights.

    Returns:
        The `TransformerXL`.

    Raises:
        ModelDirError: naming the path that is missing or wrong.
    """
    return load(str(directory), **config_overrides)[0]
