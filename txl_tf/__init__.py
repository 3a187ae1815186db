"""txl_tf: Transformer-XL for TensorFlow 2 / Keras 3.

The model: `TransformerXLConfig` (every hyper-parameter, presets), the pure
core `TransformerXL` (`(token_ids, memory) -> (outputs, new_memory)`), the
stateful Keras model `TransformerXLLM`, the classifier, the decoder. The
folders hold one idea each: `layers/`, `generation/`, `weights/`, `data/`,
`text/`, `classification/`, `learning/`, `keras_support/`, `checks/`, `app/`.

Importing the package imports TensorFlow without its start-up noise on
stderr (`txl_tf.app.tf_startup`; real errors are still shown, and TF's C++
log level defaults to warnings-off unless `TF_CPP_MIN_LOG_LEVEL` is set).
"""
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from txl_tf.app.tf_startup import quiet_tensorflow_import  # noqa: E402

quiet_tensorflow_import()

from txl_tf.checks.inputs import InputError, NonFiniteMemoryError  # noqa: E402
from txl_tf.classification.classifier import TransformerXLClassifier  # noqa: E402
from txl_tf.config import PRESETS, ConfigError, TransformerXLConfig  # noqa: E402
from txl_tf.core import TransformerXL  # noqa: E402
from txl_tf.errors import TxlError  # noqa: E402
from txl_tf.generation.decoder import Decoder  # noqa: E402
from txl_tf.generation.request import DecodeState, Generation  # noqa: E402
from txl_tf.generation.sampling import Sampling  # noqa: E402
from txl_tf.layers.memory import Memory  # noqa: E402
from txl_tf.learning.optimizer import ReplicaClippedAdam  # noqa: E402
from txl_tf.learning.schedule import WarmupCosineDecay  # noqa: E402
from txl_tf.model import TransformerXLLM  # noqa: E402

__all__ = ["PRESETS", "ConfigError", "DecodeState", "Decoder", "Generation", "InputError",
           "Memory", "NonFiniteMemoryError", "ReplicaClippedAdam", "Sampling", "TransformerXL",
           "TransformerXLClassifier", "TransformerXLConfig", "TransformerXLLM", "TxlError",
           "WarmupCosineDecay"]
__version__ = "0.1.0"
