"""Import paths from before the package's re-layout into folders (and
`export/`'s regrouping by idea, and single moves since): importing one is an
ImportError that names where the module went, not a bare "No module named".
A name that moved out of a module that stayed (`MOVED_NAMES`) is one too,
from the module's `__getattr__` (`answers_moved_names`).
Both `txl_tf` and `export` install the finder when imported, so the first
import of a process may be an old path of either. Standard library only:
`export` reads this file without importing `txl_tf` (and TensorFlow)."""
import importlib.abc
import sys

# old module -> where it went (modules moved into `checks/`, `classification/`,
# `generation/`, `keras_support/`, `learning/`, `models/` and `weights/`).
MOVED = {
    "txl_tf.validation": "txl_tf.checks.inputs",
    "txl_tf.memory_budget": "txl_tf.checks.memory_budget",
    "txl_tf.attention_picture": "txl_tf.classification.attention_picture",
    "txl_tf.classifier": "txl_tf.classification.classifier",
    "txl_tf.data.classification": "txl_tf.classification.data",
    "txl_tf.data.labels": "txl_tf.classification.labels",
    "txl_tf.classification_metrics": "txl_tf.classification.metrics",
    "txl_tf.data.passages": "txl_tf.classification.passages",
    "txl_tf.counter_rng": "txl_tf.generation.counter_rng",
    "txl_tf.decoder": "txl_tf.generation.decoder",
    "txl_tf.generate": "txl_tf.generation.decoder",
    "txl_tf.host_decode": "txl_tf.generation.host_loop",
    "txl_tf.decode_request": "txl_tf.generation.request",
    "txl_tf.sampling": "txl_tf.generation.sampling",
    "txl_tf.sampling_numpy": "txl_tf.generation.sampling_numpy",
    "txl_tf.compile_mixin": "txl_tf.keras_support.compile_mixin",
    "txl_tf.keras_compat": "txl_tf.keras_support.keras_compat",
    "txl_tf.precision": "txl_tf.keras_support.precision",
    "txl_tf.untracked": "txl_tf.keras_support.untracked",
    "txl_tf.keras_support.stream_memory": "txl_tf.models.transformer_xl.stream_memory",
    "txl_tf.evaluation": "txl_tf.learning.evaluation",
    "txl_tf.metrics": "txl_tf.learning.metrics",
    "txl_tf.optimizer": "txl_tf.learning.optimizer",
    "txl_tf.schedule": "txl_tf.learning.schedule",
    "txl_tf.checkpoints": "txl_tf.weights.checkpoints",
    "txl_tf.model_dir": "txl_tf.weights.model_dir",
    "txl_tf.pytorch_import": "txl_tf.weights.pytorch_import",
    "txl_tf.state_dict": "txl_tf.weights.state_dict",
    # export/ regrouped by idea
    "export.cache_slab": "export.slab",
    "export.device_ring": "export.device_cache",
    "export.graph_replay": "export.device_cache",
    "export.host_cache": "export.decode_cache",
    "export.classifier_export": "export.classifier",
    "export.classifier_runtime": "export.classifier",
    "export.input_checks": "export.runtime",
    "export.runtime_base": "export.runtime",
    "export.serving_module": "export.saved_model",
    "export.triton_cached": "export.triton",
    "export.triton_config": "export.triton",
    # the host's slab (out of export.decode_cache) beside the device's
    "export.device_slab": "export.slab",
}


# module that stayed -> {name that moved out of it: the module it went to}
MOVED_NAMES = {
    # export.decode_cache split by idea: the host's cache stays (every name 0.4.0's had)
    "export.decode_cache": {
        **dict.fromkeys(("DeviceCache", "FixedStep", "IN_PLACE", "MOVED", "NUMPY_TYPES", "OPSET",
                         "RINGS", "Resident", "WRITE_INPUTS", "WRITE_OUTPUTS", "bind_ring",
                         "bind_rows", "copy_model", "copy_on_device", "device_step",
                         "empty_like", "is_ortvalue", "on_device", "ortvalue",
                         "replay_run_options", "ring_memory_model", "ring_write_model",
                         "run_on_device", "small_model", "with_cache_dtype", "write_on_device"),
                        "export.device_cache"),
        **dict.fromkeys(("CacheSlab", "check_admission", "one_thread_at_a_time",
                         "slab_row_bytes"), "export.slab")},
}


# removed module -> what replaces it
REMOVED = {
    "txl_tf.generation.generate": "its Generator was a shell over txl_tf.Decoder: "
                                  "Decoder(core, mem_len).generate(prompt_ids, n, ...).ids",
    "export.model_dir": "folded into txl_tf.weights.model_dir: load_pretrained(model_dir), "
                        "save_pretrained(core, model_dir, tokenizer)",
}


def moved_error(old):
    """The ImportError for the old module path `old` (moved or removed)."""
    if old in REMOVED:
        return ModuleNotFoundError(f"{old} was removed; {REMOVED[old]}", name=old)
    return ModuleNotFoundError(f"{old} moved to {MOVED[old]}: import it from there",
                               name=old)


def answers_moved_names(module):
    """The `__getattr__` (PEP 562) of `module`, a key of `MOVED_NAMES`:
    `from module import name` of a name that moved out of it raises an
    ImportError naming where it went; any other unknown name is Python's
    AttributeError."""
    def __getattr__(name):
        if name in MOVED_NAMES[module]:
            raise ImportError(f"{module}.{name} moved to {MOVED_NAMES[module][name]}: "
                              "import it from there", name=module)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return __getattr__


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Consulted after the real finders (so only for modules that do not
    exist): an old path raises `moved_error`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED or fullname in REMOVED:
            raise moved_error(fullname)
        return None


def install():
    """Adds the finder to `sys.meta_path` once, after the others."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
