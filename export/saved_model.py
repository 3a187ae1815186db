"""The serving module, a stateless `tf.Module` around a core (the functions
both export formats serve), and its SavedModel with config and vocabulary
as assets (`export_saved_model`).

Signatures (M = `mem_len`, fixed at export; batch B and length T dynamic):

- `initial_memory(batch_size: int32 [])` → `mems` float32 `[n_layer, B, M, d_model]`,
  `mem_mask` bool `[B, M]` (True = real slot).
- `step(token_ids: int32 [B, T], mems, mem_mask)` → `log_probs` float32
  `[B, T, n_token]` (or `[B, n_token]` with `log_probs="last"`), `new_mems`,
  `new_mem_mask`.
- `step_last(token_ids, mems, mem_mask)` → `step` with `log_probs` float32
  `[B, n_token]` at the last position only: what decoding reads.
- `score(token_ids, target_ids: int32 [B, T], mems, mem_mask)` → `nll` float32
  `[B, T]`, `new_mems`, `new_mem_mask`.
- `decode_init`, `decode_step`, `decode_read`, `decode_memory`: the cached decode interface
  (`export.decode_interface`).
"""
import functools
import json
import os
import tempfile

import keras
import tensorflow as tf

from export import decode_interface
from export.metadata import export_metadata, weights_quantization
from txl_tf import Memory
from txl_tf.app.paths import refuse_links_out_of
from txl_tf.app.tf_logs import logging_as_found
from txl_tf.checks.numpy_checks import check_count
from txl_tf.errors import TxlError
from txl_tf.keras_support.untracked import Untracked

LOG_PROBS_MODES = ("all", "last")
# `mems` / `new_mems` as the core holds them, `[n_layer, B, M, d_model]`, or
# batch first, `[B, n_layer, M, d_model]` (what Triton's implicit state needs).
MEMORY_LAYOUTS = ("layer_major", "batch_major")


def check_memory_layout(memory_layout):
    if memory_layout not in MEMORY_LAYOUTS:
        raise TxlError(f"memory_layout must be one of {MEMORY_LAYOUTS}, "
                       f"got {memory_layout!r}")


def interface_specs(config, mem_len, memory_layout="layer_major"):
    """TensorSpecs of `step`'s inputs: `token_ids`, `mems`, `mem_mask`."""
    check_memory_layout(memory_layout)
    geometry = [config.n_layer, None, int(mem_len), config.d_model]
    if memory_layout == "batch_major":
        geometry[:2] = geometry[1::-1]
    return [tf.TensorSpec([None, None], tf.int32, name="token_ids"),
            tf.TensorSpec(geometry, tf.float32, name="mems"),
            tf.TensorSpec([None, int(mem_len)], tf.bool, name="mem_mask")]


def serve_step(core, token_ids, mems, mem_mask, log_probs_mode="all",
               memory_layout="layer_major"):
    """The `step` computation on the core's current weights (or a StatelessScope's):
    `{"log_probs", "new_mems", "new_mem_mask"}`, `mems` and `new_mems` in
    `memory_layout` (batch-major ones are transposed around the core)."""
    check_memory_layout(memory_layout)
    swap = memory_layout == "batch_major"
    memory = Memory(_swap_layer_batch(mems) if swap else mems, mem_mask)
    if log_probs_mode == "all":
        log_probs, new = core(token_ids, memory, training=False)
    else:
        hidden, new = core.hidden_states(token_ids, memory, training=False)
        log_probs = core.crit(hidden[:, -1])
    new_mems = _swap_layer_batch(new.mems) if swap else new.mems
    return {"log_probs": log_probs, "new_mems": new_mems, "new_mem_mask": new.mem_mask}


def _swap_layer_batch(mems):
    """`mems` with its first two axes swapped. Without memory slots, an
    empty tensor of that shape: with one layer, tf2onnx writes the transpose
    as a reshape to `[-1, 1, 0, d]`, which ONNX Runtime refuses to load."""
    if mems.shape[2] == 0:
        shape = tf.shape(mems)
        return tf.zeros(tf.stack([shape[1], shape[0], 0, shape[3]]), mems.dtype)
    return tf.transpose(mems, [1, 0, 2, 3])


def plain_copies(weights):
    """Plain `tf.Variable` copies of Keras weights, for a SavedModel that
    every loader reads (see `ServingModule`)."""
    return [tf.Variable(w.value, trainable=False, name=f"w{i:03d}/{w.path}")
            for i, w in enumerate(weights)]


def weights_scope(weights, values):
    """A `keras.StatelessScope` in which Keras `weights` read as `values`."""
    return keras.StatelessScope(state_mapping=list(zip(weights, values)))


# The signatures are traced as written: the core's control flow is TensorFlow's
# own (the ONNX conversion traces it so too), and AutoGraph's rewrite of every
# function it reaches only slowed the export (benchmarks/NOTES.md).
signature_function = functools.partial(tf.function, autograph=False)


class ServingModule(tf.Module):
    """Wraps a `TransformerXL` core with fixed memory length and input signatures.

    The module owns copies of the core's weights as plain `tf.Variable`s and
    runs the core on them through `keras.StatelessScope`: the TF1-style loaders
    of TF Serving and `saved_model_cli run` fail to find Keras 3 variables saved
    directly (keras-team/keras#19274), and plain variables restore everywhere.

    Args:
        core: the `TransformerXL` to serve.
        mem_len: memory slots, an int >= 0.
        log_probs: `"all"` (`[B, T, n_token]`) or `"last"` (`[B, n_token]`).
        zero_filled: whether fresh memories are zero states.

    Raises:
        TxlError: a bad `log_probs` or `mem_len`.
    """

    def __init__(self, core, mem_len, log_probs="all", zero_filled=False):
        super().__init__(name="txl_serving")
        if log_probs not in LOG_PROBS_MODES:
            raise TxlError(f"log_probs must be one of {LOG_PROBS_MODES}, got {log_probs!r}")
        mem_len = check_count("mem_len", mem_len)
        cfg = core.config
        self._core = Untracked(core)
        self.weights = plain_copies(core.weights)
        self.mem_len = int(mem_len)
        self.log_probs_mode = log_probs
        self.zero_filled = bool(zero_filled)
        ids, mems, mask = interface_specs(cfg, self.mem_len)
        targets = tf.TensorSpec([None, None], tf.int32, name="target_ids")
        batch = tf.TensorSpec([], tf.int32, name="batch_size")
        self.initial_memory = signature_function(self._initial_memory, input_signature=[batch])
        self.step = signature_function(self._step, input_signature=[ids, mems, mask])
        self.step_last = signature_function(self._step_last, input_signature=[ids, mems, mask])
        self.score = signature_function(self._score, input_signature=[ids, targets, mems, mask])
        # The decode cache holds attn_type 0's keys alone (`TransformerXL.decode_cache`).
        self.has_decode_cache = cfg.attn_type == 0
        if not self.has_decode_cache:
            return
        self.decode_init = signature_function(
            self._decode_init,
            input_signature=decode_interface.memory_specs(cfg, self.mem_len))
        self.decode_step = signature_function(
            self._decode_step, input_signature=decode_interface.step_specs(cfg, self.mem_len))
        self.decode_read = signature_function(
            self._decode_read, input_signature=decode_interface.read_specs(cfg, self.mem_len))
        self.decode_memory = signature_function(
            decode_interface.decode_memory,
            input_signature=decode_interface.cache_memory_specs(cfg, self.mem_len))

    def signatures(self):
        """The SavedModel signature map (`serving_default` is `step`).

        Returns:
            A dict: signature name -> concrete function.
        """
        step = self.step.get_concrete_function()
        signatures = {"serving_default": step, "step": step,
                      "step_last": self.step_last.get_concrete_function(),
                      "initial_memory": self.initial_memory.get_concrete_function(),
                      "score": self.score.get_concrete_function()}
        if self.has_decode_cache:
            signatures.update({
                "decode_init": self.decode_init.get_concrete_function(),
                "decode_step": self.decode_step.get_concrete_function(),
                "decode_read": self.decode_read.get_concrete_function(),
                "decode_memory": self.decode_memory.get_concrete_function()})
        return signatures

    @property
    def core(self):
        return self._core.value

    def _weights_scope(self):
        return weights_scope(self.core.weights, self.weights)

    def _initial_memory(self, batch_size):
        memory = self.core.initial_memory(batch_size, self.mem_len, self.zero_filled)
        return {"mems": memory.mems, "mem_mask": memory.mem_mask}

    def _step(self, token_ids, mems, mem_mask):
        with self._weights_scope():
            return serve_step(self.core, token_ids, mems, mem_mask, self.log_probs_mode)

    def _step_last(self, token_ids, mems, mem_mask):
        with self._weights_scope():
            return serve_step(self.core, token_ids, mems, mem_mask, "last")

    def _score(self, token_ids, target_ids, mems, mem_mask):
        with self._weights_scope():
            nll, new = self.core(token_ids, Memory(mems, mem_mask), targets=target_ids,
                                 training=False)
        return {"nll": nll, "new_mems": new.mems, "new_mem_mask": new.mem_mask}

    def _decode_init(self, mems, mem_mask):
        with self._weights_scope():
            return decode_interface.decode_init(self.core, mems, mem_mask)

    def _decode_step(self, *inputs):
        with self._weights_scope():
            return decode_interface.decode_step(self.core, *inputs)

    def _decode_read(self, *inputs):
        with self._weights_scope():
            return decode_interface.decode_read(self.core, *inputs)


# ----------------------------------------------------------- the SavedModel
CONFIG_ASSET = "config.json"
METADATA_ASSET = "export_metadata.json"


def save_module(module, path):
    """`tf.saved_model.save` of a serving `module` with its `signatures()`,
    leaving the process's logging as it found it
    (`txl_tf.app.tf_logs.logging_as_found`).

    Args:
        module: a `tf.Module` with a `signatures()` method.
        path: the SavedModel directory to write.

    Returns:
        `path`.
    """
    with logging_as_found():
        tf.saved_model.save(module, path, signatures=module.signatures())
    return path


def export_saved_model(core, path, mem_len, log_probs="all", zero_filled=False,
                       vocab_dir=None):
    """Saves `initial_memory`, `step` (= `serving_default`) and `score` signatures.

    `assets/config.json` holds the TransformerXLConfig, `assets/export_metadata.json`
    the memory geometry, and each file of `vocab_dir` is copied into `assets/`.

    Args:
        core: the `TransformerXL` to export.
        path: the SavedModel directory to write.
        mem_len: memory slots, an int >= 0.
        log_probs: `"all"` (`[B, T, n_token]`) or `"last"` (`[B, n_token]`).
        zero_filled: whether fresh memories are zero states.
        vocab_dir: None, or a folder whose files go into `assets/`.

    Returns:
        `path`.
    """
    module = ServingModule(core, mem_len, log_probs, zero_filled)
    with tempfile.TemporaryDirectory() as staging:
        config_file = os.path.join(staging, CONFIG_ASSET)
        core.config.to_json(config_file)
        metadata_file = os.path.join(staging, METADATA_ASSET)
        with open(metadata_file, "w", encoding="utf-8") as f:
            json.dump(export_metadata(core.config, mem_len, log_probs, zero_filled,
                                      quantization=weights_quantization(core)), f,
                      indent=2, sort_keys=True)
        module.config_file = tf.saved_model.Asset(config_file)
        module.metadata_file = tf.saved_model.Asset(metadata_file)
        module.vocab_files = [tf.saved_model.Asset(p) for p in _vocab_files(vocab_dir)]
        save_module(module, path)
    return path


def _vocab_files(vocab_dir):
    if not vocab_dir:
        return []
    refuse_links_out_of(vocab_dir)
    names = sorted(os.listdir(vocab_dir))
    return [os.path.join(vocab_dir, n) for n in names
            if os.path.isfile(os.path.join(vocab_dir, n))]
