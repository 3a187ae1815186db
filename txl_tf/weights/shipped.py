"""Trained models shipped inside the package, read by name wherever a model
directory is accepted (`from_preset("pystdlib_small")`,
`load_pretrained("pystdlib_small")`, `txl-evaluate --model_dir=pystdlib_small`).

Each is a model directory under `txl_tf/weights/shipped/<name>/` with a
`TRAINING.md` saying how it was trained (the command, the steps, the time).
"""
import os

SHIPPED_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shipped")
SHIPPED = {
    "pystdlib_small": "the small preset (0.89M parameters) trained on this Python's standard "
                      "library, bytes, memory 128: the demo's and the tour's model",
}


def shipped_model_dir(name):
    """The folder of the shipped model `name`, or None when `name` is not
    one (or is an existing path, which wins)."""
    name = os.fspath(name)
    if name not in SHIPPED or os.path.exists(name):
        return None
    return os.path.join(SHIPPED_ROOT, name)
