"""Short reprs for the library's result tuples (standard library only).

A `NamedTuple`'s default repr prints every array it holds: a notebook cell
ending in `out = runtime.generate(...); out` showed hundreds of lines of
log-probs, masks and caches. These reprs name each array's dtype and shape
instead, and show the values of the small ones.
"""

# Arrays with at most this many elements show their values.
SMALL = 8


def short(value):
    """A one-line description of `value`.

    Args:
        value: anything; arrays and tensors (a `shape` and a `dtype`), dicts,
            lists and tuples of them are summarised.

    Returns:
        `float32[4, 1, 128, 128]` for an array (its values too when it has at
        most `SMALL` elements, on the host), a named tuple's fields so,
        else `repr(value)`.
    """
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if callable(shape) and callable(getattr(value, "data_type", None)):  # an OrtValue
        dims = ", ".join(str(d) for d in shape())
        return f"OrtValue {value.data_type()}[{dims}] on {value.device_name()}"
    if shape is not None and dtype is not None and not callable(shape):
        try:
            dims = [int(d) if d is not None else None for d in shape]
        except (TypeError, ValueError):  # a shape of unknown rank
            return repr(value)
        name = getattr(dtype, "name", None) or str(dtype)
        text = f"{name}[{', '.join('?' if d is None else str(d) for d in dims)}]"
        size = 1
        for d in dims:
            size = size * d if d is not None and size is not None else None
        if size is not None and size <= SMALL and type(value).__module__ == "numpy":
            text += f" {_values(value.tolist())}"
        return text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return fields_repr(value)
    if isinstance(value, (list, tuple)):
        left, right = "[]" if isinstance(value, list) else "()"
        if len(value) > SMALL:
            return f"{left}{len(value)} items: {short(value[0])}, ...{right}"
        return left + ", ".join(short(v) for v in value) + right
    return repr(value)


def _values(values):
    """Nested lists of numbers, floats to 6 significant digits."""
    if isinstance(values, list):
        return "[" + ", ".join(_values(v) for v in values) + "]"
    return f"{values:.6g}" if isinstance(values, float) else repr(values)


def fields_repr(record):
    """`Name(field=short(value), ...)` of a `NamedTuple`: its `__repr__`.

    Args:
        record: a `NamedTuple` instance.

    Returns:
        One line naming each field's array by dtype and shape.
    """
    inner = ", ".join(f"{name}={short(value)}" for name, value in zip(record._fields, record))
    return f"{type(record).__name__}({inner})"
