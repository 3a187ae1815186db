"""What a run's checkpoints were trained on, and the check that a restart
resumes the same run.

`<model_dir>/checkpoints/run.json` holds the dataset, data folder, corpus
options, global batch size, tgt_len, number of replicas, vocabulary size,
the number and CRC-32 of the training ids, and whether the optimizer scales
the loss (float16: its state has another layout). A restart that finds
checkpoints must match it (the data folder may move if the data is the same); flags that
do not change the data or the batches (train_steps, log_every, eval
settings, verbose, max_time_s, ...) are not recorded.
"""
import json
import os
import zlib

import numpy as np

from training.errors import TrainingError
from txl_tf.app.files import parse_json

RUN_RECORD = "run.json"

# record key -> how a mismatch is named (the flag that sets it)
STRICT = (("dataset", "--dataset"), ("corpus_options", "--corpus_option"),
          ("batch_size", "--batch_size"), ("tgt_len", "--tgt_len"),
          ("replicas", "the number of replicas (--strategy)"),
          ("vocab_size", "the vocabulary size"),
          ("document_separator", "--document_separator"),
          ("loss_scaling", "float16 loss scaling (--mixed_precision=mixed_float16)"))


def checksum(ids, chunk=1 << 24):
    """CRC-32 of `ids` as little-endian int32, read in chunks (memory maps stay cheap)."""
    crc = 0
    for start in range(0, len(ids), chunk):
        crc = zlib.crc32(np.ascontiguousarray(ids[start:start + chunk], dtype="<i4").data, crc)
    return crc


def describe(dataset, data_dir, corpus_options, batch_size, tgt_len, replicas, vocab_size,
             train_ids, document_separator=None, loss_scaling=False):
    """The record of a run (a JSON-ready dict); `loss_scaling`: whether the
    optimizer is float16's loss-scaling one (its state has another layout)."""
    record = {"dataset": dataset,
              "data_dir": os.path.abspath(data_dir) if data_dir else None,
              "corpus_options": dict(sorted((corpus_options or {}).items())),
              "batch_size": int(batch_size), "tgt_len": int(tgt_len),
              "replicas": int(replicas), "vocab_size": int(vocab_size),
              "train_tokens": int(len(train_ids)), "train_crc32": checksum(train_ids),
              "document_separator": document_separator, "loss_scaling": bool(loss_scaling)}
    return json.loads(json.dumps(record))


def differences(previous, record):
    """`[(what, old, new)]` that forbid resuming `previous` as `record`."""
    found = [(flag, previous[key], record[key]) for key, flag in STRICT
             if key in previous and previous[key] != record[key]]
    data = lambda r: (r.get("train_tokens"), r.get("train_crc32"))  # noqa: E731
    if data(previous) != data(record):
        if previous.get("data_dir") != record["data_dir"]:
            found.append(("--data_dir", previous.get("data_dir"), record["data_dir"]))
        elif not found:
            found.append(("the training data (the corpus files changed)",
                          "%s tokens, crc32 %s" % data(previous),
                          "%s tokens, crc32 %s" % data(record)))
    return found


def check(record, path):
    """Raises `TrainingError` unless `record` may resume the run recorded at
    `path` (no file: nothing to compare, e.g. checkpoints of an older version)."""
    if not os.path.exists(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            previous = parse_json(f.read())
    except (OSError, ValueError) as err:
        raise TrainingError(f"cannot read the run record {path}: {err}") from None
    found = differences(previous, record)
    if found:
        listed = "; ".join(f"{what} was {old!r}, now {new!r}" for what, old, new in found)
        raise TrainingError(
            f"cannot resume the checkpoints in {os.path.dirname(path)}: they were trained "
            f"on other data or batches ({listed}); restart with the recorded values "
            f"({path}) or use a new --model_dir")
