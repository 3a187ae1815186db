"""What a library call must leave as it found it in the user's process: the
environment, the root logger, warning filters, hooks, signal handlers, the
global random generators and Keras's and TensorFlow's global settings.

`snapshot()` reads them (cheaply, nothing is created); `changes(before,
after)` names the entries that differ."""
import contextlib
import logging
import os
import random
import signal
import sys
import threading
import warnings

import numpy as np


def _logger(logger):
    return logger.level, logger.propagate, logger.disabled, tuple(map(id, logger.handlers))


def snapshot():
    """Returns a dict of the process-wide state (name: value), comparable with `==`."""
    import keras
    import tensorflow as tf
    from tensorflow.python.eager import context
    state = {f"env {k}": v for k, v in os.environ.items()}
    state.update({
        "cwd": os.getcwd(),
        "logger root": _logger(logging.root),
        "logger tensorflow": _logger(logging.getLogger("tensorflow")),
        "logging disabled": logging.root.manager.disable,
        "warnings filters": tuple(map(repr, warnings.filters)),
        "hooks": (sys.excepthook, sys.unraisablehook, threading.excepthook, sys.displayhook),
        "signals": tuple(signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)),
        "meta path": tuple(map(id, sys.meta_path)),
        "recursion limit": sys.getrecursionlimit(),
        "numpy errors": tuple(sorted(np.geterr().items())),
        "python random": random.getstate(),
        "numpy random": repr(np.random.get_state()),
        "tf global seed": context.global_seed(),
        "keras dtype policy": keras.config.dtype_policy().name,
        "keras floatx": keras.config.floatx(),
        "keras epsilon": keras.config.epsilon(),
        "keras image data format": keras.config.image_data_format(),
        "keras traceback filtering": keras.config.is_traceback_filtering_enabled(),
        "keras interactive logging": keras.config.is_interactive_logging_enabled(),
        "tf threads": (tf.config.threading.get_intra_op_parallelism_threads(),
                       tf.config.threading.get_inter_op_parallelism_threads()),
        "tf jit": tf.config.optimizer.get_jit(),
        "tf soft placement": tf.config.get_soft_device_placement(),
        "tf functions run eagerly": tf.config.functions_run_eagerly(),
        "tf tf32": tf.config.experimental.tensor_float_32_execution_enabled(),
    })
    return state


def changes(before, after):
    """The names whose values differ between two snapshots (sorted)."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


@contextlib.contextmanager
def unconfigured_logging():
    """Within: the root logger without handlers and the `absl` logger at
    NOTSET, as in a fresh process (pytest's capture handlers are put back,
    in the same list, on the way out)."""
    root, absl = logging.getLogger(), logging.getLogger("absl")
    handlers, level = root.handlers[:], absl.level
    root.handlers.clear()
    absl.setLevel(logging.NOTSET)
    try:
        yield
    finally:
        root.handlers[:] = handlers
        absl.setLevel(level)
