"""SentencePiece subword tokenizer: trained with ``sentencepiece``, applied
with ``tensorflow_text.SentencepieceTokenizer`` (so Python and tf.data agree),
decoded with ``sentencepiece``.

``encode`` needs tensorflow-text: the sentencepiece package's encoder breaks
ties between segmentations of equal score otherwise (``type(arg)))``: ``')'
'))'`` where tensorflow-text gives ``'))' ')'``, on one or two lines of
Python code in a thousand), so its ids would not be those the model was
trained on. Without TensorFlow, ``load_tokenizer``, ``decode`` and
``vocab_size`` work and ``encode`` is one ImportError saying so."""
from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from txl_tf.errors import TxlError
from txl_tf.text.base import (Tokenizer, as_text, file_in, register, split_lines,
                              split_lines_tf)

if TYPE_CHECKING:
    import tensorflow as tf
    import tensorflow_text as tf_text

MODEL_FILE = "spm.model"
VOCAB_FILE = "vocab.txt"

# Lossless defaults: no normalisation, keep spaces, bytes for unseen characters.
TRAIN_DEFAULTS = dict(
    model_type="unigram", character_coverage=1.0, byte_fallback=True,
    normalization_rule_name="identity", remove_extra_whitespaces=False,
    split_digits=True, hard_vocab_limit=False, unk_id=0, bos_id=1, eos_id=2,
    pad_id=-1, input_sentence_size=2_000_000, shuffle_input_sentence=True,
    num_threads=2)


def _sentencepiece():
    """The `sentencepiece` module, or an ImportError naming the package to install."""
    try:
        import sentencepiece
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] != "sentencepiece":
            raise
        raise ImportError("a SentencePiece tokenizer needs the sentencepiece package, which "
                          "is not installed: pip install sentencepiece") from None
    return sentencepiece


@register
class SentencePieceTokenizer(Tokenizer):
    """Subword ids from a serialized SentencePiece model (``model_proto``).

    Each line of the text (split at ``\\n`` as for words) is encoded on its own
    and followed by the model's ``</s>`` id when ``add_eos`` (the default), so
    line structure survives: with the lossless training defaults,
    ``decode(encode(t)) == t`` for text that ends with ``\\n`` (every decoded
    line ends with one). ``vocab_size`` is the model's piece count.

    Args:
        model_proto: the serialized SentencePiece model, bytes.
        add_eos: end every line with the model's ``</s>`` id.

    Raises:
        TxlError: ``add_eos`` with a model that has no eos piece.
    """

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes, add_eos: bool = True):
        spm = _sentencepiece()
        self.model_proto = bytes(model_proto)
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(self.model_proto)
        except RuntimeError as err:  # sentencepiece's "INTERNAL: ..." on a damaged model
            raise TxlError(f"not a SentencePiece model ({' '.join(str(err).split())})") \
                from None
        self.pieces = [processor.IdToPiece(i) for i in range(processor.GetPieceSize())]
        self.scores = [processor.GetScore(i) for i in range(processor.GetPieceSize())]
        self.eos_id = processor.eos_id()
        self.unk_id = processor.unk_id()
        if add_eos and self.eos_id < 0:
            raise TxlError("add_eos=True but the SentencePiece model has no eos piece")
        self.add_eos = add_eos
        self._processor = processor
        self._tokenizer = None

    @classmethod
    def train(cls, files: Sequence[str | os.PathLike] | None = None, *,
              texts: Iterable[str] | None = None, vocab_size: int = 8000,
              seed: int = 0, add_eos: bool = True, **options) -> "SentencePieceTokenizer":
        """Train a model on text files or lines.

        Args:
            files: a text file or a list of them (one sentence per line); or
                None with ``texts``.
            texts: a str, or an iterable of lines; or None with ``files``.
            vocab_size: the model's pieces.
            seed: the trainer's random seed.
            add_eos: as for the constructor.
            **options: override :data:`TRAIN_DEFAULTS` (any
                ``sentencepiece`` trainer flag).

        Returns:
            A `SentencePieceTokenizer`.

        Raises:
            TxlError: both or neither of ``files`` and ``texts``, or the
                trainer's refusal (a ``vocab_size`` too small for the text).
            FileNotFoundError: a missing file.
        """
        spm = _sentencepiece()
        if (files is None) == (texts is None):
            raise TxlError("give exactly one of files= or texts=")
        kwargs = dict(TRAIN_DEFAULTS, vocab_size=vocab_size, **options)
        if files is not None:
            paths = [Path(files)] if isinstance(files, (str, os.PathLike)) else \
                [Path(f) for f in files]
            for path in paths:
                try:
                    found = path.is_file()
                except OSError:  # a name too long: a line, not a path
                    found = False
                if not found:
                    shown = str(path) if len(str(path)) <= 80 else str(path)[:77] + "..."
                    raise FileNotFoundError(f"SentencePiece training file not found: {shown} "
                                            "(lines of text go in texts=)")
            kwargs["input"] = ",".join(str(p) for p in paths)
        else:
            # A str is one text (as `build` of the other kinds takes it), not
            # an iterable of one-character sentences; its lines are those `encode`
            # reads (not `str.splitlines`'s, which end at U+2028, form feeds, ...).
            kwargs["sentence_iterator"] = iter(split_lines(texts) if isinstance(texts, str)
                                               else texts)
        model = io.BytesIO()
        spm.set_random_generator_seed(seed)
        with open(os.devnull, "w", encoding="utf-8") as quiet:
            try:
                spm.SentencePieceTrainer.train(model_writer=model, logstream=quiet, **kwargs)
            except RuntimeError as err:  # the trainer's checks: too small a vocab_size, ...
                room = " (byte_fallback's 256 byte pieces count)" if kwargs.get(
                    "byte_fallback") else ""
                raise TxlError(f"SentencePiece training with vocab_size={vocab_size}{room} "
                               f"failed: {str(err).strip()}") from None
        return cls(model.getvalue(), add_eos=add_eos)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def _tf_tokenizer(self) -> tf_text.SentencepieceTokenizer:
        import tensorflow as tf
        import tensorflow_text as tf_text
        # The model's resource belongs to a cached kernel, which
        # `tf.random.set_seed` (so `keras.utils.set_random_seed`) drops with
        # TensorFlow's caches: a tokenizer made before is then made again.
        # Read once and returned as read or built: another thread may drop or
        # replace `self._tokenizer` meanwhile (two may build one each).
        tokenizer = self._tokenizer
        with tf.init_scope():
            if tokenizer is not None:
                try:
                    tokenizer.tokenize(tf.constant([""]))
                except tf.errors.NotFoundError:
                    tokenizer = None
            if tokenizer is None:
                tokenizer = tf_text.SentencepieceTokenizer(model=self.model_proto,
                                                           out_type=tf.int32)
                self._tokenizer = tokenizer
        return tokenizer

    def _encode_tf_batch(self, texts: tf.Tensor) -> tf.RaggedTensor:
        import tensorflow as tf
        lines = split_lines_tf(texts)
        per_line = self._tf_tokenizer().tokenize(lines.flat_values)
        if self.add_eos:
            per_line = tf.concat(
                [per_line, tf.fill([per_line.nrows(), 1], self.eos_id)], axis=1)
        nested = tf.RaggedTensor.from_row_lengths(per_line, lines.row_lengths())
        return nested.merge_dims(1, 2)

    def encode(self, text: str | bytes) -> np.ndarray:
        text = as_text(text)  # bad text is the same error without TensorFlow
        try:
            import tensorflow as tf
            ids = self.encode_tf(tf.constant(text))  # imports tensorflow_text
        except ModuleNotFoundError as missing:
            if (missing.name or "").split(".")[0] not in ("tensorflow", "tensorflow_text"):
                raise
            raise ImportError(
                f"SentencePieceTokenizer.encode needs tensorflow-text, which is not installed "
                f"({missing}): the model's ids are tensorflow-text's (the sentencepiece "
                f"package splits some text differently); pip install tensorflow-text "
                f"(decode needs only sentencepiece)") from None
        return ids.numpy().astype(np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = self._check_ids(ids)
        if not self.add_eos:
            return self._detokenize([ids])[0]
        cuts = np.flatnonzero(ids == self.eos_id)
        lines = np.split(ids, cuts + 1)
        tail = lines.pop()  # ids after the last eos (no line end)
        lines = [line[:-1] for line in lines]
        texts = self._detokenize(lines + [tail])
        return "".join(t + "\n" for t in texts[:-1]) + texts[-1]

    def _detokenize(self, rows: list[np.ndarray]) -> list[str]:
        # sentencepiece's own decoder: tensorflow-text's detokenize drops the
        # spaces a line starts with (" x" came back as "x").
        return [self._processor.DecodeIds([int(i) for i in row]) for row in rows]

    def entries(self) -> list[str]:
        """What :meth:`fingerprint` hashes: not the pieces (``.pieces``, in id
        order) but the model file, pieces and scores together.

        Returns:
            ``[the SHA-256 of model_proto, hex]``.
        """
        return [hashlib.sha256(self.model_proto).hexdigest()]

    def get_config(self) -> dict[str, Any]:
        return {"add_eos": self.add_eos}

    def _save_files(self, directory: Path) -> dict[str, Any]:
        (directory / MODEL_FILE).write_bytes(self.model_proto)
        with open(directory / VOCAB_FILE, "w", encoding="utf-8", newline="") as f:
            f.writelines(f"{p}\t{s}\n" for p, s in zip(self.pieces, self.scores))
        return {"model_file": MODEL_FILE, "vocab_file": VOCAB_FILE}

    @classmethod
    def _from_files(cls, directory: Path, config: dict[str, Any]) -> "SentencePieceTokenizer":
        path = file_in(directory, config, "model_file", MODEL_FILE)
        if not path.is_file():
            raise FileNotFoundError(f"SentencePiece model not found: {path}")
        try:
            return cls(path.read_bytes(), add_eos=config.get("add_eos", True))
        except TxlError as err:
            raise TxlError(f"{path}: {err}") from None
