"""SavedModel backend: the reloaded `step` and `score` signatures; memory stays
a `tf.Tensor` (on the GPU when one is used) between calls."""
import logging
import os

import numpy as np
import tensorflow as tf

from export.decode_cache import ALIGNMENT, CHANGING_NAMES, host_cache, step_feeds, write_token
from export.metadata import ExportInfo
from export.runtime import Runtime, RuntimeMemory
from export.saved_model import METADATA_ASSET
from txl_tf.app.nvidia_driver import nvidia_driver
from txl_tf.errors import TxlError
from txl_tf.weights.model_dir import ModelDirError

log = logging.getLogger(__name__)


def choose_tf_device(device="auto"):
    """`(tf device string, name)` for `device` in `auto | cuda | gpu | cpu`."""
    if device not in ("auto", "cuda", "gpu", "cpu"):
        raise TxlError(f"device must be auto, cuda, gpu or cpu, got {device!r}")
    if device != "cpu" and tf.config.list_physical_devices("GPU"):
        return "/GPU:0", "gpu"
    if device in ("cuda", "gpu") or nvidia_driver():
        driver = (": this machine has NVIDIA's GPU driver, and TensorFlow with its CUDA "
                  "libraries (the gpu extra) would use it" if nvidia_driver() else "")
        log.warning("no GPU visible to TensorFlow; the SavedModel runs on the CPU%s", driver)
    return "/CPU:0", "cpu"


def load_saved_model(path, device):
    """`tf.saved_model.load(path)` on `device`; a missing, truncated or corrupt
    SavedModel is a `ModelDirError` naming it."""
    try:
        with tf.device(device):
            return tf.saved_model.load(path)
    # IndexError: TensorFlow's reader on a variables data file cut short
    except (OSError, ValueError, IndexError, tf.errors.OpError) as err:
        reason = " ".join(str(err).split())[:500]
        raise ModelDirError(f"cannot load the SavedModel {path}: {reason}") from None


class SavedModelRuntime(Runtime):
    """Runs a SavedModel written by `export_saved_model` (`tf.saved_model.load`)."""

    backend = "saved_model"

    def __init__(self, path, device="auto"):
        self._tf_device, name = choose_tf_device(device)
        self.loaded = load_saved_model(path, self._tf_device)
        metadata = getattr(self.loaded, "metadata_file", None)
        metadata_path = (metadata.asset_path.numpy().decode() if metadata is not None
                         else os.path.join(path, "assets", METADATA_ASSET))
        super().__init__(ExportInfo.from_json_file(metadata_path))
        self.device = name
        self._step_fn = self.loaded.signatures["step"]
        self._score_fn = self.loaded.signatures["score"]
        # Exports before `step_last` existed decode through `step`.
        self._step_last_fn = self.loaded.signatures.get("step_last")
        self._decode_init_fn = self.loaded.signatures.get("decode_init")
        self._decode_step_fn = self.loaded.signatures.get("decode_step")
        self._decode_read_fn = self.loaded.signatures.get("decode_read")

    @property
    def has_decode_cache(self):
        # An export of an older decode interface (no `decode_read`) decodes
        # through `step_last`.
        return self._usable_decode_graphs(self._decode_read_fn is not None)

    def _to_backend(self, mems, mem_mask):
        with tf.device(self._tf_device):
            return RuntimeMemory(tf.constant(mems), tf.constant(mem_mask))

    def _native(self, mems, mem_mask):
        # An OrtValue from another runtime (either of the two: a mixed pair too).
        return tuple(tf.convert_to_tensor(v.numpy() if hasattr(v, "data_type") else v)
                     for v in (mems, mem_mask))

    def _step(self, ids, mems, mem_mask):
        with tf.device(self._tf_device):
            out = self._step_fn(token_ids=tf.constant(ids), mems=mems, mem_mask=mem_mask)
        return (np.asarray(out["log_probs"]),
                RuntimeMemory(out["new_mems"], out["new_mem_mask"]))

    def _step_last(self, ids, mems, mem_mask):
        if self._step_last_fn is None:
            return super()._step_last(ids, mems, mem_mask)
        with tf.device(self._tf_device):
            out = self._step_last_fn(token_ids=tf.constant(ids), mems=mems, mem_mask=mem_mask)
        return (np.asarray(out["log_probs"]),
                RuntimeMemory(out["new_mems"], out["new_mem_mask"]))

    def _score(self, ids, targets, mems, mem_mask):
        with tf.device(self._tf_device):
            out = self._score_fn(token_ids=tf.constant(ids), target_ids=tf.constant(targets),
                                 mems=mems, mem_mask=mem_mask)
        return np.asarray(out["nll"]), RuntimeMemory(out["new_mems"], out["new_mem_mask"])

    def _decode_init(self, mems, mem_mask):
        with tf.device(self._tf_device):
            return host_cache(self._decode_init_fn(mems=mems, mem_mask=mem_mask))

    def _decode_read(self, ids, cache):
        with tf.device(self._tf_device):
            out = self._decode_read_fn(token_ids=tf.constant(ids, tf.int32),
                                       **{name: _zero_copy(value) for name, value in cache.items()})
        return np.asarray(out["log_probs"]), host_cache(
            {**{name: out[f"new_{name}"] for name in CHANGING_NAMES},
             "positions": cache["positions"]})

    def _decode_step(self, ids, stopped, cache):
        feeds = {name: _zero_copy(value) for name, value in step_feeds(cache).items()}
        with tf.device(self._tf_device):
            out = self._decode_step_fn(token_ids=tf.constant(ids, tf.int32), **feeds)
        del feeds
        out = {name: np.asarray(value) for name, value in out.items()}
        write_token(cache, out, stopped)
        return out["log_probs"]


def _zero_copy(array):
    """`array` as a tf.Tensor: through DLPack, which hands TensorFlow the
    host's buffer without a copy (a numpy array converts by copying: the
    whole ring, every step), where TensorFlow accepts the buffer (float32,
    contiguous, aligned: it aborts the process on an unaligned one); else a
    copy. An OrtValue (another runtime's device cache on the CPU) is read as numpy."""
    array = np.asarray(array)
    if (array.dtype == np.float32 and array.flags.c_contiguous
            and array.ctypes.data % ALIGNMENT == 0):
        return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    return tf.constant(array)
