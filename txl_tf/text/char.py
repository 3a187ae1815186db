"""Character-level tokenizer with a vocabulary (text8 style)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from txl_tf.errors import TxlError
from txl_tf.text.base import Tokenizer, as_text, checked, file_in, register
from txl_tf.text.vocab import build_vocab, read_vocab, write_vocab

if TYPE_CHECKING:
    import tensorflow as tf

VOCAB_FILE = "vocab.txt"
DEFAULT_UNK = "\ufffd"


@register
class CharTokenizer(Tokenizer):
    """One id per Unicode character (code point).

    Newlines are ordinary characters; nothing is appended at line ends.

    Args:
        chars: the vocabulary (id = index), each entry a single character,
            none twice.
        unk_char: receives characters not in the vocabulary (default
            U+FFFD, itself in the vocabulary at id 0 when built with
            :meth:`build`); with None an unknown character is an error.

    Raises:
        TxlError: an empty or bad vocabulary, or ``unk_char`` not in it.
    """

    kind = "char"

    def __init__(self, chars: Sequence[str], unk_char: str | None = DEFAULT_UNK):
        chars = list(chars)
        for i, ch in enumerate(chars):
            if not isinstance(ch, str) or len(ch) != 1:
                raise TxlError(f"vocabulary entry {i} ({ch!r}) is not one character")
        if len(set(chars)) != len(chars):
            raise TxlError("duplicate characters in the vocabulary")
        if not chars:
            raise TxlError("empty character vocabulary")
        if unk_char is not None and unk_char not in chars:
            raise TxlError(f"unk_char {unk_char!r} is not in the vocabulary")
        self.chars = chars
        self.unk_char = unk_char
        self.unk_id = chars.index(unk_char) if unk_char is not None else -1
        codes = np.array([ord(c) for c in chars], dtype=np.int64)
        order = np.argsort(codes)
        self._sorted_codes = codes[order]
        self._sorted_ids = order.astype(np.int32)
        self._table = None

    @classmethod
    def build(cls, texts: Iterable[str] | str, unk_char: str | None = DEFAULT_UNK,
              min_count: int = 1, max_size: int | None = None) -> "CharTokenizer":
        """Vocabulary from training text: ``unk_char`` first, then characters
        by count (descending), ties by code point. Deterministic.

        Args:
            texts: a str or an iterable of chunks.
            unk_char: as for the constructor.
            min_count: characters seen fewer times are dropped.
            max_size: None, or the most characters besides ``unk_char``.

        Returns:
            A `CharTokenizer`.
        """
        if isinstance(texts, str):
            texts = [texts]
        total = np.zeros([0], np.int64)
        for text in texts:
            codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
            found = np.bincount(codes)
            if found.size > total.size:
                found[:total.size] += total
                total = found
            else:
                total[:found.size] += found
        counts = {chr(c): int(total[c]) for c in np.flatnonzero(total)}
        specials = [unk_char] if unk_char is not None else []
        return cls(build_vocab(counts, specials, min_count, max_size), unk_char)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str | bytes) -> np.ndarray:
        text = as_text(text)
        try:
            encoded = text.encode("utf-32-le")
        except UnicodeEncodeError as error:  # a lone surrogate
            raise TxlError(f"text is not UTF-8 ({error})") from None
        codes = np.frombuffer(encoded, dtype=np.uint32).astype(np.int64)
        pos = np.searchsorted(self._sorted_codes, codes)
        pos = np.minimum(pos, len(self._sorted_codes) - 1)
        found = self._sorted_codes[pos] == codes
        ids = np.where(found, self._sorted_ids[pos], self.unk_id).astype(np.int32)
        if self.unk_id < 0 and not found.all():
            i = int(np.flatnonzero(~found)[0])
            raise TxlError(f"character {text[i]!r} (U+{ord(text[i]):04X}) at "
                           f"position {i} is not in the vocabulary and there "
                           "is no unk_char")
        return ids

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return "".join(self.chars[i] for i in self._check_ids(ids))

    def _lookup_table(self) -> tf.lookup.StaticHashTable:
        import tensorflow as tf
        if self._table is None:
            with tf.init_scope():
                self._table = tf.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(
                        tf.constant([ord(c) for c in self.chars], tf.int64),
                        tf.range(len(self.chars), dtype=tf.int64)),
                    default_value=self.unk_id)
        return self._table

    def _encode_tf_batch(self, texts: tf.Tensor) -> tf.RaggedTensor:
        import tensorflow as tf
        codes = tf.strings.unicode_decode(texts, "UTF-8", errors="strict")
        ids = self._lookup_table().lookup(tf.cast(codes.flat_values, tf.int64))
        if self.unk_id < 0:
            ids = checked(ids, tf.debugging.assert_non_negative(
                ids, message="character not in the vocabulary (no unk_char)"))
        return codes.with_flat_values(tf.cast(ids, tf.int32))

    def entries(self) -> list[str]:
        return list(self.chars)

    def get_config(self) -> dict[str, Any]:
        return {"unk_char": self.unk_char}

    def _save_files(self, directory: Path) -> dict[str, Any]:
        write_vocab(directory / VOCAB_FILE, self.chars, escape=True)
        return {"vocab_file": VOCAB_FILE, "vocab_escaped": True}

    @classmethod
    def _from_files(cls, directory: Path, config: dict[str, Any]) -> "CharTokenizer":
        chars = read_vocab(file_in(directory, config, "vocab_file", VOCAB_FILE), escape=True)
        return cls(chars, config.get("unk_char", DEFAULT_UNK))
