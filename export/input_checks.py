"""Checks of runtime inputs, done on shapes and values before any session runs."""
import numpy as np

from txl_tf.checks.numpy_checks import InputError, out_of_range_message


class RuntimeInputError(InputError):
    """Token ids or memory handed to a runtime do not fit the exported model."""


def shape_and_dtype(value):
    """`(shape tuple, numpy dtype)` of a numpy array, tf.Tensor or OrtValue."""
    if hasattr(value, "data_type") and callable(getattr(value, "shape", None)):  # OrtValue
        onnx_type = value.data_type()
        dtype = _ONNX_TYPES.get(onnx_type)
        return tuple(value.shape()), np.dtype(dtype) if dtype else onnx_type
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        dtype = getattr(value.dtype, "as_numpy_dtype", value.dtype)
        return tuple(int(d) for d in value.shape), np.dtype(dtype)
    array = np.asarray(value)
    return array.shape, array.dtype


_ONNX_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
               "tensor(float16)": np.float16, "tensor(bool)": np.bool_,
               "tensor(int32)": np.int32, "tensor(int64)": np.int64}


def check_ids(token_ids, n_token, name="token_ids"):
    """Returns the ids as an int32 numpy array `[B, T]` or raises `RuntimeInputError`."""
    ids = token_ids.numpy() if hasattr(token_ids, "numpy") else np.asarray(token_ids)
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise RuntimeInputError(f"{name} must have an integer dtype, got {ids.dtype}")
    if ids.ndim != 2 or 0 in ids.shape:
        raise RuntimeInputError(f"{name} must be a non-empty [batch, length] array, "
                                f"got shape {ids.shape}")
    problem = out_of_range_message(ids, n_token, f"{name}:")
    if problem:
        raise RuntimeInputError(problem)
    return ids.astype(np.int32, copy=False)


def check_memory(mems, mem_mask, n_layer, mem_len, d_model, batch_size):
    """Raises `RuntimeInputError` unless mems are float32 `[n_layer, B, M, d_model]`
    and mem_mask is bool `[B, M]` with the exported M and the ids' batch B."""
    m_shape, s_dtype = shape_and_dtype(mems)
    v_shape, v_dtype = shape_and_dtype(mem_mask)
    if s_dtype != np.float32:
        raise RuntimeInputError(f"mems must be float32, got {s_dtype}")
    if v_dtype != np.bool_:
        raise RuntimeInputError(f"mem_mask must be bool, got {v_dtype}")
    want = (n_layer, batch_size, mem_len, d_model)
    if len(m_shape) == 4 and m_shape[1] != batch_size and (
            m_shape[0], m_shape[2], m_shape[3]) == (n_layer, mem_len, d_model):
        raise RuntimeInputError(f"batch mismatch: token_ids have batch {batch_size} but the "
                                f"memory has batch {m_shape[1]}")
    if tuple(m_shape) != want:
        raise RuntimeInputError(
            f"mems must have shape [n_layer, batch, mem_len, d_model] = {list(want)}"
            f" for this export (mem_len fixed at {mem_len}), got {list(m_shape)}")
    if tuple(v_shape) != (batch_size, mem_len):
        raise RuntimeInputError(f"mem_mask must have shape [batch, mem_len] = "
                                f"{[batch_size, mem_len]}, got {list(v_shape)}")


_CACHE_DTYPES = {"valid": np.bool_, "slot": np.int32, "row_slot": np.int32}


def check_decode_cache(cache, expected_shapes, batch_size=None):
    """Raises `RuntimeInputError` unless `cache` is a decode cache of this
    export: a dict with every name of `expected_shapes` (`decode_interface.
    cache_shapes` with the batch axis named "batch"), each of that shape and
    dtype (float32 but for `valid` bool, `slot` and `row_slot` int32), one
    batch (the ids' when `batch_size` is given), and ring positions inside the
    ring. Returns the batch size."""
    if not isinstance(cache, dict):
        raise RuntimeInputError(f"a decode cache is the dict decode_init returns, got "
                                f"{type(cache).__name__}")
    missing = [name for name in expected_shapes if name not in cache]
    if missing:
        raise RuntimeInputError(f"decode cache is missing {missing} (pass the dict "
                                f"decode_init or decode_step returned)")
    shapes = {name: shape_and_dtype(cache[name]) for name in expected_shapes}
    batch = shapes["valid"][0][0] if len(shapes["valid"][0]) == 2 else None
    if batch_size is not None and batch is not None and batch != batch_size:
        raise RuntimeInputError(f"batch mismatch: token_ids have batch {batch_size} but the "
                                f"decode cache has batch {batch}")
    for name, want in expected_shapes.items():
        (shape, dtype), want = shapes[name], tuple(batch if d == "batch" else d for d in want)
        if tuple(shape) != want:
            raise RuntimeInputError(f"decode cache {name} has shape {list(shape)}, this export "
                                    f"needs {list(want)} (a cache of another model or memory "
                                    f"length?)")
        if dtype != _CACHE_DTYPES.get(name, np.float32):
            raise RuntimeInputError(f"decode cache {name} must be "
                                    f"{np.dtype(_CACHE_DTYPES.get(name, np.float32))}, got "
                                    f"{dtype}")
    size = expected_shapes["valid"][1]
    for name in ("slot", "row_slot"):
        value = cache[name]
        value = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        if value.size and (value.min() < 0 or value.max() >= size):
            raise RuntimeInputError(f"decode cache {name} must lie in [0, {size}) (the ring's "
                                    f"slots), got {value.tolist()}")
    return batch
