"""The training input of a job: the step-addressed segment stream, distributed."""
import gc
import json
import os

import numpy as np
import tensorflow as tf

from txl_tf.data import (distribute_documents, distribute_segments, segment_dataset,
                         split_documents)
from txl_tf.errors import TxlError


def release_input_iterators():
    """Frees the input iterators a finished `fit` leaves to the garbage collector.

    Keras drops its epoch iterator in a reference cycle, so it is destroyed
    at some later collection. Destroying a tf.data iterator waits for a
    thread of the iterator (a stack dump of a stalled process showed it),
    and that wait grew with the time the iterator had lived. Collected
    right after `fit`, the wait is short, and a process that trains
    in-process (a notebook, the tests) does not pause at a random later
    collection (the measurements: benchmarks/NOTES.md §10).
    """
    gc.collect()


def _log_batches(dataset, start_step, path):
    """Appends `{"step", "first_ids", "pid"}` for every batch the pipeline
    hands out (at the time it is handed out) to `path`."""
    pid = os.getpid()

    def write(step, inputs):
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": int(step), "first_ids": inputs[:, 0].tolist(),
                                "pid": pid}) + "\n")
        return np.int64(step)

    def log(step, batch):
        done = tf.numpy_function(write, [step, batch[0]], tf.int64, stateful=True)
        with tf.control_dependencies([done]):
            return tuple(tf.identity(t) for t in batch)

    return dataset.enumerate(start=start_step).map(log)


def training_input(strategy, ids, global_batch_size, tgt_len, start_step=0, batch_log=None,
                   document_separator=None):
    """Batches from global step `start_step` on: the step-s batch is the same
    whatever the number of replicas, and replica r always gets streams
    `[r*b, (r+1)*b)` (`txl_tf.data.distribute_segments`).

    `batch_log` (a file path) records each batch's first-token ids; it needs
    a single replica, without `document_separator` (`train.run` checks
    both). `document_separator` (an id): the corpus is separate documents,
    each ending at that id, streamed one after another per row, each row's
    memory cleared at a document's start
    (`txl_tf.data.distribute_documents`).
    """
    if document_separator is not None:
        if not np.any(np.asarray(ids) == document_separator):
            raise TxlError(f"--document_separator {document_separator}: the training data "
                           "holds no such id, so it would be one document")
        documents = split_documents(ids, document_separator)
        return distribute_documents(strategy, documents, global_batch_size, tgt_len,
                                    start_step=start_step)
    if batch_log:
        dataset = segment_dataset(ids, global_batch_size, tgt_len, start_step=start_step)
        return _log_batches(dataset, start_step, batch_log)
    return distribute_segments(strategy, ids, global_batch_size, tgt_len, start_step=start_step)
