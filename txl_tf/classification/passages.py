"""Passages of N words cut from whole corpora, labelled by corpus (for the
"which corpus does this passage come from" task)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from txl_tf.classification.data import Examples
from txl_tf.classification.labels import LabelSet
from txl_tf.errors import TxlError


def corpus_passages(text: str, n_words: int, *, limit: int | None = None) -> list[str]:
    """Consecutive, non-overlapping passages of exactly ``n_words``
    whitespace-separated words, joined by single spaces (line breaks, a cue
    of the source's layout rather than of its language, are not kept). The
    last, shorter piece is dropped.

    Args:
        text: the corpus.
        n_words: words per passage, a positive int.
        limit: None, or the most passages kept (the first ones).

    Returns:
        The passages, a list of str.
    """
    if isinstance(n_words, bool) or not isinstance(n_words, int) or n_words <= 0:
        raise TxlError(f"n_words must be a positive int, got {n_words!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise TxlError(f"limit must be an int >= 0 or None, got {limit!r}")
    words = text.split()
    count = len(words) // n_words if limit is None else min(len(words) // n_words, limit)
    return [" ".join(words[i * n_words:(i + 1) * n_words]) for i in range(count)]


def passage_examples(corpora: Mapping[str, str], n_words: int, *,
                     per_corpus: int | None = None,
                     labels: LabelSet | None = None) -> Examples:
    """Examples labelled with the corpus name, corpora in the order given.
    Sources read ``name:passage i``.

    Args:
        corpora: ``{name: text}``.
        n_words: words per passage (:func:`corpus_passages`).
        per_corpus: None (all), or the first passages of each corpus kept.
        labels: None (the sorted corpus names), or the :class:`LabelSet`.

    Returns:
        The :class:`Examples`.

    Raises:
        TxlError: no corpora, or one shorter than ``n_words``.
    """
    if not corpora:
        raise TxlError("no corpora given")
    texts, names, sources = [], [], []
    for name, text in corpora.items():
        passages = corpus_passages(text, n_words, limit=per_corpus)
        if not passages:
            raise TxlError(f"corpus {name!r} has fewer than {n_words} words")
        texts += passages
        names += [name] * len(passages)
        sources += [f"{name}:passage {i}" for i in range(len(passages))]
    labels = labels if labels is not None else LabelSet.from_labels(corpora)
    ids = np.array([labels.id(name) for name in names], np.int32)
    return Examples(texts, ids, labels, sources)
