"""Classification data: readers, labels.json, errors, and the padded batches."""
import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from txl_tf.classification import (ClassificationDataError, Examples, LabelSet,
                                   UnknownLabelError, classification_dataset, corpus_passages,
                                   passage_examples, read_examples, read_folder, read_tsv,
                                   token_dataset)
from txl_tf.classification.data import read_lines
from txl_tf.data import CorpusNotFoundError
from txl_tf.text import ByteTokenizer, CharTokenizer, SentencePieceTokenizer, WordTokenizer

SHARED_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"

TRAIN = [
    ("sports", "the team won the cup"),
    ("weather", "rain again"),
    ("sports", "a long match in the rain ended with the home team ahead by one goal"),
    ("arts", "the old play"),
    ("weather", "sun"),
    ("arts", "paint\twith tabs inside the text"),
    ("sports", "goal"),
]


def write_tsv(path, rows, extra=""):
    path.write_text("".join(f"{label}\t{text}\n" for label, text in rows) + extra,
                    encoding="utf-8")
    return path


def batches(ds):
    """A dataset's batches as numpy: [(token_ids, lengths, labels or None)]."""
    out = []
    for element in ds:
        features, labels = element if isinstance(element, tuple) else (element, None)
        out.append((features["token_ids"].numpy(), features["lengths"].numpy(),
                    None if labels is None else labels.numpy()))
    return out


def rows_of(ds_or_batches):
    """Documents (unpadded id lists) and labels of every row, in order."""
    docs, labels = [], []
    got = ds_or_batches if isinstance(ds_or_batches, list) else batches(ds_or_batches)
    for ids, lengths, y in got:
        for b in range(len(lengths)):
            docs.append(ids[b, :lengths[b]].tolist())
            labels.append(None if y is None else int(y[b]))
    return docs, labels


# -- readers and labels ----------------------------------------------------------

def test_read_tsv_labels_sorted_and_text_after_first_tab(tmp_path):
    ex = read_tsv(write_tsv(tmp_path / "train.tsv", TRAIN, extra="\n   \n"))
    assert ex.labels.names == ["arts", "sports", "weather"]
    assert ex.label_ids.dtype == np.int32
    assert ex.label_ids.tolist() == [1, 2, 1, 0, 2, 0, 1]
    assert ex.texts[5] == "paint\twith tabs inside the text"  # later TABs stay in the text
    assert ex.texts[0] == "the team won the cup"
    assert ex.sources[1] == f"{tmp_path / 'train.tsv'}:2"
    assert len(ex) == 7  # the trailing blank lines are not examples
    assert ex.class_counts() == {"arts": 2, "sports": 3, "weather": 2}


def test_read_tsv_windows_line_ends_bom_and_several_files(tmp_path):
    a = tmp_path / "a.tsv"
    a.write_bytes("\ufeffpos\tgood film\r\nneg\tbad film\r\n".encode("utf-8"))
    b = write_tsv(tmp_path / "b.tsv", [("neg", "dull")])
    ex = read_tsv([a, b])
    assert ex.texts == ["good film", "bad film", "dull"]
    assert ex.labels.names == ["neg", "pos"]
    assert ex.label_ids.tolist() == [1, 0, 0]


def test_read_tsv_cr_line_ends_are_line_ends(tmp_path):
    # a file with CR line ends (old Mac) was one example: label 'pos', the rest its text
    path = tmp_path / "cr.tsv"
    path.write_bytes(b"pos\tgood film\rneg\tbad\r\n\rneg\tdull")
    ex = read_tsv(path)
    assert ex.texts == ["good film", "bad", "dull"]
    assert ex.labels.names == ["neg", "pos"] and ex.label_ids.tolist() == [1, 0, 0]
    assert ex.sources == [f"{path}:1", f"{path}:2", f"{path}:4"]
    path.write_bytes(b"pos\tgood\rno tab here\n")
    with pytest.raises(ClassificationDataError, match=r"cr.tsv:2: no TAB"):
        read_tsv(path)


def _reference_tsv(data: bytes):
    """The documented line layout, parsed independently: ``[(label, text,
    line)]``, or the line number of the first error (None: no examples)."""
    text = data.decode("utf-8").removeprefix("\ufeff")
    lines = re.split(r"\r\n|\r|\n", text)
    if lines[-1] == "":
        lines.pop()
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        label, tab, text = line.partition("\t")
        if not tab or not label.strip() or not text.strip():
            return n
        rows.append((label.strip(), text, n))
    return rows or None


def test_random_line_files_read_as_the_documented_layout(tmp_path):
    # LF / CRLF / CR line ends, BOM, blank lines, a missing last line end, TABs in texts,
    # non-ASCII and Python-whitespace characters, labels that are or look like numbers,
    # differently cased labels; against _reference_tsv
    rng = random.Random(0)
    pool = ["pos", "Pos", "neg", "7", "07", "-3", "+4", "1.0", "1e3", "\u00e9t\u00e9", "a b"]
    chars = list("ab z\t\"'\u00e9\u6f22\U0001f600\u00a0\u2028\x85\x0b\x0c\x1c\ufeff\\")
    for case in range(150):
        labels = rng.sample(pool, rng.randint(1, 4))
        if rng.random() < 0.5:
            labels = [x for x in labels if re.fullmatch(r"[+-]?[0-9]+", x)] or ["2", "10"]
        lines = []
        for _ in range(rng.randint(1, 8)):
            if rng.random() < 0.1:
                lines.append(rng.choice(["", " ", "\t", " \t "]))
                continue
            text = "".join(rng.choice(chars) for _ in range(rng.choice([0, 1, 4, 30, 300])))
            lines.append(rng.choice(["", " "]) + rng.choice(labels) + rng.choice(["", " "])
                         + "\t" + text)
        end = rng.choice(["\n", "\r\n", "\r"])
        data = (end.join(lines) + end * rng.randint(0, 1)).encode("utf-8")
        path = tmp_path / f"{case}.tsv"
        path.write_bytes(b"\xef\xbb\xbf" * rng.randint(0, 1) + data)
        want = _reference_tsv(path.read_bytes())
        if not isinstance(want, list):
            with pytest.raises(ClassificationDataError) as err:
                read_tsv(path)
            assert err.value.line == want, (case, data)
            continue
        ex = read_tsv(path)
        names = [label for label, _, _ in want]
        if all(re.fullmatch(r"[+-]?[0-9]+", x) for x in names):
            order = sorted({int(x) for x in names})
            assert ex.labels.names == [str(k) for k in order]
            ids = [order.index(int(x)) for x in names]
        else:
            assert ex.labels.names == sorted(set(names))
            ids = [ex.labels.names.index(x) for x in names]
        assert ex.label_ids.tolist() == ids, (case, data)
        assert ex.texts == [text for _, text, _ in want], (case, data)
        assert ex.sources == [f"{path}:{n}" for _, _, n in want], (case, data)
        assert read_lines(path) == re.split(r"\r\n|\r|\n", data.decode()
                                            .removesuffix(end))


def test_integer_labels_ordered_numerically(tmp_path):
    rows = [("10", "x"), ("2", "y"), ("1", "z"), ("2", "w")]
    ex = read_tsv(write_tsv(tmp_path / "t.tsv", rows))
    assert ex.labels.names == ["1", "2", "10"] and ex.labels.integer
    assert ex.label_ids.tolist() == [2, 1, 0, 1]
    assert ex.labels.id("02") == 1  # integers compare by value
    labels = LabelSet.from_labels(["0", "1", "2"])
    assert [labels.id(str(i)) for i in range(3)] == [0, 1, 2]  # 0..C-1 keep their ids
    mixed = LabelSet.from_labels(["b", "10", "9"])
    assert mixed.names == ["10", "9", "b"] and not mixed.integer


def test_labels_json_round_trip(tmp_path):
    train = read_tsv(write_tsv(tmp_path / "train.tsv", TRAIN))
    saved = train.labels.save(tmp_path / "model")
    assert saved == tmp_path / "model" / "labels.json"
    assert json.loads(saved.read_text())["labels"] == ["arts", "sports", "weather"]
    loaded = LabelSet.load(tmp_path / "model")
    assert loaded == train.labels and LabelSet.load(saved) == train.labels
    # evaluation data in another order gets the training ids, not its own
    evaluation = read_tsv(write_tsv(tmp_path / "eval.tsv",
                                    [("weather", "snow"), ("arts", "a poem")]), loaded)
    assert evaluation.label_ids.tolist() == [2, 0]
    assert evaluation.labels is loaded
    other = tmp_path / "x.json"
    LabelSet(["z", "a"]).save(other)
    assert LabelSet.load(other).names == ["z", "a"]  # an explicit order is kept


def test_labels_json_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="labels.json"):
        LabelSet.load(tmp_path)
    bad = tmp_path / "labels.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a labels file"):
        LabelSet.load(tmp_path)
    bad.write_text(json.dumps({"labels": ["a", "a"]}))
    with pytest.raises(ValueError, match="appears twice"):
        LabelSet.load(bad)
    with pytest.raises(UnknownLabelError, match="unknown label 'c'"):
        LabelSet(["a", "b"]).id("c")
    with pytest.raises(ValueError, match="out of range"):
        LabelSet(["a", "b"]).name(2)
    for data, message in (([], r'expected an object \{"labels": \[name, \.\.\.\]\}'),
                          ({"labels": []}, "a LabelSet needs at least one label"),
                          ({"labels": [" a"]}, r"label 0 \(' a'\) must be a non-empty string"),
                          ({"labels": ["a"], "format_version": 99},
                           r"format_version 99 is newer than this reader \(1\)")):
        bad.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=rf"labels.json: not a labels file: {message}"):
            LabelSet.load(bad)
    with pytest.raises(ValueError, match="^no labels to build a LabelSet from$"):
        LabelSet.from_labels([])


def make_folder(root, layout):
    for label, files in layout.items():
        (root / label).mkdir(parents=True)
        for name, text in files.items():
            (root / label / name).write_text(text, encoding="utf-8")
    return root


def test_read_folder(tmp_path):
    root = make_folder(tmp_path / "data", {
        "pos": {"b.txt": "a fine film\nwith two lines\n", "a.txt": "great"},
        "neg": {"1.txt": "dull"},
        "unsup": {"u.txt": "no label"},
    })
    (root / "pos" / ".hidden").write_text("ignored")
    (root / "README").write_text("files in the root are not examples")
    (root / "pos" / "more").mkdir()
    (root / "pos" / "more" / "c.txt").write_text("nested")
    ex = read_folder(root)
    assert ex.labels.names == ["neg", "pos", "unsup"]
    assert ex.texts == ["dull", "great", "a fine film\nwith two lines\n", "nested", "no label"]
    assert ex.label_ids.tolist() == [0, 1, 1, 1, 2]
    assert ex.sources[1] == str(root / "pos" / "a.txt")
    two = read_folder(root, classes=["pos", "neg"])
    assert two.labels.names == ["neg", "pos"]
    assert two.label_ids.tolist() == [0, 1, 1, 1]
    assert read_examples(root, classes=["neg", "pos"]).texts == two.texts
    evaluation = read_folder(root, LabelSet(["pos", "neg", "unsup"]))
    assert evaluation.label_ids.tolist() == [1, 0, 0, 0, 2]


def test_read_folder_follows_links_to_folders(tmp_path):
    # a linked folder inside a class folder was skipped without a word (a linked file and
    # a linked class folder were read); a link to nothing was skipped too
    root = make_folder(tmp_path / "data", {"pos": {"a.txt": "great"}, "neg": {"b.txt": "dull"}})
    make_folder(tmp_path / "elsewhere", {"d": {"e.txt": "deeper"}})
    (tmp_path / "elsewhere" / "c.txt").write_text("kept elsewhere")
    (root / "pos" / "more").symlink_to(tmp_path / "elsewhere")
    (root / "pos" / "loop").symlink_to(root / "pos")  # a link to a folder above ends there
    (root / "neg" / "f.txt").symlink_to(tmp_path / "elsewhere" / "c.txt")
    ex = read_folder(root)
    assert ex.texts == ["dull", "kept elsewhere", "great", "kept elsewhere", "deeper"]
    assert ex.sources[3:] == [str(root / "pos" / "more" / "c.txt"),
                              str(root / "pos" / "more" / "d" / "e.txt")]
    (root / "neg" / "gone.txt").symlink_to(tmp_path / "nowhere.txt")
    with pytest.raises(ClassificationDataError, match=r"neg/gone.txt: a link to nothing"):
        read_folder(root)


def test_read_examples_dispatches(tmp_path):
    path = write_tsv(tmp_path / "t.tsv", TRAIN)
    assert read_examples(path).texts == read_tsv(path).texts
    assert read_examples([path, path]).label_ids.tolist() == read_tsv(path).label_ids.tolist() * 2
    with pytest.raises(CorpusNotFoundError, match="label<TAB>text.*class name"):
        read_examples(tmp_path / "nope")
    with pytest.raises(ValueError, match="classes= applies to a folder"):
        read_examples(path, classes=["a"])


# -- errors ----------------------------------------------------------------------

def test_missing_file_and_folder(tmp_path):
    with pytest.raises(CorpusNotFoundError, match=r"classification file not found: .*nope\.tsv"):
        read_tsv(tmp_path / "nope.tsv")
    with pytest.raises(FileNotFoundError, match="classification folder not found"):
        read_folder(tmp_path / "nope")
    (tmp_path / "d" / "a").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"class folder not found: .*d/b"):
        read_folder(tmp_path / "d", classes=["a", "b"])


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    with pytest.raises(ClassificationDataError, match=r"empty\.tsv: empty file") as info:
        read_tsv(empty)
    assert info.value.path == empty and info.value.line is None
    blank = tmp_path / "blank.tsv"
    blank.write_text("\n  \n")
    with pytest.raises(ClassificationDataError, match="blank.tsv: empty file"):
        read_tsv(blank)


def test_line_without_tab_names_file_and_line(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_text("a\tfine\nb    spaces, not a tab\n")
    with pytest.raises(ClassificationDataError, match=r"t\.tsv:2: no TAB") as info:
        read_tsv(path)
    assert info.value.line == 2
    path.write_text("a\tfine\n\tno label\n")
    with pytest.raises(ClassificationDataError, match=r"t\.tsv:2: empty label"):
        read_tsv(path)


def test_invalid_utf8_names_line(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_bytes(b"a\tok\nb\tbad \xff byte\n")
    with pytest.raises(ClassificationDataError, match=r"t\.tsv:2: not valid UTF-8"):
        read_tsv(path)
    root = make_folder(tmp_path / "f", {"x": {"a.txt": "ok"}})
    (root / "x" / "b.txt").write_bytes(b"line one\nline \xc3 two")
    with pytest.raises(ClassificationDataError, match=r"b\.txt:2: not valid UTF-8"):
        read_folder(root)
    (root / "x" / "b.txt").write_bytes(b"one\r\ntwo\rthree\n\rfive \xc3")  # CR ends a line
    with pytest.raises(ClassificationDataError, match=r"b\.txt:5: not valid UTF-8"):
        read_folder(root)


def test_empty_text_is_an_error_or_skipped(tmp_path):
    path = write_tsv(tmp_path / "t.tsv", [("a", "x"), ("b", "   "), ("a", "y")])
    with pytest.raises(ClassificationDataError, match=r"t\.tsv:2: empty text"):
        read_tsv(path)
    ex = read_tsv(path, empty_text="skip")
    assert ex.texts == ["x", "y"] and ex.skipped == [f"{path}:2"]
    assert ex.labels.names == ["a"]  # a label seen only on skipped lines is not a class
    only = write_tsv(tmp_path / "only.tsv", [("a", "")])
    with pytest.raises(ClassificationDataError, match="1 lines with empty text skipped"):
        read_tsv(only, empty_text="skip")
    with pytest.raises(ValueError, match="empty_text must be one of"):
        read_tsv(path, empty_text="keep")
    root = make_folder(tmp_path / "f", {"x": {"a.txt": "ok", "b.txt": "\n"}})
    with pytest.raises(ClassificationDataError, match=r"b\.txt: empty file"):
        read_folder(root)
    assert read_folder(root, empty_text="skip").skipped == [str(root / "x" / "b.txt")]


def test_unknown_label_at_evaluation_names_file_and_line(tmp_path):
    labels = LabelSet(["arts", "sports"])
    path = write_tsv(tmp_path / "eval.tsv", [("arts", "x"), ("sports", "y"), ("cooking", "z")])
    with pytest.raises(UnknownLabelError, match=r"eval\.tsv:3: unknown label 'cooking'") as info:
        read_tsv(path, labels)
    assert info.value.line == 3 and str(path) in str(info.value)
    root = make_folder(tmp_path / "f", {"arts": {"a": "x"}, "cooking": {"b": "y"}})
    with pytest.raises(UnknownLabelError, match=r"class folder 'cooking' is not a known label"):
        read_folder(root, labels)


def test_folder_errors(tmp_path):
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.txt").write_text("no class folders")
    with pytest.raises(ClassificationDataError, match="flat: no class sub-folders"):
        read_folder(tmp_path / "flat")
    root = make_folder(tmp_path / "f", {"a": {"x.txt": "text"}})
    (root / "b").mkdir()
    (root / "b" / ".DS_Store").write_text("hidden")
    with pytest.raises(ClassificationDataError, match=r"f/b: empty class folder"):
        read_folder(root)
    empty = make_folder(tmp_path / "e", {"a": {"x.txt": " "}, "b": {"y.txt": ""}})
    with pytest.raises(ClassificationDataError, match=r"e: no examples \(2 empty files skipped\)"):
        read_folder(empty, empty_text="skip")


# -- batches ---------------------------------------------------------------------

def byte_ids(text):
    return list(text.encode("utf-8"))


@pytest.mark.parametrize("keep", ["start", "end"])
def test_byte_batches_exact_ids_padding_and_truncation(tmp_path, keep):
    ex = read_tsv(write_tsv(tmp_path / "t.tsv", TRAIN))
    ds = classification_dataset(ex, ByteTokenizer(), 3, max_length=20, segment_len=8,
                                keep=keep, pad_id=0)
    got = batches(ds)
    assert [len(y) for _, _, y in got] == [3, 3, 1]
    for ids, lengths, y in got:
        assert ids.dtype == np.int32 and lengths.dtype == np.int32 and y.dtype == np.int32
        assert ids.shape[1] % 8 == 0
        assert ids.shape[1] == math.ceil(lengths.max() / 8) * 8  # longest, rounded up
    ids, lengths, labels = got[0]
    # row 0: "the team won the cup" is 20 bytes, exactly max_length
    assert lengths.tolist() == [20, 10, 20]
    assert ids.shape == (3, 24)
    assert ids[0, :20].tolist() == byte_ids("the team won the cup")
    assert ids[1, :10].tolist() == byte_ids("rain again")
    assert (ids[1, 10:] == 0).all() and (ids[0, 20:] == 0).all()
    long_text = TRAIN[2][1]
    want = byte_ids(long_text)[:20] if keep == "start" else byte_ids(long_text)[-20:]
    assert ids[2, :20].tolist() == want
    assert labels.tolist() == [1, 2, 1]
    ids, lengths, labels = got[2]
    assert lengths.tolist() == [4] and ids.shape == (1, 8)
    assert ids[0].tolist() == byte_ids("goal") + [0] * 4


def test_word_batches_exact_ids(tmp_path):
    ex = read_tsv(write_tsv(tmp_path / "t.tsv", TRAIN))
    tok = WordTokenizer.build(ex.texts)
    vocab = {w: i for i, w in enumerate(tok.vocab)}
    eos = vocab["<eos>"]
    for keep in ("start", "end"):
        ds = classification_dataset(ex, tok, 4, max_length=6, segment_len=4, keep=keep,
                                    pad_id=-1)
        got = batches(ds)
        docs, labels = rows_of(got)
        assert labels == ex.label_ids.tolist()
        for text, doc in zip(ex.texts, docs):
            words = [vocab[w] for w in text.split()] + [eos]
            assert doc == (words[:6] if keep == "start" else words[-6:])
        ids, lengths, _ = got[0]
        # "the team won the cup" -> 5 words + <eos> = 6 ids; "rain again" -> 3
        assert lengths.tolist() == [6, 3, 6, 4]
        assert ids.shape == (4, 8)
        assert ids[1].tolist() == [vocab["rain"], vocab["again"], eos] + [-1] * 5
        names = "team ahead by one goal" if keep == "end" else "a long match in the"
        assert ids[2].tolist() == [vocab[w] for w in names.split()] + \
            ([eos] if keep == "end" else [vocab["rain"]]) + [-1, -1]


@pytest.fixture(scope="module")
def tokenizers():
    text = "\n".join(t for _, t in TRAIN) + "\n"
    return {"byte": ByteTokenizer(), "char": CharTokenizer.build(text),
            "word": WordTokenizer.build(text),
            "sentencepiece": SentencePieceTokenizer.train(texts=text.split("\n") * 20,
                                                          vocab_size=300)}


@pytest.mark.parametrize("kind", ["byte", "char", "word", "sentencepiece"])
def test_every_tokenizer_kind_matches_python_encode(tokenizers, kind):
    tok = tokenizers[kind]
    texts = [t for _, t in TRAIN]
    ds = classification_dataset(texts, tok, 3, max_length=9, segment_len=4, keep="end",
                                tokenize_chunk=2)
    docs, labels = rows_of(ds)
    assert labels == [None] * len(texts)  # a list of texts gives features only
    assert docs == [tok.encode(t)[-9:].tolist() for t in texts]


def test_shapes_are_multiples_of_segment_len_and_static_options(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 50, size=n).tolist() for n in rng.integers(1, 70, size=40)]
    labels = rng.integers(0, 3, size=40)
    for bucket, fixed in ((False, False), (True, False), (False, True)):
        ds = token_dataset(docs, labels, 5, max_length=45, segment_len=16, bucket=bucket,
                           pad_to_max_length=fixed)
        got = batches(ds)
        assert sum(len(y) for _, _, y in got) == 40
        for ids, lengths, _ in got:
            assert ids.shape[1] % 16 == 0
            if fixed:
                assert ids.shape[1] == 48
            else:
                assert ids.shape[1] == math.ceil(lengths.max() / 16) * 16
            if bucket:  # one segment count per batch: no all-padding segment
                assert len({math.ceil(n / 16) for n in lengths}) == 1
        got_docs, got_labels = rows_of(ds)
        want = sorted(zip(map(tuple, (d[:45] for d in docs)), labels.tolist()))
        assert sorted(zip(map(tuple, got_docs), got_labels)) == want
    ds = token_dataset(docs, labels, 6, max_length=45, segment_len=16, drop_remainder=True)
    assert ds.element_spec[0]["token_ids"].shape.as_list() == [6, None]
    assert ds.element_spec[1].shape.as_list() == [6]
    assert [len(y) for _, _, y in batches(ds)] == [6] * 6
    fixed = token_dataset(docs, labels, 6, max_length=45, segment_len=16,
                          drop_remainder=True, pad_to_max_length=True)
    assert fixed.element_spec[0]["token_ids"].shape.as_list() == [6, 48]


def test_bucketing_does_not_grow_with_max_length():
    """The buckets were a list of every segment count up to max_length's: at
    2**31 - 1 making it hung (and each document was compared with all)."""
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, 50, size=n).tolist() for n in rng.integers(1, 40, size=20)]
    labels = rng.integers(0, 3, size=20)
    short, huge = (batches(token_dataset(docs, labels, 4, max_length=length, segment_len=16,
                                         bucket=True))
                   for length in (45, 2 ** 31 - 1))
    assert len(short) == len(huge) > 1
    for a, b in zip(short, huge):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_shuffle_is_deterministic_with_a_seed_and_repeat_reshuffles(tmp_path):
    ex = Examples([f"text {i}" for i in range(30)], np.arange(30) % 3, LabelSet(["a", "b", "c"]),
                  [f"s{i}" for i in range(30)])
    tok = ByteTokenizer()

    def order(seed, repeat=False, bucket=False, take=None):
        ds = classification_dataset(ex, tok, 4, max_length=8, segment_len=4, shuffle=True,
                                    seed=seed, repeat=repeat, bucket=bucket)
        if take:
            ds = ds.take(take)
        docs, _ = rows_of(ds)
        return [int(bytes(d).decode().split()[1]) for d in docs]

    first = order(7)
    assert first == order(7) and sorted(first) == list(range(30))
    assert first != list(range(30)) and first != order(8)
    assert order(7, bucket=True) == order(7, bucket=True)
    two_epochs = order(7, repeat=True, take=15)  # 60 rows
    assert len(two_epochs) == 60 and two_epochs[:30] == first
    assert sorted(two_epochs[30:]) == list(range(30)) and two_epochs[30:] != first
    unshuffled = rows_of(classification_dataset(ex, tok, 4, max_length=8, segment_len=4))[0]
    assert [bytes(d).decode() for d in unshuffled] == ex.texts


def test_token_dataset_ragged_and_errors():
    ragged = tf.ragged.constant([[5, 6, 7], [8]])
    ds = token_dataset(ragged, None, 2, max_length=2, segment_len=3, pad_id=9)
    ids, lengths, _ = batches(ds)[0]
    assert ids.tolist() == [[5, 6, 9], [8, 9, 9]] and lengths.tolist() == [2, 1]
    with pytest.raises(ValueError, match="document 1 is empty"):
        token_dataset([[1], []], [0, 1], 2, max_length=4, segment_len=2)
    with pytest.raises(ValueError, match="label_ids must be 2 ints"):
        token_dataset([[1], [2]], [0], 2, max_length=4, segment_len=2)
    with pytest.raises(ValueError, match=r"document 0 must be a 1-D sequence of ints, got shape "
                                         r"\(2,\) dtype float"):
        token_dataset([[1.5, 2.0]], None, 1, max_length=4, segment_len=2)
    with pytest.raises(ValueError, match=r"documents must be \[N, None\], got shape "
                                         r"\(1, None, None\)"):
        token_dataset(tf.ragged.constant([[[1, 2]]]), None, 1, max_length=4, segment_len=2)
    with pytest.raises(ValueError, match="no documents to make a dataset from"):
        token_dataset([], None, 1, max_length=4, segment_len=2)
    # Cast to int32 these wrapped to id 5 and label 1 (review35).
    with pytest.raises(ValueError, match=r"label_ids\[1\] = 4294967297 is no class id"):
        token_dataset([[1], [2]], np.int64([0, 2 ** 32 + 1]), 2, max_length=4, segment_len=2)
    for wide in ([np.int64([1, 2 ** 32 + 5])],
                 tf.RaggedTensor.from_row_lengths(np.int64([1, 2 ** 32 + 5]), [2])):
        with pytest.raises(ValueError, match=r"document 0: id 4294967301 does not fit int32"):
            token_dataset(wide, None, 1, max_length=4, segment_len=2)
    with pytest.raises(ValueError, match=r"documents must hold ints, got dtype float32"):
        token_dataset(tf.ragged.constant([[1.5, 2.0]]), None, 1, max_length=4, segment_len=2)
    with pytest.raises(ValueError, match="shuffle_buffer must be a positive int, got 0"):
        token_dataset([[1]], None, 1, max_length=4, segment_len=2, shuffle=True,
                      shuffle_buffer=0)


def test_argument_errors():
    tok = ByteTokenizer()
    with pytest.raises(ValueError, match="keep must be one of"):
        classification_dataset(["a"], tok, 1, max_length=4, segment_len=2, keep="middle")
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        classification_dataset(["a"], tok, 0, max_length=4, segment_len=2)
    with pytest.raises(ValueError, match="segment_len must be a positive int"):
        classification_dataset(["a"], tok, 1, max_length=4, segment_len=0)
    with pytest.raises(ValueError, match="exclude each other"):
        classification_dataset(["a"], tok, 1, max_length=4, segment_len=2, bucket=True,
                               pad_to_max_length=True)
    with pytest.raises(ValueError, match="text 1: empty text"):
        classification_dataset(["a", " "], tok, 1, max_length=4, segment_len=2)
    with pytest.raises(TypeError, match="Tokenizer"):
        classification_dataset(["a"], "byte", 1, max_length=4, segment_len=2)
    with pytest.raises(ValueError, match=r"max_length must be at most 2147483647 \(2\*\*31 - 1\), "
                                         r"got 2147483648"):  # lengths are int32
        classification_dataset(["a"], tok, 1, max_length=2 ** 31, segment_len=2)
    with pytest.raises(ValueError, match="pad_id must be an int, got 0.5"):
        classification_dataset(["a"], tok, 1, max_length=4, segment_len=2, pad_id=0.5)
    with pytest.raises(ValueError, match="no examples to make a dataset from"):
        classification_dataset([], tok, 1, max_length=4, segment_len=2)
    with pytest.raises(TypeError, match="text 0: expected str, got bytes"):
        classification_dataset([b"a"], tok, 1, max_length=4, segment_len=2)
    with pytest.raises(ValueError, match="tokenize_chunk must be a positive int, got 0"):
        classification_dataset(["a"], tok, 1, max_length=4, segment_len=2, bucket=True,
                               tokenize_chunk=0)
    with pytest.raises(ValueError, match="2 texts, 1 label ids and 2 sources do not match"):
        Examples(["a", "b"], [0], LabelSet(["x", "y"]), ["s1", "s2"])
    with pytest.raises(ValueError, match="s1: label id 2 is out of range for 2 classes"):
        Examples(["a"], [2], LabelSet(["x", "y"]), ["s1"])
    # Cast to int32 these were read as other classes: 1.5 as 1, True as 1, 2**32 + 1 as 1.
    for bad in ([0, 1.5], [False, True]):
        with pytest.raises(ValueError, match=r"^label_ids must be integers, got dtype "):
            Examples(["a", "b"], bad, LabelSet(["x", "y"]), ["s1", "s2"])
    with pytest.raises(ValueError, match="s2: label id 4294967297 is out of range for 2 classes"):
        Examples(["a", "b"], np.int64([0, 2 ** 32 + 1]), LabelSet(["x", "y"]), ["s1", "s2"])


# -- passages --------------------------------------------------------------------

def test_corpus_passages():
    text = "one two  three\nfour five\n\nsix seven eight nine ten eleven"
    assert corpus_passages(text, 4) == ["one two three four", "five six seven eight"]
    assert corpus_passages(text, 4, limit=1) == ["one two three four"]
    assert corpus_passages(text, 20) == []
    ex = passage_examples({"b": "x " * 9, "a": "y " * 6}, 3)
    assert ex.labels.names == ["a", "b"]
    assert ex.texts == ["x x x"] * 3 + ["y y y"] * 2
    assert ex.label_ids.tolist() == [1, 1, 1, 0, 0]
    assert ex.sources[3] == "a:passage 0"
    assert len(passage_examples({"b": "x " * 9, "a": "y " * 6}, 3, per_corpus=1)) == 2
    with pytest.raises(ValueError, match="corpus 'a' has fewer than 3 words"):
        passage_examples({"a": "y y"}, 3)


def test_passages_from_the_shared_corpora():
    files = {"shakespeare": "tinyshakespeare.txt", "ptb": "ptb.valid.txt",
             "wikitext2": "wikitext2.valid.txt"}
    if not all((SHARED_DATA / f).is_file() for f in files.values()):
        pytest.skip(f"shared corpora not found in {SHARED_DATA.resolve()}")
    corpora = {name: (SHARED_DATA / f).read_text(encoding="utf-8")[:200_000]
               for name, f in files.items()}
    ex = passage_examples(corpora, 64, per_corpus=50)
    assert ex.labels.names == ["ptb", "shakespeare", "wikitext2"]
    assert ex.class_counts() == {"ptb": 50, "shakespeare": 50, "wikitext2": 50}
    assert all(len(t.split()) == 64 and "\n" not in t for t in ex.texts)
    ds = classification_dataset(ex, ByteTokenizer(), 16, max_length=256, segment_len=64,
                                shuffle=True, seed=0, bucket=True)
    docs, labels = rows_of(ds)
    assert len(docs) == 150 and sorted(labels) == sorted(ex.label_ids.tolist())
