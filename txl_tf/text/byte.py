"""Byte-level tokenizer (enwik8 style)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from txl_tf.errors import TxlError
from txl_tf.text.base import Tokenizer, register

if TYPE_CHECKING:
    import tensorflow as tf


@register
class ByteTokenizer(Tokenizer):
    """Raw bytes as ids: id i is the byte value i, so ``vocab_size`` is 256.

    ``encode`` takes bytes (used as is) or str (UTF-8 encoded first); there is
    no unknown token and no end-of-line token (newline is byte 10), as in the
    enwik8 benchmark. ``decode`` returns str (invalid UTF-8, e.g. a cut
    multi-byte character, becomes U+FFFD); ``decode_bytes`` is lossless.
    """

    kind = "byte"

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str | bytes) -> np.ndarray:
        if isinstance(text, str):
            try:
                text = text.encode("utf-8")
            except UnicodeEncodeError as error:  # a lone surrogate
                raise TxlError(f"text is not UTF-8 ({error})") from None
        elif not isinstance(text, (bytes, bytearray, memoryview)):
            raise TypeError(f"expected str or bytes, got {type(text).__name__}")
        return np.frombuffer(bytes(text), dtype=np.uint8).astype(np.int32)

    def decode_bytes(self, ids: Sequence[int] | np.ndarray) -> bytes:
        """Ids back to the exact bytes.

        Args:
            ids: 1-D ints in `[0, 256)`.

        Returns:
            The bytes.
        """
        return self._check_ids(ids).astype(np.uint8).tobytes()

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def _encode_tf_batch(self, texts: tf.Tensor) -> tf.RaggedTensor:
        import tensorflow as tf
        pieces = tf.strings.bytes_split(texts)
        values = tf.reshape(tf.io.decode_raw(pieces.flat_values, tf.uint8), [-1])
        return pieces.with_flat_values(tf.cast(values, tf.int32))

    @classmethod
    def _from_files(cls, directory: Path, config: dict[str, Any]) -> "ByteTokenizer":
        return cls()
