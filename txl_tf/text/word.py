"""Word-level tokenizer with a plain-text vocabulary (WikiText / PTB / lm1b)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from txl_tf.errors import TxlError
from txl_tf.text.base import (Tokenizer, as_text, checked, file_in, register, split_lines,
                              split_lines_tf)
from txl_tf.text.vocab import build_vocab, count_tokens, read_vocab, whitespace_regex, write_vocab

if TYPE_CHECKING:
    import tensorflow as tf

VOCAB_FILE = "vocab.txt"
_SPLIT_PATTERN = whitespace_regex()


def _universal_newlines(text: str) -> str:
    """`text` with ``\\r\\n`` and a lone ``\\r`` as ``\\n``: the lines the paper's
    code reads (Python's universal newlines; not U+2028, ``\\x0c``, ...)."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


@register
class WordTokenizer(Tokenizer):
    """Whitespace-separated words; one id per word, plus line markers.

    Every line (text split at ``\\n``, ``\\r\\n`` or ``\\r``, as the paper's
    code reads files; blank lines included; a final line without its end
    included) becomes ``[bos] + words + [eos]`` (``bos`` only
    when ``bos_token`` is set: lm1b wraps sentences as ``<S> ... <S>``).
    Words split on Python's whitespace (``str.split()``), identically in
    ``encode`` and ``encode_tf``. Words not in the vocabulary map to
    ``unk_token``. ``decode`` joins words with single spaces and ends every
    line with ``\\n``, so ``decode(encode(t))`` is ``t`` with whitespace
    normalised (and unknown words as ``unk_token``).

    Args:
        vocab: the words (id = index), none twice.
        unk_token: the word unknown words map to (None: they are an error).
        eos_token: the line end.
        bos_token: None, or the line start.

    Raises:
        TxlError: an empty or bad vocabulary, or a token not in it.
    """

    kind = "word"

    def __init__(self, vocab: Sequence[str], unk_token: str | None = "<unk>",
                 eos_token: str = "<eos>", bos_token: str | None = None):
        vocab = list(vocab)
        if not vocab:
            raise TxlError("empty vocabulary")
        index = {}
        for i, token in enumerate(vocab):
            if not isinstance(token, str) or not token or token.split() != [token]:
                raise TxlError(f"vocabulary entry {i} ({token!r}) is not a word")
            if token in index:
                raise TxlError(f"token {token!r} appears twice in the vocabulary "
                               f"(ids {index[token]} and {i})")
            index[token] = i
        if eos_token is None:  # every line ends with it
            raise TxlError("eos_token must be a word of the vocabulary (each line ends with "
                           "it), got None")
        for role, token in (("unk_token", unk_token), ("eos_token", eos_token),
                            ("bos_token", bos_token)):
            if token is not None and token not in index:
                raise TxlError(f"{role} {token!r} is not in the vocabulary")
        self.vocab = vocab
        self.index = index
        self.unk_token, self.eos_token, self.bos_token = unk_token, eos_token, bos_token
        self.unk_id = index[unk_token] if unk_token is not None else -1
        self.eos_id = index[eos_token]
        self.bos_id = index[bos_token] if bos_token is not None else -1
        self._table = None

    # -- construction --------------------------------------------------------
    @classmethod
    def build(cls, texts: Iterable[str] | str, *, min_count: int = 1,
              max_size: int | None = None, unk_token: str | None = "<unk>",
              eos_token: str = "<eos>", bos_token: str | None = None,
              specials: Sequence[str] | None = None) -> "WordTokenizer":
        """Vocabulary from training text (chunks of whole lines).

        Order: ``specials`` (default: eos, bos, unk, those set), then words by
        count (descending), ties by the word itself; deterministic.

        Args:
            texts: a str or an iterable of chunks of whole lines.
            min_count: words seen fewer times are dropped.
            max_size: None, or the most non-special words.
            unk_token: as for the constructor.
            eos_token: as for the constructor.
            bos_token: as for the constructor.
            specials: None, or the words that come first, in order.

        Returns:
            A `WordTokenizer`.
        """
        if isinstance(texts, str):
            texts = [texts]
        return cls.from_counts(count_tokens(texts), min_count=min_count,
                               max_size=max_size, unk_token=unk_token,
                               eos_token=eos_token, bos_token=bos_token,
                               specials=specials)

    @classmethod
    def from_counts(cls, counts, *, min_count: int = 1, max_size: int | None = None,
                    unk_token: str | None = "<unk>", eos_token: str = "<eos>",
                    bos_token: str | None = None,
                    specials: Sequence[str] | None = None) -> "WordTokenizer":
        """Like :meth:`build`, from counts.

        Args:
            counts: a ``{word: count}`` mapping.
            min_count: as for :meth:`build`.
            max_size: as for :meth:`build`.
            unk_token: as for the constructor.
            eos_token: as for the constructor.
            bos_token: as for the constructor.
            specials: as for :meth:`build`.

        Returns:
            A `WordTokenizer`.
        """
        if specials is None:
            specials = [t for t in dict.fromkeys((eos_token, bos_token, unk_token))
                        if t is not None]
        vocab = build_vocab(counts, specials, min_count, max_size)
        return cls(vocab, unk_token=unk_token, eos_token=eos_token, bos_token=bos_token)

    @classmethod
    def from_vocab_file(cls, path, **tokens) -> "WordTokenizer":
        """From a one-word-per-line file (extra columns, e.g. counts, ignored).

        Args:
            path: the file (`read_vocab`).
            **tokens: ``unk_token``, ``eos_token``, ``bos_token`` as for the
                constructor.

        Returns:
            A `WordTokenizer`.
        """
        return cls(read_vocab(path), **tokens)

    # -- encoding ------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str | bytes) -> np.ndarray:
        get, unk, eos, bos = self.index.get, self.unk_id, self.eos_id, self.bos_id
        ids: list[int] = []
        for line in split_lines(_universal_newlines(as_text(text))):
            if bos >= 0:
                ids.append(bos)
            for word in line.split():
                i = get(word, unk)
                if i < 0:
                    raise TxlError(f"word {word!r} is not in the vocabulary "
                                   "and there is no unk_token")
                ids.append(i)
            ids.append(eos)
        return np.array(ids, dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        out: list[str] = []
        line: list[str] = []
        at_start = True
        for i in self._check_ids(ids).tolist():
            if at_start and i == self.bos_id:
                at_start = False
            elif i == self.eos_id:
                out.append(" ".join(line) + "\n")
                line, at_start = [], True
            else:
                line.append(self.vocab[i])
                at_start = False
        if line:
            out.append(" ".join(line))
        return "".join(out)

    def _lookup_table(self) -> tf.lookup.StaticHashTable:
        import tensorflow as tf
        if self._table is None:
            with tf.init_scope():
                self._table = tf.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(
                        tf.constant(self.vocab, tf.string),
                        tf.range(len(self.vocab), dtype=tf.int64)),
                    default_value=self.unk_id)
        return self._table

    def _encode_tf_batch(self, texts: tf.Tensor) -> tf.RaggedTensor:
        import tensorflow as tf
        lines = split_lines_tf(tf.strings.regex_replace(texts, "\r\n?", "\n"))
        # regex_split stops at a NUL byte (dropping the rest of the line);
        # regex_replace and split keep every byte.
        spaced = tf.strings.regex_replace(lines.flat_values, _SPLIT_PATTERN, " ")
        words = tf.strings.split(spaced, " ")
        words = tf.ragged.boolean_mask(words, tf.not_equal(words, ""))
        ids = tf.cast(self._lookup_table().lookup(words.flat_values), tf.int32)
        if self.unk_id < 0:
            ids = checked(ids, tf.debugging.assert_non_negative(
                ids, message="word not in the vocabulary (no unk_token)"))
        per_line = words.with_flat_values(ids)
        n_lines = per_line.nrows()
        parts = [per_line, tf.fill([n_lines, 1], self.eos_id)]
        if self.bos_id >= 0:
            parts.insert(0, tf.fill([n_lines, 1], self.bos_id))
        per_line = tf.concat(parts, axis=1)
        nested = tf.RaggedTensor.from_row_lengths(per_line, lines.row_lengths())
        return nested.merge_dims(1, 2)

    def entries(self) -> list[str]:
        return list(self.vocab)

    # -- saving --------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        return {"unk_token": self.unk_token, "eos_token": self.eos_token,
                "bos_token": self.bos_token}

    def _save_files(self, directory: Path) -> dict[str, Any]:
        write_vocab(directory / VOCAB_FILE, self.vocab)
        return {"vocab_file": VOCAB_FILE}

    @classmethod
    def _from_files(cls, directory: Path, config: dict[str, Any]) -> "WordTokenizer":
        vocab = read_vocab(file_in(directory, config, "vocab_file", VOCAB_FILE))
        return cls(vocab, unk_token=config.get("unk_token"),
                   eos_token=config.get("eos_token", "<eos>"),
                   bos_token=config.get("bos_token"))
