"""Files from someone else (a downloaded model, a shared vocabulary): a
hostile one ends in one error naming it, never a traceback or a crash."""
import pytest

from txl_tf.errors import TxlError

DEEP = "[" * 100_000 + "]" * 100_000  # 200 KB: deeper than Python's JSON parser recurses


def test_deeply_nested_json_is_one_error_naming_the_file(tmp_path):
    """Every JSON file a loader reads (tokenizer.json, config.json, a labels
    file, the port's config) raised RecursionError, past every handler."""
    from txl_tf.classification.labels import LabelSet
    from txl_tf.config import TransformerXLConfig
    from txl_tf.text import ByteTokenizer, load_tokenizer
    from txl_tf.weights.convert import read_config_file
    from txl_tf.weights.model_dir import ModelDirError, load_config, resolve

    ByteTokenizer().save(tmp_path / "vocab")
    (tmp_path / "vocab" / "tokenizer.json").write_text(DEEP)
    with pytest.raises(TxlError, match="tokenizer.json: .*nested too deeply"):
        load_tokenizer(tmp_path / "vocab")
    (tmp_path / "config.json").write_text('{"n_token": ' + DEEP + "}")
    (tmp_path / "weights.npz").write_bytes(b"")
    with pytest.raises(ModelDirError, match="config.json.*nested too deeply"):
        load_config(resolve(str(tmp_path)))
    with pytest.raises(ValueError, match="nested too deeply"):
        TransformerXLConfig.from_json('{"n_token": ' + DEEP + "}")
    with pytest.raises(TxlError, match=r"config\.json.*nested too deeply"):
        read_config_file(str(tmp_path / "config.json"))
    (tmp_path / "labels.json").write_text(DEEP)
    with pytest.raises(TxlError, match=r"labels\.json: not a labels file.*nested too deeply"):
        LabelSet.load(tmp_path / "labels.json")


@pytest.mark.parametrize("name", ["../secret.txt", "ABSOLUTE", 5, ["vocab.txt"]])
@pytest.mark.parametrize("kind", ["word", "char"])
def test_a_tokenizer_file_name_that_leaves_its_folder_is_refused(tmp_path, kind, name):
    """tokenizer.json's `vocab_file` was joined to the folder as given: `../x`
    and `/etc/x` read a file elsewhere (its first line in the error), and a
    number was a TypeError past the loaders' handlers."""
    import json

    from txl_tf.text import CharTokenizer, WordTokenizer, load_tokenizer
    tokenizer = (WordTokenizer(["<eos>", "<unk>", "a"], unk_token="<unk>") if kind == "word"
                 else CharTokenizer(["a", "b", "\ufffd"]))
    tokenizer.save(tmp_path / "vocab")
    secret = tmp_path / "secret.txt"
    secret.write_text("".join(f"{t}\n" for t in tokenizer.entries()))  # a vocabulary, too
    path = tmp_path / "vocab" / "tokenizer.json"
    config = json.loads(path.read_text())
    config["vocab_file"] = str(secret) if name == "ABSOLUTE" else name
    path.write_text(json.dumps(config))
    with pytest.raises(TxlError, match=r"tokenizer\.json: vocab_file must be a file name in "):
        load_tokenizer(tmp_path / "vocab")


@pytest.mark.parametrize("key,value", [("unk_token", ["<unk>"]), ("eos_token", {})])
def test_a_tokenizer_option_of_the_wrong_type_names_the_file(tmp_path, key, value):
    """A list or dict where tokenizer.json holds a token was a TypeError
    (unhashable type) past the loaders' handlers."""
    import json

    from txl_tf.text import WordTokenizer, load_tokenizer
    WordTokenizer(["<eos>", "<unk>", "a"], unk_token="<unk>").save(tmp_path / "vocab")
    path = tmp_path / "vocab" / "tokenizer.json"
    config = json.loads(path.read_text())
    config[key] = value
    config.pop("fingerprint", None)
    path.write_text(json.dumps(config))
    with pytest.raises(TxlError, match=rf"tokenizer\.json: {key} "):
        load_tokenizer(tmp_path / "vocab")


@pytest.mark.parametrize("content", [b"garbage\x00\xff", b""])
def test_a_damaged_sentencepiece_model_is_one_error_naming_it(tmp_path, content):
    """sentencepiece's RuntimeError ("INTERNAL: ... ParseFromArray") reached
    past the loaders' handlers."""
    import json

    from txl_tf.text import load_tokenizer
    (tmp_path / "tokenizer.json").write_text(json.dumps({"type": "sentencepiece",
                                                         "format_version": 1}))
    (tmp_path / "spm.model").write_bytes(content)
    with pytest.raises(TxlError, match=r"spm\.model: not a SentencePiece model \("):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("field", ["layer_norm_epsilon", "init_std", "proj_init_std"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_config_number_that_is_nan_or_infinite_is_refused(field, value):
    """config.json may say NaN or Infinity (Python's JSON reads both):
    `layer_norm_epsilon` NaN passed `<= 0` and made every output NaN; inf
    made every normalized output 0."""
    from txl_tf.config import ConfigError, TransformerXLConfig
    with pytest.raises(ConfigError, match=rf"{field} must be a finite number > 0, got "):
        TransformerXLConfig.from_json(
            '{"n_token": 10, "%s": %s}' % (field, "NaN" if value != value else "Infinity"))


def _npy(array=None, header=None, tail=b""):
    import io

    import numpy as np
    buffer = io.BytesIO()
    if header is None:
        np.save(buffer, array)
    else:
        np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + tail


@pytest.mark.parametrize("damage", ["float ids", "2-D ids", "ids past the vocabulary",
                                    "negative ids", "cut short", "a header of 2**40 ids",
                                    "a header whose brackets do not close",
                                    "meta not JSON", "meta without lengths"])
@pytest.mark.parametrize("mmap", [True, False])
def test_a_damaged_corpus_cache_entry_is_one_error_naming_it(tmp_path, damage, mmap):
    """A cache entry (a shared --cache_dir, a copied cache) holding float or
    2-D ids, or ids outside the vocabulary, was read as the corpus without a
    word; one cut short, or whose .npy header declared 2**40 ids, or a
    meta.json that is not JSON, was a ValueError or MemoryError."""
    import glob

    import numpy as np

    from txl_tf.data.corpora import load_corpus
    text = tmp_path / "corpus.txt"
    text.write_text("hello world\n" * 300)
    load_corpus("text", text, cache_dir=tmp_path / "cache")
    entry = glob.glob(str(tmp_path / "cache" / "text-*"))[0]
    train = tmp_path / "cache" / entry / "train.npy"
    length = len(np.load(train))
    file, content = "train.npy", {
        "float ids": lambda: _npy(np.zeros(length, np.float32)),
        "2-D ids": lambda: _npy(np.zeros((length, 1), np.int32)),
        "ids past the vocabulary": lambda: _npy(np.full(length, 256, np.int32)),
        "negative ids": lambda: _npy(np.full(length, -1, np.int32)),
        "cut short": lambda: train.read_bytes()[:200],
        "a header of 2**40 ids": lambda: _npy(header={"descr": "<i4", "fortran_order": False,
                                                      "shape": (2**40,)}, tail=b"\0" * 64),
        # numpy's header parser raised tokenize.TokenError on it
        "a header whose brackets do not close": lambda: train.read_bytes().replace(
            b"'shape': (", b"'shape': ((", 1),
        "meta not JSON": lambda: b"{not json",
        "meta without lengths": lambda: b"{}"}[damage]()
    if damage.startswith("meta"):
        file = "meta.json"
    (tmp_path / "cache" / entry / file).write_bytes(content)
    with pytest.raises(TxlError, match=rf"corpus cache entry {entry} is damaged \(.+\): "
                                       "delete it"):
        load_corpus("text", text, cache_dir=tmp_path / "cache", mmap=mmap)


@pytest.mark.parametrize("key,value", [
    ("num_classes", "x"), ("num_classes", "-3"), ("num_classes", None),
    ("label_names", '{"a": 1}'), ("label_names", '["a"]'), ("label_names", "[1, 2]"),
    ("segment_len", "0"), ("mem_len", "-1"), ("vocab_files", '["../../etc/passwd"]'),
    ("vocab_files", "5"), ("num_classes", 2.5), ("segment_len", 4.9), ("mem_len", True)])
def test_classifier_metadata_of_the_wrong_kind_is_one_error(key, value):
    """classifier.json (or a classifier graph's metadata) with num_classes "x"
    was a ValueError, without it a KeyError; -3 classes, label names of
    another count or kind, a segment_len of 0 and vocabulary files outside
    the export were taken as they were; a JSON number 2.5 (or true) was cut
    to 2 (or 1)."""
    from export.metadata import CONFIG_KEY, ClassifierInfo
    from txl_tf.config import TransformerXLConfig
    values = {"task": "classification", CONFIG_KEY: TransformerXLConfig(n_token=10).to_json(),
              "num_classes": "2", "label_names": '["a", "b"]', "segment_len": "4",
              "mem_len": "4", "vocab_files": '["vocab.txt", "tokenizer.json"]'}
    assert ClassifierInfo(values).label_names == ["a", "b"]
    if value is None:
        del values[key]
    else:
        values[key] = value
    with pytest.raises(TxlError, match=rf"classifier metadata: {key} "):
        ClassifierInfo(values)


def test_a_config_that_is_not_a_json_object_is_a_config_error(tmp_path):
    """A config (a file, an export's `txl_tf.config` metadata) that is not
    JSON was a bare JSONDecodeError, which open_runtime let through (it
    names only TxlErrors) and the jobs printed as a traceback."""
    from txl_tf.config import ConfigError, TransformerXLConfig
    for text in ("{not json", "{}x", '{"n_token": [}'):
        with pytest.raises(ConfigError, match="not a JSON object of config fields"):
            TransformerXLConfig.from_json(text)
    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=rf"{path}: not a JSON object of config fields"):
        TransformerXLConfig.from_json(str(path))


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "[" * 100_000])
def test_an_export_metadata_file_that_is_not_a_json_object_is_one_error_naming_it(tmp_path,
                                                                                  text):
    """classifier.json or a SavedModel's metadata file that is not JSON was a
    bare JSONDecodeError; a JSON list an AttributeError (`values.get`)."""
    from export.metadata import ClassifierInfo, ExportInfo
    path = tmp_path / "classifier.json"
    path.write_text(text)
    for info in (ClassifierInfo, ExportInfo):
        with pytest.raises(TxlError, match=rf"{path}: not a JSON object of export metadata"):
            info.from_json_file(str(path))
