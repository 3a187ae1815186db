"""txl_tf: Transformer-XL for TensorFlow 2 / Keras 3."""
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from txl_tf.config import PRESETS, ConfigError, TransformerXLConfig  # noqa: E402
from txl_tf.core import TransformerXL  # noqa: E402
from txl_tf.layers.memory import Memory  # noqa: E402
from txl_tf.model import TransformerXLLM  # noqa: E402
from txl_tf.classifier import TransformerXLClassifier  # noqa: E402
from txl_tf.optimizer import ReplicaClippedAdam  # noqa: E402
from txl_tf.schedule import WarmupCosineDecay  # noqa: E402
from txl_tf.validation import InputError, NonFiniteMemoryError  # noqa: E402

__all__ = ["PRESETS", "ConfigError", "InputError", "Memory", "NonFiniteMemoryError",
           "ReplicaClippedAdam", "TransformerXL", "TransformerXLClassifier",
           "TransformerXLConfig", "TransformerXLLM", "WarmupCosineDecay"]
__version__ = "0.1.0"

from txl_tf.decode_request import DecodeState, Generation  # noqa: E402
from txl_tf.decoder import Decoder  # noqa: E402
from txl_tf.sampling import Sampling  # noqa: E402

__all__ += ["DecodeState", "Decoder", "Generation", "Sampling"]
