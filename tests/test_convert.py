"""`python -m txl_tf.convert`, pickled vocabularies, and a converted model
through evaluation and export."""
import collections
import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.pytorch_fixtures import CASES, save_safetensors
from tests.reference_pytorch_numpy import PytorchReference
from txl_tf.errors import TxlError
from txl_tf.text.pickled_vocab import PickledVocabError, convert_pickled_vocab
from txl_tf.text.vocab import read_vocab
from txl_tf.weights.convert import ConvertError, convert, read_config_file

SYMBOLS = ["<eos>", "<unk>"] + [f"w{i}" for i in range(58)]  # 60 = the port fixture's n_token


class _RunsCode:
    """Unpickling this calls os.system: what a malicious pickle does."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_the_pickled_vocab_command_answers_help_and_fails_with_an_error_line(capsys):
    """`python -m txl_tf.text.pickled_vocab --help` read `--help` as a file
    (`error: [Errno 2] ... '--help'`), and a wrong count of arguments printed
    the usage without `error:`."""
    from txl_tf.text import pickled_vocab
    for flag in ("--help", "-h"):
        assert pickled_vocab.main(["pickled_vocab", flag]) == 0
        out, err = capsys.readouterr()
        assert "python -m txl_tf.text.pickled_vocab VOCAB.pkl VOCAB.txt" in out and not err
    assert pickled_vocab.main(["pickled_vocab", "only.pkl"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: usage: python -m txl_tf.text.pickled_vocab") and not out
    assert len(err.splitlines()) == 1


def test_malicious_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "ran"
    bad = tmp_path / "vocab.pkl"
    bad.write_bytes(pickle.dumps({"idx2sym": SYMBOLS, "hook": _RunsCode(marker)}))
    with pytest.raises(PickledVocabError, match=r"refusing to unpickle (posix|os)\.system"):
        convert_pickled_vocab(bad, tmp_path / "vocab.txt")
    assert not marker.exists() and not (tmp_path / "vocab.txt").exists()
    obj = tmp_path / "object.pkl"
    obj.write_bytes(pickle.dumps({"idx2sym": collections.deque(SYMBOLS)}))
    with pytest.raises(PickledVocabError, match="refusing to unpickle collections.deque"):
        convert_pickled_vocab(obj, tmp_path / "vocab.txt")


@pytest.mark.parametrize("cls", ["Counter", "OrderedDict"])
def test_pickle_cannot_set_attributes_on_an_allowed_class(tmp_path, cls):
    # GLOBAL collections.<cls>, then BUILD with the slot state (None,
    # {"most_common": 0}): on the real class that would be setattr for the
    # whole process.
    name = cls.encode()
    payload = (b"\x80\x02ccollections\n" + name + b"\nN}X\x0b\x00\x00\x00most_commonK\x00s"
               b"\x86b.")
    path = tmp_path / "vocab.pkl"
    path.write_bytes(payload)
    before = getattr(getattr(collections, cls), "most_common", None)
    with pytest.raises(PickledVocabError, match="not a readable pickle"):
        convert_pickled_vocab(path, tmp_path / "vocab.txt")
    assert getattr(getattr(collections, cls), "most_common", None) is before


def test_bad_zip_is_one_clear_error(tmp_path):
    path = tmp_path / "vocab.pkl"
    # An end record naming one 46-byte central-directory entry where there is none.
    end = (b"PK\x05\x06" + b"\x00" * 4 + (1).to_bytes(2, "little") * 2
           + (46).to_bytes(4, "little") + (0).to_bytes(4, "little") + b"\x00\x00")
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 60 + end)
    assert zipfile.is_zipfile(path)
    with pytest.raises(PickledVocabError, match="not a readable pickle"):
        convert_pickled_vocab(path, tmp_path / "vocab.txt")


def test_plain_pickles_convert(tmp_path):
    attrs = {"idx2sym": SYMBOLS, "counter": collections.Counter(SYMBOLS),
             "sym2idx": collections.OrderedDict((s, i) for i, s in enumerate(SYMBOLS)),
             "special": ["<eos>"], "lower_case": False, "min_freq": 0, "max_size": None}
    forms = {"plain.pkl": pickle.dumps(attrs, protocol=2),
             "sym2idx.pkl": pickle.dumps(dict(attrs["sym2idx"]))}
    # torch.save without tensors: the legacy sequence of pickles, and the zip.
    legacy = io.BytesIO()
    for part in (0x1950a86a20f9469cfc6c, 1001, {"protocol_version": 1001}, attrs, []):
        pickle.dump(part, legacy, protocol=2)
    forms["legacy.pt"] = legacy.getvalue()
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(attrs))
    forms["zip.pt"] = zipped.getvalue()
    for name, data in forms.items():
        (tmp_path / name).write_bytes(data)
        assert convert_pickled_vocab(tmp_path / name, tmp_path / f"{name}.txt") == SYMBOLS
        assert read_vocab(tmp_path / f"{name}.txt") == SYMBOLS
    (tmp_path / "gap.pkl").write_bytes(pickle.dumps({"a": 0, "b": 2}))
    with pytest.raises(PickledVocabError, match="not 0..1"):
        convert_pickled_vocab(tmp_path / "gap.pkl", tmp_path / "gap.txt")
    # A symbol twice in idx2sym was written out, a file read_vocab then refuses.
    (tmp_path / "twice.pkl").write_bytes(pickle.dumps({"idx2sym": ["<eos>", "a", "<eos>"]}))
    with pytest.raises(PickledVocabError, match=r"'<eos>' appears twice \(ids 0 and 2\)"):
        convert_pickled_vocab(tmp_path / "twice.pkl", tmp_path / "twice.txt")
    assert not (tmp_path / "twice.txt").exists()


def _port_files(tmp_path):
    case = CASES["wt103_port"]()
    weights = save_safetensors(case["state"], tmp_path / "model.safetensors")
    port_config = {"vocab_size": 60, "cutoffs": [20, 40], "d_model": 32, "d_embed": 32,
                   "n_head": 2, "d_head": 8, "d_inner": 48, "div_val": 4, "n_layer": 2,
                   "untie_r": True, "proj_share_all_but_first": True, "tie_word_embeddings": True,
                   "mem_len": 8, "clamp_len": 3, "same_length": True, "attn_type": 0,
                   "sample_softmax": -1, "pre_lnorm": False, "layer_norm_epsilon": 1e-5,
                   "eos_token_id": 0, "architectures": ["TransfoXLLMHeadModel"]}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(port_config))
    vocab = tmp_path / "vocab.pkl"
    vocab.write_bytes(pickle.dumps({"idx2sym": SYMBOLS,
                                    "sym2idx": {s: i for i, s in enumerate(SYMBOLS)}}))
    return case, weights, str(config), str(vocab)


def test_cli_converts_the_port_and_export_matches_the_reference(tmp_path, jobs):
    from export import open_runtime, run_export
    from txl_tf.weights.model_dir import load

    case, weights, config, vocab = _port_files(tmp_path)
    fields, ignored = read_config_file(config)
    assert fields["tie_projs"] == [False, True, True] and fields["n_token"] == 60
    assert ignored == ["architectures", "eos_token_id"]
    out = tmp_path / "model"
    proc = jobs.run("txl_tf.weights.convert", ["--source=pytorch", f"--input={weights}",
                                               f"--config={config}", f"--vocab={vocab}",
                                               f"--output_dir={out}"], check=True)
    printed = proc.stdout
    assert "transfo-xl-wt103 port" in printed and "cluster_order=tf" in printed
    assert "same_length_convention=pytorch" in printed and "restricted unpickler" in printed
    assert sorted(os.listdir(out)) == ["config.json", "vocab", "weights.npz"]
    core, source = load(str(out))
    cfg = core.config
    assert (cfg.same_length, cfg.same_length_convention, cfg.zero_filled_memory,
            cfg.clamp_len, cfg.mem_len) == (True, "pytorch", True, 3, 8)
    assert read_vocab(os.path.join(source.vocab_dir, "vocab.txt")) == SYMBOLS

    exported = tmp_path / "exported"
    report = run_export(str(exported), model_dir=str(out), formats=("saved_model", "onnx"),
                        opset=17, verify=True)
    assert set(report["parity"]) == {"onnxruntime", "saved_model"}
    # The ONNX graph keeps the PyTorch same_length rule and the zero start:
    # three segments (the memory full throughout) equal the numpy reference.
    rt = open_runtime(str(exported), backend="onnx")
    assert rt.info.values["same_length_convention"] == "pytorch"
    ref = PytorchReference(case["state"], mem_len=8, same_length=True, clamp_len=3,
                           zero_start=True, cluster_rule="tf", **case["hyper"])
    ids = np.random.default_rng(5).integers(0, 60, (2, 12))
    memory = rt.initial_memory(2)
    for s in range(3):
        seg = ids[:, 4 * s:4 * s + 4]
        log_probs, memory = rt.step(seg, memory)
        np.testing.assert_allclose(log_probs, ref.forward(seg.T).transpose(1, 0, 2), atol=1e-4)


def test_cli_bad_input_is_one_error_line(tmp_path, jobs):
    _, weights, config, _ = _port_files(tmp_path)
    values = json.loads(Path(config).read_text(encoding="utf-8"))
    values["d_inner"] = 64
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(values))
    proc = jobs.run("txl_tf.weights.convert", ["--source=pytorch", f"--input={weights}",
                                               f"--config={wrong}",
                                               f"--output_dir={tmp_path / 'o'}"])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1].startswith("error: ")
    assert "transformer.layers.0.pos_ff.CoreNet.0.weight: the weights have (48, 32), the " \
           "config needs (64, 32)" in lines[-1]
    assert not (tmp_path / "o").exists()


def test_convert_refuses_bad_inputs(tmp_path):
    case, weights, config, vocab = _port_files(tmp_path)
    quiet = dict(echo=lambda line: None)
    with pytest.raises(ConvertError, match="--input .* does not exist"):
        convert("pytorch", str(tmp_path / "none.safetensors"), str(tmp_path / "o"), **quiet)
    with pytest.raises(ConvertError, match="needs --config"):
        convert("tf", weights, str(tmp_path / "o"), **quiet)
    with pytest.raises(ConvertError, match=r"--source must be one of \('pytorch', 'tf'\), "
                                           r"got 'onnx'"):
        convert("onnx", weights, str(tmp_path / "o"), **quiet)
    with pytest.raises(ConvertError, match="--input is required"):
        convert("pytorch", "", str(tmp_path / "o"), **quiet)
    with pytest.raises(ConvertError, match=r"--output_dir .*model.safetensors is a file"):
        convert("pytorch", weights, str(weights), **quiet)
    for text, problem in (("{nope", "cannot read the config .*bad.json: Expecting"),
                          ("[1]", r"bad.json: a config is a JSON object")):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ConvertError, match=problem):
            convert("pytorch", weights, str(tmp_path / "o"), config=str(tmp_path / "bad.json"),
                    **quiet)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep").write_text("x")
    with pytest.raises(ConvertError, match="not empty"):
        convert("pytorch", weights, str(busy), **quiet)
    short = tmp_path / "short.txt"
    short.write_text("<eos>\nw\n")
    with pytest.raises(ConvertError, match="2 symbols, the model n_token=60"):
        convert("pytorch", weights, str(tmp_path / "o"), config=config, vocab=str(short),
                **quiet)
    no_eos = tmp_path / "bytes.txt"  # as the paper's enwik8 vocabulary: byte values, no <eos>
    no_eos.write_text("".join(f"{i}\n" for i in range(60)))
    with pytest.raises(ConvertError, match="no <eos> symbol"):
        convert("pytorch", weights, str(tmp_path / "o"), config=config, vocab=str(no_eos),
                **quiet)
    from txl_tf.weights.convert import _spec
    assert "<eos>" in next(h for _, name, _, h, _ in _spec() if name == "vocab")  # --help
    binary = tmp_path / "weights.npz"  # a wrong file given as --vocab: not UTF-8 text
    binary.write_bytes(b"PK\x03\x04\x96\xff\n")
    with pytest.raises(TxlError, match=r"'.*weights\.npz' is not a TF checkpoint: .*"
                                       r"sstable"):  # was a DataLossError traceback
        convert("tf", str(binary), str(tmp_path / "o"), config=config, **quiet)
    with pytest.raises(TxlError, match=r"vocabulary file .*weights\.npz is not UTF-8 text"):
        convert("pytorch", weights, str(tmp_path / "o"), config=config, vocab=str(binary),
                **quiet)
    values = json.loads(Path(config).read_text(encoding="utf-8"))
    values["attn_type"] = 2
    absolute = tmp_path / "absolute.json"
    absolute.write_text(json.dumps(values))
    with pytest.raises(ConvertError, match="attn_type=2 is not supported"):
        read_config_file(str(absolute))


def test_the_ports_config_keeps_its_layer_norm_epsilon(tmp_path, monkeypatch):
    """The port's layers use its config's `layer_norm_epsilon`; `--config`
    gave it and the PyTorch default 1e-5 replaced it (0.43 nats off at 0.5)."""
    import tests.reference_pytorch_numpy as reference
    from txl_tf.weights import load_pretrained

    case, weights, config, _ = _port_files(tmp_path)
    values = json.loads(Path(config).read_text(encoding="utf-8"))
    values["layer_norm_epsilon"] = 0.5
    Path(config).write_text(json.dumps(values))
    out = tmp_path / "model"
    convert("pytorch", weights, str(out), config=config, echo=lambda line: None)
    core = load_pretrained(str(out))
    assert core.config.layer_norm_epsilon == 0.5
    monkeypatch.setattr(reference, "EPS", 0.5)
    ref = PytorchReference(case["state"], mem_len=8, same_length=True, clamp_len=3,
                           zero_start=True, cluster_rule="tf", **case["hyper"])
    ids = np.random.default_rng(6).integers(0, 60, (2, 8))
    memory = core.initial_memory(2)
    for s in range(2):
        got, memory = core(ids[:, 4 * s:4 * s + 4], memory)
        np.testing.assert_allclose(got, ref.forward(ids[:, 4 * s:4 * s + 4].T).transpose(1, 0, 2),
                                   atol=1e-4)


def test_the_ports_config_keys_take_the_ports_precedence(tmp_path):
    """As `TransfoXLConfig` reads them: a `tie_projs` list beats
    `proj_share_all_but_first` (an argument that only sets its default) and
    `tie_word_embeddings` beats the older `tie_weight`, in any key order.
    Both lost here (a valid config then refused its own weights)."""
    port = {"vocab_size": 60, "cutoffs": [20, 40], "d_model": 32, "n_layer": 2}
    for first, then in ((("proj_share_all_but_first", True), ("tie_projs", [False, False, True])),
                        (("tie_projs", [False, False, True]), ("proj_share_all_but_first", True)),
                        (("tie_word_embeddings", False), ("tie_weight", True)),
                        (("tie_weight", True), ("tie_word_embeddings", False))):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**port, first[0]: first[1], then[0]: then[1]}))
        fields, _ = read_config_file(str(path))
        if "tie_projs" in (first[0], then[0]):
            assert fields["tie_projs"] == [False, False, True], (first, then)
        else:
            assert fields["tie_weight"] is False, (first, then)
    path.write_text(json.dumps({**port, "proj_share_all_but_first": False}))
    assert read_config_file(str(path))[0]["tie_projs"] == [False, False, False]


def test_the_ports_sample_softmax_0_is_the_full_softmax(tmp_path):
    """The paper's code and the port sample the softmax only where
    `sample_softmax > 0`: 0 (as -1) is the full softmax, which was refused
    as "sample_softmax=0 is not supported (only ... a full softmax ...)"."""
    port = {"vocab_size": 60, "cutoffs": [20, 40], "d_model": 32, "n_layer": 2}
    path = tmp_path / "config.json"
    for value in (-1, 0, None):
        path.write_text(json.dumps({**port, "sample_softmax": value}))
        assert read_config_file(str(path))[0]["n_token"] == 60
    path.write_text(json.dumps({**port, "sample_softmax": 8192}))
    with pytest.raises(ConvertError, match="sample_softmax=8192 is not supported"):
        read_config_file(str(path))


def test_a_vocab_pkl_saved_by_transformers_4_converts(tmp_path, monkeypatch):
    """`TransfoXLTokenizer.save_pretrained` (transformers 4.x) pickles its
    whole `__dict__`: compiled regexes, its Moses tokenizers, a `Trie`,
    `AddedToken`s beside `idx2sym`. Those were refused (`re._compile`), so the
    port's own saved tokenizer could not be converted. They are skipped now,
    never built or run; any other class is still refused."""
    import re
    import sys
    import types

    fakes = {}
    for module, name in (("sacremoses.tokenize", "MosesTokenizer"),
                         ("sacremoses.normalize", "MosesPunctNormalizer"),
                         ("transformers.tokenization_utils", "Trie")):
        for package in (module.split(".")[0], module):  # pickle imports both
            if package not in sys.modules:
                monkeypatch.setitem(sys.modules, package, types.ModuleType(package))
        cls = type(name, (), {"__module__": module})
        monkeypatch.setattr(sys.modules[module], name, cls, raising=False)
        fakes[name] = cls

    class Token:  # as tokenizers' AddedToken pickles: a call with its content, then state
        def __reduce__(self):
            return fakes["AddedToken"], ("<unk>",), {"special": True}
    added = types.ModuleType("tokenizers")
    fakes["AddedToken"] = added.AddedToken = type("AddedToken", (), {"__module__": "tokenizers"})
    monkeypatch.setitem(sys.modules, "tokenizers", added)
    moses = fakes["MosesTokenizer"]()
    moses.lang, moses.pattern = "en", re.compile(r"\s+")
    attrs = {"counter": collections.Counter(SYMBOLS), "idx2sym": SYMBOLS,
             "sym2idx": collections.OrderedDict((s, i) for i, s in enumerate(SYMBOLS)),
             "punctuation_with_space_around_pattern": re.compile(r"(?<=[^\s])([,.])"),
             "moses_tokenizer": moses, "moses_punct_normalizer": fakes["MosesPunctNormalizer"](),
             "tokens_trie": fakes["Trie"](), "init_kwargs": {"unk_token": Token()}}
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps(attrs, protocol=4))
    assert convert_pickled_vocab(path, tmp_path / "vocab.txt") == SYMBOLS
    path.write_bytes(pickle.dumps({"idx2sym": SYMBOLS, "x": collections.deque()}))
    with pytest.raises(PickledVocabError, match="refusing to unpickle collections.deque"):
        convert_pickled_vocab(path, tmp_path / "vocab.txt")
    # BUILD on the placeholder class itself sets nothing on it.
    path.write_bytes(b"\x80\x02cre\n_compile\nN}X\x04\x00\x00\x00evilK\x00s\x86b.")
    with pytest.raises(PickledVocabError, match="no symbol list"):
        convert_pickled_vocab(path, tmp_path / "vocab.txt")
    from txl_tf.text import pickled_vocab
    assert not hasattr(pickled_vocab._Skipped, "evil")


def test_the_ports_folder_given_as_a_model_directory_names_txl_convert(tmp_path):
    """`load_pretrained` / `from_preset` on the Hub's folder (config.json +
    model.safetensors) said only that it was no model directory."""
    from txl_tf.weights import load_pretrained
    from txl_tf.weights.model_dir import ModelDirError

    _port_files(tmp_path)
    with pytest.raises(ModelDirError, match=r"its model\.safetensors is a PyTorch state dict .*"
                                            r"`txl-convert --source=pytorch --input=.*"
                                            r"model\.safetensors --config=.*config\.json"):
        load_pretrained(str(tmp_path))


def test_a_state_dict_folder_without_config_names_a_command_without_one(tmp_path):
    """A folder holding only the state dict: the command named `--config=<a
    config.json that is not there>` (an error when run); `--config` is
    optional for a PyTorch state dict."""
    from txl_tf.weights import load_pretrained
    from txl_tf.weights.model_dir import ModelDirError

    _port_files(tmp_path)
    os.remove(tmp_path / "config.json")
    with pytest.raises(ModelDirError) as caught:
        load_pretrained(str(tmp_path))
    assert "--config" not in str(caught.value)
    assert f"--input={tmp_path / 'model.safetensors'} --output_dir=" in str(caught.value)


def test_a_placeholder_takes_no_state_and_runs_nothing(tmp_path):
    """What a pickle can do to `_Skipped` (a skipped transformers 4.x object):
    BUILD on an instance (dict state, slot state naming `__class__` or
    `__setstate__`) sets nothing; append, item set and call are refused."""
    from txl_tf.text import pickled_vocab

    new = b"\x80\x02cre\n_compile\n)\x81"  # GLOBAL re._compile (the placeholder), NEWOBJ
    key = b"X\x0c\x00\x00\x00__setstate__"
    built = [new + b"}" + key + b"K\x00sb.", new + b"N}" + key + b"K\x00s\x86b.",
             new + b"N}X\x09\x00\x00\x00__class__cbuiltins\ndict\ns\x86b."]
    before = dict(vars(pickled_vocab._Skipped))
    path = tmp_path / "vocab.pkl"
    for payload in built:
        path.write_bytes(payload)
        obj = pickled_vocab.load_plain_pickle(path)
        assert type(obj) is pickled_vocab._Skipped and vars(obj) == {}
    assert dict(vars(pickled_vocab._Skipped)) == before
    for payload in (new + b"K\x01a.", new + b"K\x01K\x02s.", new + b")R."):
        path.write_bytes(payload)
        with pytest.raises(PickledVocabError, match="not a readable pickle"):
            pickled_vocab.load_plain_pickle(path)


def _memo_chain(start, depth, end):
    """A pickle: `start` (memo 0), then x_k = (x_{k-1}, x_{k-1}) for k < depth,
    then x_{depth-1} and `end`: a few hundred bytes, 2**depth leaves when walked."""
    ops = [b"\x80\x02", start, b"X\x01\x00\x00\x00a\x85q\x000"]
    for k in range(1, depth):
        ops.append(b"h%ch%c\x86q%c0" % (k - 1, k - 1, k))
    return b"".join(ops) + b"h%c" % (depth - 1) + end


@pytest.mark.parametrize("payload", [
    # LONG_BINPUT 2**31 - 1: CPython's unpickler sized its memo list to 2**32
    # entries (32 GiB) before storing anything.
    pytest.param(b"\x80\x02Nr\xff\xff\xff\x7f.", id="memo index"),
    # BYTEARRAY8 of 2**40 bytes: the pure-Python unpickler allocates it first.
    pytest.param(b"\x80\x05\x96" + (2**40).to_bytes(8, "little") + b".", id="bytearray"),
    # str(b"a", "no-such-codec"): the codec's LookupError reached past the handler.
    pytest.param(b"\x80\x03cbuiltins\nstr\nC\x01aX\x0d\x00\x00\x00no-such-codec\x86R.",
                 id="codec"),
    # str() of a 60-level shared tuple: 2**60 leaves to print (a hang).
    pytest.param(_memo_chain(b"cbuiltins\nstr\n", 60, b"\x85R."), id="str"),
    # The same tree as a dict key: hashing walks every leaf (a hang).
    pytest.param(_memo_chain(b"}", 60, b"K\x00s."), id="dict key"),
    pytest.param(_memo_chain(b"\x8f(", 60, b"\x90."), id="set item"),
    pytest.param(_memo_chain(b"cbuiltins\ndict\n", 60, b"K\x00\x86\x85\x85R."),
                 id="dict of pairs"),
    # A million nested tuples as a dict key: hash recursed in C (a segfault).
    pytest.param(b"\x80\x02})" + b"\x85" * 1_000_000 + b"K\x00s.", id="deep key"),
    # list(x) over one x of 2**16 items, 2**16 times: 2**32 copied items from 400 KB.
    pytest.param(b"\x80\x02]q\x00(" + b"h\x00" * 2**16 + b"e" + b"cbuiltins\nlist\nq\x01"
                 + b"0" + b"h\x01h\x00\x85R" * 2**16 + b".", id="copies"),
])
def test_a_hostile_pickle_of_plain_containers_is_refused_at_once(tmp_path, payload):
    """A few hundred bytes of plain containers made the unpickler allocate
    32 GiB, walk 2**60 shared leaves, recurse until it crashed, or copy one
    list without end. Each is now one PickledVocabError, quickly."""
    path = tmp_path / "vocab.pkl"
    path.write_bytes(payload)
    with pytest.raises(PickledVocabError, match=r"vocab\.pkl: "):
        convert_pickled_vocab(path, tmp_path / "vocab.txt")
    assert not (tmp_path / "vocab.txt").exists()


def test_a_zipped_pickle_declaring_gigabytes_is_refused_before_reading(tmp_path):
    """A torch.save zip whose data.pkl inflates to 2 GiB (a zip bomb: a few MB
    on disk) was inflated in memory before anything was checked."""
    from txl_tf.text import pickled_vocab

    path = tmp_path / "vocab.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"idx2sym": SYMBOLS}))
    data = bytearray(path.read_bytes())
    # The declared (uncompressed) size in the central directory: 2 GiB.
    central = data.rindex(b"PK\x01\x02")
    data[central + 24:central + 28] = (2**31).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(PickledVocabError, match=r"data\.pkl.*2147483648 bytes.* at most"):
        pickled_vocab.load_plain_pickle(path)


def test_an_idx2sym_and_sym2idx_that_disagree_are_refused(tmp_path):
    """The port encodes with sym2idx and decodes with idx2sym; a vocab.pkl
    whose two disagree was converted from idx2sym alone, so the model read
    other ids than the port's without a word."""
    path = tmp_path / "vocab.pkl"
    swapped = {s: i for i, s in enumerate(SYMBOLS)}
    swapped["w0"], swapped["w1"] = swapped["w1"], swapped["w0"]
    path.write_bytes(pickle.dumps({"idx2sym": SYMBOLS, "sym2idx": swapped}))
    with pytest.raises(PickledVocabError, match=r"vocab\.pkl: idx2sym and sym2idx disagree: "
                                                r"idx2sym\[2\] is 'w0', sym2idx\['w0'\] is 3"):
        convert_pickled_vocab(path, tmp_path / "vocab.txt")
    path.write_bytes(pickle.dumps({"idx2sym": SYMBOLS,
                                   "sym2idx": {s: i for i, s in enumerate(SYMBOLS)}}))
    assert convert_pickled_vocab(path, tmp_path / "vocab.txt") == SYMBOLS


@pytest.mark.parametrize("key", [2**20000, tuple(["w"] * 5000), (2**20000,)],
                         ids=["int", "tuple", "tuple_of_int"])
def test_a_key_costly_to_hash_is_refused(tmp_path, key):
    """An int's hash walks all its digits and a tuple's all its items, every
    time the key is reached: one 500 MB int (or a tuple of 10**8 shared
    strings) set as a key 10**8 times through the memo, 3 bytes each, hashed
    for days; dict keys and set items are bounded ints or short tuples of strings."""
    from txl_tf.text import pickled_vocab

    for obj in ({key: 1}, {"idx2sym": SYMBOLS, "extra": {key}}):
        path = tmp_path / "vocab.pkl"
        path.write_bytes(pickle.dumps(obj, protocol=4))
        with pytest.raises(PickledVocabError, match=r"vocab\.pkl: refusing a dict key or set "
                                                    r"item of type (int|tuple) "):
            pickled_vocab.load_plain_pickle(path)
    path.write_bytes(pickle.dumps({2**60: ("a",) * 64, ("a",) * 64: -2**60}))
    assert pickled_vocab.load_plain_pickle(path) == {2**60: ("a",) * 64, ("a",) * 64: -2**60}


def test_keys_whose_hashes_a_file_can_make_collide_are_refused(tmp_path):
    """An int's hash is itself modulo 2**61-1 and a tuple's is computed from
    its items' without a random seed: 40,000 int keys n * (2**61 - 1) + 1
    (560 KB) took seconds and a 5 MB file minutes (every key probed every
    other; measured at d0adafd); str and bytes hashes are seeded per process."""
    from txl_tf.text import pickled_vocab

    path = tmp_path / "vocab.pkl"
    for key in (2**61 - 1, -(2**61 - 1), (1, 2), ("w", 0.5), ("w", (2**61 - 1) + 1)):
        path.write_bytes(pickle.dumps({key: 0}, protocol=4))
        with pytest.raises(PickledVocabError, match=r"refusing a dict key or set item of type"):
            pickled_vocab.load_plain_pickle(path)
    fine = {2**61 - 2: 0, -(2**61 - 2): 1, 0.5: 2, True: 3, None: 4, b"w": 5,
            ("w", b"x", None, False): 6}
    path.write_bytes(pickle.dumps(fine, protocol=4))
    assert pickled_vocab.load_plain_pickle(path) == fine


def test_a_pickle_over_64_mib_is_refused_before_it_is_read(tmp_path):
    """A pickle's objects take up to some 70 times its bytes (an empty dict,
    64 bytes and a stack slot, per byte `}`): 1 GiB allowed 70 GiB. A real
    vocab.pkl of 267,735 symbols is 5 MB."""
    from txl_tf.text import pickled_vocab

    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps(b"x" * (64 << 20), protocol=4))
    with pytest.raises(PickledVocabError, match=r"vocab\.pkl: more than 67108864 bytes"):
        pickled_vocab.load_plain_pickle(path)


def test_a_symbol_that_is_not_utf8_text_is_refused_before_writing(tmp_path):
    """A pickled str may hold a lone surrogate (pickle writes it with
    surrogatepass): the converter emptied an existing vocab.txt, then failed
    on UTF-8 with a message naming neither file nor symbol."""
    path, out = tmp_path / "vocab.pkl", tmp_path / "vocab.txt"
    path.write_bytes(pickle.dumps({"idx2sym": ["<eos>", "a\ud800b"]}, protocol=4))
    out.write_text("kept\n")
    with pytest.raises(PickledVocabError, match=r"vocab\.pkl: symbol 1 \('a\\ud800b'\) is "
                                                r"not UTF-8 text"):
        convert_pickled_vocab(path, out)
    assert out.read_text() == "kept\n"
