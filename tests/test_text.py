"""Tokenizers: round trips, line markers, vocabulary order, save/load, tf.data."""
import json
import random
import re
import sys
import threading
import types

import numpy as np
import pytest
import tensorflow as tf

from txl_tf.errors import TxlError
from txl_tf.text import (ByteTokenizer, CharTokenizer, SentencePieceTokenizer, Tokenizer,
                         WordTokenizer, build_vocab, load_tokenizer, read_vocab, write_vocab)
from txl_tf.text.prompt import prompt_ids, without_open_line_end

WORDS = ("the cat sat on a mat while the dog ran to the old tree and a bird sang "
         "over river hill town road light dark rain sun wind stone water").split()


def make_text(lines=120, seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        n = rng.randint(0, 12)
        out.append(" ".join(rng.choice(WORDS) for _ in range(n)))
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def text():
    return make_text()


@pytest.fixture(scope="module")
def spm_tok(text):
    return SentencePieceTokenizer.train(texts=text.split("\n"), vocab_size=300)


@pytest.fixture(scope="module")
def tokenizers(text, spm_tok):
    return {"byte": ByteTokenizer(), "char": CharTokenizer.build(text),
            "word": WordTokenizer.build(text), "sentencepiece": spm_tok}


KINDS = ["byte", "char", "word", "sentencepiece"]


# -- round trips ---------------------------------------------------------------

def test_byte_roundtrip_any_bytes():
    tok = ByteTokenizer()
    assert tok.vocab_size == 256
    raw = bytes(range(256)) + b"\n\xff\x00"
    ids = tok.encode(raw)
    assert ids.dtype == np.int32 and ids.tolist() == list(raw)
    assert tok.decode_bytes(ids) == raw
    s = "héllo ☃\n"
    assert tok.decode(tok.encode(s)) == s
    assert len(tok.encode(s)) == len(s.encode("utf-8"))


def test_char_roundtrip_and_order(text):
    tok = CharTokenizer.build(text + "é☃\t")
    assert tok.decode(tok.encode(text + "é☃\t")) == text + "é☃\t"
    assert tok.chars[0] == "\ufffd"  # unk first
    counts = {c: text.count(c) for c in set(text)}
    ordered = sorted(counts, key=lambda c: (-counts[c], c))
    assert tok.chars[1:1 + len(ordered)] == ordered
    unknown = tok.encode("aZb")
    assert unknown[1] == tok.unk_id and tok.decode(unknown) == "a\ufffdb"



def test_char_counts_add_up_over_chunks():
    """A later chunk's counts add to the earlier ones', whatever its highest code point."""
    tok = CharTokenizer.build(["aab", "b", "b"])
    assert tok.chars == ["\ufffd", "b", "a"]  # b: 3, a: 2
    assert CharTokenizer.build(["b", "b", "ac"]).chars == ["\ufffd", "b", "a", "c"]

def test_char_without_unk_names_the_character(text):
    tok = CharTokenizer.build(text, unk_char=None)
    with pytest.raises(ValueError, match=r"'Z'.*position 1"):
        tok.encode("aZ")
    with pytest.raises(TxlError, match="not in the vocabulary"):  # eagerly: named
        tok.encode_tf(tf.constant("aZ"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="not in the vocabulary"):
        tf.function(tok.encode_tf)(tf.constant("aZ"))  # in a graph: its assertion


def test_word_eos_every_line_and_unk():
    tok = WordTokenizer.build("b a b\nc a b\n")
    # specials first, then count desc (b:3, a:2, c:1)
    assert tok.vocab == ["<eos>", "<unk>", "b", "a", "c"]
    ids = tok.encode("a  b\n\n\tzzz c\nlast")
    eos, unk = tok.eos_id, tok.unk_id
    assert ids.tolist() == [3, 2, eos, eos, unk, 4, eos, unk, eos]
    assert tok.decode(ids) == "a b\n\n<unk> c\n<unk>\n"
    assert tok.encode("").size == 0
    assert tok.encode("x\n").tolist() == tok.encode("x").tolist() == [unk, eos]



def test_word_decode_keeps_a_last_line_without_its_end():
    """Generated ids seldom end with eos: their last words are text too."""
    tok = WordTokenizer.build("b a b\nc a b\n")
    b, a, c = (tok.index[w] for w in "bac")
    assert tok.decode([b, a]) == "b a"
    assert tok.decode([b, tok.eos_id, c, a]) == "b\nc a"

def test_word_roundtrip_normalised(text):
    tok = WordTokenizer.build(text)
    messy = text.replace(" ", "  \t", 5)
    assert tok.decode(tok.encode(messy)) == text


def test_word_vocab_ties_min_count_max_size():
    tok = WordTokenizer.build("d c b a\nd c\n", min_count=1)
    assert tok.vocab[2:] == ["c", "d", "a", "b"]  # ties broken by the token
    assert WordTokenizer.build("d c b a\nd c\n", min_count=2).vocab[2:] == ["c", "d"]
    assert WordTokenizer.build("d c b a\nd c\n", max_size=3).vocab[2:] == ["c", "d", "a"]
    # Values of --corpus_option are parsed, so a float or a word can arrive: a
    # TypeError traceback before.
    for options, message in (({"max_size": 1e3}, r"max_size must be an integer >= 0 or None, "
                                                 r"got 1000\.0"),
                             ({"min_count": "abc"}, r"min_count must be an integer >= 1, "
                                                    r"got 'abc'")):
        with pytest.raises(ValueError, match=message):
            WordTokenizer.build("d c\n", **options)


def test_word_bos_eos_lm1b_style():
    tok = WordTokenizer.build("x y\n", unk_token="<UNK>", eos_token="<S>", bos_token="<S>")
    assert tok.vocab[:2] == ["<S>", "<UNK>"]
    s, x, y = tok.index["<S>"], tok.index["x"], tok.index["y"]
    ids = tok.encode("x y\n\nq\n")
    assert ids.tolist() == [s, x, y, s, s, s, s, tok.unk_id, s]
    assert tok.decode(ids) == "x y\n\n<UNK>\n"
    np.testing.assert_array_equal(tok.encode_tf(tf.constant("x y\n\nq\n")).numpy(), ids)


def test_word_unknown_without_unk_token():
    tok = WordTokenizer(["<eos>", "a"], unk_token=None)
    with pytest.raises(ValueError, match="'b' is not in the vocabulary"):
        tok.encode("a b")
    with pytest.raises(ValueError, match="unk_token '<unk>' is not in the vocabulary"):
        WordTokenizer(["<eos>", "a"])


def test_word_eos_token_none_is_named(tmp_path):
    with pytest.raises(ValueError, match="eos_token must be a word of the vocabulary"):
        WordTokenizer(["<eos>", "a", "<unk>"], eos_token=None)
    with pytest.raises(ValueError, match="eos_token must be a word of the vocabulary"):
        WordTokenizer.build("a b\n", eos_token=None)
    WordTokenizer(["<eos>", "a", "<unk>"]).save(tmp_path)
    path = tmp_path / "tokenizer.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "eos_token": None}))
    with pytest.raises(ValueError, match="eos_token must be a word of the vocabulary"):
        load_tokenizer(tmp_path)


def test_sentencepiece_trains_on_a_str_as_on_its_lines(spm_tok, text):
    """texts= a str (as `WordTokenizer.build` and `CharTokenizer.build` take
    one) trained on each character as a sentence of its own."""
    assert SentencePieceTokenizer.train(texts=text, vocab_size=300).pieces == spm_tok.pieces


def test_sentencepiece_names_text_that_is_not_utf8(spm_tok):
    # A lone surrogate was TensorFlow's ValueError ("Error converting unicode string")
    for text in ("a\ud800b", b"ok \xff"):
        with pytest.raises(TxlError, match="text is not UTF-8"):
            spm_tok.encode(text)


@pytest.mark.parametrize("kind", KINDS)
def test_a_numpy_str_reads_as_its_str_trailing_nul_included(tokenizers, kind):
    """A numpy `str_` is a str, but converted to a tensor it loses its trailing
    NULs: SentencePiece read `np.str_("ab\\n\\x00")` as "ab\\n", and
    `prompt_ids` then dropped the closed line's end id (its last char is NUL)."""
    tok = tokenizers[kind]
    for text in ("ab\x00", "ab\n\x00"):
        assert tok.encode(np.str_(text)).tolist() == tok.encode(text).tolist(), text
        assert prompt_ids(tok, np.str_(text)).tolist() == prompt_ids(tok, text).tolist(), text


def test_sentencepiece_encode_gives_tensorflow_texts_ids_where_segmentations_tie():
    """`type(arg)))`: `'))' ')'` and `')' '))'` score the same; tensorflow-text
    (encode_tf, tf.data) gives the first, the sentencepiece package's encoder
    the second, so encode runs tensorflow-text too (never the package)."""
    tok = SentencePieceTokenizer.train(
        texts="".join(f"f(g(x{i}))\nh(k(m(y{i})))\nprint(z)\n" for i in range(60)),
        vocab_size=300)
    text = "(index, type(arg)))\n"
    assert tok.encode(text).tolist() == tok.encode_tf(tf.constant(text)).numpy().tolist()
    assert [tok.pieces[i] for i in tok.encode(text)][-3:] == ["))", ")", "</s>"]


def test_sentencepiece_entries_are_its_models_hash_and_its_pieces_the_vocabulary(spm_tok):
    """What `entries` documents for SentencePiece (its fingerprint reads it)."""
    import hashlib
    assert spm_tok.entries() == [hashlib.sha256(spm_tok.model_proto).hexdigest()]
    assert len(spm_tok.pieces) == spm_tok.vocab_size


def test_sentencepiece_roundtrip(spm_tok, text):
    assert 260 < spm_tok.vocab_size <= 300
    ids = spm_tok.encode(text)
    assert ids.dtype == np.int32 and len(ids) < len(text) / 2  # real subwords
    assert spm_tok.decode(ids) == text
    unseen = "Ünïcode ☃ never  seen\n\n"  # byte fallback, spaces kept
    assert spm_tok.decode(spm_tok.encode(unseen)) == unseen
    assert (spm_tok.encode("a\nb\n") == spm_tok.eos_id).sum() == 2


def test_sentencepiece_encodes_after_the_seed_is_set_again(spm_tok):
    # tensorflow-text's model resource belongs to a cached kernel, which
    # tf.random.set_seed (keras.utils.set_random_seed) drops: every encode
    # after it raised NotFoundError ("Resource ... SentencepieceResource
    # does not exist"), also through the keras-hub tokenizer and tf.data.
    expected = spm_tok.encode("the cat sat\n").tolist()
    tf.random.set_seed(3)
    assert spm_tok.encode("the cat sat\n").tolist() == expected
    lines = tf.data.Dataset.from_tensors(["the cat sat\n"]).map(spm_tok.encode_tf)
    assert next(iter(lines)).to_list() == [expected]


def test_two_threads_rebuilding_the_sentencepiece_model_each_get_one(monkeypatch):
    """Y rebuilt the dropped model (`set_seed`), X found it dropped too and
    set the attribute to None just before Y returned it: Y got None. The
    interleaving is forced: Y waits, having stored its new model, until X
    moves (drops it or builds its own), and X's build waits for Y's return."""
    x_read, x_go, x_moved, y_done = (threading.Event() for _ in range(4))

    class Dropped:  # a model whose resource `tf.random.set_seed` dropped
        def tokenize(self, texts):
            if threading.current_thread().name == "X":
                x_read.set()
                x_go.wait(10)  # X reads it first, finds it dropped once Y has built
            raise tf.errors.NotFoundError(None, None, "SentencepieceResource does not exist")

    class Watched(SentencePieceTokenizer):
        @property
        def _tokenizer(self):
            return self.__dict__["model"]

        @_tokenizer.setter
        def _tokenizer(self, value):
            self.__dict__["model"] = value
            if threading.current_thread().name == "X":
                x_moved.set()
            elif value is not None:  # Y stored its new model
                x_go.set()
                x_moved.wait(10)

    def build(model, out_type):
        if threading.current_thread().name == "X":
            x_moved.set()
            y_done.wait(10)
        return object()

    monkeypatch.setitem(sys.modules, "tensorflow_text",  # imported by the first encode_tf
                        types.SimpleNamespace(SentencepieceTokenizer=build))
    tok = object.__new__(Watched)
    tok.model_proto, tok.__dict__["model"] = b"", Dropped()
    got = {}

    def run():
        got[threading.current_thread().name] = tok._tf_tokenizer()
        if threading.current_thread().name == "Y":
            y_done.set()
    threads = [threading.Thread(target=run, name=name) for name in ("X", "Y")]
    threads[0].start()
    assert x_read.wait(10)
    threads[1].start()
    for thread in threads:
        thread.join(30)
    assert sorted(got) == ["X", "Y"] and None not in got.values(), got


def test_sentencepiece_training_is_deterministic(text, spm_tok):
    again = SentencePieceTokenizer.train(texts=text.split("\n"), vocab_size=300)
    assert again.model_proto == spm_tok.model_proto


# -- vocabulary files, save / load ------------------------------------------------

@pytest.mark.parametrize("kind", ["char", "word"])
def test_vocab_files_identical_across_builds(kind, text, tmp_path):
    cls = CharTokenizer if kind == "char" else WordTokenizer
    # same multiset of lines in a different order must give the same vocabulary
    lines = text.split("\n")
    shuffled = "\n".join(random.Random(1).sample(lines, len(lines)))
    a = cls.build(text).save(tmp_path / "a")
    b = cls.build(shuffled).save(tmp_path / "b")
    assert (a / "vocab.txt").read_bytes() == (b / "vocab.txt").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_roundtrip(kind, tokenizers, text, tmp_path):
    tok = tokenizers[kind]
    tok.save(tmp_path / kind)
    loaded = load_tokenizer(tmp_path / kind)
    assert type(loaded) is type(tok) and loaded.vocab_size == tok.vocab_size
    sample = text[:300] + "Zq\n"
    np.testing.assert_array_equal(loaded.encode(sample), tok.encode(sample))
    assert loaded.decode(tok.encode(sample)) == tok.decode(tok.encode(sample))
    assert not list(tmp_path.rglob("*.pkl")) and not list(tmp_path.rglob("*.pickle"))


def test_char_vocab_file_escapes_whitespace(tmp_path):
    tok = CharTokenizer.build("a b\nc\t\\d\r\u2028")
    tok.save(tmp_path)
    lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert len(lines) == tok.vocab_size + 1 and lines[-1] == ""
    assert read_vocab(tmp_path / "vocab.txt", escape=True) == tok.chars


def test_missing_files_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "tokenizer.json"))):
        load_tokenizer(tmp_path)
    WordTokenizer.build("a b\n").save(tmp_path / "w")
    (tmp_path / "w" / "vocab.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"w/vocab\.txt"):
        load_tokenizer(tmp_path / "w")
    with pytest.raises(FileNotFoundError, match=r"nope\.txt"):
        WordTokenizer.from_vocab_file(tmp_path / "nope.txt")


def test_load_wrong_kind(tmp_path):
    ByteTokenizer().save(tmp_path)
    with pytest.raises(ValueError, match="'byte' tokenizer, not 'word'"):
        WordTokenizer.load(tmp_path)
    assert isinstance(Tokenizer.load(tmp_path), ByteTokenizer)
    (tmp_path / "tokenizer.json").write_text("[]")  # JSON, but not a tokenizer's object
    with pytest.raises(ValueError, match=r"tokenizer\.json: not a tokenizer description"):
        Tokenizer.load(tmp_path)



@pytest.mark.parametrize("change, message", [
    ({"type": "bpe"}, r"unknown tokenizer type 'bpe'; known: byte, char, sentencepiece, word"),
    ({"type": ["char"]}, r"unknown tokenizer type \['char'\]; known: byte, "),  # a TypeError
    ({"vocab_size": 9}, r"vocab_size 9 does not match the loaded vocabulary \(5\)"),
])
def test_a_tokenizer_file_of_another_kind_or_size_is_named(tmp_path, change, message):
    CharTokenizer(list("abc \n"), unk_char=None).save(tmp_path)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: {message}"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_decode_rejects_out_of_range(kind, tokenizers):
    tok = tokenizers[kind]
    with pytest.raises(ValueError,
                       match=rf"id {tok.vocab_size} at position 1 .*vocab_size {tok.vocab_size}"):
        tok.decode([0, tok.vocab_size])
    with pytest.raises(ValueError, match="id -1"):
        tok.decode([-1])


# -- graph mode -------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_encode_tf_in_dataset_map_matches_encode(kind, tokenizers, text):
    tok = tokenizers[kind]
    docs = [text[:200], "", "unseen Wörds ☃ here\n\nend", text[200:700] + "\n\n"]
    ds = tf.data.Dataset.from_tensor_slices(docs).map(tok.encode_tf)
    assert ds.element_spec.dtype == tf.int32
    for doc, ids in zip(docs, ds):
        np.testing.assert_array_equal(ids.numpy(), tok.encode(doc))
    batch = tok.encode_tf(tf.constant(docs))  # rank 1 -> ragged [N, None]
    assert isinstance(batch, tf.RaggedTensor)
    for doc, row in zip(docs, batch):
        np.testing.assert_array_equal(row.numpy(), tok.encode(doc))


def test_word_encode_tf_keeps_words_after_a_nul_byte():
    # tensorflow-text's regex_split stopped at a NUL byte: "a\x00b c" lost
    # everything after "a" in the graph, while encode kept three words.
    tok = WordTokenizer(["<eos>", "<unk>", "a", "\x00", "c"])
    for text in ("a\x00b c\nc", "\x00", "c \x00\n\x00c a"):
        np.testing.assert_array_equal(tok.encode_tf(tf.constant(text)).numpy(),
                                      tok.encode(text))
    assert tok.encode("a\x00b c").tolist() == [1, 4, 0]


# Pieces random texts are made of: control characters (NUL included), every
# kind of line end and Unicode whitespace, combining marks, emoji sequences,
# the special tokens, non-BMP code points.
_PIECES = ["abc xyz", " \t", "\n", "\r\n", "\r", "\x00\x01\x1c\x1d\x1e\x1f\x7f\x85\xa0",
           "\u0301\u0308\u20dd", "\u2028\u2029\u3000\u200b\ufeff\u180e\u2000\u2007",
           "\U0001f600\U0001f44d\U0001f3fd\u200d", "\u00e9\u6f22\u03a9\u0436",
           "<eos><unk><S>", "\ufffd", "\\u0041\\", "\ud7ff\ue000\U0010ffff"]


def _random_text(rng, max_pieces=40):
    out = []
    for _ in range(rng.randint(0, max_pieces)):
        piece = rng.choice(_PIECES)
        out.append(piece if rng.random() < 0.3 else rng.choice(piece))
    return "".join(out)


def test_random_texts_same_ids_in_graph_and_python(tmp_path, spm_tok):
    """Seeded random texts and vocabularies: encode_tf (tf.data, keras-hub)
    gives encode's ids (the corpus reader's), and saved vocabularies load back;
    `prompt_ids` (numpy) drops the line end the graph's rule drops."""
    rng = random.Random(1234)
    for case in range(6):
        texts = [_random_text(rng) for _ in range(24)] + ["", "\n"]
        train = "".join(_random_text(rng) for _ in range(4))
        bos = rng.choice([None, "<S>"])
        word = WordTokenizer.build(train, max_size=rng.choice([None, 5]), bos_token=bos,
                                   eos_token=rng.choice(["<eos>", bos or "<eos>"]))
        char = CharTokenizer.build(train + "\ufffd")
        for tok in (ByteTokenizer(), char, word, spm_tok):
            batch = tok.encode_tf(tf.constant(texts))
            prompts = without_open_line_end(texts, batch, getattr(tok, "eos_id", -1),
                                            tok.kind == "word").to_list()
            for text, row, prompt in zip(texts, batch.to_list(), prompts):
                assert row == tok.encode(text).tolist(), (tok.kind, text)
                assert prompt_ids(tok, text).tolist() == prompt, (tok.kind, text)
            loaded = load_tokenizer(tok.save(tmp_path / f"{case}-{tok.kind}"))
            assert loaded.entries() == tok.entries()
        whole = CharTokenizer.build("".join(texts) + "\ufffd")
        for text in texts:
            assert whole.decode(whole.encode(text)) == text
            ids = word.encode(text)
            text = text.replace("\r\n", "\n").replace("\r", "\n")  # line ends too
            lines = text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
            normalised = "".join(" ".join(line.split()) + "\n" for line in lines if text)
            if word.unk_id not in ids:
                assert word.decode(ids) == normalised


def test_sentencepiece_keeps_the_spaces_a_line_starts_with(spm_tok):
    # tensorflow-text's detokenize dropped them: "  the cat\n" came back as
    # "the cat\n" (indented code lost its indentation).
    assert spm_tok.decode(spm_tok.encode("  the cat\n \tsat\n")) == "  the cat\n \tsat\n"
    rng = random.Random(99)
    for _ in range(30):
        text = "".join(rng.choice([" ", "  ", "\t", "\n", "\r\n", "\x00", "\u3000"])
                       + " ".join(rng.sample(WORDS, rng.randint(0, 4)))
                       + rng.choice(["", " ", "\t"]) + "\n" for _ in range(rng.randint(1, 4)))
        assert spm_tok.decode(spm_tok.encode(text)) == text


def test_sentencepiece_training_files_one_path_or_a_list(text, tmp_path):
    """`files="corpus.txt"` is that file (it was read as one path per
    character: `file not found: c`), and lines given as `files` are a
    FileNotFoundError saying to pass `texts=` (a long one was a raw
    `OSError: File name too long`)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    for files in (str(corpus), corpus):
        tok = SentencePieceTokenizer.train(files, vocab_size=300)
        assert tok.decode(tok.encode("the cat sat")).rstrip("\n") == "the cat sat"
    for line in ("the cat", "the cat sat " * 40):
        with pytest.raises(FileNotFoundError, match=r"not found: .*texts="):
            SentencePieceTokenizer.train([line], vocab_size=300)


def test_sentencepiece_training_a_vocabulary_too_small_is_a_txl_error(text):
    """The trainer's refusal (a `RuntimeError: INTERNAL: src/trainer_interface.cc
    ...`) is the library's error naming `vocab_size` (byte fallback's 256
    pieces need room)."""
    from txl_tf.errors import TxlError
    with pytest.raises(TxlError, match=r"^SentencePiece training with vocab_size=30 .*failed: "
                                       r".*Vocabulary size is smaller than required_chars"):
        SentencePieceTokenizer.train(texts=text.split("\n"), vocab_size=30)


def test_vocabulary_files_that_cannot_be_word_vocabularies_are_named(tmp_path):
    import collections
    with pytest.raises(ValueError, match=r"^duplicate special tokens in \['<eos>', '<eos>'\]$"):
        build_vocab(collections.Counter("ab"), specials=["<eos>", "<eos>"])
    with pytest.raises(ValueError, match=r"^token 1 \('b c'\) is empty or contains whitespace"):
        write_vocab(tmp_path / "v.txt", ["a", "b c"])
    assert not (tmp_path / "v.txt").exists()  # nothing half written
    for text, message in (("a\n\nb\n", r"v.txt:2: blank line in vocabulary file"),
                          ("", r"^vocabulary file is empty: .*v.txt$"),
                          ("a 5\nb 3\na 1\n", r"v.txt: token 'a' appears twice \(lines 1 and 3\)")):
        (tmp_path / "v.txt").write_text(text)
        with pytest.raises(ValueError, match=message):
            read_vocab(tmp_path / "v.txt")


@pytest.mark.parametrize("make, message", [
    (lambda: WordTokenizer([]), r"^empty vocabulary$"),
    (lambda: WordTokenizer(["<unk>", "a b"]), r"^vocabulary entry 1 \('a b'\) is not a word$"),
    (lambda: WordTokenizer(["a", "a"]), r"^token 'a' appears twice in the vocabulary \(ids 0 "
                                        r"and 1\)"),
    (lambda: CharTokenizer(["ab"]), r"^vocabulary entry 0 \('ab'\) is not one character$"),
    (lambda: CharTokenizer(["a", "a"], unk_char=None), r"^duplicate characters in the "
                                                        r"vocabulary$"),
    (lambda: CharTokenizer([], unk_char=None), r"^empty character vocabulary$"),
    (lambda: CharTokenizer(["a"], unk_char="z"), r"^unk_char 'z' is not in the vocabulary$"),
    (lambda: SentencePieceTokenizer.train(vocab_size=10), r"^give exactly one of files= or "
                                                          r"texts=$"),
])
def test_a_vocabulary_a_tokenizer_cannot_take_is_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()
