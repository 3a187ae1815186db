"""Text as it comes from the real world: Windows and old Mac line ends, byte-order
marks, UTF-16, files without a final newline, lines longer than a chunk, a stdout
that is not UTF-8 (tiny files written by the tests)."""
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


@pytest.mark.parametrize("name", ["wt2", "lm1b"])
def test_a_byte_order_mark_starting_a_word_file_is_no_part_of_its_first_word(name, tmp_path):
    """Notepad's UTF-8 files start with U+FEFF: `\\ufeffthe` was a word of its own
    in the vocabulary (and `<unk>` for a model trained without it)."""
    bom = "\ufeff".encode()
    if name == "wt2":
        files = [tmp_path / f"wiki.{s}.tokens" for s in ("train", "valid", "test")]
    else:
        train = tmp_path / "training-monolingual.tokenized.shuffled"
        held = tmp_path / "heldout-monolingual.tokenized.shuffled"
        train.mkdir(), held.mkdir()
        files = [train / "news.en-00001-of-00100",
                 held / "news.en.heldout-00001-of-00050", held / "news.en.heldout-00000-of-00050"]
    for path in files:
        path.write_bytes(bom + b"the cat\r\nthe mat\r\n")
    corpus = load_corpus(name, tmp_path, use_cache=False)
    tok = corpus.tokenizer
    assert not [w for w in tok.vocab if "\ufeff" in w]
    for split in ("train", "valid", "test"):
        words = tok.decode(corpus.split(split)).replace("<S>", "").split()
        assert words == ["the", "cat", "the", "mat"], split


def test_the_mark_is_dropped_wherever_the_reading_chunks_fall(tmp_path):
    from txl_tf.data.corpora import iter_text_chunks
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffthe cat\nmat".encode())
    for size in (1, 2, 3, 4, 100):
        assert "".join(iter_text_chunks(path, chunk_bytes=size)) == "the cat\nmat", size
    path.write_bytes("a\n\ufeffb\n".encode())  # not at the start: text, as it stands
    assert "".join(iter_text_chunks(path, chunk_bytes=1)) == "a\n\ufeffb\n"


def test_a_vocabulary_file_saved_by_notepad_reads_as_written(tmp_path):
    """A word vocabulary with a byte-order mark and CRLF line ends: its first
    word was `\\ufeff<eos>` (`eos_token '<eos>' is not in the vocabulary`),
    or, were it a plain word, never matched. A character vocabulary with CRLF
    line ends read `a\\r`, not one character."""
    from txl_tf.text import CharTokenizer
    path = tmp_path / "vocab.txt"
    path.write_bytes("\ufeff<eos>\r\n<unk>\r\nthe 12\r\ncat\r\n".encode())
    assert read_vocab(path) == ["<eos>", "<unk>", "the", "cat"]
    tok = WordTokenizer.from_vocab_file(path)
    assert tok.encode("the cat").tolist() == [2, 3, 0]
    path.write_bytes("\ufeffthe\ncat\n".encode())
    assert read_vocab(path) == ["the", "cat"]
    chars = CharTokenizer.build("ab\r\n")
    saved = chars.save(tmp_path / "chars")
    vocab = saved / "vocab.txt"
    vocab.write_bytes(b"\xef\xbb\xbf" + vocab.read_bytes().replace(b"\n", b"\r\n"))
    assert read_vocab(vocab, escape=True) == chars.chars


def test_generated_text_on_an_ascii_stdout_with_surrogateescape(monkeypatch):
    """Under the C locale with UTF-8 mode off (`PYTHONUTF8=0 LC_ALL=C`) stdout
    is ASCII with `surrogateescape`: `lenient_stdout` left it so, and the first
    generated `é` ended `txl-generate` in a `UnicodeEncodeError` traceback."""
    from txl_tf.app.cli import lenient_stdout
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii", errors="surrogateescape")
    monkeypatch.setattr(sys, "stdout", stream)
    lenient_stdout()
    stream.write("caf\u00e9 \U0001f600 \udce9.")
    stream.flush()
    assert raw.getvalue() == b"caf\\xe9 \\U0001f600 \xe9."  # a raw byte stays that byte
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape")
    monkeypatch.setattr(sys, "stdout", stream)
    lenient_stdout()
    assert stream.errors == "surrogateescape"  # UTF-8 mode's: nothing to escape


def test_a_file_of_one_line_ending_in_its_newline_read_with_a_word_model(tmp_path):
    """The split point moved on to the next line start, the text's end, and
    left valid empty (`EmptyCorpusError`); without its final newline the same
    line was split where the percentages fall, as documented."""
    words = WordTokenizer(["<unk>", "<eos>", "alpha"])
    for end in ("", "\n", "\r\n"):
        path = tmp_path / "one_line.txt"
        path.write_bytes(("alpha " * 50 + end).encode())
        corpus = load_corpus("text", path, use_cache=False, tokenizer=words)
        assert len(corpus.valid) >= 5 + 1 and corpus.valid[-1] == words.eos_id, repr(end)
        assert len(corpus.train) >= 45 + 1 and corpus.train[-1] == words.eos_id


@pytest.mark.parametrize("kind", ["word", "sentencepiece"])
def test_a_folder_read_with_a_word_model_keeps_each_files_lines(kind, tmp_path):
    """`load_corpus("text", folder, tokenizer=...)` joined the files' bytes:
    a file without its final newline ran into the next one's first line
    (`cat` + `sat` read as `catsat`, an `<unk>`), and every file's
    byte-order mark was read as part of its first word."""
    from txl_tf.text import SentencePieceTokenizer
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_bytes("\ufeffthe cat".encode())
    (folder / "b.txt").write_bytes(b"sat on\nthe mat\n")
    (folder / "c.txt").write_bytes("\ufeffon the\r\nmat".encode())
    (folder / "d.txt").write_bytes(b"cat\n" * 10)
    want = "the cat\nsat on\nthe mat\non the\r\nmat\n" + "cat\n" * 10
    if kind == "word":
        tok = WordTokenizer.build(want)
    else:
        tok = SentencePieceTokenizer.train(texts=want.split("\n")[:-1] * 20, vocab_size=270)
    corpus = load_corpus("text", folder, tokenizer=tok, use_cache=False)
    ids = np.concatenate([corpus.train, corpus.valid])
    assert ids.tolist() == tok.encode(want).tolist()
    # bytes are read as they are
    raw = load_corpus("text", folder, use_cache=False)
    assert len(raw.train) + len(raw.valid) == sum(p.stat().st_size for p in folder.iterdir())


def test_the_lines_view_of_joined_files_reads_any_range_as_the_whole():
    import random
    import tempfile
    from pathlib import Path
    from txl_tf.data.corpora import _Concat
    rng = random.Random(3)
    pieces = [b"a", b" ", b"\n", b"\r\n", "\ufeff".encode(), "\u00e9".encode(), b""]
    with tempfile.TemporaryDirectory() as tmp:
        for trial in range(200):
            files, want = [], []
            count = rng.randint(1, 4)
            for k in range(count):
                data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
                path = Path(tmp) / f"{trial}-{k}"
                path.write_bytes(data)
                files.append(path)
                data = data.removeprefix("\ufeff".encode())
                want.append(data + (b"\n" if data and not data.endswith(b"\n")
                                    and k < count - 1 else b""))
            whole = b"".join(want)
            joined = _Concat(files, lines=True)
            assert joined.size == len(whole)
            lo = rng.randint(0, len(whole))
            hi = rng.randint(lo, len(whole))
            assert joined.read(lo, hi) == whole[lo:hi], (trial, whole, lo, hi)


@pytest.mark.parametrize("name", ["wt2", "lm1b", "text"])
def test_a_line_longer_than_a_chunk_is_read_in_pieces_with_the_ids_of_the_whole(
        name, tmp_path, monkeypatch):
    """A file of one 200 MB line was read whole (the rest of each chunk kept
    until a newline came): counting and encoding it held the line, its words
    and their ids at once (a MemoryError under 5 GB). Now a line longer than a
    chunk is cut after a space, each piece losing the line markers a cut adds."""
    from txl_tf.data import corpora as corpora_lib
    words = "the cat sat on a mat \u00e9t\u00e9 ran\t".split(" ")
    rng = np.random.default_rng(0)
    line = " ".join(rng.choice(words, 300)) + "\r" + " ".join(rng.choice(words, 300))
    text = f"short one\n{line}\n\nend  of it\r\n" + " ".join(rng.choice(words, 50))
    monkeypatch.setattr(corpora_lib, "CHUNK_BYTES", 64)
    seen = []
    encode = WordTokenizer.encode
    monkeypatch.setattr(WordTokenizer, "encode",
                        lambda self, t: seen.append(len(t)) or encode(self, t))
    counted, count = [], corpora_lib.count_tokens
    monkeypatch.setattr(corpora_lib, "count_tokens", lambda texts: count(
        counted.append(len(t)) or t for t in texts))
    if name == "wt2":
        for split in ("train", "valid", "test"):
            (tmp_path / f"wiki.{split}.tokens").write_text(text, encoding="utf-8")
        corpus = load_corpus(name, tmp_path, use_cache=False)
        tok = corpus.tokenizer
        parts = [corpus.train, corpus.valid, corpus.test]
        whole = [encode(tok, text)] * 3
    elif name == "lm1b":
        train = tmp_path / "training-monolingual.tokenized.shuffled"
        held = tmp_path / "heldout-monolingual.tokenized.shuffled"
        train.mkdir(), held.mkdir()
        for path in (train / "news.en-00001-of-00100", held / "news.en.heldout-00001-of-00050",
                     held / "news.en.heldout-00000-of-00050"):
            path.write_text(text, encoding="utf-8")
        corpus = load_corpus(name, tmp_path, use_cache=False)
        tok = corpus.tokenizer
        parts = [corpus.train, corpus.valid, corpus.test]
        whole = [encode(tok, text)] * 3
    else:
        path = tmp_path / "one.txt"
        path.write_text(text * 3, encoding="utf-8")
        tok = WordTokenizer.build(text)
        corpus = load_corpus(name, path, use_cache=False, tokenizer=tok)
        parts = [np.concatenate([corpus.train, corpus.valid])]
        whole = [encode(tok, text * 3)]
    for got, want in zip(parts, whole):
        assert got.tolist() == want.tolist()
    assert max(seen) < 4 * 64, seen  # never the whole line at once
    if name == "text":  # a given tokenizer: nothing counted
        assert not counted
    else:
        assert counted and max(counted) < 4 * 64, counted


def test_word_files_read_in_pieces_of_any_size_give_the_ids_of_the_whole(tmp_path,
                                                                          monkeypatch):
    import random
    from txl_tf.data import corpora as corpora_lib
    from txl_tf.text import ByteTokenizer, CharTokenizer
    rng = random.Random(5)
    pieces = ["a", "b", " ", "  ", "\t", "\n", "\r\n", "\r", "\u00e9", "\U0001d11e", "\u2028"]
    path = tmp_path / "f.txt"
    for trial in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        path.write_bytes(text.encode())
        tok = rng.choice([WordTokenizer(["<eos>", "<unk>", "a", "b"]),
                          WordTokenizer(["<S>", "<unk>", "a"], unk_token="<unk>",
                                        eos_token="<S>", bos_token="<S>"),
                          ByteTokenizer(), CharTokenizer.build("ab \t\n\r\u00e9")])
        monkeypatch.setattr(corpora_lib, "CHUNK_BYTES", rng.randint(1, 9))
        got = list(corpora_lib._encode_file(tok, path))
        got = np.concatenate(got).tolist() if got else []
        assert got == tok.encode(text).tolist(), (trial, text, tok)


@pytest.mark.parametrize("kind", ["word", "char"])
def test_a_bad_byte_in_a_folder_is_named_by_its_file_and_place_there(kind, tmp_path):
    """A cp1252 `é` in the second file of a folder read with a word or
    character model named the folder and the byte's place in all the files
    joined, not the file."""
    from txl_tf.errors import TxlError
    from txl_tf.text import CharTokenizer
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_bytes("\ufeffthe cat\n".encode() * 5)
    (folder / "b.txt").write_bytes(b"the caf\xe9\n")
    tok = WordTokenizer.build("the cat\n") if kind == "word" else CharTokenizer.build("the cat")
    with pytest.raises(TxlError, match=r"/docs/b\.txt: not valid UTF-8 near byte 7$"):
        load_corpus("text", folder, tokenizer=tok, use_cache=False)


def test_a_utf16_file_is_named_as_one(tmp_path):
    """Windows' "Unicode" text is UTF-16 with a byte-order mark: the error said
    only `not valid UTF-8 near byte 0`."""
    from txl_tf.errors import TxlError
    for split in ("train", "valid", "test"):
        (tmp_path / f"wiki.{split}.tokens").write_bytes("the cat\r\n".encode("utf-16"))
    with pytest.raises(TxlError, match=r"wiki\.train\.tokens: not valid UTF-8 near byte 0 "
                                       r"\(UTF-16, by its byte-order mark: save it as UTF-8\)$"):
        load_corpus("wt2", tmp_path, use_cache=False)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"the cat\n" * 9)
    (folder / "b.txt").write_bytes("the cat\n".encode("utf-16-be").join([b"\xfe\xff", b""]))
    with pytest.raises(TxlError, match=r"b\.txt: not valid UTF-8 near byte [01] \(UTF-16"):
        load_corpus("text", folder, use_cache=False, tokenizer=WordTokenizer.build("the cat"))
    (tmp_path / "vocab.txt").write_bytes("<eos>\n<unk>\n".encode("utf-16"))
    with pytest.raises(TxlError, match=r"is not UTF-8 text \(byte 0; UTF-16, by its "
                                       r"byte-order mark: save it as UTF-8\)"):
        read_vocab(tmp_path / "vocab.txt")


def test_the_attention_pictures_text_file_is_read_without_its_byte_order_mark(tmp_path):
    """`--text_file` saved by Notepad: its mark was the picture's first token
    (three bytes for a byte model, `<unk>` for a word model)."""
    from training.attention_picture import _read_text
    path = tmp_path / "text.txt"
    path.write_bytes("\ufeffthe cat\r\nsat\r\n".encode())
    assert _read_text({"text": None, "text_file": str(path)}) == "the cat\nsat\n"


def test_sentencepiece_trains_on_a_str_split_into_lines_as_it_encodes_them():
    """`train(texts=str)` split the text with `str.splitlines`, at U+2028,
    form feeds and the other breaks `encode` keeps inside a line: the
    trainer never saw those characters, so each became byte pieces."""
    from txl_tf.text import SentencePieceTokenizer
    text = "the cat\u2028sat on\x0cthe mat\x85and ran\n" * 40
    tok = SentencePieceTokenizer.train(texts=text, vocab_size=290)
    pieces = [tok.pieces[i] for i in tok.encode("cat\u2028sat\x0cthe\x85ran\n")]
    assert not [p for p in pieces if p.startswith("<0x")], pieces
    assert tok.decode(tok.encode(text)) == text


def test_a_prompt_ending_in_an_old_mac_line_end_keeps_its_line_end():
    """A word tokenizer ends a line at `\\r` too: the prompt `the cat\\r` ends its
    line (`encode` gives its `<eos>`), but the prompt rule looked for a final
    `\\n` only and dropped that `<eos>`, so the model went on with the line."""
    from txl_tf.models.transformer_xl.transformer_xl_causal_lm_preprocessor import (
        TransformerXLCausalLMPreprocessor)
    from txl_tf.models.transformer_xl.transformer_xl_tokenizer import TransformerXLTokenizer
    from txl_tf.text.prompt import prompt_ids
    words = WordTokenizer(["<unk>", "<eos>", "the", "cat"])
    prompts = ["the cat\r", "the cat\r\n", "the cat\n", "the cat", "the\rcat"]
    want = [[2, 3, 1], [2, 3, 1], [2, 3, 1], [2, 3], [2, 1, 3]]
    assert [prompt_ids(words, p).tolist() for p in prompts] == want
    rows = TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(words), sequence_length=8
                                             ).generate_preprocess(prompts)
    got = [np.asarray(t)[np.asarray(m, bool)].tolist()
           for t, m in zip(rows["token_ids"], rows["padding_mask"])]
    assert got == want


def test_a_long_line_whose_only_whitespace_is_tabs_is_read_in_pieces(tmp_path, monkeypatch):
    """`str.split()` splits words at a tab (form feed, ...) as at a space, but a
    long line was cut only after a space: a one-line file of tab-separated
    words was held whole, as before pieces."""
    from txl_tf.data import corpora as corpora_lib
    rng = np.random.default_rng(1)
    text = "\t".join(rng.choice(["the", "cat", "sat", "\u00e9t\u00e9"], 400)) + "\x0cmat\n"
    for split in ("train", "valid", "test"):
        (tmp_path / f"wiki.{split}.tokens").write_text(text, encoding="utf-8")
    monkeypatch.setattr(corpora_lib, "CHUNK_BYTES", 64)
    seen, encode = [], WordTokenizer.encode
    monkeypatch.setattr(WordTokenizer, "encode",
                        lambda self, t: seen.append(len(t)) or encode(self, t))
    counted, count = [], corpora_lib.count_tokens
    monkeypatch.setattr(corpora_lib, "count_tokens", lambda texts: count(
        counted.append(len(t)) or t for t in texts))
    corpus = load_corpus("wt2", tmp_path, use_cache=False)
    assert corpus.train.tolist() == encode(corpus.tokenizer, text).tolist()
    assert max(seen) < 4 * 64 and max(counted) < 4 * 64, (seen, counted)
    tok = corpus.tokenizer  # a byte split read with the model's words, likewise
    (tmp_path / "one.txt").write_text(text * 3 + "cat\n", encoding="utf-8")
    seen.clear()
    corpus = load_corpus("text", tmp_path / "one.txt", use_cache=False, tokenizer=tok)
    assert np.concatenate([corpus.train, corpus.valid]).tolist() == \
        encode(tok, text * 3 + "cat\n").tolist()
    assert max(seen) < 4 * 64, seen
