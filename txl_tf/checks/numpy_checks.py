"""The checks the runtimes need, on numpy values and without TensorFlow: the
input error type, out-of-range ids, NaN or inf in a step's outputs."""
import numpy as np

from txl_tf.errors import TxlError

# TensorFlow counts positions in int32 (a tensor's shape in a graph, a
# segment's keys, a document's length): more cannot be held without wrapping.
MAX_POSITIONS = 2 ** 31 - 1
# Arrays up to this size are checked through a Python list (numpy's fixed cost
# per call is several times a list's for a few values).
SMALL = 256


class InputError(TxlError):
    """Token ids or memory that do not fit the model."""

    # Raised while a tf.function traces, autograph would wrap it in a
    # StagingError (tensorflow/python/autograph/impl/api.py); this keeps its type.
    ag_pass_through = True


def is_integer_dtype(dtype):
    """Whether `dtype` is a signed or unsigned integer dtype: not a bool,
    nor a timedelta64 (which numpy counts among its integers)."""
    return np.dtype(dtype).kind in "iu"


def is_float_dtype(dtype):
    """Whether `dtype` is a float dtype: numpy's, or one of ml_dtypes'
    (bfloat16, float8: numpy's `kind` 'V'), which TensorFlow's tensors
    and Keras's mixed policies give."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or (dtype.kind == "V" and dtype.names is None
                                 and dtype.name.startswith(("bfloat", "float")))


def out_of_range_message(ids, n_token, name="token"):
    """Names the first id of a numpy array outside `[0, n_token)`, or None."""
    if ids.size <= SMALL:  # a few ids (a decode step's): Python's min and max are faster
        listed = ids.ravel().tolist()
        if not listed or (min(listed) >= 0 and max(listed) < n_token):
            return None
    bad = np.argwhere((ids < 0) | (ids >= n_token))
    if not bad.size:
        return None
    where = tuple(int(i) for i in bad[0])
    return (f"{name} id {int(ids[where])} at position {where} is out of range for a "
            f"vocabulary of {n_token} tokens (valid ids are 0..{n_token - 1})")


FLAGS = "bool or 0/1 flags"


def flags_message(values, name="padding_mask"):
    """Names the first entry of a numpy array that is not a flag (a bool, or
    0 or 1 as a number: a cast reads 0.4 as False or True, 2 as True), or
    None."""
    if values.dtype.kind == "b":
        return None
    if values.dtype.kind not in "iu" and not is_float_dtype(values.dtype):
        return f"{name} must be {FLAGS}, got dtype {values.dtype}"
    bad = np.flatnonzero((values != 0) & (values != 1))  # NaN too
    if not bad.size:
        return None
    where = tuple(int(i) for i in np.unravel_index(bad[0], values.shape))
    return f"{name} must be {FLAGS}, got {values[where]} at position {where}"


def float_ids_message(values, n_token, name="target"):
    """Names the first of a numpy array of floats that is not a whole number
    in `[0, n_token)` (a loss that casts them to ids would cut 1.5 to 1), or
    None."""
    whole = np.isfinite(values) & (values == np.floor(values))
    if not whole.all():
        where = tuple(int(i) for i in np.argwhere(~whole)[0])
        return (f"{name} {values[where]} at position {where} is not a whole number: {name}s "
                f"are token ids 0..{n_token - 1} (a cast to integers would cut it)")
    return out_of_range_message(values, n_token, name)


def lengths_message(lengths, width):
    """Names the first length outside `[1, width]` of a numpy array, or None."""
    bad = np.flatnonzero((lengths < 1) | (lengths > width))
    if not bad.size:
        return None
    row = int(bad[0])
    return (f"lengths[{row}] = {int(lengths[row])} is out of range: a document has 1 to L "
            f"= {width} tokens (token_ids[b, :lengths[b]] is row b's document)")


def lengths_problem(lengths, token_ids):
    """What is wrong with a classifier's `lengths` (numpy) for `token_ids`
    `[B, L]`, as `check_lengths` says it, or None."""
    if lengths.dtype.kind not in "iu":
        return f"lengths must be integers, got dtype {lengths.dtype}"
    if lengths.ndim != 1:
        return f"lengths must be [batch] (one length per document), got shape {lengths.shape}"
    if token_ids.ndim != 2:
        return None  # the ids' own check names them
    if lengths.shape[0] != token_ids.shape[0]:
        return (f"lengths has {lengths.shape[0]} entries but token_ids have "
                f"{token_ids.shape[0]} rows")
    return lengths_message(lengths, token_ids.shape[1])


class NonFiniteMemoryError(InputError):
    """A step's outputs are NaN or inf for some streams: the memory handed in
    held NaN or inf in valid slots. `rows`: those streams' batch rows;
    `cause`: the message's reason in place of that one (a decode whose own
    steps overflowed)."""

    MEMORY = ("the memory passed in holds NaN or inf in valid slots (or the weights do); "
              "start those streams from a fresh memory")

    def __init__(self, rows, what="log-probs", cause=None):
        self.rows = [r.item() if hasattr(r, "item") else r for r in rows]
        self.what, self.cause = what, cause
        listed = ", ".join(map(str, self.rows[:10])) + (", ..." if len(self.rows) > 10 else "")
        super().__init__(f"stream(s) {listed}: the step's {what} are NaN or inf, so "
                         f"{cause or self.MEMORY}")

    def in_batch(self, rows):
        """The same error for streams numbered by `rows` (a sub-batch's map
        to the caller's batch)."""
        return NonFiniteMemoryError([rows[r] for r in self.rows], self.what, self.cause)


def check_finite_outputs(values, what="log-probs"):
    """`values` (numpy `[batch, ...]`, a step's outputs), or
    `NonFiniteMemoryError` naming the rows that hold NaN or inf.

    With finite weights, a valid slot holding NaN or inf makes the output of
    every query that sees it NaN (even at attention probability 0), and the
    last query sees every slot that stays in the new memory; a slot it does
    not see leaves the memory with this step. So checking the last
    position's log-probs (`batch x n_token` numbers per step) is exact, and
    the memory itself is never re-read.
    """
    values = np.asarray(values)
    if values.size == 0 or np.isfinite(values.sum()):  # one pass; NaN/inf propagate
        return values
    finite = np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    raise NonFiniteMemoryError(np.flatnonzero(~finite), what)


def as_array(value, name, error=InputError, fix="pad them to one length"):
    """`value` (array-like or tensor) as a numpy array, or `error` naming
    `name` (and `fix`, what to do) for nested rows of other lengths (a
    `tf.RaggedTensor`'s `.numpy()` is an object array of its rows), or for a
    numpy masked array with masked entries (numpy would drop the mask and
    the entries would be read as ids)."""
    if isinstance(value, np.ma.MaskedArray) and np.ma.is_masked(value):
        raise error(f"{name} is a masked array with masked entries, whose mask would be "
                    f"ignored: pass only the ids (rows of other lengths as a list of rows)")
    try:
        if not hasattr(value, "numpy"):
            return np.asarray(value)
        array = value.numpy()
    except ValueError:  # numpy: "an inhomogeneous shape"
        raise error(f"{name} holds rows of other lengths: {fix}") from None
    if array.dtype == object and any(np.ndim(row) for row in array.reshape(-1)):
        raise error(f"{name} holds rows of other lengths: {fix}")
    return array


def check_id_array(token_ids, n_token, name="token_ids", error=InputError):
    """The ids as an int32 numpy array `[B, T]`, or `error` unless they are a
    non-empty `[batch, length]` of integers in `[0, n_token)` (compiled
    graphs cannot check them: XLA drops assertions and clamps a gather).

    Args:
        token_ids: array-like or tensor of ids.
        n_token: the vocabulary size.
        name: the argument's name in messages.
        error: the exception class raised.

    Returns:
        An int32 numpy array.
    """
    ids = as_array(token_ids, name, error)
    if not is_integer_dtype(ids.dtype):
        raise error(f"{name} must have an integer dtype, got {ids.dtype}")
    if ids.ndim != 2 or 0 in ids.shape:
        raise error(f"{name} must be a non-empty [batch, length] array, got shape {ids.shape}")
    problem = out_of_range_message(ids, n_token, f"{name}:")
    if problem:
        raise error(problem)
    return ids.astype(np.int32, copy=False)


def check_rows(rows, batch_size, error=InputError):
    """`rows` as int64 indices `[n]`, or `error` unless they are a non-empty
    1-D list of integers in `[0, batch_size)` (a gather past the batch is
    an error on a CPU but zeros on a GPU)."""
    index = np.asarray(rows)
    if index.ndim != 1 or index.size == 0 or not is_integer_dtype(index.dtype):
        raise error(f"rows must be a non-empty 1-D list of row indices, got {rows!r}")
    if index.min() < 0 or index.max() >= batch_size:
        raise error(f"rows must lie in [0, {batch_size}) (the batch), got {index.tolist()}")
    return index.astype(np.int64, copy=False)


def check_count(name, value, low=0, high=None):
    """`value` as an int, or `TxlError` unless it is an integer >= `low`
    (and <= `high` when given; a Python or numpy integer; not a bool, a
    float or a string)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < low:
        raise TxlError(f"{name} must be an integer >= {low}, got {value!r}")
    if high is not None and value > high:
        raise TxlError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def is_flag(value):
    """Whether `value` is a bool (Python or numpy) or the integer 0 or 1: a
    string such as "no" is not (it would be truthy)."""
    return isinstance(value, (bool, np.bool_)) or (
        isinstance(value, (int, np.integer)) and value in (0, 1))


def is_real(value):
    """Whether `value` is a real number: a Python or numpy int or float, not
    a bool or a complex."""
    return isinstance(value, (int, float, np.integer, np.floating)) and \
        not isinstance(value, (bool, np.bool_))


def check_flag(name, value):
    """`value` as a bool, or `TxlError` unless `is_flag(value)`."""
    if not is_flag(value):
        raise TxlError(f"{name} must be a boolean, got {value!r}")
    return bool(value)
