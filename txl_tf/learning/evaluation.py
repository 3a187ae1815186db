"""Corpus evaluation the paper's way: streams, segments, carried memory.

The ids are cut into `batch_size` contiguous streams (`ceil(N / B)` ids each,
nothing dropped; with `drop_remainder`, `N // B` each and the last `N mod B`
ids dropped, as the paper's `LMOrderedIterator` does); segments of `tgt_len`
are scored in order with the memory carried between them (the last, shorter
segment is padded and masked), and the loss is the token-weighted mean NLL
over every id except the first of each stream
(`txl_tf.data.eval_segment_dataset`).
"""
import math
import time

import numpy as np
import tensorflow as tf

from txl_tf.checks.numpy_checks import (InputError, check_count, check_flag,
                                        out_of_range_message)
from txl_tf.data import eval_segment_dataset, num_segments, stream_length
from txl_tf.errors import TxlError


def make_scorer(core):
    """A `tf.function` `(inputs, labels, memory) -> (nll [B, T], new memory)`
    of the core at inference (no dropout); one per core, kept on it, so
    evaluating again reuses its graphs instead of tracing new ones. A graph
    per batch size, `tgt_len` and `mem_len`: not relaxed to unknown sizes,
    which a model may branch on (an LSTM's empty state). A new one once
    the core's weights change (`enable_lora`, `quantize`)."""
    from txl_tf.keras_support.placement import kept_on

    def score(inputs, labels, memory):
        return core(inputs, memory, targets=labels, training=False)
    return kept_on(core, "_txl_scorer", lambda: tf.function(score, autograph=False))


def evaluate_ids(core, ids, batch_size=1, tgt_len=None, mem_len=None, max_segments=None,
                 scorer=None, progress=None, by_position=False, drop_remainder=False):
    """Token-weighted NLL of `core` over `ids`.

    `tgt_len` / `mem_len` default to the core's config; `mem_len=0` evaluates
    without memory. `max_segments` stops early (a quick estimate). Returns a
    dict with `loss` (nats/token), `bpc` (bits/token), `ppl`, `tokens`,
    `segments` and `seconds`; with `by_position`, also `loss_by_position`:
    the mean NLL at each position of a segment (`tgt_len` floats; position p
    sees p earlier ids of its segment plus the memory), which shows how far
    back the model's context helps. `drop_remainder=True` reads the paper's
    streams (its `eval.py`): the last `len(ids) mod batch_size` ids are
    dropped, each stream has `len(ids) // batch_size` ids.
    """
    cfg = core.config
    array = np.asarray(ids)
    if array.ndim != 1:
        raise InputError(f"ids must be a 1-D sequence of token ids (a corpus), got "
                         f"{type(ids).__name__} of shape {array.shape}")
    if array.dtype.kind in "iu":  # up front: the step's assertion was TensorFlow's error
        problem = out_of_range_message(array.reshape(-1), cfg.n_token)
        if problem:
            raise InputError(problem)
    tgt_len = cfg.tgt_len if tgt_len is None else check_count("tgt_len", tgt_len, low=1)
    mem_len = cfg.mem_len if mem_len is None else check_count("mem_len", mem_len)
    scorer = scorer or make_scorer(core)
    if check_flag("drop_remainder", drop_remainder):
        length = stream_length(len(ids), batch_size)
        if length < 2:  # a stream's first id is never scored
            raise TxlError(f"{len(ids)} ids are too few for batch_size {batch_size} with "
                           f"drop_remainder: streams of {length} ids give no segment (need at "
                           f"least {2 * batch_size} ids)")
        ids = ids[:batch_size * length]
    total = num_segments(len(ids), batch_size, tgt_len, drop_remainder=False)
    if max_segments is not None:
        total = min(total, check_count("max_segments", max_segments, low=1))
    dataset = eval_segment_dataset(ids, batch_size, tgt_len).take(total)
    memory = core.initial_memory(batch_size, mem_len)
    loss_sums, counts, start = np.zeros(tgt_len), np.zeros(tgt_len), time.time()
    for i, (inputs, labels, weights) in enumerate(dataset):
        nll, memory = scorer(inputs, labels, memory)
        w = weights.numpy().astype(np.float64)
        loss_sums += np.sum(nll.numpy().astype(np.float64) * w, axis=0)
        counts += np.sum(w, axis=0)
        if progress is not None:
            progress(i + 1, total)
    count = float(np.sum(counts))
    loss = float(np.sum(loss_sums)) / max(count, 1.0)
    result = {"loss": loss, "bpc": loss / math.log(2.0), "ppl": math.exp(min(loss, 700.0)),
              "tokens": int(count), "segments": total, "tgt_len": tgt_len, "mem_len": mem_len,
              "batch_size": int(batch_size), "seconds": time.time() - start}
    if by_position:
        result["loss_by_position"] = (loss_sums / np.maximum(counts, 1.0)).tolist()
    return result


def position_bands(loss_by_position):
    """`(first, last, mean loss)` over positions 0, 1, 2-3, 4-7, ... of a
    segment (bands doubling in width), from `loss_by_position`."""
    bands, first = [], 0
    while first < len(loss_by_position):
        last = min(max(2 * first - 1, first), len(loss_by_position) - 1)
        bands.append((first, last, float(np.mean(loss_by_position[first:last + 1]))))
        first = last + 1
    return bands
