"""Export and serving of txl_tf models: SavedModel (TF Serving), ONNX (ONNX
Runtime), a Triton Inference Server model repository, one runtime interface
over SavedModel and ONNX, and parity checks.

```python
from export import (export_classifier, export_onnx, export_saved_model, open_classifier,
                    open_runtime, write_triton_repository)
from txl_tf.weights import load_pretrained
core = load_pretrained("runs/tiny")                    # config.json + weights.npz
export_saved_model(core, "out/saved_model", mem_len=64)
export_onnx(core, "out/model.onnx", mem_len=64)
write_triton_repository(core, "out/triton", mem_len=64)  # txl/config.pbtxt, txl/1/
rt = open_runtime("out/model.onnx")                    # or "out/saved_model"
log_probs, memory = rt.step(token_ids, rt.initial_memory(batch_size))

export_classifier(classifier, "out/cls")                # TransformerXLClassifier
probs = open_classifier("out/cls").probabilities(token_ids, lengths)
```
"""
import importlib
import importlib.util
import sys
from pathlib import Path


def _moved_modules():
    """`txl_tf.app.moved_modules`, its finder installed: an old module path
    (`import export.host_cache`) names where it went from the first import
    on. The module is standard library only; it is read from its file when
    `txl_tf` is not imported yet, because importing it as a submodule would
    run `txl_tf/__init__.py`, which imports TensorFlow."""
    name = "txl_tf.app.moved_modules"
    if name not in sys.modules:
        txl_tf = importlib.util.find_spec("txl_tf")
        spec = importlib.util.spec_from_file_location(
            name, Path(txl_tf.submodule_search_locations[0], "app", "moved_modules.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    sys.modules[name].install()
    return sys.modules[name]


_MOVED = _moved_modules()

# Names are imported on first use (PEP 562), so `python -m export` can quiet
# TensorFlow's start-up before anything here imports it.
_SOURCES = {
    "ExportError": "export.job", "run_export": "export.job",
    "ClassifierRuntime": "export.classifier", "export_classifier": "export.classifier",
    "open_classifier": "export.classifier",
    "ExportInfo": "export.metadata", "export_metadata": "export.metadata",
    "ModelDirError": "txl_tf.errors",
    "export_onnx": "export.onnx_export",
    "ParityError": "export.parity", "check_parity": "export.parity",
    "Runtime": "export.runtime", "RuntimeMemory": "export.runtime",
    "RuntimeInputError": "export.runtime",
    "ServingModule": "export.saved_model", "export_saved_model": "export.saved_model",
    "SessionTable": "export.sessions",
    "triton_model_config": "export.triton", "write_triton_repository": "export.triton",
}
# Removed names -> what replaces them (export/model_dir.py was a layer over
# txl_tf.weights).
_REMOVED = {
    "load_model": "txl_tf.weights.load_pretrained(model_dir) (or txl_tf.weights.model_dir.load "
                  "for the files it came from)",
    "save_model_dir": "txl_tf.weights.save_pretrained(core, model_dir, tokenizer)",
    "save_core_weights": "txl_tf.weights.checkpoints.save_weights(core, path)",
}
__all__ = sorted([*_SOURCES, "open_runtime"])


def open_runtime(path, device="auto", backend="auto", **options):
    """Opens an exported model for inference.

    Args:
        path: a `.onnx` file, a SavedModel directory, or an export output
            directory holding `model.onnx` and/or `saved_model/`.
        device: `auto` (CUDA when available), `cuda`/`gpu` (falls back to
            the CPU with a warning) or `cpu`.
        backend: which artefact of a directory: `auto` (prefers ONNX),
            `onnx` or `saved_model`.
        **options: go to the backend: ONNX's (`io_binding`,
            `session_options`, `low_memory`, ...: `export.onnx_runtime.OnnxRuntime`;
            `export.runtime.BACKEND_OPTIONS`); the SavedModel backend takes
            none. One the opened backend does not take is a `TxlError`
            naming the backend it belongs to.

    Returns:
        A `Runtime`.

    Raises:
        ImportError: a SavedModel where TensorFlow is not installed.
    """
    # Here, above the backends (which build on export.runtime), and imported
    # when called, so that `import export` stays light.
    from export.runtime import check_options, choose_artefact
    backend, found = choose_artefact(path, backend)
    check_options(backend, found, options)
    if backend == "onnx":
        from export.onnx_runtime import OnnxRuntime
        return OnnxRuntime(found, device=device, **options)
    from txl_tf.app.tf_startup import tensorflow_needed
    with tensorflow_needed(f"{found} (a SavedModel)"):
        from export.tf_runtime import SavedModelRuntime
    return SavedModelRuntime(found, device=device, **options)


def __getattr__(name):
    if f"export.{name}" in _MOVED.MOVED or f"export.{name}" in _MOVED.REMOVED:
        raise _MOVED.moved_error(f"export.{name}")  # `from export import host_cache`
    if name in _REMOVED:
        raise AttributeError(f"export.{name} was removed; use {_REMOVED[name]}")
    if name not in _SOURCES:
        raise AttributeError(f"module 'export' has no attribute {name!r}")
    # txl_tf first: importing it starts TensorFlow without its C++ start-up
    # lines, which the export modules' own `import tensorflow` / `import
    # keras` (above their txl_tf imports) printed, in a notebook's cell too.
    importlib.import_module("txl_tf")
    value = getattr(importlib.import_module(_SOURCES[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
