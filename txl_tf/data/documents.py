"""Separate documents as streams: each batch row reads documents one after
another, and the first segment of each document says so (`document_start`),
so a model clears that row's memory there while the other rows keep theirs."""
from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np
import tensorflow as tf

from txl_tf.checks.memory_budget import check_bytes
from txl_tf.checks.numpy_checks import as_array, check_count, is_integer_dtype
from txl_tf.data.stream import _check_ids, device_prefetch
from txl_tf.errors import TxlError


# Segments placed at once by `_plan` (and about the ids whose range it checks
# at once), the bytes of its temporaries per segment (int64 indices and values,
# several alive at once) and of its table per document (int64 sizes, segments,
# rows, first steps, offsets, ends); the test of `_plan`'s memory check holds
# the count to tracemalloc's peak.
_SEGMENT_BLOCK = 1 << 16
_BYTES_PER_SEGMENT = 64
_BYTES_PER_DOCUMENT = 48


def _check_document(i, doc):
    """Raises `TxlError` naming document `i` (a numpy array) unless it is
    1-D, of at least 2 integer ids, each in `[0, int32 max]`."""
    if doc.ndim != 1 or doc.size < 2 or not is_integer_dtype(doc.dtype):
        raise TxlError(f"document {i} must be a 1-D sequence of at least 2 integer ids, "
                       f"got shape {doc.shape} and dtype {doc.dtype}")
    if doc.min() < 0:
        raise TxlError(f"document {i} holds a negative id ({int(doc.min())})")
    if doc.max() > np.iinfo(np.int32).max:  # the int32 batches would wrap it
        raise TxlError(f"document {i} holds id {int(doc.max())}, beyond int32")


def _first_out_of_range(docs, sizes):
    """The index of the first of `docs` (1-D integer arrays of `sizes`
    ids) holding an id below 0 or beyond int32, else `len(docs)`; the
    documents are read a block of about `_SEGMENT_BLOCK` ids at a time."""
    ends = np.cumsum(sizes)
    lo = 0
    while lo < len(docs):
        base = int(ends[lo] - sizes[lo])
        hi = max(lo + 1, int(np.searchsorted(ends, base + _SEGMENT_BLOCK, side="right")))
        # Mixed integer dtypes may join as float64: still exact about the sign and int32 max.
        ids = docs[lo] if hi == lo + 1 else np.concatenate(docs[lo:hi])
        if ids.min() < 0 or ids.max() > np.iinfo(np.int32).max:
            bad = int(np.argmax((ids < 0) | (ids > np.iinfo(np.int32).max)))
            return lo + int(np.searchsorted(ends[lo:hi] - base, bad, side="right"))
        lo = hi
    return len(docs)


def _checked(documents):
    """`(docs, sizes)`: the documents as numpy arrays and their sizes
    (int64), each checked as `_check_document` does, the whole list at once;
    the first bad document raises `_check_document`'s error."""
    docs = [as_array(d, f"document {i}", TxlError) if isinstance(d, np.ma.MaskedArray)
            else np.asarray(d) for i, d in enumerate(documents)]  # a mask: not dropped
    if not docs:
        raise TxlError("no documents: the dataset would be empty")
    integer = {t: is_integer_dtype(t) for t in {doc.dtype for doc in docs}}
    sizes = np.fromiter((doc.size if doc.ndim == 1 and integer[doc.dtype] else 0
                         for doc in docs), np.int64, len(docs))
    short = np.flatnonzero(sizes < 2)  # or of another shape or dtype
    bad = int(short[0]) if short.size else len(docs)
    bad = min(bad, _first_out_of_range(docs[:bad], sizes[:bad]))
    if bad < len(docs):
        _check_document(bad, docs[bad])
    return docs, sizes


def _plan(documents, batch_size, tgt_len):
    """`(docs, (begin, length, document_start))`: the checked documents, and
    per step and row (`[S, B]`) where its segment's inputs start in the
    documents joined (`_flat`), how many it predicts (0: an empty segment)
    and whether it is a document's first (or empty); each document goes to
    the row with the fewest segments so far (the first such row)."""
    batch_size = check_count("batch_size", batch_size, low=1)
    tgt_len = check_count("tgt_len", tgt_len, low=1)
    docs, sizes = _checked(documents)
    segments = -(-(sizes - 1) // tgt_len)
    heap = [(0, row) for row in range(batch_size)]  # (segments so far, row): min picks the first
    rows, firsts = np.empty(len(docs), np.int64), np.empty(len(docs), np.int64)
    for d, n in enumerate(segments.tolist()):
        first, row = heap[0]
        rows[d], firsts[d] = row, first
        heapq.heapreplace(heap, (first + n, row))
    steps = max(count for count, _ in heap)
    total = int(segments.sum())
    block = min(total, _SEGMENT_BLOCK)
    check_bytes({"segment starts and lengths": 13 * steps * batch_size,
                 "their placement": _BYTES_PER_SEGMENT * block,
                 "the document table": _BYTES_PER_DOCUMENT * len(docs)},
                f"the document layout ({steps:,} steps of batch {batch_size:,})",
                "lower the batch size")
    begin = np.zeros([steps, batch_size], np.int64)
    length = np.zeros([steps, batch_size], np.int32)
    document_start = np.ones([steps, batch_size], bool)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    ends = np.cumsum(segments)  # segment j belongs to the document whose end passes it
    for lo in range(0, total, block):  # a block of segments at a time: bounded temporaries
        j = np.arange(lo, min(lo + block, total))
        doc_of = np.searchsorted(ends, j, side="right")
        k = j - (ends[doc_of] - segments[doc_of])  # the segment's number within its document
        at = (firsts[doc_of] + k, rows[doc_of])
        begin[at] = offsets[doc_of] + k * tgt_len
        length[at] = np.minimum(tgt_len, sizes[doc_of] - 1 - k * tgt_len)
        document_start[at] = k == 0
    return docs, (begin, length, document_start)


def _flat(docs):
    """The documents joined, int32 (their ids checked to fit)."""
    flat = np.empty(sum(doc.size for doc in docs), np.int32)
    return np.concatenate(docs, out=flat, casting="unsafe")


def _windows(flat, begin, length, tgt_len):
    """`(token_ids, labels, weights)` of the segments at `begin` with
    `length` predictions (`_plan`), numpy, `begin`'s shape + `[tgt_len]`."""
    t = np.arange(tgt_len)
    valid = t < length[..., None]
    index = np.where(valid, begin[..., None] + t, 0)
    token_ids = np.where(valid, flat[index], 0).astype(np.int32)
    labels = np.where(valid, flat[np.where(valid, index + 1, 0)], 0).astype(np.int32)
    return token_ids, labels, valid.astype(np.float32)


def document_segments(documents: Sequence[Sequence[int]], batch_size: int,
                      tgt_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Lays documents out as `batch_size` streams of whole segments.

    A document of n ids gives n - 1 predictions (its first id has nothing
    before it), in `ceil((n - 1) / tgt_len)` segments; its last segment is
    padded with id 0 and weight 0. Each document goes to the row with the
    fewest segments so far (rows end nearly together), and rows that end
    early get empty segments (weight 0).

    Args:
        documents: one 1-D sequence of ids per document, each of length >= 2.
        batch_size: rows (streams) per batch.
        tgt_len: segment length.

    Returns:
        `(token_ids, labels, weights, document_start)`: `[S, B, T]` int32,
        int32, float32 and `[S, B]` bool (True at a document's first
        segment and at every empty segment), S the number of steps.
    """
    docs, (begin, length, document_start) = _plan(documents, batch_size, tgt_len)
    steps = begin.shape[0]
    positions = steps * batch_size * tgt_len
    check_bytes({"ids, labels and weights": 12 * positions, "document starts": steps * batch_size},
                f"the document batches ({steps:,} steps of batch {batch_size:,}, segment "
                f"{tgt_len:,})", "lower the segment length or the batch size")
    flat = _flat(docs)
    token_ids = np.zeros([steps, batch_size, tgt_len], np.int32)
    labels = np.zeros_like(token_ids)
    weights = np.zeros(token_ids.shape, np.float32)
    block = max(1, (1 << 20) // (batch_size * tgt_len))  # steps filled at once
    for lo in range(0, steps, block):
        token_ids[lo:lo + block], labels[lo:lo + block], weights[lo:lo + block] = _windows(
            flat, begin[lo:lo + block], length[lo:lo + block], tgt_len)
    return token_ids, labels, weights, document_start


def document_dataset(documents: Sequence[Sequence[int]], batch_size: int,
                     tgt_len: int) -> tf.data.Dataset:
    """`document_segments` as batches for `TransformerXLLM.fit` / `evaluate`,
    one pass in order (`.repeat()` goes on from each row's first document).

    Args:
        documents: one 1-D sequence of ids per document, each of length >= 2.
        batch_size: rows (streams) per batch.
        tgt_len: segment length.

    Returns:
        A `tf.data.Dataset` of `({"token_ids" [B, T] int32,
        "document_start" [B] bool}, labels [B, T] int32, weights [B, T]
        float32)`.
    """
    token_ids, labels, weights, document_start = document_segments(documents, batch_size,
                                                                   tgt_len)
    inputs = {"token_ids": token_ids, "document_start": document_start}
    return tf.data.Dataset.from_tensor_slices((inputs, labels, weights))


def split_documents(ids: Sequence[int] | np.ndarray, separator: int) -> list[np.ndarray]:
    """A corpus's ids cut into documents.

    Args:
        ids: 1-D ids.
        separator: the id that ends a document (kept as its last id: it is
            predicted, and it ends the document).

    Returns:
        A list of 1-D numpy arrays; pieces of fewer than 2 ids are dropped
        (they predict nothing).
    """
    ids = _check_ids(ids)  # integers, 1-D, a mask not dropped
    ends = np.flatnonzero(ids == separator) + 1
    starts = np.concatenate([[0], ends])
    stops = np.concatenate([ends, [ids.size]])
    keep = stops - starts >= 2
    return [ids[a:b] for a, b in zip(starts[keep].tolist(), stops[keep].tolist())]


def distribute_documents(strategy: tf.distribute.Strategy, documents, global_batch_size: int,
                         tgt_len: int, start_step: int = 0) -> tf.distribute.DistributedDataset:
    """`document_dataset`'s batches from global step `start_step` on, for
    ever (step s serves segment `s % S` of the layout), as a distributed
    dataset: replica r always gets rows `[r*b, (r+1)*b)`, `b = global_batch_size
    / R`, so each row's stream stays on one replica, and the step-s batch is
    the same for any number of replicas.

    Args:
        strategy: the `tf.distribute.Strategy`.
        documents: as for `document_dataset`.
        global_batch_size: rows over all replicas, divisible by their number.
        tgt_len: segment length.
        start_step: the global step of the first batch, an int >= 0.

    Returns:
        A `tf.distribute.DistributedDataset` of `document_dataset`'s batches.
    """
    replicas = strategy.num_replicas_in_sync
    if global_batch_size % replicas:
        raise TxlError(f"global_batch_size {global_batch_size} is not divisible by the "
                       f"{replicas} replicas of {type(strategy).__name__}")
    if not isinstance(start_step, (int, np.integer)) or start_step < 0:
        raise TxlError(f"start_step must be an int >= 0, got {start_step!r}")
    # The ids (one TensorFlow tensor) and each segment's start and length, not the
    # batches padded (12 bytes a position, a short document's segment mostly padding).
    docs, (begin, length, document_start) = _plan(documents, global_batch_size, tgt_len)
    check_bytes({"ids, labels, weights and positions": 21 * global_batch_size * tgt_len},
                f"a batch of the documents (batch {global_batch_size:,}, segment {tgt_len:,})",
                "lower the segment length or the batch size")
    with tf.device("/cpu:0"):  # the ids in TensorFlow's copy only (dataset_fn keeps no other)
        ids = tf.constant(_flat(docs))
    del docs
    steps = begin.shape[0]
    per_replica = global_batch_size // replicas

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = replicas // context.num_input_pipelines
        r0 = context.input_pipeline_id * local * per_replica
        rows = slice(r0, r0 + local * per_replica)
        starts, lengths, firsts = (tf.constant(a[:, rows]) for a in
                                   (begin, length, document_start))
        t = tf.range(tgt_len, dtype=tf.int64)

        def batch(step):
            """Step `step`'s rows, as `local` per-replica batches one after
            another (the order tf.distribute expects)."""
            s = step % steps
            valid = t[None, :] < tf.cast(tf.gather(lengths, s), tf.int64)[:, None]
            index = tf.where(valid, tf.gather(starts, s)[:, None] + t[None, :], 0)
            token_ids = tf.where(valid, tf.gather(ids, index), 0)
            labels = tf.where(valid, tf.gather(ids, tf.where(valid, index + 1, 0)), 0)
            parts = [tf.reshape(a, (local, per_replica) + tuple(a.shape[1:])) for a in
                     (token_ids, tf.gather(firsts, s), labels, tf.cast(valid, tf.float32))]
            return {"token_ids": parts[0], "document_start": parts[1]}, parts[2], parts[3]

        dataset = tf.data.Dataset.counter(start=int(start_step), dtype=tf.int64).map(batch)
        return dataset.unbatch().prefetch(tf.data.AUTOTUNE)

    return strategy.distribute_datasets_from_function(dataset_fn, options=device_prefetch())
