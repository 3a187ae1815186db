"""Export and serving of txl_tf models: SavedModel (TF Serving), ONNX (ONNX
Runtime), one runtime interface over both, and parity checks.

```python
from export import load_model, export_saved_model, export_onnx, open_runtime
loaded = load_model("runs/tiny")                       # config.json + weights.npz
export_saved_model(loaded.core, "out/saved_model", mem_len=64)
export_onnx(loaded.core, "out/model.onnx", mem_len=64)
rt = open_runtime("out/model.onnx")                    # or "out/saved_model"
log_probs, memory = rt.step(token_ids, rt.initial_memory(batch_size))
```
"""
# First: TensorFlow's C++ start-up noise stays out of stderr (`python -m export`
# imports this package, hence TensorFlow, before its __main__ runs).
import os as _os

from training.tf_startup import quiet_tensorflow_import as _quiet_tensorflow_import

# TensorFlow's oneDNN CPU allocator keeps every freed buffer for reuse and never
# gives it back: an export would hold on to the largest transient copies of the
# weights while onnxruntime loads its own. Read when TensorFlow starts, so only
# where this package is imported first (`python -m export` does).
_os.environ.setdefault("TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "1")
_quiet_tensorflow_import()

from export.input_checks import RuntimeInputError  # noqa: E402
from export.job import run_export
from export.metadata import ExportInfo, export_metadata
from export.model_dir import (ModelDirError, load_model, save_core_weights,
                              save_model_dir)
from export.onnx_export import export_onnx
from export.parity import ParityError, check_parity
from export.runtime import open_runtime
from export.runtime_base import Runtime, RuntimeMemory
from export.saved_model import export_saved_model
from export.serving_module import ServingModule

__all__ = ["ExportInfo", "ModelDirError", "ParityError", "Runtime", "RuntimeInputError",
           "RuntimeMemory", "ServingModule", "check_parity", "export_metadata",
           "export_onnx", "export_saved_model", "load_model", "open_runtime", "run_export",
           "save_core_weights", "save_model_dir"]
