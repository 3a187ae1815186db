"""Separate documents as streams: each batch row reads documents one after
another, and the first segment of each document says so (`document_start`),
so a model clears that row's memory there while the other rows keep theirs."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from txl_tf.checks.memory_budget import check_bytes
from txl_tf.checks.numpy_checks import check_count
from txl_tf.data.stream import device_prefetch
from txl_tf.errors import TxlError


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
    batch_size = check_count("batch_size", batch_size, low=1)
    tgt_len = check_count("tgt_len", tgt_len, low=1)
    docs = [np.asarray(d) for d in documents]
    if not docs:
        raise TxlError("no documents: the dataset would be empty")
    for i, doc in enumerate(docs):
        if doc.ndim != 1 or doc.size < 2 or not np.issubdtype(doc.dtype, np.integer):
            raise TxlError(f"document {i} must be a 1-D sequence of at least 2 integer ids, "
                           f"got shape {doc.shape} and dtype {doc.dtype}")
        if doc.min() < 0:
            raise TxlError(f"document {i} holds a negative id ({int(doc.min())})")
        if doc.max() > np.iinfo(np.int32).max:  # the int32 batches would wrap it
            raise TxlError(f"document {i} holds id {int(doc.max())}, beyond int32")
    rows = [[] for _ in range(batch_size)]  # per row: (inputs, labels, start) per segment
    for doc in docs:
        row = min(rows, key=len)
        inputs, targets = doc[:-1], doc[1:]
        for k, begin in enumerate(range(0, inputs.size, tgt_len)):
            row.append((inputs[begin:begin + tgt_len], targets[begin:begin + tgt_len], k == 0))
    steps = max(len(r) for r in rows)
    positions = steps * batch_size * tgt_len
    check_bytes({"ids, labels and weights": 12 * positions, "document starts": steps * batch_size},
                f"the document batches ({steps:,} steps of batch {batch_size:,}, segment "
                f"{tgt_len:,})", "lower the segment length or the batch size")
    token_ids = np.zeros([steps, batch_size, tgt_len], np.int32)
    labels = np.zeros_like(token_ids)
    weights = np.zeros(token_ids.shape, np.float32)
    document_start = np.ones([steps, batch_size], bool)
    for b, row in enumerate(rows):
        for s, (inputs, targets, start) in enumerate(row):
            token_ids[s, b, :len(inputs)] = inputs
            labels[s, b, :len(targets)] = targets
            weights[s, b, :len(targets)] = 1.0
            document_start[s, b] = start
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
    ids = np.asarray(ids)
    ends = np.flatnonzero(ids == separator) + 1
    pieces = np.split(ids, ends)
    return [p for p in pieces if p.size >= 2]


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
    layout = document_segments(documents, global_batch_size, tgt_len)
    steps = layout[0].shape[0]
    per_replica = global_batch_size // replicas

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = replicas // context.num_input_pipelines
        r0 = context.input_pipeline_id * local * per_replica
        token_ids, labels, weights, start = (a[:, r0:r0 + local * per_replica] for a in layout)

        def batch(step):
            """Step `step`'s rows, as `local` per-replica batches one after
            another (the order tf.distribute expects)."""
            parts = [tf.reshape(tf.gather(a, step % steps), (local, per_replica) + a.shape[2:])
                     for a in (token_ids, start, labels, weights)]
            return {"token_ids": parts[0], "document_start": parts[1]}, parts[2], parts[3]

        dataset = tf.data.Dataset.counter(start=int(start_step), dtype=tf.int64).map(batch)
        return dataset.unbatch().prefetch(tf.data.AUTOTUNE)

    return strategy.distribute_datasets_from_function(dataset_fn, options=device_prefetch())
