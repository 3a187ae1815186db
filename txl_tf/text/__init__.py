"""Tokenizers (byte, char, word, SentencePiece) and plain-text vocabularies.

Every tokenizer has ``vocab_size``, ``encode(text) -> int32 ndarray``,
``decode(ids) -> str``, graph-mode ``encode_tf(tf.string)`` for tf.data, and
``save(dir)`` / ``load_tokenizer(dir)`` (JSON + plain-text files, no pickle).
All but ``encode_tf`` (and SentencePiece's ``encode``) work without TensorFlow.
"""
from txl_tf.text.base import Tokenizer, known_kinds, load_tokenizer
from txl_tf.text.byte import ByteTokenizer
from txl_tf.text.char import CharTokenizer
from txl_tf.text.spm import SentencePieceTokenizer
from txl_tf.text.vocab import build_vocab, read_vocab, write_vocab
from txl_tf.text.word import WordTokenizer

__all__ = [
    "Tokenizer", "ByteTokenizer", "CharTokenizer", "WordTokenizer",
    "SentencePieceTokenizer", "load_tokenizer", "known_kinds",
    "build_vocab", "read_vocab", "write_vocab",
]
