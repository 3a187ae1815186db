"""txl_tf: Transformer-XL for TensorFlow 2 / Keras 3.

The model: `TransformerXLConfig` (every hyper-parameter, presets), the pure
core `TransformerXL` (`(token_ids, memory) -> (outputs, new_memory)`), the
keras-hub family (`TransformerXLCausalLM` and its backbone, preprocessor and
tokenizer: `from_preset`, `generate`, samplers), the stateful Keras model
`TransformerXLLM`, the classifier, the decoder. The
folders hold one idea each: `layers/`, `models/`, `generation/`, `weights/`,
`baselines/`, `data/`, `text/`, `classification/`, `learning/`,
`keras_support/`, `checks/`, `app/`.

Importing the package imports no TensorFlow: the model's names
(`TransformerXL`, `TransformerXLLM`, ...) import it when first used, and
TensorFlow's first import in the process, whoever asks for it, leaves out
its start-up noise on stderr (`txl_tf.app.tf_startup`; real errors are still
shown, and TF's C++ log level defaults to warnings-off unless
`TF_CPP_MIN_LOG_LEVEL` is set). So a process that serves the ONNX export with
onnxruntime never loads TensorFlow, installed or not: the ONNX Runtime
runtime and its host loop need none of it, nor do the config, the errors,
`Sampling`, `Generation` and `DecodeState`. Where TensorFlow is not
installed, the model's names raise an ImportError that says so.
"""
import importlib.util
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from txl_tf.app.closed_streams import fill_closed_streams  # noqa: E402

fill_closed_streams()  # `2>&-`: before anything opens a file or writes to stderr

from txl_tf.app import moved_modules  # noqa: E402
from txl_tf.app.exits import quiet_interrupts  # noqa: E402
from txl_tf.app.first_imports import when_keras_is_imported  # noqa: E402
from txl_tf.app.tf_startup import (install_quiet_import,  # noqa: E402
                                   quiet_tensorflow_import, require_tensorflow_backend,
                                   tensorflow_needed)
# Without TensorFlow too:
from txl_tf.checks.numpy_checks import InputError, NonFiniteMemoryError  # noqa: E402
from txl_tf.config import PRESETS, ConfigError, TransformerXLConfig  # noqa: E402
from txl_tf.errors import TxlError  # noqa: E402
from txl_tf.generation.nan_rows import NonFiniteLogProbsError  # noqa: E402
from txl_tf.generation.request import DecodeState, Generation  # noqa: E402
from txl_tf.generation.sampling_settings import Sampling  # noqa: E402

# A Ctrl-C during TensorFlow's long import: `interrupted`, not a traceback;
# one that lands in a `__del__` is not lost (in the project's commands only).
quiet_interrupts()
install_quiet_import()
try:
    _TENSORFLOW_INSTALLED = importlib.util.find_spec("tensorflow") is not None
except ModuleNotFoundError:  # a finder that refuses it (a test's stand-in for a box without it)
    _TENSORFLOW_INSTALLED = False
if _TENSORFLOW_INSTALLED:
    require_tensorflow_backend()

# The names that need TensorFlow, and their modules: imported on first use (`__getattr__`).
_TENSORFLOW_NAMES = {
    "TransformerXLClassifier": "txl_tf.classification.classifier",
    "TransformerXL": "txl_tf.core",
    "Decoder": "txl_tf.generation.decoder",
    "Memory": "txl_tf.layers.memory",
    "ReplicaClippedAdam": "txl_tf.learning.optimizer",
    "WarmupCosineDecay": "txl_tf.learning.schedule",
    "TransformerXLLM": "txl_tf.model",
    **dict.fromkeys(("TransformerXLBackbone", "TransformerXLCausalLM",
                     "TransformerXLCausalLMPreprocessor", "TransformerXLTokenizer"),
                    "txl_tf.models.transformer_xl"),
}


def _register_with_keras():
    """Imports the modules of `_TENSORFLOW_NAMES`, whose classes (and those
    of the modules they import) Keras finds by registered name when it loads
    a `.keras` file or a keras-hub preset; on another Keras backend, none.
    It runs inside the import that brought Keras in (the user's `import
    keras`): a module that fails (a dependency missing, or one for another
    Keras) is not that import's to fail, nor the others' to go unregistered;
    its name raises the error when used."""
    import keras
    if keras.config.backend() != "tensorflow":
        return
    for module in dict.fromkeys(_TENSORFLOW_NAMES.values()):
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 (see above)
            pass

__all__ = ["PRESETS", "ConfigError", "DecodeState", "Decoder", "Generation", "InputError", "Memory",
           "NonFiniteLogProbsError", "NonFiniteMemoryError", "ReplicaClippedAdam", "Sampling",
           "TransformerXL", "TransformerXLBackbone", "TransformerXLCausalLM",
           "TransformerXLCausalLMPreprocessor", "TransformerXLClassifier", "TransformerXLConfig",
           "TransformerXLLM", "TransformerXLTokenizer", "TxlError", "WarmupCosineDecay"]
# setup.py reads it; CHANGELOG.md says what each release changed.
__version__ = "0.4.0"


moved_modules.install()


def __getattr__(name):
    if f"txl_tf.{name}" in moved_modules.MOVED:  # `from txl_tf import checkpoints`
        raise moved_modules.moved_error(f"txl_tf.{name}")
    if name not in _TENSORFLOW_NAMES:
        raise AttributeError(f"module 'txl_tf' has no attribute {name!r}")
    with tensorflow_needed(f"txl_tf.{name}"):
        quiet_tensorflow_import()
    value = globals()[name] = getattr(importlib.import_module(_TENSORFLOW_NAMES[name]), name)
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


# Keras comes with TensorFlow (each imports the other): where it is imported,
# now or later, the classes are registered (after the package's module whose
# import imported it, when one did: `import txl_tf.core` as a first import).
when_keras_is_imported(_register_with_keras, package="txl_tf")
