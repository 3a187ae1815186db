"""Keeps TensorFlow's C++ start-up noise out of the user's log.

TF 2.21 logs through absl before `absl::InitializeLog()` runs, so
`TF_CPP_MIN_LOG_LEVEL` cannot silence lines such as `port.cc ... oneDNN`,
`cudart_stub.cc ... Could not find cuda drivers` or `failed call to cuInit`.
`install_quiet_import` (run when `txl_tf` is imported) makes TensorFlow's
first import in the process, whichever module asks for it (`first_imports`),
run with file descriptor 2 sent through a filter process (`stderr_filter`;
once it says it runs, else stderr stays as it is) while TensorFlow loads
and lists its devices (which is when cuInit runs): every line that is not
such noise goes on to stderr as it comes, so real errors still show, those
of a process that dies in the import too. On a machine with NVIDIA's driver
(`nvidia_driver`) the CUDA and GPU lines are not noise: they say why
TensorFlow lists no GPU there. Importing
`txl_tf` imports no TensorFlow itself: a process that serves an ONNX export
never loads it. Only the standard library (and `first_imports`) is imported
here.
"""
import contextlib
import os
import subprocess
import sys
import threading

from txl_tf.app import first_imports, stderr_filter
from txl_tf.app.nvidia_driver import nvidia_driver
from txl_tf.app.stderr_filter import NOISE  # noqa: F401 (the lines dropped)

# How long the import waits, once done, for the filter to write its last lines: it ends
# at once, unless a child process started meanwhile holds its pipe (then it goes on, and a
# thread waits for it).
FILTER_WAIT_S = 2.0
# How long the import waits for the filter to say it runs (else stderr stays as it is).
FILTER_START_S = 10.0


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
    """File descriptor 2 into a `stderr_filter` process for the block (where
    one starts: else the block runs as it is); the filter's last lines are
    written before the block's end returns."""
    try:
        _flush_stderr()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2: nothing to protect
        saved = None
    noise_filter = None if saved is None else _start_filter(saved)
    if noise_filter is None:
        if saved is not None:
            os.close(saved)
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):  # the filter killed: flushed after
            _flush_stderr()
        os.dup2(saved, 2)  # the pipe's last end here closed: the filter reads to its end
        os.close(saved)
        try:
            noise_filter.wait(timeout=FILTER_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        finally:  # past the wait, or a Ctrl-C in it: reaped when it ends (no zombie)
            if noise_filter.returncode is None:
                threading.Thread(target=noise_filter.wait, name="txl_tf stderr filter",
                                 daemon=True).start()


def _start_filter(stderr):
    """The `stderr_filter` process writing to `stderr` (a descriptor), with
    file descriptor 2 now its pipe; None where it cannot start."""
    command = _filter_command()
    if command is None:
        return None
    read, write = os.pipe()
    try:
        # A session of its own: the terminal's Ctrl-C (SIGINT to its foreground process
        # group) is the importing process's, not the filter's, which reads on to the end.
        process = subprocess.Popen(command, stdin=read, stdout=subprocess.PIPE,
                                   stderr=stderr, start_new_session=True)
    except (OSError, ValueError):  # no interpreter to run (an embedded Python), no processes
        os.close(write)
        return None
    finally:
        os.close(read)
    try:
        if _says_it_runs(process):
            os.dup2(write, 2)
            return process
        process.kill()  # no Python (uWSGI's sys.executable is uwsgi)
        process.wait()
        return None
    finally:
        os.close(write)


def _says_it_runs(process):
    """Whether `process` writes `stderr_filter.READY` to its stdout within
    `FILTER_START_S` (read in a thread: the same on every system)."""
    said = []

    def read():
        with process.stdout:
            said.append(process.stdout.read(len(stderr_filter.READY)))

    reader = threading.Thread(target=read, name="txl_tf stderr filter start", daemon=True)
    reader.start()
    reader.join(FILTER_START_S)
    return said == [stderr_filter.READY]


def _filter_command():
    """The command that runs `stderr_filter` (its source, not its file: the
    package may be in a zip archive); None in a frozen app, whose
    `sys.executable` is the app itself, or where the source is not there."""
    if getattr(sys, "frozen", False):
        return None
    try:
        source = stderr_filter.__loader__.get_source(stderr_filter.__name__)
    except (ImportError, OSError):
        return None
    if source is None:
        return None
    gpu_machine = ["gpu_machine"] if nvidia_driver() else []
    return [sys.executable, "-I", "-S", "-c", source, *gpu_machine]


@contextlib.contextmanager
def tensorflow_needed(what):
    """Turns the block's `ModuleNotFoundError` of TensorFlow (an ONNX Runtime
    serving box installs none) into an `ImportError` saying that `what`
    needs it and what works without it; other errors pass as they are.

    Args:
        what: what needs TensorFlow, for the message (`txl_tf.TransformerXL`).
    """
    try:
        yield
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] != "tensorflow":
            raise
        raise ImportError(f"{what} needs TensorFlow, which is not installed ({missing}); "
                          "without it only ONNX Runtime serves: export.open_runtime on an "
                          "export's model.onnx") from None


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
