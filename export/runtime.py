"""`open_runtime`: one entry point over an exported ONNX file or SavedModel."""
import os

from export.metadata import DECODE_FILES
from txl_tf.errors import TxlError

ONNX_FILE = "model.onnx"
SAVED_MODEL_DIR = "saved_model"


def open_runtime(path, device="auto", backend="auto", **options):
    """Opens an exported model for inference.

    `path` is a `.onnx` file, a SavedModel directory, or an export output
    directory holding `model.onnx` and/or `saved_model/` (`backend` picks:
    `auto` prefers ONNX, else `onnx` or `saved_model`). `device` is `auto`
    (CUDA when available), `cuda`/`gpu` (falls back to the CPU with a warning)
    or `cpu`. Extra `options` go to the backend (`io_binding`,
    `session_options`, `low_memory` for ONNX: `export.onnx_runtime.OnnxRuntime`).
    Returns a `Runtime`.
    """
    backend, found = choose_artefact(path, backend)
    if backend == "onnx":
        from export.onnx_runtime import OnnxRuntime
        return OnnxRuntime(found, device=device, **options)
    from export.tf_runtime import SavedModelRuntime
    return SavedModelRuntime(found, device=device, **options)


def choose_artefact(path, backend="auto"):
    """`("onnx" | "saved_model", its path)` for an export at `path` (see
    `open_runtime`; `auto` prefers ONNX); FileNotFoundError when absent."""
    if backend not in ("auto", "onnx", "saved_model"):
        raise TxlError(f"backend must be auto, onnx or saved_model, got {backend!r}")
    onnx_path, saved_model_path = _locate(path)
    if backend == "auto":
        backend = "onnx" if onnx_path else "saved_model"
    if backend == "onnx" and not onnx_path:
        raise FileNotFoundError(f"no ONNX model at {path!r}")
    if backend == "saved_model" and not saved_model_path:
        raise FileNotFoundError(f"no SavedModel at {path!r}")
    return backend, onnx_path if backend == "onnx" else saved_model_path


def _locate(path):
    if os.path.isfile(path):
        name = os.path.basename(path)
        if name in DECODE_FILES.values():
            raise TxlError(f"{path} is one of the cached decode interface's graphs, which the "
                           f"runtime opens itself beside {ONNX_FILE}: open "
                           f"{os.path.join(os.path.dirname(path) or '.', ONNX_FILE)} or its folder")
        return (path if path.endswith(".onnx") else None), None
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path!r} is neither an ONNX file nor a directory")
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return None, path
    onnx_path = os.path.join(path, ONNX_FILE)
    saved = os.path.join(path, SAVED_MODEL_DIR)
    return (onnx_path if os.path.isfile(onnx_path) else None,
            saved if os.path.isfile(os.path.join(saved, "saved_model.pb")) else None)
