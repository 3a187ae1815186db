"""Input checks that name the problem (used by the core and the runtimes)."""
import contextlib
import re

import keras
import numpy as np
import tensorflow as tf

# The numpy half, re-exported: the runtimes import it without TensorFlow.
from txl_tf.checks.numpy_checks import (FLAGS, InputError, NonFiniteMemoryError,  # noqa: F401
                                        as_array, check_finite_outputs, flags_message,
                                        float_ids_message, lengths_message,
                                        out_of_range_message)
from txl_tf.checks.python_batches import checked_python_batches, is_python_batches


# What to do with rows of other lengths, for the model's dense ids.
_PAD = ("the model reads dense [batch, length] ids; pad the rows to one length and mark the "
        "padding (padding_mask, or the classifier's lengths)")


def rectangular(value, name="token_ids"):
    """`np.asarray(value)`; raises `InputError` for rows of other lengths
    (nested lists, or a numpy array of arrays), where numpy's and
    TensorFlow's errors did not say what was wrong."""
    array = as_array(value, name, InputError, _PAD)
    if array.dtype == object and any(np.ndim(row) for row in array.reshape(-1)):
        raise InputError(f"{name} holds rows of other lengths (a numpy array of arrays): {_PAD}")
    return array


# What each named input holds, for `convertible`'s message.
_HOLDS = {"token_ids": "integers", "targets": "integers", "lengths": "integers",
          "token_mask": "bool", "padding_mask": FLAGS, "document_start": "bool",
          "stopped": "bool", "sample_weight": "numbers"}


def convertible(value, name="token_ids", what=None):
    """`value`, or `InputError` naming `name` where it is a numpy array that
    TensorFlow would misread or refuse with an error of its own: one with
    masked entries (`as_array`: the mask would be dropped and the values
    under it read), of durations or dates (numpy counts timedelta64 among
    its integers), of Python objects, or of bools for integers (a Keras
    input of int32 reads them as ids 0 and 1). `what`: what `name` must
    hold, for the message (default by name, `_HOLDS`). A masked array
    without masked entries comes back as a plain array."""
    if not isinstance(value, np.ndarray):
        return value
    array = rectangular(value, name)  # masked entries, rows of other lengths: its error
    what = what or _HOLDS.get(name, "numbers")
    if array.dtype.kind in "mMO" or (array.dtype.kind == "b" and what == "integers"):
        raise InputError(f"{name} must be {what}, got dtype {array.dtype}")
    return array


def check_numpy(value, name="token_ids"):
    """Raises `convertible`'s `InputError` for a numpy array in `value` (an array,
    or a dict, list or tuple of them, as a Keras model reads them), each
    named by its dict key (else `name`): checked where Keras would convert
    it (dropping a mask) before the model's own checks see it."""
    if isinstance(value, dict):
        for key, item in value.items():
            check_numpy(item, key if isinstance(key, str) else name)
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_numpy(item, name)
    else:
        convertible(value, name)


def check_numpy_data(x, y=None, sample_weight=None, labels="targets"):
    """`check_numpy` for what `fit`, `evaluate` or `predict` take as arrays:
    inputs `x` (ids, or a dict of named arrays), `y` (named `labels`) and
    `sample_weight`. Other data (a dataset, a generator) passes."""
    check_numpy(x)
    check_numpy(y, labels)
    check_numpy(sample_weight, "sample_weight")


def check_int32_ids(value, name="token_ids"):
    """Raises `InputError` where `value` (eager ids: a numpy array or tensor)
    is not integers, or holds one beyond int32: a functional model's int32
    input would cast it (bools read as ids 0 and 1, 1.7 as 1, 2**32 + 1 as
    1). Other values (symbolic ones, lists, a ragged tensor: the model names
    it) pass."""
    if isinstance(value, np.ndarray):  # first: tf.is_tensor is slow on an array
        dtype = value.dtype
    elif isinstance(value, tf.Tensor) and hasattr(value, "numpy"):  # not a ragged one
        dtype = np.dtype(value.dtype.as_numpy_dtype)
    else:
        return
    if dtype.kind not in "iu":
        raise InputError(f"{name} must be integers, got dtype {dtype}")
    if np.can_cast(dtype, np.int32):
        return
    array = np.asarray(value)
    if array.size and (array.min() < -2 ** 31 or array.max() > 2 ** 31 - 1):
        where = tuple(int(i) for i in np.argwhere((array < -2 ** 31) | (array > 2 ** 31 - 1))[0])
        raise InputError(f"{name}: id {int(array[where])} at position {where} does not fit "
                         "int32, the model's input dtype (it would wrap)")


def check_flags(value, name="padding_mask"):
    """Raises `InputError` where `value` (eager: a numpy array or tensor) is
    not bools or 0/1 numbers (`flags_message`): a functional model's int32
    input would cast 0.4 to 0, a bool cast reads 2 as True. Other values
    (symbolic ones, lists, a ragged tensor: the ids' check names it) pass."""
    if value is None:  # first: tf.is_tensor is slow on None or an array
        return
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "b":
            return
        array = value
    elif isinstance(value, tf.Tensor) and hasattr(value, "numpy"):  # not a ragged one
        if value.dtype == tf.bool:
            return
        array = value.numpy()
    else:
        return
    problem = flags_message(array, name)
    if problem:
        raise InputError(problem)


def checked_flags(mask, name="padding_mask"):
    """`mask` (a tensor) checked to be bools or 0/1 numbers: eagerly
    (`flags_message`), or in a graph by an assertion that `input_errors`
    turns into the `InputError`."""
    if mask.dtype == tf.bool:
        return mask
    if not (mask.dtype.is_integer or mask.dtype.is_floating):
        raise InputError(f"{name} must be {FLAGS}, got dtype {mask.dtype.name}")
    if tf.executing_eagerly():
        check_flags(mask, name)
        return mask
    flags = tf.equal(mask, 0) | tf.equal(mask, 1)
    check = tf.debugging.Assert(tf.reduce_all(flags), [
        f"{name} must be {FLAGS}, got", tf.boolean_mask(mask, ~flags)[:1]], name="check_flags")
    with tf.control_dependencies([check]):
        return tf.identity(mask)


class NumpyInputsChecked:
    """A Keras model or layer whose `__call__` checks its numpy inputs first
    (`check_numpy`): Keras converts them before `call` sees them. The first
    argument is named `token_ids` (or by its dict's keys), the next ones by
    `call_arg_names`, keywords by name. A functional model's int32 ids
    (`int32_ids`) are checked as Keras would cast them (`check_int32_ids`)."""

    call_arg_names = ()
    int32_ids = False

    def __call__(self, *args, **kwargs):
        for name, value in zip(("token_ids",) + self.call_arg_names, args):
            check_numpy(value, name)
        check_numpy({key: value for key, value in kwargs.items()
                     if key not in ("training", "mask")})
        inputs = args[0] if args else kwargs.get("inputs")
        if self.int32_ids and isinstance(inputs, dict):
            check_int32_ids(inputs.get("token_ids"))
            check_flags(inputs.get("padding_mask"))
        return super().__call__(*args, **kwargs)


def dense(value, name="token_ids"):
    """`value` as a dense tensor; raises `InputError` for a ragged or sparse
    one, rows of other lengths (`rectangular`), or a numpy array TensorFlow
    would misread or refuse (`convertible`); TensorFlow's own
    error did not say what was wrong."""
    value = convertible(value, name)
    if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
        raise InputError(f"{name} is a {type(value).__name__}: the model reads dense [batch, "
                         "length] tensors; pad the rows (e.g. `ragged.to_tensor()`) and mark the "
                         "padding (padding_mask, or the classifier's lengths)")
    try:
        return tf.convert_to_tensor(value)
    except ValueError:
        if isinstance(value, (list, tuple, np.ndarray)):
            rectangular(value, name)  # rows of other lengths: its InputError
        raise


def check_token_ids(token_ids, n_token, name="token_ids", id_name="token"):
    """Raises if ids are not a non-empty `[batch, length]` of integers in `[0, n_token)`.

    Errors name the argument (`name`, e.g. "targets") and, eagerly, the first
    bad id ("<id_name> id", e.g. "target id") and its position. In a graph the
    range (and, for unknown shapes, emptiness) becomes an assertion (a plain
    gather on GPU would silently give zeros for a bad id); under XLA
    assertions are dropped, so callers that compile should check ids up front
    (the runtimes do; the Keras models check in their input pipeline,
    `check_batch`, and `input_errors` turns the assertion into an `InputError`).
    """
    if not token_ids.dtype.is_integer:
        raise InputError(f"{name} must be integers, got dtype {token_ids.dtype.name}")
    shape = token_ids.shape
    if shape.rank is not None and shape.rank != 2:
        raise InputError(f"{name} must be [batch, length], got shape {shape}")
    if shape.rank is not None and 0 in shape:
        raise InputError(f"{name} is empty (shape {shape}): a segment needs at least one "
                         "sequence and one position")
    if tf.executing_eagerly():
        problem = out_of_range_message(np.asarray(token_ids), n_token, id_name)
        if problem:
            raise InputError(problem)
        return token_ids
    low, high = tf.reduce_min(token_ids), tf.reduce_max(token_ids)
    ok = (tf.size(token_ids) > 0) & (low >= 0) & (high < n_token)
    check = tf.debugging.Assert(
        ok, [f"{name} empty or out of range for a vocabulary of {n_token} tokens; "
             "min id:", low, "max id:", high], name="check_token_ids")
    with tf.control_dependencies([check]):
        return tf.identity(token_ids)


def check_lengths(lengths, token_ids):
    """Returns `lengths` as int32 `[B]`, or raises unless `1 <= lengths[b] <= L`
    for `token_ids` `[B, L]` (eagerly with the first bad row named; in a graph
    as an assertion, which XLA drops: callers that compile check up front)."""
    if not lengths.dtype.is_integer:
        raise InputError(f"lengths must be integers, got dtype {lengths.dtype.name}")
    if lengths.shape.rank is not None and lengths.shape.rank != 1:
        raise InputError(f"lengths must be [batch] (one length per document), got shape "
                         f"{lengths.shape}")
    batch = token_ids.shape[0]
    if lengths.shape[0] is not None and batch is not None and lengths.shape[0] != batch:
        raise InputError(f"lengths has {lengths.shape[0]} entries but token_ids have "
                         f"{batch} rows")
    # Range-checked before the int32 cast, which would wrap 2**32 + 5 to 5.
    if tf.executing_eagerly():
        problem = lengths_message(lengths.numpy(), int(token_ids.shape[1]))
        if problem:
            raise InputError(problem)
        return tf.cast(lengths, tf.int32)
    width = tf.shape(token_ids)[1]
    wide = tf.cast(lengths, tf.int64)  # uint64 above 2**63 turns negative: still caught
    ok = tf.reduce_all(wide >= 1) & tf.reduce_all(wide <= tf.cast(width, tf.int64)) & \
        tf.equal(tf.size(lengths), tf.shape(token_ids)[0])
    check = tf.debugging.Assert(
        ok, ["lengths must be one per row of token_ids, each in [1, L] with L =", width,
             "; got min", tf.reduce_min(wide), "max", tf.reduce_max(wide)],
        name="check_lengths")
    with tf.control_dependencies([check]):
        return tf.cast(lengths, tf.int32)


def check_batch(data, n_token, targets=True):
    """A batch `(inputs, labels, weights)` (or inputs alone) with its ids, a
    classifier's `lengths`, a `padding_mask` (0/1 flags, `checked_flags`)
    and, if `targets`, its integer labels checked by `check_token_ids`.

    Args:
        data: `inputs`, `(inputs, labels)` or `(inputs, labels, weights)`;
            inputs ids `[B, T]` or a dict holding them as `token_ids`.
        n_token: the vocabulary size.
        targets: whether integer labels are ids of the vocabulary too (a
            language model's) rather than class labels.

    Returns:
        `data`, the same structure, its ids (and labels) checked.
    """
    inputs, labels, weights = keras.utils.unpack_x_y_sample_weight(data)
    if isinstance(inputs, dict):
        inputs = {**inputs, "token_ids": check_token_ids(dense(inputs["token_ids"]), n_token)}
        if "lengths" in inputs:  # a classifier's documents
            inputs["lengths"] = check_lengths(dense(inputs["lengths"], "lengths"),
                                              inputs["token_ids"])
        if "padding_mask" in inputs:  # a cast would read 0.4 or 2 as a flag
            inputs["padding_mask"] = checked_flags(dense(inputs["padding_mask"], "padding_mask"))
    else:
        inputs = check_token_ids(dense(inputs), n_token)
    if targets and labels is not None:
        labels = tf.convert_to_tensor(labels)
        ids = inputs["token_ids"] if isinstance(inputs, dict) else inputs
        if labels.dtype.is_integer:  # one target per id
            labels = check_targets(labels, ids, n_token)
        elif labels.shape.rank is not None and labels.shape.rank == ids.shape.rank:
            labels = checked_float_targets(labels, n_token)  # not one-hot: ids a loss casts
    return keras.utils.pack_x_y_sample_weight(inputs, labels, weights)


def checked_float_targets(targets, n_token):
    """Targets of the ids' shape that are not integers, checked to be whole
    floats in `[0, n_token)` (a sparse loss casts them to ids: 1.5 would be
    read as 1): eagerly (`float_ids_message`), or in a graph by an
    assertion that `input_errors` turns into the `InputError`. They keep
    their dtype (a loss of one's own may read floats); bools raise."""
    if not targets.dtype.is_floating:
        raise InputError(f"targets must be integers, got dtype {targets.dtype.name}")
    if tf.executing_eagerly():
        problem = float_ids_message(targets.numpy(), n_token)
        if problem:
            raise InputError(problem)
        return targets
    ok = tf.equal(targets, tf.floor(targets)) & (targets >= 0) & (targets < n_token)
    check = tf.debugging.Assert(tf.reduce_all(ok), [
        f"targets must be whole numbers in 0..{n_token - 1} (token ids), got",
        tf.boolean_mask(targets, ~ok)[:1]], name="check_float_targets")
    with tf.control_dependencies([check]):
        return tf.identity(targets)


def checked_data(x, n_token, y=None, targets=True, rows=None, method="fit"):
    """What a Keras model's `fit` / `evaluate` / `predict` read, with its ids
    checked (`check_batch`) outside the step, where the check survives XLA
    (which drops assertions): mapped over a `tf.data.Dataset` (each batch
    checked by the input pipeline before the step reads it), at once for
    arrays (raising `InputError`), batch by batch as Keras reads a generator
    or a `keras.utils.PyDataset` (`txl_tf.checks.python_batches`, rows too).
    Other data (None, a distributed dataset) passes unchecked: its maker
    checks it (the training job's ids come from the tokenizer whose size is
    the model's `n_token`).

    Args:
        x: a dataset, a generator, a `PyDataset`, or `inputs` /
            `(inputs, labels[, weights])` arrays.
        n_token, targets: as `check_batch`'s.
        y: the labels of arrays `x`, if apart.
        rows: the rows each batch of a generator or a `PyDataset` must have
            (a memory's streams; a dataset's and arrays' are checked before);
            None: any.
        method: the method's name, for the rows' message.

    Returns:
        `x`: a dataset mapped through the check, a generator or a
        `PyDataset` checking each batch, arrays unchanged.
    """
    if is_python_batches(x):
        fix = (f"the memory holds {rows} streams, one a row: every batch must have {rows} "
               "rows")
        return checked_python_batches(x, n_token, targets, rows, method, fix)
    if isinstance(x, tf.data.Dataset):
        return x.map(lambda *batch: check_batch(batch if len(batch) > 1 else batch[0],
                                                n_token, targets))
    arrays = x if y is None else (x, y)
    leaves = tf.nest.flatten(arrays)
    if x is not None and all(tf.is_tensor(v) or hasattr(v, "__array__") for v in leaves):
        check_batch(arrays, n_token, targets)
    return x


_ASSERTED = re.compile(r"\[(\w+ empty or out of range for a vocabulary of \d+ tokens; min id:)\] "
                       r"\[(-?\d+)\] \[max id:\] \[(-?\d+)\]")


_LENGTHS_ASSERTED = re.compile(r"\[(lengths must be one per row of token_ids, each in \[1, L\] "
                               r"with L =)\] \[(\d+)\] \[(; got min)\] \[(-?\d+)\] \[(max)\] "
                               r"\[(-?\d+)\]")


# `checked_flags`' and `checked_float_targets`' assertions.
_FLAGS_ASSERTED = re.compile(r"\[(\w+ must be (?:bool or 0/1 flags|whole numbers in [^\]]*), "
                             r"got)\] \[\[?([^\]]*)")


# An `InputError` raised while TensorFlow's input pipeline read a batch in Python
# (`txl_tf.checks.python_batches`), as the pipeline's error quotes it.
_RAISED_IN_PYTHON = re.compile(r"^(?:[\w.]+\.)?InputError: (.+)$", re.MULTILINE)


@contextlib.contextmanager
def input_errors():
    """Re-raises `check_token_ids`' graph assertion (a TensorFlow
    `InvalidArgumentError` from a step or an input pipeline), and an
    `InputError` a batch check raised inside TensorFlow's input pipeline
    (`txl_tf.checks.python_batches`), as the `InputError` it stands for;
    other errors pass unchanged."""
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        found = _ASSERTED.search(error.message or "")
        if found:
            raise InputError(f"{found[1]} {found[2]} max id: {found[3]}") from None
        found = _LENGTHS_ASSERTED.search(error.message or "")
        if found:  # `check_lengths`' assertion
            raise InputError(" ".join(found.groups())) from None
        found = _FLAGS_ASSERTED.search(error.message or "")
        if found:  # `checked_flags`' or `checked_float_targets`' assertion
            raise InputError(f"{found[1]} {found[2]}") from None
        raised = _RAISED_IN_PYTHON.search(error.message or "")
        if raised:
            raise InputError(raised[1]) from None
        raise


def check_targets(targets, token_ids, n_token):
    """`check_token_ids` for targets, which must also have the shape of `token_ids`."""
    targets = check_token_ids(targets, n_token, "targets", "target")
    ids_shape = token_ids.shape
    if not targets.shape.is_compatible_with(ids_shape):
        raise InputError(f"targets have shape {targets.shape} but token_ids have shape "
                         f"{ids_shape}: there must be one target per token")
    return _shaped_like(targets, token_ids,
                        "targets must have the shape of token_ids (one target per token)")


def check_token_mask(token_mask, token_ids):
    """Raises unless `token_mask` is bool with the shape of `token_ids`."""
    if token_mask.dtype != tf.bool:
        raise InputError(f"token_mask must be bool (True = real token), got dtype "
                         f"{token_mask.dtype.name}")
    if not token_mask.shape.is_compatible_with(token_ids.shape):
        raise InputError(f"token_mask has shape {token_mask.shape} but token_ids have shape "
                         f"{token_ids.shape}: there must be one flag per token")
    return _shaped_like(token_mask, token_ids,
                        "token_mask must have the shape of token_ids (one flag per token)")


def _shaped_like(tensor, token_ids, message):
    """`tensor`, checked in the graph to have `token_ids`' shape when the
    static shapes (already found compatible) cannot tell."""
    if tf.executing_eagerly() or (tensor.shape.is_fully_defined()
                                  and token_ids.shape.is_fully_defined()):
        return tensor
    check = tf.debugging.assert_equal(tf.shape(tensor), tf.shape(token_ids), message=message)
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def check_memory(memory, n_layer, d_model, batch_size=None):
    """Raises `InputError` if the memory's static geometry does not fit."""
    mems, mem_mask = memory
    if mems.shape.rank is not None and mems.shape.rank != 4:
        raise InputError("mems must be [n_layer, batch, mem_len, d_model] "
                         f"(rank 4), got shape {mems.shape}")
    if mem_mask.shape.rank is not None and mem_mask.shape.rank != 2:
        raise InputError(f"mem_mask must be [batch, mem_len] (rank 2), got shape {mem_mask.shape}")
    if mem_mask.dtype != tf.bool:
        raise InputError(f"mem_mask must be bool, got {mem_mask.dtype.name}")
    if not mems.dtype.is_floating:
        raise InputError(f"mems must be floating point, got {mems.dtype.name}")
    shape = mems.shape
    if shape.rank is None:
        return
    if shape[0] is not None and shape[0] != n_layer:
        raise InputError(f"mems hold {shape[0]} layers, the model has {n_layer} "
                         f"(mems shape {shape})")
    if shape[3] is not None and shape[3] != d_model:
        raise InputError(f"mems have width {shape[3]}, the model's d_model is "
                         f"{d_model} (mems shape {shape})")
    for name, got, want in (("batch", shape[1], mem_mask.shape[0]),
                            ("mem_len", shape[2], mem_mask.shape[1])):
        if got is not None and want is not None and got != want:
            raise InputError(f"mems and mem_mask disagree on {name}: {got} vs {want}")
    if batch_size is not None and shape[1] is not None and shape[1] != batch_size:
        raise InputError(f"token_ids have batch {batch_size} but the memory has batch "
                         f"{shape[1]}")
