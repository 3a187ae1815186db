"""Metrics of a classifier's logits against the true labels (numpy only)."""
import numpy as np

from txl_tf.errors import TxlError


def classification_metrics(logits, label_ids, label_names):
    """`{"examples", "accuracy", "loss", "per_class", "confusion"}` for float
    `logits [N, C]` and int `label_ids [N]`.

    `loss` is the mean cross-entropy in nats; `per_class[name]` holds
    `count` (true examples), `accuracy` (the share of them predicted right,
    i.e. recall; None without examples) and `precision` (None when the class
    is never predicted); `confusion[i][j]` counts examples of class i
    predicted as j.
    """
    logits = np.asarray(logits, np.float64)
    label_ids = np.asarray(label_ids).reshape(-1)
    names = list(label_names)
    if logits.ndim != 2 or logits.shape != (label_ids.size, len(names)):
        raise TxlError(f"logits must be [{label_ids.size}, {len(names)}] for "
                       f"{label_ids.size} labels of {len(names)} classes, got "
                       f"{list(logits.shape)}")
    if label_ids.size == 0:
        raise TxlError("no examples to score")
    if ((label_ids < 0) | (label_ids >= len(names))).any():
        raise TxlError(f"label ids must be in [0, {len(names)})")
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    predicted = logits.argmax(-1)
    confusion = np.zeros([len(names)] * 2, np.int64)
    np.add.at(confusion, (label_ids, predicted), 1)
    per_class = {}
    for i, name in enumerate(names):
        count, hits, guessed = confusion[i].sum(), confusion[i, i], confusion[:, i].sum()
        per_class[name] = {"count": int(count),
                           "accuracy": float(hits / count) if count else None,
                           "precision": float(hits / guessed) if guessed else None}
    return {"examples": int(label_ids.size),
            "accuracy": float((predicted == label_ids).mean()),
            "loss": float(-log_probs[np.arange(label_ids.size), label_ids].mean()),
            "per_class": per_class, "confusion": confusion.tolist()}
