"""Keeps TensorFlow's C++ start-up noise out of the user's log.

TF 2.21 logs through absl before `absl::InitializeLog()` runs, so
`TF_CPP_MIN_LOG_LEVEL` cannot silence lines such as `port.cc ... oneDNN`,
`cudart_stub.cc ... Could not find cuda drivers` or `failed call to cuInit`.
`install_quiet_import` (run when `txl_tf` is imported) makes TensorFlow's
first import in the process, whichever module asks for it (`first_imports`),
run with file descriptor 2 sent to a temporary file while TensorFlow loads
and lists its devices (which is when cuInit runs); then it restores it and
replays every captured line that is not such noise, so real errors still
show. Importing `txl_tf` imports no TensorFlow itself: a process that serves
an ONNX export never loads it. Only the standard library (and
`first_imports`) is imported here.
"""
import contextlib
import os
import re
import sys
import tempfile

from txl_tf.app import first_imports

NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|[IW]\d{4} [\d:. ]+\d+ [\w.]+(?<!\.py):\d+\]"  # C++ INFO / WARNING (not Python's absl)
    r"|E\d{4} [\d:. ]+\d+ [\w.]+:\d+\] .*(cuInit|CUDA|cuda|cuDNN|cuFFT|cuBLAS|factory)"
    r"|To enable the following instructions:)")


def quiet_tensorflow_import():
    """Imports TensorFlow once, without its start-up noise on stderr
    (`install_quiet_import`), and returns it.

    A no-op when TensorFlow is already imported. Sets `TF_CPP_MIN_LOG_LEVEL`
    to 2 (unless set) for the C++ log after start-up.
    """
    if "tensorflow" not in sys.modules:
        install_quiet_import()
    import tensorflow as tf
    return tf


def install_quiet_import():
    """Makes the process's first `import tensorflow`, whoever runs it, drop
    TensorFlow's start-up noise from stderr (`first_imports`)."""
    first_imports.install({"tensorflow": _quiet_start})


@contextlib.contextmanager
def _quiet_start():
    """TensorFlow's first import, and its device listing, with the noise
    dropped."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    with _noise_dropped():
        yield
        sys.modules["tensorflow"].config.list_physical_devices()


@contextlib.contextmanager
def _noise_dropped():
    """File descriptor 2 into a temporary file for the block; then the lines
    that are not `NOISE` written back to it, as they came (not through
    `sys.stderr`: a line a Python stream wrote to the descriptor, a tee's
    too, would have been written twice where that stream also writes)."""
    try:
        _flush_stderr()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2: nothing to protect
        saved = None
    if saved is None:
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            _flush_stderr()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            _replay(capture.read())


def require_tensorflow_backend():
    """Raises ImportError unless Keras runs (or will run) on its TensorFlow
    backend: the one already imported, else `KERAS_BACKEND`'s, which
    `quiet_tensorflow_import` defaults to TensorFlow (Keras reads
    ~/.keras/keras.json only where the variable is unset)."""
    keras = sys.modules.get("keras")
    config = getattr(keras, "config", None)
    backend = config.backend() if config is not None else os.environ.get("KERAS_BACKEND")
    if backend != "tensorflow":
        raise ImportError(f"txl_tf runs on Keras's TensorFlow backend, but Keras's backend is "
                          f"{backend!r} (KERAS_BACKEND or ~/.keras/keras.json): unset "
                          f"KERAS_BACKEND or set it to 'tensorflow'")


def _flush_stderr():
    flush = getattr(sys.stderr, "flush", None)  # a program may set sys.stderr to None
    if flush is not None:
        flush()


def _replay(data):
    kept = memoryview(b"".join(line for line in data.splitlines(keepends=True)
                               if not NOISE.match(line.decode("utf-8", errors="replace"))))
    try:
        while kept:
            kept = kept[os.write(2, kept):]
    except OSError:  # stderr a closed pipe: TensorFlow's own writes fail silently
        pass
