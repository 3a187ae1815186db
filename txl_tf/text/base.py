"""The tokenizer interface shared by all kinds, and saving/loading.

A saved tokenizer is a directory holding ``tokenizer.json`` (which kind, and
its options) plus the kind's plain-text vocabulary (or SentencePiece model)
files. Nothing is ever pickled.

Only ``encode_tf`` (and the graph helpers here) needs TensorFlow, imported
when it is called: ``load_tokenizer``, ``encode`` and ``decode`` work on a
serving box without it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import numpy as np

from txl_tf.app.files import parse_json
from txl_tf.checks.numpy_checks import as_array, is_integer_dtype
from txl_tf.errors import TxlError

if TYPE_CHECKING:
    import tensorflow as tf

CONFIG_FILE = "tokenizer.json"
FORMAT_VERSION = 1
_REGISTRY: dict[str, type["Tokenizer"]] = {}


def register(cls: type["Tokenizer"]) -> type["Tokenizer"]:
    """Class decorator: make a tokenizer kind loadable by :func:`load_tokenizer`."""
    _REGISTRY[cls.kind] = cls
    return cls


def known_kinds() -> list[str]:
    """The tokenizer kinds `load_tokenizer` reads.

    Returns:
        Their names, sorted.
    """
    return sorted(_REGISTRY)


class Tokenizer:
    """Text <-> int32 ids, from plain Python and inside tf.data graphs.

    Subclasses implement ``vocab_size``, ``encode``, ``decode``,
    ``_encode_tf_batch`` (rank-1 tf.string -> RaggedTensor int32),
    ``_save_files`` and ``_from_files``.
    """

    kind: ClassVar[str] = ""

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str | bytes) -> np.ndarray:
        """Encode one text.

        Args:
            text: a str, or UTF-8 bytes.

        Returns:
            A 1-D int32 numpy array.
        """
        raise NotImplementedError

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Decode ids to text.

        Args:
            ids: 1-D ints in `[0, vocab_size)`.

        Returns:
            The text.

        Raises:
            ValueError: an id outside `[0, vocab_size)`.
        """
        raise NotImplementedError

    def encode_tf(self, text: tf.Tensor) -> tf.Tensor | tf.RaggedTensor:
        """Graph-mode encoding for tf.data / tf.function.

        Same ids as ``encode``.

        Args:
            text: a scalar or 1-D tf.string tensor (or what converts to one).

        Returns:
            For a scalar, a 1-D int32 Tensor; for a 1-D batch, an int32
            RaggedTensor ``[batch, None]``.

        Raises:
            TxlError: a tensor of rank 2 or more.
            ImportError: TensorFlow is not installed (``encode`` needs none).
        """
        tf = _tensorflow(f"{type(self).__name__}.encode_tf")
        try:
            text = tf.convert_to_tensor(text, dtype=tf.string)
        except ValueError as error:  # a str with a lone surrogate
            raise TxlError(f"text is not UTF-8 ({error})") from None
        rank = text.shape.rank
        if rank not in (0, 1):
            raise TxlError(f"encode_tf takes a scalar or 1-D tf.string tensor, "
                           f"got shape {text.shape}")
        if not tf.executing_eagerly():  # in a graph, bad text fails its assertions
            return self._encode(text, rank)
        try:
            return self._encode(text, rank)
        except tf.errors.InvalidArgumentError as error:  # eagerly: the same, named
            what = "text is not UTF-8" if "UnicodeDecode" in str(error) else \
                error.message.strip().splitlines()[0]
            raise TxlError(f"encode_tf: {what}") from None

    def _encode(self, text, rank):
        import tensorflow as tf
        if rank == 0:
            return self._encode_tf_batch(tf.reshape(text, [1])).flat_values
        return self._encode_tf_batch(text)

    def _encode_tf_batch(self, texts: tf.Tensor) -> tf.RaggedTensor:
        raise NotImplementedError

    # -- identity ----------------------------------------------------------
    def entries(self) -> list[str]:
        """The vocabulary, as :meth:`fingerprint` hashes it.

        Returns:
            Its entries in id order (empty for a fixed one, e.g. bytes;
            SentencePiece: one entry, its model file's SHA-256, whose pieces
            are ``.pieces``).
        """
        return []

    def fingerprint(self) -> str:
        """A hash of the kind, its options and :meth:`entries` in order: two
        tokenizers with the same fingerprint give every text the same ids.

        Returns:
            16 hex digits.
        """
        canonical = json.dumps({"type": self.kind, "config": self.get_config(),
                                "entries": self.entries()}, sort_keys=True,
                               ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]

    # -- saving ------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        """The options needed to rebuild this (not the vocabulary).

        Returns:
            A JSON-able dict.
        """
        return {}

    def _save_files(self, directory: Path) -> dict[str, Any]:
        """Write vocabulary/model files; return extra JSON fields."""
        return {}

    @classmethod
    def _from_files(cls, directory: Path, config: dict[str, Any]) -> "Tokenizer":
        raise NotImplementedError

    def save(self, directory: str | os.PathLike) -> Path:
        """Save to ``directory``: ``tokenizer.json`` and the vocabulary files.

        Args:
            directory: the folder (created if needed).

        Returns:
            The directory, a `Path`.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = {"type": self.kind, "format_version": FORMAT_VERSION,
                  "vocab_size": self.vocab_size, "fingerprint": self.fingerprint(),
                  **self.get_config()}
        config.update(self._save_files(directory))
        (directory / CONFIG_FILE).write_text(
            json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Tokenizer":
        """Load a tokenizer saved with :meth:`save`.

        Args:
            directory: the folder :meth:`save` wrote.

        Returns:
            The tokenizer (any kind when called on ``Tokenizer``; the named
            kind otherwise).

        Raises:
            FileNotFoundError: no ``tokenizer.json`` there.
            TxlError: an unreadable description, an unknown kind (or not
                this class's), or vocabulary files that changed since the
                save.
        """
        directory = Path(directory)
        path = directory / CONFIG_FILE
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path} (expected a "
                                    "directory written by Tokenizer.save)")
        try:
            config = parse_json(path.read_text(encoding="utf-8"))
        except ValueError as err:  # not JSON, or not UTF-8
            raise TxlError(f"{path}: not a tokenizer description ({err})") from None
        if not isinstance(config, dict):
            raise TxlError(f"{path}: not a tokenizer description (a JSON object with its "
                           "\"type\")")
        kind = config.get("type")
        if not isinstance(kind, str) or kind not in _REGISTRY:  # a list: a TypeError
            raise TxlError(f"{path}: unknown tokenizer type {kind!r}; "
                           f"known: {', '.join(known_kinds())}")
        target = _REGISTRY[kind]
        if cls is not Tokenizer and not issubclass(target, cls):
            raise TxlError(f"{path} holds a {kind!r} tokenizer, not {cls.kind!r}")
        for key, value in config.items():  # a list where a token belongs was a TypeError
            if key.endswith(("_token", "_char")) and not isinstance(value, (str, type(None))):
                raise TxlError(f"{path}: {key} must be a string, got {value!r}")
        try:
            tokenizer = target._from_files(directory, config)
        except TypeError as err:  # another option of another type
            raise TxlError(f"{path}: {err}") from None
        if "vocab_size" in config and config["vocab_size"] != tokenizer.vocab_size:
            raise TxlError(f"{path}: vocab_size {config['vocab_size']} does not "
                           f"match the loaded vocabulary ({tokenizer.vocab_size})")
        saved = config.get("fingerprint")  # absent in folders saved before it existed
        if saved is not None and saved != tokenizer.fingerprint():
            raise TxlError(f"{directory}: the vocabulary files changed since they were "
                           f"saved (fingerprint {saved} in {CONFIG_FILE}, "
                           f"{tokenizer.fingerprint()} now): entries edited or reordered")
        return tokenizer

    # -- helpers -----------------------------------------------------------
    def _check_ids(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        arr = as_array(ids, "ids", TxlError, "decode takes a 1-D sequence of ids")
        if arr.ndim != 1:
            raise TxlError(f"decode takes a 1-D sequence of ids, got shape {arr.shape}")
        if arr.size == 0:
            return arr.astype(np.int64)
        if not is_integer_dtype(arr.dtype):
            raise TxlError(f"decode takes integer ids, got dtype {arr.dtype}")
        bad = np.flatnonzero((arr < 0) | (arr >= self.vocab_size))
        if bad.size:
            i = int(bad[0])
            raise TxlError(f"id {int(arr[i])} at position {i} is out of range "
                           f"for vocab_size {self.vocab_size}")
        return arr.astype(np.int64)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


def file_in(directory: Path, config: dict[str, Any], key: str, default: str) -> Path:
    """The file `config[key]` (else `default`) names in `directory`: a plain
    file name, since `../x` or `/etc/x` from a downloaded tokenizer.json would
    read a file elsewhere."""
    name = config.get(key, default)
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name \
            or os.sep in name or (os.altsep and os.altsep in name):
        raise TxlError(f"{directory / CONFIG_FILE}: {key} must be a file name in "
                       f"{directory}, got {name!r}")
    return directory / name


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """Load any saved tokenizer (dispatches on ``tokenizer.json``'s ``type``).

    Args:
        directory: the folder `Tokenizer.save` wrote.

    Returns:
        The `Tokenizer`.
    """
    return Tokenizer.load(directory)


def _tensorflow(what: str):
    """The `tensorflow` module, or an ImportError saying that `what` needs it."""
    try:
        import tensorflow as tf
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] != "tensorflow":
            raise
        raise ImportError(f"{what} needs TensorFlow (tf.data graphs), which is not installed "
                          f"({missing}); encode and decode need none") from None
    return tf


def split_lines_tf(texts: tf.Tensor) -> tf.RaggedTensor:
    """Split a rank-1 tf.string batch into lines ``[batch, (lines)]``.

    Lines end at ``\\n``; a final empty piece (text ending in ``\\n``, or the
    empty text) is not a line, so ``"a\\n\\n"`` has two lines, ``""`` none.
    Matches :func:`split_lines`.
    """
    import tensorflow as tf
    lines = tf.strings.split(texts, "\n")
    flat = lines.flat_values
    lengths = lines.row_lengths()
    last = tf.maximum(lines.row_limits() - 1, 0)
    last_empty = tf.logical_and(lengths > 0, tf.equal(tf.gather(flat, last), ""))
    new_lengths = lengths - tf.cast(last_empty, lengths.dtype)
    rows = lines.value_rowids()
    position = tf.range(tf.shape(flat, out_type=rows.dtype)[0]) - tf.gather(
        lines.row_starts(), rows)
    keep = position < tf.gather(new_lengths, rows)
    return tf.RaggedTensor.from_row_lengths(tf.boolean_mask(flat, keep), new_lengths)


def split_lines(text: str) -> list[str]:
    """Python twin of :func:`split_lines_tf`."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def checked(value: tf.Tensor, assertion) -> tf.Tensor:
    """``value``, made to depend on ``assertion`` in graph mode."""
    if assertion is None:  # eager: the assertion already ran
        return value
    import tensorflow as tf
    with tf.control_dependencies([assertion]):
        return tf.identity(value)


def as_text(text: str | bytes) -> str:
    """`text` as a str (bytes decoded); text that is not UTF-8 is a `TxlError`."""
    if isinstance(text, bytes):
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise TxlError(f"text is not UTF-8 ({error})") from None
    if not isinstance(text, str):
        raise TypeError(f"expected str or bytes, got {type(text).__name__}")
    if not text.isascii():  # a lone surrogate is no UTF-8 (encode_tf refuses it too)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise TxlError(f"text is not UTF-8 ({error})") from None
    # A str subclass as a plain str: numpy's str_ becomes a tensor without its trailing NULs.
    return text if type(text) is str else str.__str__(text)
