"""Checks of the batches a Python generator or a `keras.utils.PyDataset`
gives `fit`, `evaluate` or `predict`: Keras reads them in Python, one at a
time, so they cannot be mapped through the graph check `checked_data` puts
on a `tf.data.Dataset`, and a check inside the step does not survive XLA
(an id out of range would read zeros on a GPU). Here each batch is checked
with numpy as it is read: its ids (and integer labels) in range and, for a
model whose memory holds a fixed number of streams, its rows.

A problem raises `InputError`: Keras reads the first batch itself, so that
one raises as it is; a later one comes back from TensorFlow's input
pipeline as an `InvalidArgumentError` whose message holds it, which
`txl_tf.checks.inputs.input_errors` turns back into the `InputError`.
"""
import types

import keras

from txl_tf.checks.numpy_checks import (InputError, as_array, flags_message, float_ids_message,
                                        is_integer_dtype, lengths_problem,
                                        out_of_range_message)


def is_python_batches(x):
    """Whether `x` is data Keras reads batch by batch in Python: a generator
    or a `keras.utils.PyDataset`."""
    return isinstance(x, (types.GeneratorType, keras.utils.PyDataset))


def checked_python_batches(x, n_token, targets=True, rows=None, method="fit", fix=""):
    """`x` (see `is_python_batches`) with each batch checked as it is read.

    Args:
        x: a generator or a `keras.utils.PyDataset` of `inputs`,
            `(inputs, labels)` or `(inputs, labels, weights)` batches; inputs
            ids `[B, T]` or a dict holding them as `token_ids`.
        n_token: the vocabulary size.
        targets: whether integer labels are ids of the vocabulary too (a
            language model's) rather than class labels.
        rows: the rows every batch must have (a memory's streams); None: any.
        method, fix: the method's name and what to do, for the rows' message.

    Returns:
        A generator or a `PyDataset` of the same batches.
    """
    return map_python_batches(
        x, lambda batch: _check_batch(batch, n_token, targets, rows, method, fix))


def map_python_batches(x, check):
    """`x` (see `is_python_batches`) giving `check(batch)` for each batch as
    it is read: a generator or a `PyDataset`."""
    if isinstance(x, keras.utils.PyDataset):
        return _CheckedPyDataset(x, check)
    return (check(batch) for batch in x)


def _check_batch(batch, n_token, targets, rows, method, fix):
    inputs, labels, _ = keras.utils.unpack_x_y_sample_weight(batch)
    # as_array: a masked array's mask would be dropped, its entries read
    ids = as_array(inputs["token_ids"] if isinstance(inputs, dict) else inputs, "token_ids")
    if rows is not None and ids.ndim and ids.shape[0] != rows:
        raise InputError(f"{method}: a batch of {ids.shape[0]} rows; {fix}")
    if not is_integer_dtype(ids.dtype):
        raise InputError(f"token_ids must be integers, got {ids.dtype} in a batch")
    problem = out_of_range_message(ids, n_token)
    if problem is None and isinstance(inputs, dict) and "lengths" in inputs:  # a classifier's
        # (checked here: XLA drops the step's check)
        problem = lengths_problem(as_array(inputs["lengths"], "lengths"), ids)
    if problem is None and isinstance(inputs, dict) and "padding_mask" in inputs:
        problem = flags_message(as_array(inputs["padding_mask"], "padding_mask"))
    if problem is None and targets and labels is not None:
        labels = as_array(labels, "targets")
        if is_integer_dtype(labels.dtype):  # one target per id, as `check_targets`
            problem = out_of_range_message(labels, n_token, "target") or (
                None if labels.shape == ids.shape else
                f"targets have shape {labels.shape} but token_ids have shape {ids.shape}: "
                "there must be one target per token")
        elif labels.ndim == ids.ndim:  # not one-hot: ids a loss casts (`check_batch`)
            problem = (float_ids_message(labels, n_token) if labels.dtype.kind == "f" else
                       f"targets must be integers, got dtype {labels.dtype}")
    if problem:
        raise InputError(problem)
    return batch


class _CheckedPyDataset(keras.utils.PyDataset):
    """A `PyDataset` whose batches are `check(inner[index])`."""

    def __init__(self, inner, check):
        super().__init__(workers=inner.workers, use_multiprocessing=inner.use_multiprocessing,
                         max_queue_size=inner.max_queue_size)
        self.inner, self.check = inner, check

    def __getitem__(self, index):
        return self.check(self.inner[index])

    @property
    def num_batches(self):
        return self.inner.num_batches

    def on_epoch_begin(self):
        self.inner.on_epoch_begin()

    def on_epoch_end(self):
        self.inner.on_epoch_end()
