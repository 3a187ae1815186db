"""Corpus evaluation the paper's way: streams, segments, carried memory.

The ids are cut into `batch_size` contiguous streams (`ceil(N / B)` ids each,
nothing dropped); segments of `tgt_len` are scored in order with the memory
carried between them (the last, shorter segment is padded and masked), and
the loss is the token-weighted mean NLL over every id except the first of
each stream (`txl_tf.data.eval_segment_dataset`).
"""
import math
import time

import numpy as np
import tensorflow as tf

from txl_tf.data import eval_segment_dataset, num_segments


def make_scorer(core):
    """A `tf.function` `(inputs, labels, memory) -> (nll [B, T], new memory)`
    of the core at inference (no dropout)."""
    @tf.function(reduce_retracing=True)
    def score(inputs, labels, memory):
        return core(inputs, memory, targets=labels, training=False)
    return score


def evaluate_ids(core, ids, batch_size=1, tgt_len=None, mem_len=None, max_segments=None,
                 scorer=None, progress=None):
    """Token-weighted NLL of `core` over `ids`.

    `tgt_len` / `mem_len` default to the core's config; `mem_len=0` evaluates
    without memory. `max_segments` stops early (a quick estimate). Returns a
    dict with `loss` (nats/token), `bpc` (bits/token), `ppl`, `tokens`,
    `segments` and `seconds`.
    """
    cfg = core.config
    tgt_len = int(tgt_len or cfg.tgt_len)
    mem_len = cfg.mem_len if mem_len is None else int(mem_len)
    scorer = scorer or make_scorer(core)
    total = num_segments(len(ids), batch_size, tgt_len, drop_remainder=False)
    if max_segments is not None:
        total = min(total, int(max_segments))
    dataset = eval_segment_dataset(ids, batch_size, tgt_len).take(total)
    memory = core.initial_memory(batch_size, mem_len)
    loss_sum, count, start = 0.0, 0.0, time.time()
    for i, (inputs, labels, weights) in enumerate(dataset):
        nll, memory = scorer(inputs, labels, memory)
        w = weights.numpy().astype(np.float64)
        loss_sum += float(np.sum(nll.numpy().astype(np.float64) * w))
        count += float(np.sum(w))
        if progress is not None:
            progress(i + 1, total)
    loss = loss_sum / max(count, 1.0)
    return {"loss": loss, "bpc": loss / math.log(2.0), "ppl": math.exp(min(loss, 700.0)),
            "tokens": int(count), "segments": total, "tgt_len": tgt_len, "mem_len": mem_len,
            "batch_size": int(batch_size), "seconds": time.time() - start}
