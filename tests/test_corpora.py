"""Corpus readers on tiny fake layouts, errors, the cache, pystdlib, real PTB."""
import os
import re
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from txl_tf.data import (KNOWN_CORPORA, CorpusNotFoundError, EmptyCorpusError,
                         load_corpus)
from txl_tf.data import corpora as corpora_lib
from txl_tf.errors import TxlError
from txl_tf.text import ByteTokenizer, CharTokenizer, WordTokenizer

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def user_cache(tmp_path_factory, monkeypatch):
    """The default cache root of every test here: a fresh folder, not ~/.cache."""
    root = tmp_path_factory.mktemp("user_cache")
    monkeypatch.setenv("TXL_TF_CACHE", str(root))
    return root


def write(path: Path, content) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_enwik8_bytes_90_5_5(tmp_path):
    raw = np.random.default_rng(0).integers(0, 256, 2000, dtype=np.uint8).tobytes()
    write(tmp_path / "enwik8", raw)
    c = load_corpus("enwik8", tmp_path)
    assert isinstance(c.tokenizer, ByteTokenizer) and c.vocab_size == 256
    assert (len(c.train), len(c.valid), len(c.test)) == (1800, 100, 100)
    assert c.train.dtype == np.int32
    joined = np.concatenate([c.train, c.valid, c.test])
    assert joined.tolist() == list(raw)  # every byte kept, newlines included, no eos


def test_text8_chars(tmp_path):
    text = ("anarchism originated as a term of abuse " * 30)[:1000]
    write(tmp_path / "text8", text)
    c = load_corpus("text8", tmp_path)
    assert isinstance(c.tokenizer, CharTokenizer)
    assert (len(c.train), len(c.valid), len(c.test)) == (900, 50, 50)
    assert "".join(c.tokenizer.decode(s) for s in (c.train, c.valid, c.test)) == text
    assert c.tokenizer.chars[1] == " "  # most frequent character after unk


def test_text8_vocabulary_comes_from_the_training_part_only(tmp_path):
    # The vocabulary was counted over chunks that ran past the training part:
    # characters seen only in valid/test got ids, and counts were off.
    text = "ab " * 300 + "zq" * 50  # 1000 characters; z and q only after the 90%
    write(tmp_path / "text8", text)
    c = load_corpus("text8", tmp_path, use_cache=False)
    assert c.tokenizer.chars == CharTokenizer.build(text[:900]).chars
    assert "z" not in c.tokenizer.chars and c.valid.tolist().count(c.tokenizer.unk_id) == 50


def test_random_word_and_char_corpora_read_as_the_tokenizer_encodes(tmp_path, monkeypatch):
    """Seeded random files (control characters, \\r\\n, blank lines, no final
    newline) read in chunks of a few bytes: each split's ids are what a
    tokenizer built from the training text alone gives the whole split."""
    import random
    rng = random.Random(5)
    pieces = ["the", "cat", " ", "  ", "\t", "\n", "\n\n", "\r\n", "\x00", "\x1c", "\u2028",
              "\u00e9\u0301", "\U0001f600", "<unk>"]
    for case in range(4):
        monkeypatch.setattr(corpora_lib, "CHUNK_BYTES", rng.choice([1, 5, 64]))
        folder = tmp_path / str(case)
        texts = {s: "".join(rng.choice(pieces) for _ in range(rng.randint(5, 60)))
                 for s in ("train", "valid", "test")}
        for split, text in texts.items():
            write(folder / f"wiki.{split}.tokens", text)
        c = load_corpus("wt2", folder, use_cache=False)
        words = WordTokenizer.build(texts["train"])
        assert c.tokenizer.vocab == words.vocab
        for split, text in texts.items():
            assert c.split(split).tolist() == words.encode(text).tolist()
        whole = "".join(texts.values())
        write(folder / "text8", whole)
        c = load_corpus("text8", folder, use_cache=False)
        chars = CharTokenizer.build(whole[:len(whole) - 2 * (len(whole) * 5 // 100)])
        assert c.tokenizer.chars == chars.chars
        assert np.concatenate([c.train, c.valid, c.test]).tolist() == chars.encode(whole).tolist()


@pytest.mark.parametrize("name", ["wt2", "wt103"])
def test_wikitext_words(name, tmp_path):
    write(tmp_path / "wiki.train.tokens", " = Title = \n\n the cat <unk> the \n the end \n")
    write(tmp_path / "wiki.valid.tokens", " the dog \n")
    write(tmp_path / "wiki.test.tokens", "cat\n\n")
    c = load_corpus(name, tmp_path)
    tok = c.tokenizer
    assert isinstance(tok, WordTokenizer)
    assert tok.vocab[:3] == ["<eos>", "<unk>", "the"]  # specials, then most frequent
    eos = tok.eos_id
    assert (c.train == eos).sum() == 4  # every line, the blank one included
    assert c.valid.tolist() == [tok.index["the"], tok.unk_id, eos]  # "dog" unseen
    assert tok.decode(c.test) == "cat\n\n"


def test_ptb_layouts_and_options(tmp_path):
    write(tmp_path / "ptb.train.txt", " a b b c c c \n")
    write(tmp_path / "ptb.valid.txt", " a d \n")
    write(tmp_path / "test.txt", " c \n")  # the paper's renamed layout also works
    c = load_corpus("ptb", tmp_path, min_count=2)
    assert c.tokenizer.vocab == ["<eos>", "<unk>", "c", "b"]
    assert c.tokenizer.decode(c.valid) == "<unk> <unk>\n"
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['max_bytes'\].*min_count"):
        load_corpus("ptb", tmp_path, max_bytes=3)


def lm1b_tree(tmp_path, vocab=False):
    root = tmp_path / "1-billion-word-language-modeling-benchmark-r13output"
    train = root / "training-monolingual.tokenized.shuffled"
    held = root / "heldout-monolingual.tokenized.shuffled"
    write(train / "news.en-00002-of-00100", "the dog barked .\n")
    write(train / "news.en-00001-of-00100", "the cat sat .\nthe end .\n")
    write(held / "news.en.heldout-00000-of-00050", "the cat barked .\n")
    write(held / "news.en.heldout-00001-of-00050", "a new word .\n")
    if vocab:
        write(tmp_path / "1b_word_vocab.txt", "<S>\n</S>\n<UNK>\nthe\n.\ncat\n")
    return tmp_path


def test_lm1b_in_a_log_has_a_line_per_tenth_of_its_shards(tmp_path, monkeypatch, capsys):
    """A log (stderr no terminal) of a large corpus's first read gets plain
    lines: lm1b's over its shards, none for each shard (99 of them, twice)."""
    from txl_tf.data import corpora
    monkeypatch.setattr(corpora, "PROGRESS_MIN_BYTES", 10)
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    load_corpus("lm1b", lm1b_tree(tmp_path), use_cache=False)
    assert capsys.readouterr().err.splitlines() == [
        "lm1b: counting: 1/2 (50%)", "lm1b: counting: 2/2 (100%)",
        "lm1b: train: 1/2 (50%)", "lm1b: train: 2/2 (100%)"]
    load_corpus("lm1b", lm1b_tree(tmp_path), use_cache=False, progress=False)
    assert capsys.readouterr().err == ""


def test_lm1b_sentences_wrapped(tmp_path):
    c = load_corpus("lm1b", lm1b_tree(tmp_path))
    tok = c.tokenizer
    assert tok.vocab[:2] == ["<S>", "<UNK>"]
    s = tok.index["<S>"]
    words = [tok.vocab[i] for i in c.train]
    # shards in sorted order; each sentence <S> ... <S>, no <eos>
    assert words == ["<S>", "the", "cat", "sat", ".", "<S>", "<S>", "the", "end", ".", "<S>",
                     "<S>", "the", "dog", "barked", ".", "<S>"]
    assert c.valid[0] == s and c.valid[-1] == s and tok.unk_id in c.valid
    assert tok.decode(c.test) == "the cat barked .\n"


def test_lm1b_shard_options_are_checked(tmp_path):
    """max_train_shards=-1 dropped the last training shard without a word."""
    lm1b_tree(tmp_path)
    for options, message in (({"max_train_shards": -1}, r"max_train_shards must be an "
                                                        r"integer >= 1 \(or None: all\), got -1"),
                             ({"max_train_shards": 0}, r"max_train_shards .* got 0"),
                             ({"valid_shard": -1}, r"valid_shard must be a heldout shard "
                                                   r"number in \[0, 49\], got -1")):
        with pytest.raises(ValueError, match=message):
            load_corpus("lm1b", tmp_path, use_cache=False, **options)
    assert len(load_corpus("lm1b", tmp_path, use_cache=False, max_train_shards=1).train) == 11


def test_lm1b_vocab_file(tmp_path):
    c = load_corpus("lm1b", lm1b_tree(tmp_path, vocab=True))
    assert c.tokenizer.vocab == ["<S>", "</S>", "<UNK>", "the", ".", "cat"]
    assert c.tokenizer.decode(c.test) == "the cat <UNK> .\n"
    with pytest.raises(CorpusNotFoundError, match="missing_vocab.txt"):
        load_corpus("lm1b", tmp_path, vocab_file=tmp_path / "missing_vocab.txt")


def test_text_file_and_folder(tmp_path):
    write(tmp_path / "one.txt", "x" * 95 + "y" * 5)
    c = load_corpus("text", tmp_path / "one.txt", cache_dir=tmp_path / "cache")
    assert (len(c.train), len(c.valid), len(c.test)) == (90, 10, 0)
    folder = tmp_path / "docs"
    write(folder / "b" / "2.txt", "BBBB")
    write(folder / "a.txt", "AAAA")
    write(folder / ".hidden", "HHHH")
    write(folder / "c.md", "C" * 12)
    c = load_corpus("text", folder)
    assert ByteTokenizer().decode(np.concatenate([c.train, c.valid])) == "AAAA" + "BBBB" + "C" * 12


def test_text_read_with_a_character_model_splits_between_characters(tmp_path):
    """The 90% byte split fell inside a two-byte character: a valid UTF-8 file
    was refused as "not valid UTF-8" when read with a char or word model's
    tokenizer (training.evaluate --dataset=text)."""
    text = "\u00e9" * 100 + "a"  # 201 bytes: the split at byte 181 is inside an é
    path = write(tmp_path / "one.txt", text)
    tokenizer = CharTokenizer.build(text)
    c = load_corpus("text", path, use_cache=False, tokenizer=tokenizer)
    assert tokenizer.decode(np.concatenate([c.train, c.valid])) == text
    assert (len(c.train), len(c.valid)) == (90, 11)
    # pystdlib's max_bytes cut inside a character: the incomplete one is left out.
    write(tmp_path / "py" / "a.py", text)
    c = load_corpus("pystdlib", tmp_path / "py", use_cache=False, tokenizer=tokenizer,
                    max_bytes=101)
    assert tokenizer.decode(np.concatenate([c.train, c.valid, c.test])) == "\u00e9" * 50


def test_text_read_with_a_word_model_splits_between_lines(tmp_path):
    """The 90% byte split fell inside line 36: train ended in `<unk> <eos>`
    and valid started with `<unk>` ("line36" cut in two) and one line more."""
    text = "".join(f"line{i} alpha beta gamma delta\n" for i in range(40))
    path = write(tmp_path / "lines.txt", text)
    at_90, cut = len(text) - len(text) // 10, text.index("line37")
    assert text.index("line36") < at_90 < cut  # (ASCII: bytes are characters)
    words = WordTokenizer(["<unk>", "<eos>"] + sorted(set(text.split())))
    for cache in (True, False):  # built, then read back
        c = load_corpus("text", path, cache_dir=tmp_path / "cache", tokenizer=words)
        assert c.from_cache is not cache
        assert words.decode(c.train) == text[:cut]  # the split moved on to line 37's start
        assert words.decode(c.valid) == text[cut:]
        assert words.unk_id not in c.valid and words.unk_id not in c.train
        assert np.count_nonzero(np.concatenate([c.train, c.valid]) == words.eos_id) == 40
    # Bytes and characters still split at the 90% byte.
    assert len(load_corpus("text", path, use_cache=False).train) == at_90
    assert len(load_corpus("text", path, use_cache=False,
                           tokenizer=CharTokenizer.build(text)).train) == at_90
    # No line starts after the split point: it stays (one line, no newline).
    path = write(tmp_path / "one_line.txt", "alpha " * 50)
    c = load_corpus("text", path, use_cache=False, tokenizer=words)
    assert (len(c.train), len(c.valid)) == (45 + 1, 5 + 1)  # each with an <eos>


def test_byte_corpora_are_read_a_chunk_at_a_time(tmp_path, monkeypatch):
    """text / enwik8 / pystdlib held the whole corpus as one bytes object (two,
    for a folder: the files, then their join), and read with a word model
    (training.evaluate) encoded each split whole: a 1 GB text file hit 7 GB
    and a MemoryError. Now peak memory follows the chunk, not the corpus."""
    import tracemalloc
    monkeypatch.setattr(corpora_lib, "CHUNK_BYTES", 1 << 14)
    lines = "".join(f"w{i % 997} alpha beta w{i % 13}\n" for i in range(40000))
    folder = tmp_path / "docs"
    for name in ("a.txt", "b.txt"):  # 2 x about 1 MB
        write(folder / name, lines)
    text = lines + lines
    words = WordTokenizer(["<unk>", "<eos>"] + sorted(set(text.split())))
    for tokenizer in (None, words):
        tracemalloc.start()
        c = load_corpus("text", folder, cache_dir=tmp_path / "cache", tokenizer=tokenizer)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 1 << 19, (tokenizer, peak)  # the corpus is 2 MB; its ids 8 or 2 MB
        expected = (words if tokenizer else ByteTokenizer()).encode(text)
        assert np.array_equal(np.concatenate([c.train, c.valid]), expected)
    assert c.train[-1] == words.eos_id  # the word split still falls at a line start


def _one_shot(data, percents, tokenizer, path):
    """The ids of `_write_bytes` as it was before the chunked reader: the
    whole corpus in memory, each split encoded at once (the reference)."""
    text = tokenizer is not None and not isinstance(tokenizer, ByteTokenizer)
    if text:
        data = data[:corpora_lib._whole_characters(data)]
    a, b = corpora_lib._split_points(len(data), percents)

    def start(i):  # of the next line for words, else of the character at `i`
        if text and tokenizer.kind == "word" and 0 < i < len(data) and data[i - 1] != 0x0A:
            newline = data.find(b"\n", i)
            if 0 <= newline < len(data) - 1:  # a line starts after it (not the text's end)
                return newline + 1
        while text and 0 < i < len(data) and data[i] & 0xC0 == 0x80:
            i -= 1
        return i
    a = start(a)
    b = start(max(a, b))
    if not text:
        ids = np.frombuffer(data, np.uint8).astype(np.int32)
        return [ids[:a], ids[a:b], ids[b:]]
    return [tokenizer.encode(corpora_lib._decode(part, path, lo))
            for part, lo in ((data[:a], 0), (data[a:b], a), (data[b:], b))]


def test_chunked_reading_gives_the_one_shot_ids_wherever_the_chunks_fall(tmp_path):
    """Chunks of random sizes over files that end mid-line, hold CRLF pairs,
    2- to 4-byte characters, invalid bytes or nothing, cut by `max_bytes`
    anywhere: the ids (or the error naming the byte) are those of the corpus
    read and encoded whole."""
    import random
    from txl_tf.data.cache import MemoryWriter
    rng = random.Random(8)
    pieces = ["a", "b", " ", "\n", "\r\n", "é", "€", "𝄞", "ab", "  "]
    chars = CharTokenizer(sorted(set("ab \n\ré€𝄞")), unk_char=None)
    for trial in range(300):
        files = [write(tmp_path / f"{trial}-{k}.txt",
                       "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))).encode()
                       + (b"\xff" if rng.random() < 0.05 else b""))
                 for k in range(rng.randint(1, 4))]
        data = b"".join(p.read_bytes() for p in files)
        limit = rng.choice([None, rng.randint(0, len(data) + 2)])
        data = data[:limit]
        words = WordTokenizer(["<unk>", "<eos>"] + sorted(set(data.decode("utf-8", "replace")
                                                                  .split())))
        tokenizer = rng.choice([None, ByteTokenizer(), chars, words])
        percents = rng.choice([(90, 10, 0), (90, 5, 5), (34, 33, 33)])
        writers = {s: MemoryWriter() for s in corpora_lib.SPLITS}
        try:
            want = _one_shot(data, percents, tokenizer, tmp_path)
        except TxlError as err:
            at = int(str(err).rsplit(" ", 1)[1])  # in the joined bytes
            for named in files:  # the file it comes from, and its place there
                if at < named.stat().st_size:
                    break
                at -= named.stat().st_size
            with pytest.raises(TxlError, match=re.escape(f"{named}: not valid UTF-8 near byte "
                                                         f"{at}")):
                corpora_lib._write_bytes(corpora_lib._Concat(files, limit), writers, percents,
                                         tokenizer, tmp_path, False, rng.randint(1, 12))
            continue
        corpora_lib._write_bytes(corpora_lib._Concat(files, limit), writers, percents,
                                 tokenizer, tmp_path, False, rng.randint(1, 12))
        for split, ids in zip(corpora_lib.SPLITS, want):
            assert np.array_equal(writers[split].array, ids), (trial, split, data)


def test_a_corpus_read_without_the_cache_holds_its_ids_once(tmp_path, monkeypatch):
    """Without a cache (`use_cache=False`, or a default cache folder that is
    not writable) the ids were collected in chunks and joined at the end:
    two copies at once, 8 GB for a 1 GB byte corpus. They grow one buffer."""
    import tracemalloc
    monkeypatch.setattr(corpora_lib, "CHUNK_BYTES", 1 << 14)
    data = bytes(range(256)) * 4096  # 1 MiB: its ids take 4 MiB
    path = write(tmp_path / "big.bin", data)
    tracemalloc.start()
    c = load_corpus("text", path, use_cache=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 6 << 20, peak  # the ids once (4 MiB), not twice (8 MiB)
    assert np.array_equal(np.concatenate([c.train, c.valid]), np.frombuffer(data, np.uint8))
    assert c.train.dtype == np.int32 and c.test.size == 0


def test_a_memory_writers_array_closes_it_and_is_read_only(tmp_path):
    """`MemoryWriter.array` was a writable view of the growing buffer: an
    append after it raised `BufferError`, and writing into the ids wrote into
    the writer. Reading `array` closes the writer (an append is the one error
    naming the misuse); the ids are read-only, as the cache's memory maps."""
    from txl_tf.data.cache import MemoryWriter
    writer = MemoryWriter()
    writer.append(np.array([3, 1, 4]))
    ids = writer.array
    assert ids.tolist() == [3, 1, 4] and ids.dtype == np.int32 and not ids.flags.writeable
    with pytest.raises(TxlError, match=r"^MemoryWriter\.append after the writer was closed "
                                       r"\(its `array` read"):
        writer.append(np.array([1]))
    with pytest.raises(ValueError, match="read-only"):
        ids[0] = 9
    assert writer.array.tolist() == [3, 1, 4] and writer.length == 3
    cached = load_corpus("text", write(tmp_path / "a.txt", b"abc\n" * 10),
                         cache_dir=tmp_path / "cache")
    uncached = load_corpus("text", tmp_path / "a.txt", use_cache=False)
    assert not cached.train.flags.writeable and not uncached.train.flags.writeable


def _text8_like():
    """One line of words and no newline, as text8 is."""
    import random
    rng = random.Random(3)
    return " ".join(rng.choice(["anarchism", "as", "a", "term", "of", "abuse", "zero"])
                    for _ in range(300))


def test_text8_read_with_a_word_model_cuts_chunks_between_words(tmp_path, monkeypatch):
    """Each chunk was encoded alone: a word cut at its end (two unknown
    halves) and an `<eos>` after it, though text8 has no line end."""
    text = _text8_like()
    write(tmp_path / "text8", text)
    words = WordTokenizer.build(text)
    assert words.unk_id not in words.encode(text)
    monkeypatch.setattr(corpora_lib, "CHUNK_BYTES", 7)
    for cache in (True, False):  # built, then read back (entries of old cuts are not reused)
        c = load_corpus("text8", tmp_path, cache_dir=tmp_path / "cache", tokenizer=words)
        assert c.from_cache is not cache
        for split in (c.train, c.valid, c.test):  # each ends its (one) line: one <eos>
            assert split[-1] == words.eos_id and np.count_nonzero(split == words.eos_id) == 1
        got = np.concatenate([split[:-1] for split in (c.train, c.valid, c.test)])
        np.testing.assert_array_equal(got, words.encode(text)[:-1])  # every word, whole
        assert len(c.train) / len(got) == pytest.approx(0.9, abs=0.02)
    # With lines, a chunk ends at a line start, and each split is the encoding of its lines.
    lines = "".join(line + "\n" for line in text.split(" a "))
    write(tmp_path / "lines" / "text8", lines)
    c = load_corpus("text8", tmp_path / "lines", use_cache=False, tokenizer=words)
    assert "".join(words.decode(split) for split in (c.train, c.valid, c.test)) == lines
    # Characters are read as before: fixed chunks, every character kept.
    c = load_corpus("text8", tmp_path, use_cache=False)
    assert np.concatenate([c.train, c.valid, c.test]).tolist() == c.tokenizer.encode(text).tolist()


def test_text8_of_one_line_ending_in_a_newline_is_split_at_spaces(tmp_path):
    """Regression: the split points moved on to the next line start, the
    text's end: all of it went to train, and valid was refused as empty."""
    text = _text8_like() + "\n"
    write(tmp_path / "text8", text)
    words = WordTokenizer.build(text)
    c = load_corpus("text8", tmp_path, use_cache=False, tokenizer=words)
    got = np.concatenate([split[:-1] for split in (c.train, c.valid, c.test)])
    np.testing.assert_array_equal(got, words.encode(text)[:-1])
    assert len(c.train) / len(got) == pytest.approx(0.9, abs=0.02)
    assert len(c.valid) / len(got) == pytest.approx(0.05, abs=0.02)


def test_pieces_never_cut_at_a_space_past_a_line_end():
    """Regression: a piece cut at the space a line starts with ended with the
    `\n` before it, and lost that line's `<eos>` as a cut inside a line."""
    text = "aa bb\n cc dd\r\n  ee\n\n ff gg"
    for bos in (None, "<s>"):
        words = WordTokenizer.build(text, bos_token=bos)
        for step in range(1, len(text) + 1):
            for lo in (0, 3):
                got = np.concatenate(list(corpora_lib._encode_in_pieces(words, text, lo,
                                                                        len(text), step)))
                np.testing.assert_array_equal(got, words.encode(text[lo:]),
                                              err_msg=f"step {step}, from {lo}, bos {bos}")


def test_text8_read_with_a_sentencepiece_model_gives_the_pieces_of_the_whole(tmp_path,
                                                                             monkeypatch):
    from txl_tf.text import SentencePieceTokenizer
    text = _text8_like()
    write(tmp_path / "text8", text)
    monkeypatch.setattr(corpora_lib, "CHUNK_BYTES", 7)
    # Without a dummy prefix, a word after a cut space reads otherwise: no cut there.
    for options in ({}, {"add_dummy_prefix": False}):
        pieces = SentencePieceTokenizer.train(
            texts=[text[i:i + 200] for i in range(0, 2000, 50)], vocab_size=300, **options)
        c = load_corpus("text8", tmp_path, use_cache=False, tokenizer=pieces)
        splits = (c.train, c.valid, c.test)
        assert all(np.count_nonzero(split == pieces.eos_id) == 1 for split in splits)
        parts = [pieces.decode(split) for split in splits]  # each split is its text's encoding
        assert all(part.endswith("\n") for part in parts)
        assert " ".join(part[:-1] for part in parts) == text  # cut at two spaces
        for split, part in zip(splits, parts):
            np.testing.assert_array_equal(split, pieces.encode(part))
        if not options:  # the pieces of the whole text, but at the split points
            got = np.concatenate([split[:-1] for split in splits])
            np.testing.assert_array_equal(got, pieces.encode(text)[:-1])


def test_a_bad_byte_is_named_by_its_place_in_the_file(tmp_path):
    """The offset was the one within the chunk being read (16 MiB chunks)."""
    path = write(tmp_path / "wiki.train.tokens", b"a b\n" * 10 + b"c \xff\n")
    with pytest.raises(ValueError, match=r"not valid UTF-8 near byte 42$"):
        list(corpora_lib.iter_text_chunks(path, chunk_bytes=8))


def stdlib_files():
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".")
                   and x not in ("site-packages", "dist-packages", "__pycache__")]
        found += [Path(d) / f for f in files if f.endswith(".py") and not f.startswith(".")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def test_pystdlib_small_cap(tmp_path):
    c = load_corpus("pystdlib", cache_dir=tmp_path, max_bytes=40_000)
    assert (len(c.train), len(c.valid), len(c.test)) == (36_000, 2_000, 2_000)
    expected = b"".join(p.read_bytes() for p in stdlib_files()[:40])[:40_000]
    got = ByteTokenizer().decode_bytes(np.concatenate([c.train, c.valid, c.test]))
    assert got == expected
    assert load_corpus("pystdlib", cache_dir=tmp_path, max_bytes=40_000).from_cache
    with pytest.raises(ValueError, match="max_bytes must be a positive int"):
        load_corpus("pystdlib", cache_dir=tmp_path, max_bytes=0)


# -- errors ------------------------------------------------------------------------

@pytest.mark.parametrize("name,missing", [
    ("enwik8", "enwik8"), ("text8", "text8"), ("wt103", "wiki.train.tokens"),
    ("ptb", "ptb.train.txt"), ("lm1b", "training-monolingual.tokenized.shuffled")])
def test_missing_file_names_path_and_layout(name, missing, tmp_path):
    with pytest.raises(CorpusNotFoundError) as info:
        load_corpus(name, tmp_path)
    assert isinstance(info.value, FileNotFoundError)
    message = str(info.value)
    assert str(tmp_path / missing) in message and "expected layout" in message


def test_missing_data_dir(tmp_path):
    with pytest.raises(CorpusNotFoundError, match="data_dir not given"):
        load_corpus("wt2")
    with pytest.raises(CorpusNotFoundError, match=re.escape(str(tmp_path / "nowhere"))):
        load_corpus("text", tmp_path / "nowhere")


def test_empty_corpus(tmp_path, user_cache):
    write(tmp_path / "enwik8", b"")
    with pytest.raises(EmptyCorpusError, match="train split is empty"):
        load_corpus("enwik8", tmp_path)
    for split in ("train", "valid", "test"):
        write(tmp_path / f"ptb.{split}.txt", "a b\n" if split != "valid" else "")
    with pytest.raises(EmptyCorpusError, match=r"valid split is empty.*ptb\.valid\.txt"):
        load_corpus("ptb", tmp_path)
    assert not list(user_cache.glob("ptb-*"))  # nothing half-cached
    (tmp_path / "folder").mkdir()
    with pytest.raises(EmptyCorpusError, match=r"^no files in .*folder \(data_dir = a text file"):
        load_corpus("text", tmp_path / "folder")
    with pytest.raises(CorpusNotFoundError, match=r"^Python source folder not found: .*nowhere"):
        load_corpus("pystdlib", tmp_path / "nowhere")
    with pytest.raises(EmptyCorpusError, match=r"^no \.py files found \(\*\.py files under "
                                               r".*folder"):
        load_corpus("pystdlib", tmp_path / "folder")
    shards = tmp_path / "lm1b" / "training-monolingual.tokenized.shuffled"
    shards.mkdir(parents=True)
    with pytest.raises(CorpusNotFoundError, match=r"^lm1b training shards not found: "
                                                  r".*shuffled/news\.en-\*"):
        load_corpus("lm1b", tmp_path / "lm1b")


def test_an_unknown_split_is_named(tmp_path):
    write(tmp_path / "t.txt", "hello world\n" * 50)
    corpus = load_corpus("text", tmp_path / "t.txt", use_cache=False)
    with pytest.raises(ValueError, match=r"^unknown split 'dev'; known: train, valid, test$"):
        corpus.split("dev")
    assert repr(corpus).startswith("Corpus('text', train=")


def test_unknown_name_lists_known():
    with pytest.raises(ValueError) as info:
        load_corpus("wikitext")
    for name in KNOWN_CORPORA:
        assert name in str(info.value)
    assert set(KNOWN_CORPORA) == {"enwik8", "text8", "wt2", "wt103", "ptb", "lm1b",
                                  "text", "pystdlib"}


# -- cache ---------------------------------------------------------------------------

def test_cache_hit_does_not_retokenize(tmp_path, monkeypatch, user_cache):
    for split in ("train", "valid", "test"):
        write(tmp_path / f"wiki.{split}.tokens", f" the {split} words \n\n")
    first = load_corpus("wt103", tmp_path)
    assert not first.from_cache and first.cache_path.parent == user_cache
    assert (first.cache_path / "tokenizer" / "vocab.txt").is_file()

    def boom(*args, **kwargs):
        raise AssertionError("retokenized")
    monkeypatch.setattr(WordTokenizer, "encode", boom)
    monkeypatch.setattr(corpora_lib, "count_tokens", boom)
    second = load_corpus("wt103", tmp_path)
    assert second.from_cache and isinstance(second.train, np.memmap)
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(second.split(split), first.split(split))
    assert second.tokenizer.vocab == first.tokenizer.vocab
    # different options or a changed source file is a different cache entry
    with pytest.raises(AssertionError, match="retokenized"):
        load_corpus("wt103", tmp_path, max_size=1)
    write(tmp_path / "wiki.valid.tokens", " changed \n")
    with pytest.raises(AssertionError, match="retokenized"):
        load_corpus("wt103", tmp_path)


def test_use_cache_false_writes_nothing(tmp_path, user_cache):
    write(tmp_path / "enwik8", b"0123456789" * 10)
    c = load_corpus("enwik8", tmp_path, use_cache=False)
    assert c.cache_path is None and os.listdir(tmp_path) == ["enwik8"]
    assert os.listdir(user_cache) == []
    assert c.train.tolist() == list(b"0123456789" * 9)


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_cache_root_is_the_users_never_the_data_dir(tmp_path, monkeypatch):
    data = tmp_path / "data"
    for split in ("train", "valid", "test"):
        write(data / f"wiki.{split}.tokens", f" the {split} words \n\n")
    write(data / "one.txt", "some text " * 20)
    before = _tree(data)
    home, xdg, env = tmp_path / "home", tmp_path / "xdg", tmp_path / "env"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    monkeypatch.setenv("TXL_TF_CACHE", str(env))
    assert load_corpus("wt103", data).cache_path.parent == env  # $TXL_TF_CACHE first
    assert load_corpus("text", data / "one.txt").cache_path.parent == env
    monkeypatch.delenv("TXL_TF_CACHE")
    assert load_corpus("wt103", data).cache_path.parent == xdg / "txl_tf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert load_corpus("text", data).cache_path.parent == home / ".cache" / "txl_tf"
    assert _tree(data) == before  # nothing written next to the user's files



def test_a_cache_inside_a_text_folder_is_refused_before_it_is_read_as_text(tmp_path):
    """`text` reads every non-hidden file of its folder: a cache kept there
    would be read as corpus text by the next load (another corpus, silently)."""
    folder = write(tmp_path / "docs" / "a.txt", "hello world\n" * 50).parent
    for root in (folder / "cache", folder):
        with pytest.raises(TxlError, match=r"cache folder .* is inside the corpus folder"):
            load_corpus("text", folder, cache_dir=root)
    assert _tree(folder) == ["a.txt"]  # no cache folder made there
    first = load_corpus("text", folder, cache_dir=folder / ".cache")  # hidden: not read
    again = load_corpus("text", folder, cache_dir=folder / ".cache")
    assert again.from_cache and len(again.train) + len(again.valid) == 600
    np.testing.assert_array_equal(again.train, first.train)
    assert load_corpus("text", folder / "a.txt", cache_dir=folder / "cache").train.size == 540

# -- real text ---------------------------------------------------------------------

@pytest.mark.skipif(not (SHARED_DATA / "ptb.valid.txt").is_file(),
                    reason=f"real-text folder {SHARED_DATA} is absent (only in the dev workspace)")
def test_real_ptb_valid_as_word_corpus(tmp_path):
    for split in ("train", "valid", "test"):
        os.symlink(SHARED_DATA / "ptb.valid.txt", tmp_path / f"ptb.{split}.txt")
    c = load_corpus("ptb", tmp_path)
    text = (SHARED_DATA / "ptb.valid.txt").read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    assert len(lines) == 3370  # the last line has no "\n" and still gets <eos>
    assert len(c.valid) == 73_760  # the well-known PTB valid size, <eos> included
    assert (c.valid == c.tokenizer.eos_id).sum() == len(lines)
    assert c.tokenizer.vocab[:2] == ["<eos>", "<unk>"] and c.vocab_size < 10_002
    assert (c.valid == c.tokenizer.unk_id).sum() == text.split().count("<unk>") > 0
    assert c.tokenizer.decode(c.valid) == "".join(" ".join(l.split()) + "\n" for l in lines)


def test_a_build_clears_what_a_killed_build_left(tmp_path):
    """A job killed while encoding a corpus left its build folder (the
    corpus's ids so far) in the cache for good: each kill kept that much disk."""
    import json
    import socket
    import subprocess
    import sys
    cache = tmp_path / "cache"
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)
    owners = {"killed": (gone, socket.gethostname()), "running": (os.getpid(),
                                                                  socket.gethostname()),
              "elsewhere": (gone, socket.gethostname() + "-another")}
    for name, (pid, host) in owners.items():
        (cache / f".tmp-text-{name}").mkdir(parents=True)
        (cache / f".tmp-text-{name}" / "train.npy").write_bytes(b"\0" * 128)
        (cache / f".tmp-text-{name}" / "owner.json").write_text(
            json.dumps({"pid": pid, "host": host}))
    (cache / ".tmp-text-being-made").mkdir()
    write(tmp_path / "one.txt", "x" * 95 + "y" * 5)
    c = load_corpus("text", tmp_path / "one.txt", cache_dir=cache)
    assert len(c.train) == 90 and not c.from_cache
    left = sorted(p.name for p in cache.iterdir())
    assert left[:3] == [".tmp-text-being-made", ".tmp-text-elsewhere", ".tmp-text-running"]
    assert len(left) == 4 and left[3].startswith("text-")
    assert sorted(p.name for p in (cache / left[3]).iterdir()) == [
        "meta.json", "test.npy", "tokenizer", "train.npy", "valid.npy"]


def test_a_build_killed_while_committing_is_cleared(tmp_path, monkeypatch):
    """`commit_entry` removed the owner file before the rename: a kill in
    between left a build folder without its owner, which no sweep deletes."""
    from txl_tf.data import cache as cache_lib
    tmp = cache_lib.new_build_dir(tmp_path, "text")
    (tmp / "train.npy").write_bytes(b"\0" * 128)

    def killed(*args):
        raise KeyboardInterrupt("killed")
    with monkeypatch.context() as patch:
        patch.setattr(cache_lib.os, "replace", killed)
        with pytest.raises(KeyboardInterrupt):
            cache_lib.commit_entry(tmp, tmp_path / "text-key", {"format": 1})
    monkeypatch.setattr(cache_lib, "process_alive", lambda pid: pid != os.getpid())
    assert cache_lib.remove_stale_builds(tmp_path) == [tmp.name] and not tmp.exists()
    tmp = cache_lib.new_build_dir(tmp_path, "text")  # and a commit leaves no owner
    entry = cache_lib.commit_entry(tmp, tmp_path / "text-key", {"format": 1})
    assert sorted(p.name for p in entry.iterdir()) == ["meta.json"]
