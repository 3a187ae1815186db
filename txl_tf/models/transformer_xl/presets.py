"""Where `from_preset` finds a Transformer-XL: the paper's named
configurations (`txl_tf.PRESETS`: `tiny`, `small`, `enwik8_base`,
`wt103_base`, ...), the trained models shipped with the package
(`txl_tf.weights.shipped`: `pystdlib_small`), the model directories this library writes
(`save_pretrained`, training's `export/`, `txl-convert`), beside keras-hub's
own preset folders (which keras-hub reads itself)."""
import contextlib
import io
import os
import shutil
import threading
from typing import NamedTuple, Optional

from txl_tf.app.files import parse_json, stage, temporary_path
from txl_tf.config import PRESETS, TransformerXLConfig
from txl_tf.errors import TxlError
from txl_tf.weights import model_dir
from txl_tf.weights.shipped import SHIPPED, shipped_model_dir


class PresetError(TxlError):
    """A preset name or folder that cannot give a Transformer-XL."""


class LocalPreset(NamedTuple):
    """A named configuration (`source` None) or a model directory (`source`
    its `ModelSource`); `load_weights`: whether its weights are loaded."""

    config: TransformerXLConfig
    source: Optional[model_dir.ModelSource]
    load_weights: bool


def _is_keras_hub_folder(path):
    """Whether the folder `path` is a keras-hub preset (its config.json names
    a registered class); one whose config.json cannot be read beside
    keras-hub's `metadata.json` raises `PresetError` naming that file (it
    was taken for a model directory that lacked its weights.npz)."""
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return False
    try:
        with open(config, encoding="utf-8") as f:
            described = parse_json(f.read())
        if not isinstance(described, dict):
            raise ValueError(f"not a JSON object but {type(described).__name__} {described!r:.40}")
    except (OSError, ValueError) as err:
        if os.path.isfile(os.path.join(path, "metadata.json")):
            raise PresetError(f"cannot read the keras-hub preset's {config}: {err}") from None
        return False
    return "registered_name" in described


@contextlib.contextmanager
def keras_hub_errors(preset):
    """Within: keras-hub reading `preset`. Where it is a folder, keras-hub's
    errors on its files (h5py's "Unable to synchronously open file
    (truncated file: ...)" for a weights file cut short) raise as a
    `PresetError` naming the folder; ours, and keras-hub's
    `FileNotFoundError` (which names the file and the folder), pass as they
    are."""
    try:
        yield
    except (OSError, ValueError) as err:
        if isinstance(err, (TxlError, FileNotFoundError)) or \
                not os.path.isdir(os.fspath(preset)):
            raise
        raise PresetError(f"cannot load the keras-hub preset {os.fspath(preset)!r}: "
                          f"{err}") from None


def local_source(preset, load_weights):
    """The `LocalPreset` that `preset` names, or None for keras-hub to read
    (its own preset folders and handles)."""
    preset = os.fspath(preset)
    if preset in PRESETS:
        if load_weights:
            raise PresetError(
                f"the preset {preset!r} is the paper's configuration without weights: pass "
                f"load_weights=False for random weights, or convert the paper's released "
                f"weights with `txl-convert` and pass the model directory it writes")
        return LocalPreset(TransformerXLConfig.preset(preset), None, False)
    preset = shipped_model_dir(preset) or preset
    if os.path.isfile(preset):  # keras-hub: "Preset <file> has no config.json"
        raise PresetError(f"preset {preset!r} is a file: pass its folder (a keras-hub preset "
                          f"or a model directory)")
    if os.path.isdir(preset) and not _is_keras_hub_folder(preset):
        source = model_dir.resolve(preset)
        return LocalPreset(model_dir.load_config(source), source, bool(load_weights))
    if "://" not in preset and not os.path.exists(preset):
        raise PresetError(f"unknown preset {preset!r}: not one of {sorted(PRESETS)}, not a "
                          f"shipped model ({', '.join(sorted(SHIPPED))}) and no such folder "
                          f"(a keras-hub preset or a model directory)")
    return None


# keras-hub's names for a preset's files beside `config.json` and the
# weights (`keras_hub.src.utils.preset_utils`): a backbone's save writes
# `metadata.json` only; a task's adds its own, its preprocessor's and its
# tokenizer's (with `assets/`).
PRESET_FILES = ("metadata.json", "task.json", "task.weights.h5", "preprocessor.json",
                "tokenizer.json", "audio_converter.json", "image_converter.json",
                "video_converter.json", "assets")


class _Saving(threading.local):
    """The temporary folders of the saves this thread is inside."""

    def __init__(self):
        self.folders = []


class _ThroughMemory(threading.local):
    """How many `_weights_through_memory` blocks this thread is inside."""

    def __init__(self):
        self.depth = 0


_saving = _Saving()


_WRAP_LOCK = threading.Lock()


def _wrap_h5_store():
    """Wraps `__init__` and `close` of Keras's `H5IOStore` class (once):
    inside a `_weights_through_memory` block of the calling thread, a
    `.weights.h5` file written by path is built in memory and written at
    `close` with one `write`; in every other thread, or outside the block,
    the store is Keras's own. The class keeps its name and identity, so
    Keras's `isinstance` checks hold for every thread's store. Returns the
    `_ThroughMemory` the wrapper reads, kept on the class: a second object of
    this module (its entry of `sys.modules` deleted and imported again) uses
    the same one, not a flag the wrapper never reads."""
    from keras.src.saving import saving_lib

    store = saving_lib.H5IOStore
    with _WRAP_LOCK:
        through_memory = store.__dict__.get("_txl_through_memory")
        if through_memory is not None:
            return through_memory
        through_memory = _ThroughMemory()
        keras_init, keras_close = store.__init__, store.close

        def __init__(self, path_or_io, archive=None, mode="r"):
            target = None
            if (through_memory.depth and mode == "w" and archive is None
                    and isinstance(path_or_io, (str, os.PathLike))):
                target, path_or_io = os.fspath(path_or_io), io.BytesIO()
            self._txl_target = target
            keras_init(self, path_or_io, archive=archive, mode=mode)

        def close(self):
            target, buffer = self.__dict__.get("_txl_target"), self.path_or_io
            keras_close(self)
            if target is not None:
                self._txl_target = None
                with open(target, "wb") as f:
                    f.write(buffer.getbuffer())

        __init__.__doc__, close.__doc__ = keras_init.__doc__, keras_close.__doc__
        store.__init__, store.close = __init__, close
        store._txl_through_memory = through_memory
        return through_memory


@contextlib.contextmanager
def _weights_through_memory():
    """For the block, Keras's `.weights.h5` files (`save_weights`) that this
    thread writes are built in memory and written with one `write`: HDF5
    writing to a full disk itself crashed the process (a segmentation
    fault), where a `write` raises an `OSError`. The file is held in memory
    once more until it is written. Other threads' saves and loads are
    Keras's own. A sharded save (`max_shard_size` smaller than the model:
    Keras's `ShardedH5IOStore`, which reopens its shards to read them)
    writes its shards straight to disk."""
    through_memory = _wrap_h5_store()
    through_memory.depth += 1
    try:
        yield
    finally:
        through_memory.depth -= 1


def save_staged(save, preset_dir):
    """Runs keras-hub's `save(folder)` (a `save_to_preset`) into a temporary
    folder inside `preset_dir`, then renames its files in with `config.json`
    last (`txl_tf.app.files.stage`): a kill leaves the previous preset whole,
    the new one, or a folder without `config.json`, never one's config beside
    the other's weights. The previous preset's files that this one does not
    write (another sharding's weights; a task's `task.json`, preprocessor and
    tokenizer under a backbone's save, which a task's `from_preset` would
    read over the new backbone) are deleted with it. A save within a save
    (keras-hub saves a task's backbone into the task's folder) writes into
    the outer one's temporary folder directly.

    Args:
        save: keras-hub's saver, called with the temporary folder.
        preset_dir: the preset folder.
    """
    preset_dir = os.fspath(preset_dir)
    folders = _saving.folders
    if folders and os.path.abspath(preset_dir) == folders[-1]:
        return save(preset_dir)
    with stage(os.path.join(preset_dir, "config.json")) as files:
        staging = temporary_path(os.path.join(preset_dir, "preset"))
        folders.append(staging)
        try:
            with _weights_through_memory():
                save(staging)
            names = os.listdir(staging)
            for name in names:
                os.rename(os.path.join(staging, name),
                          files.path(os.path.join(preset_dir, name)))
        finally:
            folders.pop()
            shutil.rmtree(staging, ignore_errors=True)
        for name in os.listdir(preset_dir):
            if name not in names and (name in PRESET_FILES or (
                    name.startswith("model") and ".weights." in name)):
                files.drop(os.path.join(preset_dir, name))


def keras_hub_dtype(preset, kwargs):
    """`kwargs` for keras-hub's `from_preset` of `preset`, with `dtype` set
    to the global policy where the preset was saved under a mixed one (e.g.
    `mixed_bfloat16`): keras-hub loads a preset saved under a float policy
    under the global policy, but takes a mixed policy's name for a dtype and
    fails ("Invalid dtype: mixed_bfloat16")."""
    import keras
    if kwargs.get("dtype") is not None or "://" in os.fspath(preset):
        return kwargs
    try:
        with open(os.path.join(preset, "config.json"), encoding="utf-8") as f:
            saved = parse_json(f.read()).get("config", {}).get("dtype")
    except (OSError, ValueError, AttributeError):
        return kwargs  # keras-hub says what is wrong with the folder
    name = saved.get("config", {}).get("name") if isinstance(saved, dict) else None
    if isinstance(name, str) and name.startswith("mixed_"):
        return {**kwargs, "dtype": keras.config.dtype_policy()}
    return kwargs


def backbone_from(cls, found, **kwargs):
    """A `cls` backbone built from a `LocalPreset` (`kwargs`: constructor
    overrides, e.g. `dtype`, `mem_len`)."""
    from txl_tf.layers.init import skip_random_init
    values = {**found.config.to_dict(), **kwargs}
    if not found.load_weights:
        return cls(**values)
    with skip_random_init():  # every weight is loaded next
        backbone = cls(**values)
    model_dir.load_weights(backbone.transformer, found.source)
    return backbone


def tokenizer_of(found):
    """The model directory's tokenizer (checked against its config), or None."""
    if found.source is None or found.source.vocab_dir is None:
        return None
    return model_dir.load_vocab(found.source.vocab_dir, found.config)
