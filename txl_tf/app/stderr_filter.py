"""Copies standard input to standard error without TensorFlow's C++
start-up noise (`NOISE`), line by line as the lines come.

`tf_startup` runs this file as a process of its own between TensorFlow's
first import and the process's stderr: what TensorFlow writes there before
it dies (an abort on a CPU it cannot run on, a failed check) still gets
through, and so does what a child process started meanwhile writes later
(it inherited the pipe). Standard library only; its source is run
(`python -I -S -c <source>`: the package may be in a zip archive), so it
imports nothing of the package. Its argument `gpu_machine` (a machine with
NVIDIA's driver, `nvidia_driver`) keeps TensorFlow's lines about CUDA and
the GPU: there they say why TensorFlow does not use the GPU.
"""
import os
import re
import signal
import sys

NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|[IW]\d{4} [\d:. ]+\d+ [\w.]+(?<!\.py):\d+\]"  # C++ INFO / WARNING (not Python's absl)
    r"|E\d{4} [\d:. ]+\d+ [\w.]+:\d+\] .*(cuInit|CUDA|cuda|cuDNN|cuFFT|cuBLAS|factory)"
    r"|To enable the following instructions:)")
# On a machine with a GPU driver: the lines of TensorFlow's GPU stack, but for the
# libraries registering twice (noise everywhere).
GPU_LINE = re.compile(r"cuda|cuinit|cudnn|cufft|cublas|gpu|dlopen|dso_loader|nvidia", re.I)
REGISTERED_TWICE = re.compile(r"Unable to register \w+ factory")
READY = b"ready\n"  # written to standard output as it starts to copy


def is_noise(line, gpu_machine=False):
    """Whether `line` (bytes) is one of TensorFlow's start-up lines (where
    `gpu_machine`, not one about CUDA or the GPU, which says why the GPU is
    not used there)."""
    text = line.decode("utf-8", errors="replace")
    if NOISE.match(text) is None:
        return False
    return not gpu_machine or not GPU_LINE.search(text) or bool(REGISTERED_TWICE.search(text))


def copy_without_noise(source, target, gpu_machine=False):
    """Copies file descriptor `source` to `target` until its end, each
    complete line as it comes, without the lines that `is_noise`.

    Args:
        source: the descriptor read (the pipe).
        target: the descriptor written (stderr).
        gpu_machine: `is_noise`'s.
    """
    pending = b""
    while True:
        chunk = os.read(source, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        _write(target, b"".join(line + b"\n" for line in lines
                                if not is_noise(line, gpu_machine)))
    if pending and not is_noise(pending, gpu_machine):
        _write(target, pending)


def _write(target, data):
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(target, view):]
    except OSError:  # stderr a closed pipe: dropped, as the writer's own would be; read on
        pass


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the writer's (Windows: no sessions)
    os.write(1, READY)
    copy_without_noise(0, 2, gpu_machine="gpu_machine" in sys.argv[1:])
