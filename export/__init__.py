"""Export and serving of txl_tf models: SavedModel (TF Serving), ONNX (ONNX
Runtime), a Triton Inference Server model repository, one runtime interface
over SavedModel and ONNX, and parity checks.

```python
from export import load_model, export_saved_model, export_onnx, open_runtime
loaded = load_model("runs/tiny")                       # config.json + weights.npz
export_saved_model(loaded.core, "out/saved_model", mem_len=64)
export_onnx(loaded.core, "out/model.onnx", mem_len=64)
write_triton_repository(loaded.core, "out/triton", mem_len=64)  # txl/config.pbtxt, txl/1/
rt = open_runtime("out/model.onnx")                    # or "out/saved_model"
log_probs, memory = rt.step(token_ids, rt.initial_memory(batch_size))

export_classifier(classifier, "out/cls")                # TransformerXLClassifier
probs = open_classifier("out/cls").probabilities(token_ids, lengths)
```
"""
import importlib

# Names are imported on first use (PEP 562), so `python -m export` can quiet
# TensorFlow's start-up before anything here imports it.
_SOURCES = {
    "ExportError": "export.job", "run_export": "export.job",
    "export_classifier": "export.classifier_export",
    "ClassifierRuntime": "export.classifier_runtime",
    "open_classifier": "export.classifier_runtime",
    "ExportInfo": "export.metadata", "export_metadata": "export.metadata",
    "ModelDirError": "export.model_dir", "load_model": "export.model_dir",
    "save_core_weights": "export.model_dir", "save_model_dir": "export.model_dir",
    "export_onnx": "export.onnx_export",
    "ParityError": "export.parity", "check_parity": "export.parity",
    "open_runtime": "export.runtime",
    "Runtime": "export.runtime_base", "RuntimeMemory": "export.runtime_base",
    "RuntimeInputError": "export.input_checks",
    "export_saved_model": "export.saved_model",
    "ServingModule": "export.serving_module",
    "SessionTable": "export.sessions",
    "triton_model_config": "export.triton", "write_triton_repository": "export.triton",
}
__all__ = sorted(_SOURCES)


def __getattr__(name):
    if name not in _SOURCES:
        raise AttributeError(f"module 'export' has no attribute {name!r}")
    value = getattr(importlib.import_module(_SOURCES[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
