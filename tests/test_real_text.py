"""Text as it comes from the real world: Windows and old Mac line ends, byte-order
marks, a stdout that is not UTF-8 (tiny files written by the tests)."""
import codecs
import io
import sys

import numpy as np
import pytest
import tensorflow as tf

from txl_tf.data import load_corpus
from txl_tf.text import WordTokenizer, read_vocab


@pytest.fixture(autouse=True)
def user_cache(tmp_path_factory, monkeypatch):
    """A fresh cache root, not ~/.cache."""
    monkeypatch.setenv("TXL_TF_CACHE", str(tmp_path_factory.mktemp("user_cache")))


@pytest.mark.parametrize("text", ["a b\rc\r", "a b\r\nc\r\n", "a b\r\nc", "a b\nc\r"])
def test_word_lines_end_at_cr_and_crlf_as_the_papers_file_reading_does(text):
    """The paper reads lines with Python's universal newlines (`\\r\\n`, `\\r`,
    `\\n`): a file with old Mac line ends (`\\r`) read as one line lost every
    `<eos>` but the last."""
    tok = WordTokenizer.build("a b\nc\n")
    want = tok.encode("a b\nc\n").tolist()
    assert tok.encode(text).tolist() == want
    assert tok.encode_tf(tf.constant(text)).numpy().tolist() == want
    assert tok.encode_tf(tf.constant([text, "c"])).to_list()[0] == want


def test_blank_lines_between_cr_line_ends_count():
    tok = WordTokenizer.build("a b\n")
    eos, a, b = tok.eos_id, tok.index["a"], tok.index["b"]
    for text in ("a\r\rb\r", "a\r\n\r\nb\r\n", "a\n\r\nb\r"):
        assert tok.encode(text).tolist() == [a, eos, eos, b, eos], repr(text)
        assert tok.encode_tf(tf.constant(text)).numpy().tolist() == [a, eos, eos, b, eos]


def test_a_word_corpus_with_cr_line_ends_has_an_eos_per_line(tmp_path):
    (tmp_path / "ptb.train.txt").write_bytes(b"the cat\rsat on\rthe mat\r")
    (tmp_path / "ptb.valid.txt").write_bytes(b"the cat\r\nsat\r\n")
    (tmp_path / "ptb.test.txt").write_bytes(b"mat\n")
    corpus = load_corpus("ptb", tmp_path, use_cache=False)
    tok = corpus.tokenizer
    assert tok.decode(corpus.train) == "the cat\nsat on\nthe mat\n"
    assert tok.decode(corpus.valid) == "the cat\nsat\n"

