"""Whether this machine has NVIDIA's GPU driver loaded. Where it has, a
TensorFlow that lists no GPU is a setup to report (the training job says
so), and TensorFlow's CUDA lines at start-up give the reason: they are not
noise there (`stderr_filter`). Only the standard library is imported here.
"""
DRIVER_FILE = "/proc/driver/nvidia/version"  # Linux's NVIDIA kernel module writes it


def nvidia_driver(path=None):
    """The NVIDIA driver's version line, or None where no driver is loaded
    (no such file: no NVIDIA GPU, or another system than Linux).

    Args:
        path: the file to read (default `DRIVER_FILE`).

    Returns:
        The file's first line (str), or None.
    """
    try:
        with open(path or DRIVER_FILE, encoding="utf-8", errors="replace") as f:
            return f.readline().strip() or "an NVIDIA driver"
    except OSError:
        return None
