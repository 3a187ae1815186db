"""Segment streams for Transformer-XL training and evaluation (tf.data).

Layout (the paper's ``batchify``): a corpus of N ids is cut into B contiguous
streams of L tokens, stream k = ``ids[k*L:(k+1)*L]``. Step s serves, for every
stream, inputs at positions ``[s*T, s*T+T)`` and labels one position later,
so batch s+1 continues batch s row by row and the recurrence memory of row k
always belongs to stream k. The batch of a step is a pure function of the
step number: a job resumed at ``start_step`` sees exactly what an
uninterrupted job would have seen.

* Training (:func:`segment_dataset`): L = N // B (the remainder, < B ids, is
  dropped); ``num_segments = (L - 1) // T`` full segments per epoch; the last
  ``(L - 1) % T`` positions of each stream are never inputs.
* Evaluation (:func:`eval_segment_dataset`): L = ceil(N / B), so nothing is
  dropped; segments are padded to T with id 0 and carry a float32 weight mask,
  so every id except the first of each stream is a weighted label exactly once.
* Distribution (:func:`distribute_segments`): replica r always receives streams
  ``[r*B/R, (r+1)*B/R)``, prefetched to its device (:func:`device_prefetch`).

Slices are read from the numpy array (a memory map works, nothing is copied
whole) through ``tf.numpy_function``; the dataset therefore runs in the
Python process that built it (not through the tf.data service). TensorFlow
keeps that function for the life of the process, so it holds the array
weakly: the array lives as long as the dataset (the Python datasets and
iterators built on it, a `tf.function` that captured it) and is freed with
the last of them (:class:`_Reader`).
"""
from __future__ import annotations

import weakref
from typing import Sequence

import numpy as np
import tensorflow as tf

from txl_tf.checks.memory_budget import check_bytes
from txl_tf.checks.numpy_checks import as_array, check_count, check_flag, is_integer_dtype
from txl_tf.errors import TxlError


def _check_ids(ids) -> np.ndarray:
    # A masked array too: its mask would be dropped (`as_array`).
    arr = ids if type(ids) is np.ndarray else as_array(ids, "ids", TxlError,
                                                        "ids are one 1-D sequence")
    if arr.ndim != 1:
        raise TxlError(f"ids must be 1-D, got shape {arr.shape}")
    if arr.size and not is_integer_dtype(arr.dtype):
        raise TxlError(f"ids must be integers, got dtype {arr.dtype}")
    return arr


def _check_positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                or value <= 0:
            raise TxlError(f"{name} must be a positive int, got {value!r}")


def stream_length(num_tokens: int, batch_size: int, drop_remainder: bool = True) -> int:
    """Tokens per stream.

    Args:
        num_tokens: ``N``, ids in the corpus (an int >= 0).
        batch_size: ``B``, streams (an int >= 1).
        drop_remainder: True for training, False for evaluation.

    Returns:
        ``N // B`` (training) or ``ceil(N / B)`` (evaluation).
    """
    num_tokens = check_count("num_tokens", num_tokens)
    _check_positive(batch_size=batch_size)
    drop_remainder = check_flag("drop_remainder", drop_remainder)
    if drop_remainder:
        return num_tokens // batch_size
    return -(-num_tokens // batch_size)


def num_segments(num_tokens: int | np.ndarray, batch_size: int, tgt_len: int,
                 drop_remainder: bool = True) -> int:
    """Segments (steps) in one pass.

    Args:
        num_tokens: ids in the corpus, or the 1-D ids array itself.
        batch_size: ``B``, streams (an int >= 1).
        tgt_len: ``T``, positions per segment (an int >= 1).
        drop_remainder: True for training, False for evaluation.

    Returns:
        With ``L = stream_length(...)``: ``(L-1) // T`` full ones when
        ``drop_remainder`` (training), else ``ceil((L-1) / T)`` (evaluation,
        last one padded); 0 when ``L < 1``.
    """
    if isinstance(num_tokens, (int, np.integer)):
        n = check_count("num_tokens", num_tokens)
    elif isinstance(num_tokens, (str, bytes)) or not hasattr(num_tokens, "__len__") \
            or getattr(num_tokens, "ndim", 1) != 1:
        shown = (f"shape {num_tokens.shape}" if hasattr(num_tokens, "shape")
                 else repr(num_tokens)[:60])
        raise TxlError(f"num_tokens must be a count or the 1-D ids, got "
                       f"{type(num_tokens).__name__} {shown}")
    else:
        n = len(num_tokens)
    _check_positive(batch_size=batch_size, tgt_len=tgt_len)
    length = stream_length(n, batch_size, drop_remainder)
    if length < 1:
        return 0
    if drop_remainder:
        return (length - 1) // tgt_len
    return -(-(length - 1) // tgt_len)


def batchify(ids, batch_size: int) -> np.ndarray:
    """The training layout of a corpus.

    Args:
        ids: 1-D integer ids, ``N`` of them.
        batch_size: ``B``, streams (an int >= 1).

    Returns:
        ``[B, N // B]``, stream b in row b (a view when ``ids`` is a numpy
        array; the remainder dropped).
    """
    ids = _check_ids(ids)
    length = stream_length(len(ids), batch_size)
    return ids[:batch_size * length].reshape(batch_size, length)


class _Streams:
    """Numpy side: the id window of rows ``[r0, r1)`` at segment ``seg``."""

    def __init__(self, ids, batch_size: int, tgt_len: int, drop_remainder: bool):
        self.ids = _check_ids(ids)
        int32 = np.iinfo(np.int32)
        if self.ids.size and (np.iinfo(self.ids.dtype).max > int32.max
                              or np.iinfo(self.ids.dtype).min < int32.min):
            # Windows are int32: a larger id would wrap (2**32 + 5 read as 5).
            low, high = int(self.ids.min()), int(self.ids.max())
            if low < int32.min or high > int32.max:
                raise TxlError(f"ids must fit int32 (the batches' dtype), got ids from {low} "
                               f"to {high}")
        _check_positive(batch_size=batch_size, tgt_len=tgt_len)
        self.batch_size, self.tgt_len = int(batch_size), int(tgt_len)
        self.length = stream_length(len(self.ids), batch_size, drop_remainder)
        self.num_segments = num_segments(len(self.ids), batch_size, tgt_len, drop_remainder)
        if self.num_segments == 0:
            need = batch_size * (tgt_len + 1) if drop_remainder else batch_size + 1
            raise TxlError(
                f"{len(self.ids)} ids are too few for batch_size {batch_size} and "
                f"tgt_len {tgt_len}: {batch_size} streams of {self.length} ids give no "
                f"{'full ' if drop_remainder else ''}segment (need at least {need} ids)")
        # A segment's window: its positions, and per row an int64 index, the
        # int32 ids and a validity flag (an evaluation segment may be far
        # longer than its streams: it is padded).
        check_bytes({"positions": 8 * (tgt_len + 1),
                     "windows": 13 * batch_size * (tgt_len + 1)},
                    f"a segment of the streams (batch {batch_size:,}, tgt_len {tgt_len:,})",
                    "lower tgt_len or the batch size")
        self.offsets = np.arange(tgt_len + 1)

    def window(self, seg, r0, r1):
        """``(ids [r1-r0, T+1] int32, valid [r1-r0, T+1] bool)``."""
        pos = int(seg) * self.tgt_len + self.offsets               # within a stream
        rows = np.arange(int(r0), int(r1))[:, None]
        index = rows * self.length + pos[None, :]
        valid = (pos[None, :] < self.length) & (index < len(self.ids))
        window = np.asarray(self.ids[np.where(valid, index, 0)], dtype=np.int32)
        return np.where(valid, window, 0).astype(np.int32), valid

    def train_pair(self, seg, r0, r1):
        window, _ = self.window(seg, r0, r1)
        return window[:, :-1], window[:, 1:]

    def eval_triple(self, seg, r0, r1):
        window, valid = self.window(seg, r0, r1)
        return window[:, :-1], window[:, 1:], valid[:, 1:].astype(np.float32)

    def dataset(self, steps: tf.data.Dataset, r0: int, r1: int, evaluation: bool,
                split: int = 1) -> tf.data.Dataset:
        """Map step numbers to segments of rows ``[r0, r1)``. With ``split`` > 1
        the rows are cut into ``split`` consecutive per-replica batches, served
        one after another for each step (the order tf.distribute expects)."""
        rows, n, t = r1 - r0, self.num_segments, self.tgt_len
        reader = _Reader(self, evaluation)
        dtypes = [tf.int32, tf.int32, tf.float32] if evaluation else [tf.int32, tf.int32]

        def to_segment(step):
            out = tf.numpy_function(reader, [step % n, r0, r1], dtypes, stateful=False)
            shaped = []
            for tensor in out:
                tensor.set_shape([rows, t])
                shaped.append(tensor if split == 1 else
                              tf.reshape(tensor, [split, rows // split, t]))
            return tuple(shaped)

        ds = steps.map(to_segment)
        if split > 1:
            ds = ds.unbatch()
        ds = ds.prefetch(tf.data.AUTOTUNE)
        reader.hold(tf.data.experimental.to_variant(ds))
        return ds


class _Reader:
    """The callable of a dataset's ``tf.numpy_function``.

    TensorFlow registers it by a token and keeps it for the life of the
    process (in its default graph, `tensorflow/python/ops/script_ops.py`),
    so it refers to the streams (and their ids) weakly. The strong reference
    is an attribute of the dataset's variant tensor: the Python datasets and
    iterators built on the dataset hold it, and so do a `tf.function` that
    captured the dataset and ``Dataset.from_tensors(dataset)``. A dataset
    built in a `tf.function`, or on another device than the first CPU (which
    ``experimental_distribute_dataset`` rebuilds from its serialized graph,
    where no Python object refers to it), keeps its streams for the life of
    the process, as every dataset did before. An iterator deleted while its
    prefetch thread reads can meet the freed streams in that thread: that
    element is never served (TensorFlow logs the error below log level 2).
    """

    def __init__(self, streams: _Streams, evaluation: bool):
        self._streams = weakref.ref(streams)
        self._evaluation = evaluation
        self._pinned = None

    def hold(self, variant) -> None:
        """Ties the streams' lifetime to the dataset whose variant is ``variant``."""
        streams = self._streams()
        device = tf.DeviceSpec.from_string(variant.device or "")
        if tf.executing_eagerly() and (device.device_type, device.device_index) == ("CPU", 0):
            variant._txl_streams = streams
        else:
            self._pinned = streams

    def __call__(self, seg, r0, r1):
        streams = self._streams()
        if streams is None:
            raise TxlError("the ids of this segment dataset are freed: the dataset was deleted "
                           "while a graph rebuilt from it still reads them; keep the dataset "
                           "(or a dataset or iterator built on it) while it is read")
        if self._evaluation:
            return streams.eval_triple(seg, r0, r1)
        return streams.train_pair(seg, r0, r1)


def _steps(start_step: int, num_segments: int, repeat: bool) -> tf.data.Dataset:
    start_step = check_count("start_step", start_step)
    if check_flag("repeat", repeat):
        return tf.data.Dataset.counter(start=int(start_step), dtype=tf.int64)
    return tf.data.Dataset.range(int(start_step), max(int(start_step), num_segments))


def segment_dataset(ids: np.ndarray | Sequence[int], batch_size: int, tgt_len: int,
                    start_step: int = 0, repeat: bool = True) -> tf.data.Dataset:
    """Training batches ``(inputs [B, T] int32, labels [B, T] int32)``.

    Element i is global step ``start_step + i``, which serves segment
    ``step % num_segments(ids, B, T)``; labels are the inputs shifted by one
    (the next token). Shapes are static; only full segments are served.

    With ``repeat=True`` the dataset is infinite: after the last segment of an
    epoch the streams start again from their first segment (same layout every
    epoch, nothing shuffled). That batch does not continue the previous one,
    so recurrence memory carried over holds the end of each stream; reset it
    when ``step % num_segments == 0`` to treat epochs as separate documents.
    With ``repeat=False`` it stops after the last full segment.

    Args:
        ids: 1-D integer ids (they must fit int32).
        batch_size: ``B``, streams.
        tgt_len: ``T``, positions per segment.
        start_step: the global step of the first element (resuming).
        repeat: infinite (True) or one pass.

    Returns:
        A `tf.data.Dataset` of ``(inputs, labels)``.

    Raises:
        TxlError: bad ids or counts, or too few ids for one full segment.
    """
    streams = _Streams(ids, batch_size, tgt_len, drop_remainder=True)
    steps = _steps(start_step, streams.num_segments, repeat)
    return streams.dataset(steps, 0, batch_size, evaluation=False)


def eval_segment_dataset(ids: np.ndarray | Sequence[int], batch_size: int, tgt_len: int,
                         start_step: int = 0) -> tf.data.Dataset:
    """Evaluation batches ``(inputs, labels, weights)``, all ``[B, T]``
    (int32, int32, float32), one pass, static shapes.

    Streams have ``ceil(N / B)`` ids (the last stream may be shorter), and
    positions past a stream's end are padded with id 0 and weight 0. Every id
    except the first of each stream is a label with weight 1 exactly once, so
    ``sum(weights * nll) / sum(weights)`` is the corpus loss; there are
    ``num_segments(ids, B, T, drop_remainder=False)`` batches.

    Args:
        ids: 1-D integer ids (they must fit int32).
        batch_size: ``B``, streams.
        tgt_len: ``T``, positions per segment.
        start_step: the first segment served (resuming).

    Returns:
        A `tf.data.Dataset` of ``(inputs, labels, weights)``.

    Raises:
        TxlError: bad ids or counts, or too few ids for one segment.
    """
    streams = _Streams(ids, batch_size, tgt_len, drop_remainder=False)
    steps = _steps(start_step, streams.num_segments, repeat=False)
    return streams.dataset(steps, 0, batch_size, evaluation=True)


# Batches each replica's device holds ahead of the step: its ids arrive
# while the step before runs, in the order of its streams (a FIFO per
# replica). The ids are [B/R, T] int32 per replica, so two cost nothing.
DEVICE_PREFETCH = 2


def device_prefetch():
    """`tf.distribute.InputOptions` of the training inputs: each replica's
    batches copied to its device ahead of the step (`DEVICE_PREFETCH` of
    them), one FIFO per replica."""
    return tf.distribute.InputOptions(experimental_fetch_to_device=True,
                                      experimental_per_replica_buffer_size=DEVICE_PREFETCH)


def distribute_segments(strategy: tf.distribute.Strategy, ids, global_batch_size: int,
                        tgt_len: int, start_step: int = 0, repeat: bool = True,
                        evaluation: bool = False):
    """The batches of :func:`segment_dataset` (or, with ``evaluation=True``,
    :func:`eval_segment_dataset`) as a distributed dataset.

    Replica r (``replica_id_in_sync_group``) receives streams
    ``[r*b, (r+1)*b)`` at every step, ``b = global_batch_size / R``; with
    several workers, worker w builds only its contiguous block of streams
    (``input_context.input_pipeline_id``), assuming replica ids are numbered
    worker-major as in MultiWorkerMirroredStrategy and TPUStrategy. The global
    batch of each step is identical for any number of replicas.

    Args:
        strategy: the `tf.distribute.Strategy`.
        ids: 1-D integer ids.
        global_batch_size: streams over all replicas, divisible by their
            number.
        tgt_len: positions per segment.
        start_step: as for :func:`segment_dataset`.
        repeat: as for :func:`segment_dataset` (evaluation: one pass).
        evaluation: serve :func:`eval_segment_dataset`'s batches.

    Returns:
        A `tf.distribute.DistributedDataset`, each replica's batches
        prefetched to its device (:func:`device_prefetch`).
    """
    _check_positive(global_batch_size=global_batch_size)
    evaluation = check_flag("evaluation", evaluation)
    replicas = strategy.num_replicas_in_sync
    if global_batch_size % replicas:
        raise TxlError(f"global_batch_size {global_batch_size} is not divisible by "
                       f"the {replicas} replicas of {type(strategy).__name__}")
    per_replica = global_batch_size // replicas
    streams = _Streams(ids, global_batch_size, tgt_len, drop_remainder=not evaluation)
    repeat = repeat and not evaluation
    _steps(start_step, streams.num_segments, repeat)  # validate arguments here

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        workers = context.num_input_pipelines
        if replicas % workers:
            raise TxlError(f"{replicas} replicas do not split evenly over "
                           f"{workers} input pipelines")
        local = replicas // workers
        if context.get_per_replica_batch_size(global_batch_size) != per_replica:
            raise TxlError("per-replica batch size mismatch")
        r0 = context.input_pipeline_id * local * per_replica
        steps = _steps(start_step, streams.num_segments, repeat)
        return streams.dataset(steps, r0, r0 + local * per_replica, evaluation, split=local)

    return strategy.distribute_datasets_from_function(dataset_fn, options=device_prefetch())
