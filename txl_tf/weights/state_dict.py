"""Reading PyTorch state dicts as numpy arrays, without pickle.

`.safetensors` files are read with the `safetensors` package (numpy API,
lazily: shapes first, one array when asked). `.bin` / `.pt` / `.pth` files
are pickles; they are read only through `torch.load(weights_only=True)`,
which builds tensors and plain containers and refuses anything else, and only
when PyTorch is installed. There is no plain-unpickle path.
"""
import os
import re
from collections.abc import Mapping

import numpy as np

from txl_tf.errors import TxlError

SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
# Containers that training scripts wrap a state dict in.
_NESTED_KEYS = ("state_dict", "model_state_dict", "model")


class StateDictError(TxlError):
    """A weights file is missing, unreadable or not a state dict of tensors."""


class StateDict(Mapping):
    """`{name: numpy array}` read lazily; `shape(name)` without reading."""

    def __init__(self, shapes, read, path):
        self._shapes, self._read, self.path = dict(shapes), read, path

    def shape(self, name):
        return self._shapes[name]

    def __getitem__(self, name):
        if name not in self._shapes:
            raise KeyError(name)
        return self._read(name)

    def __iter__(self):
        return iter(self._shapes)

    def __len__(self):
        return len(self._shapes)


def from_arrays(arrays, path="<state dict>"):
    """A `StateDict` over an in-memory mapping of arrays (or torch tensors)."""
    values = {str(k): _to_numpy(v, k, path) for k, v in arrays.items()}
    return StateDict({k: v.shape for k, v in values.items()}, values.__getitem__, path)


def read_state_dict(path):
    """A `StateDict` of the file at `path` (safetensors, or a torch pickle)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise StateDictError(f"weights file not found: {path}")
    if path.endswith(SAFETENSORS_SUFFIXES):
        return _read_safetensors(path)
    if path.endswith(TORCH_SUFFIXES):
        return _read_torch(path)
    raise StateDictError(f"{path}: unknown weights format; expected {SAFETENSORS_SUFFIXES} "
                         f"or a PyTorch state dict {TORCH_SUFFIXES}")


def _read_safetensors(path):
    try:
        from safetensors import safe_open
    except ImportError:
        raise StateDictError("reading .safetensors needs the safetensors package "
                             "(pip install safetensors)") from None
    try:
        handle = safe_open(path, framework="np")
        shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
    except Exception as err:  # safetensors raises its own SafetensorError
        raise StateDictError(f"cannot read {path} as safetensors: {err}") from None

    def read(name):
        try:
            return handle.get_tensor(name)
        except Exception as err:  # e.g. bfloat16, which numpy lacks
            raise StateDictError(f"cannot read tensor {name} of {path}: {err}") from None
    return StateDict(shapes, read, path)


def _read_torch(path):
    try:
        import torch
    except ImportError:
        raise StateDictError(
            f"{path} is a PyTorch pickle: reading it needs PyTorch (pip install torch; it is "
            "then read with torch.load(weights_only=True)), or convert it to .safetensors "
            "first") from None
    import pickle
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise StateDictError(
            f"{path} is not a plain state dict: torch.load(weights_only=True) refused it "
            f"({_refusal(err)}). The paper's code saves the whole model object; load it there "
            "and save model.state_dict() (ideally as .safetensors)") from None
    except (RuntimeError, EOFError, OSError) as err:
        raise StateDictError(f"cannot read {path}: {err}") from None
    for key in _NESTED_KEYS:
        if isinstance(loaded, Mapping) and isinstance(loaded.get(key), Mapping):
            loaded = loaded[key]
            break
    if not isinstance(loaded, Mapping):
        raise StateDictError(f"{path} holds a {type(loaded).__name__}, not a state dict")
    return from_arrays(loaded, path)


def _refusal(err):
    """The reason in torch.load's refusal: not its advice to load with
    weights_only=False (torch >= 2.6 puts that first, and alone before a
    blocked module's global), nor terminal escapes. The reason follows
    "WeightsUnpickler error:" (on its line, or from torch 2.7 on the next)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
    prefix, marker, after = text.partition("WeightsUnpickler error:")
    refused = prefix.lstrip().startswith("Weights only load failed.")
    for line in (after if marker else text).splitlines():
        line = line.strip()
        if not marker and refused:
            line = line.removeprefix("Weights only load failed.").strip()
            if "weights_only" in line or line.startswith("Check the documentation"):
                continue  # torch's advice, not the reason
        if line:
            return line.split(". ")[0].rstrip(".") if refused else line
    return type(err).__name__


def _to_numpy(value, name, path):
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        try:
            value = value.numpy()
        except (RuntimeError, TypeError) as err:  # sparse, quantized, float8, ...
            # "Numpy is not available": torch < 2.3 (built for numpy 1) beside numpy 2.
            advice = ("; a torch older than 2.3 needs numpy < 2 (pip install 'torch>=2.3', or "
                      "'numpy<2')" if "Numpy is not available" in str(err) else
                      " (a plain dense floating-point tensor is what loads)")
            raise StateDictError(f"{path}: entry {name!r} cannot be handed to numpy "
                                 f"{np.__version__} ({err}){advice}") from None
    if not isinstance(value, np.ndarray):
        raise StateDictError(f"{path}: entry {name!r} is a {type(value).__name__}, not a tensor")
    return value
