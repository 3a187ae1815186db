"""The fine-tuning job `training.classify`: a CLI run on a tiny task writes a
classifier that reloads with the same evaluation, predicts, and exports
artefacts that agree with Keras; bad flags and data give one `error:` line
and exit status 2 before anything is written."""
import json
import os
import random

import keras
import numpy as np
import pytest

from export import open_classifier
from training import classify
from training.errors import TrainingError
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.text import ByteTokenizer, CharTokenizer, WordTokenizer
from txl_tf.weights import save_pretrained

LETTERS = {"ab": "ab", "mn": "mn", "xy": "xy"}  # a class is the letters its words use


def _doc(rng, label):
    return " ".join("".join(rng.choice(LETTERS[label]) for _ in range(rng.randint(2, 5)))
                    for _ in range(rng.randint(3, 12)))


def write_tsv(path, n, seed, labels=tuple(LETTERS)):
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            label = labels[i % len(labels)]
            f.write(f"{label}\t{_doc(rng, label if label in LETTERS else 'ab')}\n")
    return str(path)


def write_backbone(path, vocab=True, n_token=256):
    keras.utils.set_random_seed(3)
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=n_token, tgt_len=8,
                                                    mem_len=8))
    save_pretrained(core, path)
    if vocab:
        ByteTokenizer().save(os.path.join(path, "vocab"))
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("classify")
    return {"root": root, "train": write_tsv(root / "train.tsv", 120, 0),
            "eval": write_tsv(root / "eval.tsv", 30, 1),
            "backbone": write_backbone(root / "backbone")}


@pytest.fixture(scope="module")
def trained(data, jobs):
    """One run of the command line: 40 steps from the tiny backbone, with
    evaluation and both exports."""
    out = str(data["root"] / "out")
    proc = jobs.run("training.classify", [
        f"--train_data={data['train']}", f"--eval_data={data['eval']}",
        f"--backbone={data['backbone']}", f"--output_dir={out}", "--steps=40",
        "--batch_size=8", "--learning_rate=3e-3", "--log_every=10", "--max_length=64",
        "--mixed_precision=none", "--export=saved_model,onnx"], check=True)
    return out, proc


def test_the_run_writes_its_output_dir(trained):
    out, proc = trained
    for name in ("classifier.keras", "labels.json", "flags.json", "train_log.jsonl",
                 "metrics.json", "vocab/tokenizer.json", "export/classifier.json",
                 "export/model.onnx", "export/saved_model/saved_model.pb"):
        assert os.path.exists(os.path.join(out, name)), name
    assert json.load(open(os.path.join(out, "labels.json")))["labels"] == ["ab", "mn", "xy"]
    log = [json.loads(line) for line in open(os.path.join(out, "train_log.jsonl"))]
    assert [r["step"] for r in log] == [10, 20, 30, 40]
    assert log[-1]["loss"] < log[0]["loss"]
    # piped stdout: plain lines with loss and accuracy, no bar
    assert "step 40/40 loss" in proc.stdout and "accuracy" in proc.stdout
    assert "\r" not in proc.stdout and "\x1b" not in proc.stdout
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["examples"] == 30 and sum(map(sum, metrics["confusion"])) == 30
    assert metrics["accuracy"] >= 0.9  # the letters decide the class: learnt in 40 steps


def test_reloaded_classifier_evaluates_the_same(trained, data, tmp_path, capsys, monkeypatch):
    """Evaluation reads documents as training did (--max_length=64 of the run,
    taken from its flags.json and said), and gets the run's own metrics;
    `--noprogress` quiets the data file's bar too (shown on a terminal)."""
    import sys
    from txl_tf.classification import data as classification_data
    monkeypatch.setattr(classification_data, "PROGRESS_MIN_BYTES", 10)  # 32 MiB, made small
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    out, _ = trained
    saved = json.load(open(os.path.join(out, "metrics.json")))
    result = classify.run(mode="evaluate", classifier_dir=out, eval_data=data["eval"],
                          output=str(tmp_path / "m.json"), progress=False)
    err = capsys.readouterr().err
    assert "as the classifier was trained: --max_length=64, --keep=start" in err
    assert "\r" not in err, repr(err)
    again = result["eval"]
    assert again["max_length"] == 64
    assert again["accuracy"] == saved["accuracy"]
    assert again["confusion"] == saved["confusion"]
    assert again["loss"] == pytest.approx(saved["loss"], abs=1e-5)
    assert json.load(open(tmp_path / "m.json"))["accuracy"] == saved["accuracy"]


def test_predict_data_is_read_as_the_line_files_are(tmp_path):
    # a UTF-8 BOM stayed in the first document (3 more byte tokens); bytes that were not
    # UTF-8 gave a position in a buffer instead of the line
    texts = tmp_path / "texts.txt"
    texts.write_bytes(b"\xef\xbb\xbffirst\r\nsecond\rthird\n")
    assert classify.read_texts(str(texts)) == ([1, 2, 3], ["first", "second", "third"])
    texts.write_bytes(b"ok\n" * 5000 + b"caf\xe9\n")
    with pytest.raises(TrainingError, match=r"^--predict_data: \S*texts.txt:5001: not valid "
                                            r"UTF-8 \(byte 0xe9\)$"):
        classify.read_texts(str(texts))


def test_texts_a_vocabulary_cannot_encode_are_named():
    words = WordTokenizer(["<eos>", "a", "b"], unk_token=None)
    classify.check_encodable(["a b", "b\na"], ["f:1", "f:2"], words, "predict_data")
    with pytest.raises(TrainingError, match=r"^--eval_data: f:2: word 'c' is not in the "):
        classify.check_encodable(["a b", "b c"], ["f:1", "f:2"], words, "eval_data")
    classify.check_encodable(["\u00e9"], ["f:1"], ByteTokenizer(), "eval_data")  # no unk_id


def test_predict_gives_one_row_per_input_line(trained, data, tmp_path):
    out, _ = trained
    texts = tmp_path / "texts.txt"
    rng = random.Random(5)
    truth = ["xy", "ab", "mn", "xy"]
    docs = [_doc(rng, t) for t in truth]
    texts.write_text("\n".join(docs[:2] + ["  "] + docs[2:]) + "\n\n")
    with pytest.raises(TrainingError, match=r"texts.txt line\(s\) 3, 6 blank \(pass "
                                            r"--skip_blank"):
        classify.run(mode="predict", classifier_dir=out, predict_data=str(texts),
                     progress=False)
    classify.run(mode="predict", classifier_dir=out, predict_data=str(texts), skip_blank=True,
                 output=str(tmp_path / "p.tsv"), progress=False)
    lines = (tmp_path / "p.tsv").read_text().splitlines()
    assert lines[0] == "line\tlabel\tab\tmn\txy" and len(lines) == 5
    help_text = next(h for _, name, _, h, _ in classify.SPEC if name == "output")
    assert "line<TAB>label<TAB>" in help_text and "header" in help_text  # what --help says
    rows = [line.split("\t") for line in lines[1:]]
    assert [int(r[0]) for r in rows] == [1, 2, 4, 5]  # the input's line numbers
    probs = np.array([[float(x) for x in r[2:]] for r in rows])
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    assert [r[1] for r in rows] == [["ab", "mn", "xy"][i] for i in probs.argmax(1)]
    assert [r[1] for r in rows] == truth


def test_a_reordered_labels_json_is_an_error(trained, data, tmp_path):
    import shutil
    out, _ = trained
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    labels = json.loads((copy / "labels.json").read_text())
    labels["labels"] = labels["labels"][::-1]
    (copy / "labels.json").write_text(json.dumps(labels))
    with pytest.raises(TrainingError, match=r"labels.json does not list the classes .* was "
                                            r"trained with, in its order \(ab, mn, xy\)"):
        classify.run(mode="evaluate", classifier_dir=str(copy), eval_data=data["eval"],
                     progress=False)


@pytest.mark.parametrize("backend", ["onnx", "saved_model"])
def test_export_agrees_with_keras(trained, backend):
    out, _ = trained
    model, labels, tokenizer = classify.load_classifier(out)
    rng = random.Random(9)
    docs = [tokenizer.encode(_doc(rng, label)) for label in ("ab", "xy", "mn", "ab")]
    lengths = np.array([len(d) for d in docs], np.int32)
    ids = np.zeros((len(docs), lengths.max() + 5), np.int32)  # right padding
    for i, d in enumerate(docs):
        ids[i, :len(d)] = d
    want = model.predict_probabilities({"token_ids": ids, "lengths": lengths}).numpy()
    runtime = open_classifier(os.path.join(out, "export"), backend=backend)
    np.testing.assert_allclose(runtime.probabilities(ids, lengths), want, atol=1e-4)
    assert runtime.label_names == labels.names
    assert np.abs(want - 1 / 3).max() > 0.1  # a trained, confident model


def test_from_scratch_with_a_preset_and_bytes(data, tmp_path):
    result = classify.run(train_data=data["train"], preset="tiny",
                          config_override=["tgt_len=8", "mem_len=8"],
                          output_dir=str(tmp_path / "scratch"), steps=3, batch_size=8,
                          max_length=32, mixed_precision="none", verbose=0)
    assert result["steps"] == 3 and result["eval"] is None
    model, labels, tokenizer = classify.load_classifier(str(tmp_path / "scratch"))
    assert isinstance(tokenizer, ByteTokenizer) and model.segment_len == 8
    assert labels.names == ["ab", "mn", "xy"]


# -- bad input -----------------------------------------------------------------

def _train(data, tmp_path, **options):
    base = dict(train_data=data["train"], backbone=data["backbone"],
                output_dir=str(tmp_path / "out") if tmp_path else None, steps=2, batch_size=8,
                max_length=32,
                mixed_precision="none", verbose=0)
    base.update(options)
    return classify.run(**base)


def test_unknown_label_at_evaluation(data, tmp_path):
    bad = write_tsv(tmp_path / "bad.tsv", 6, 2, labels=("ab", "cooking"))
    with pytest.raises(TrainingError, match=r"--eval_data: .*bad.tsv:2: unknown label "
                                            r"'cooking'"):
        _train(data, tmp_path, eval_data=bad)
    assert not (tmp_path / "out").exists()  # nothing written


def test_num_classes_mismatch(data, tmp_path):
    with pytest.raises(TrainingError, match=r"--num_classes=4 but the training data has 3 "
                                            r"labels \(ab, mn, xy\)"):
        _train(data, tmp_path, num_classes=4)


def test_grad_segments_beyond_what_can_be_read_or_held_are_refused_before_writing(
        data, tmp_path):
    """100,000 of them trained (unrolled in the graph) without end; the kept
    segments count in the memory budget (2**20 of them: terabytes)."""
    from txl_tf.checks.memory_budget import MemoryBudgetError
    with pytest.raises(TrainingError, match=r"^--grad_segments 100000 exceeds the 4 segments "
                                            r"of 8 tokens that a document of --max_length 32 "
                                            r"has$"):
        _train(data, tmp_path, grad_segments=100_000)
    with pytest.raises(MemoryBudgetError, match=r"^a training step \(batch 8, segment 8, "
                                                r"memory 8, 1048576 segments kept for the backward "
                                                r"pass\) needs at least [\d,.]+ GiB "
                                                r"\(activations"):
        _train(data, tmp_path, grad_segments=2 ** 20, max_length=2 ** 31 - 1)
    assert not (tmp_path / "out").exists()


def test_training_data_of_one_label_is_refused(data, tmp_path):
    one = write_tsv(tmp_path / "one.tsv", 10, 0, labels=("ab",))
    with pytest.raises(TrainingError, match=r"^the training data has one label \(ab\); a "
                                            r"classifier needs examples of two or more$"):
        _train({**data, "train": one}, tmp_path)


def test_backbone_without_vocabulary(data, tmp_path):
    bare = write_backbone(tmp_path / "bare", vocab=False)
    with pytest.raises(TrainingError, match=r"--backbone .*bare has no vocabulary .* "
                                            r"--vocab_dir"):
        _train(data, tmp_path, backbone=bare)


def test_vocabulary_size_differs_from_the_backbone(data, tmp_path):
    big = write_backbone(tmp_path / "big", vocab=False, n_token=300)
    vocab = str(ByteTokenizer().save(tmp_path / "bytes"))
    with pytest.raises(TrainingError, match=r"vocabulary/model size mismatch: the tokenizer "
                                            r"has 256 tokens, .* n_token=300"):
        _train(data, tmp_path, backbone=big, vocab_dir=vocab)


def test_an_existing_classifier_is_not_overwritten(trained, data):
    out, _ = trained
    before = open(os.path.join(out, "classifier.keras"), "rb").read()
    with pytest.raises(TrainingError, match=r"already holds a classifier .* --overwrite"):
        _train(data, None, output_dir=out)
    assert open(os.path.join(out, "classifier.keras"), "rb").read() == before


def test_evaluate_needs_a_classifier_dir(data, tmp_path):
    with pytest.raises(TrainingError, match=r"--classifier_dir .*nowhere does not exist"):
        classify.run(mode="evaluate", classifier_dir=str(tmp_path / "nowhere"),
                     eval_data=data["eval"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainingError, match=r"holds no classifier.keras"):
        classify.run(mode="evaluate", classifier_dir=str(tmp_path / "empty"),
                     eval_data=data["eval"])


def test_a_classifiers_unreadable_flags_file_is_named(tmp_path):
    (tmp_path / "flags.json").write_text("{max_length: 64")
    with pytest.raises(TrainingError, match=r"--classifier_dir: cannot read .*flags\.json"):
        classify.reading_settings({"classifier_dir": str(tmp_path), "max_length": None,
                                   "keep": None})


@pytest.mark.parametrize("text", ["[64]", '{"max_length": "all"}', '{"max_length": -1}',
                                  '{"keep": 3}'])
def test_a_classifiers_flags_file_of_the_wrong_kind_is_named(tmp_path, text):
    """A flags.json holding a JSON list was an AttributeError (`saved.get`);
    a max_length or keep of another kind was taken as the job's setting."""
    (tmp_path / "flags.json").write_text(text)
    with pytest.raises(TrainingError, match=r"--classifier_dir: .*flags\.json"):
        classify.reading_settings({"classifier_dir": str(tmp_path), "max_length": None,
                                   "keep": None})


@pytest.mark.parametrize("args, message", [
    (["--train_data={root}/missing.tsv", "--backbone={backbone}", "--output_dir={root}/o"],
     r"error: --train_data: classification data not found: .*missing.tsv"),
    (["--train_data={train}", "--eval_data={root}/unknown.tsv", "--backbone={backbone}",
      "--output_dir={root}/o"], r"error: --eval_data: .*unknown.tsv:2: unknown label 'zz'"),
    (["--train_data={train}", "--backbone={backbone}", "--output_dir={root}/o",
      "--num_classes=2"], r"error: --num_classes=2 but the training data has 3 labels"),
    (["--train_data={train}", "--backbone={root}/bare", "--output_dir={root}/o"],
     r"error: --backbone .*bare has no vocabulary"),
    (["--train_data={train}", "--output_dir={root}/o"],
     r"error: pass exactly one of --backbone .* got none"),
    (["--train_data={train}", "--backbone={backbone}", "--output_dir={root}/o", "--steps=3",
      "--epochs=1"], r"error: pass --steps or --epochs, not both"),
    (["--train_data={train}", "--backbone={backbone}", "--output_dir={root}/o",
      "--export=tflite"], r"error: --export: unknown format\(s\) tflite"),
    # Found by random command lines: flags.json, labels.json and vocab/ written, then an
    # error (or an OOM traceback at 2**31; a TypeError at segment_len=2**63).
    (["--train_data={train}", "--backbone={backbone}", "--output_dir={root}/o",
      "--mem_len=10000000000"],
     r"error: a training step \(batch 32, segment 8, memory 10000000000\) needs at least"),
    (["--train_data={train}", "--backbone={backbone}", "--output_dir={root}/o",
      "--segment_len=9223372036854775808"],
     r"error: a training step \(batch 32, segment 9223372036854775808, memory 8\) needs"),
    (["--mode=predict", "--classifier_dir={root}/nowhere", "--predict_data={train}"],
     r"error: --classifier_dir .*nowhere does not exist"),  # nothing said before it
    # a tokenizer without an unknown entry failed inside fit (a TensorFlow traceback)
    # after writing flags.json, labels.json and vocab/
    (["--train_data={train}", "--preset=tiny", "--vocab_dir={root}/strict",
      "--output_dir={root}/o"], r"error: --train_data: .*train.tsv:3: character 'x' "
                                r"\(U\+0078\) at position \d+ is not in the vocabulary"),
])
def test_command_line_errors(data, jobs, args, message):
    root = data["root"]
    if not (root / "bare").exists():
        write_backbone(root / "bare", vocab=False)
    write_tsv(root / "unknown.tsv", 4, 3, labels=("ab", "zz"))
    if not (root / "strict").exists():
        CharTokenizer(list("abmny \n"), unk_char=None).save(root / "strict")
    fill = {"root": str(root), "train": data["train"], "backbone": data["backbone"]}
    proc = jobs.run("training.classify", [a.format(**fill) for a in args])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert __import__("re").search(message, lines[0]), lines[0]
    assert "Traceback" not in proc.stderr
    assert not (root / "o").exists()


def test_a_nan_loss_stops_the_classifier_before_it_is_saved(data, tmp_path):
    """Weights so large that the first step's loss is NaN: the job saved
    and exported a NaN classifier, reporting a NaN loss."""
    with pytest.raises(TrainingError, match=r"^the training loss is nan at step 1: training "
                                            r"stopped there and nothing was saved; lower "
                                            r"--learning_rate$"):
        _train(data, tmp_path, backbone=None, preset="tiny",
               config_override=["tgt_len=8", "mem_len=8", "init_std=1e20"])
    assert not (tmp_path / "out" / classify.MODEL_FILE).exists()


def _files_of(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in ("train_log.jsonl", "train_log.previous.jsonl")}


def test_an_overwrite_killed_while_training_leaves_the_previous_classifier(
        trained, data, tmp_path, monkeypatch):
    """`--overwrite` wrote the new run's flags.json, labels.json and vocab/ at
    its start: killed while training, the folder held the previous
    classifier.keras read with the new run's --max_length (another accuracy,
    neither run's) without a word."""
    import pathlib
    import shutil
    out = tmp_path / "out"
    shutil.copytree(trained[0], out)
    before = _files_of(out)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # a SIGKILL while training: nothing after it runs
    monkeypatch.setattr(keras.Model, "fit", killed)
    log = (out / "train_log.jsonl").read_bytes()
    with pytest.raises(KeyboardInterrupt):
        _train(data, None, output_dir=str(out), overwrite=True, max_length=16, seed=9)
    assert _files_of(pathlib.Path(out)) == before
    # The kept classifier's log was deleted: it is aside until a new classifier is saved.
    assert (out / "train_log.previous.jsonl").read_bytes() == log and log
    with pytest.raises(KeyboardInterrupt):  # killed again: still the kept classifier's
        _train(data, None, output_dir=str(out), overwrite=True, max_length=16, seed=9)
    assert (out / "train_log.previous.jsonl").read_bytes() == log


def test_a_save_killed_before_its_classifier_leaves_the_previous_one(
        trained, data, tmp_path, monkeypatch):
    """classifier.keras was written in place: a kill while Keras wrote it left
    neither the previous classifier nor the new one."""
    import shutil
    from txl_tf.app import files
    out = tmp_path / "out"
    shutil.copytree(trained[0], out)
    before = _files_of(out)
    monkeypatch.setattr(files.Staged, "discard", lambda self: None)  # a kill cleans nothing

    def killed(self, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt
    monkeypatch.setattr(keras.Model, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        _train(data, None, output_dir=str(out), overwrite=True, steps=1, seed=9)
    after = _files_of(out)
    assert {name: after[name] for name in before} == before  # leftovers aside
    assert all(name.startswith(".tmp-") for name in set(after) - set(before))
    monkeypatch.undo()
    result = _train(data, None, output_dir=str(out), overwrite=True, steps=1, seed=9)
    assert sorted(os.listdir(out)) == ["classifier.keras", "flags.json", "labels.json",
                                       "train_log.jsonl", "vocab"]  # no metrics, no export
    assert result["eval"] is None and result["export"] is None
    classify.load_classifier(str(out))


def test_a_kill_while_writing_output_leaves_the_previous_file(trained, tmp_path, monkeypatch):
    """`--output` (predict, evaluate; `training.evaluate`, `training.recl`
    alike) was opened in place: a kill while it was written left a cut
    file where the previous one had been."""
    import builtins
    from training import files
    texts = tmp_path / "texts.txt"
    texts.write_text("ab ab\nxy xy\n")
    output = tmp_path / "p.tsv"
    output.write_text("the previous run's rows\n")

    class HalfWritten:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[:len(text) // 2])
            self.f.close()
            raise KeyboardInterrupt  # a SIGKILL half-way

    def killed_while_writing(path, mode="r", *args, **kwargs):
        f = builtins.open(path, mode, *args, **kwargs)
        return HalfWritten(f) if "w" in mode else f
    monkeypatch.setattr(classify, "open", killed_while_writing, raising=False)
    monkeypatch.setattr(files, "open", killed_while_writing, raising=False)
    with pytest.raises(KeyboardInterrupt):
        classify.run(mode="predict", classifier_dir=trained[0], predict_data=str(texts),
                     output=str(output), progress=False)
    assert output.read_text() == "the previous run's rows\n"


@pytest.mark.parametrize("options, message", [
    (dict(mode="serve"), r"--mode must be one of train, evaluate, predict, got 'serve'"),
    (dict(learning_rate=float("nan")), r"--learning_rate must be a finite number > 0, got nan"),
    (dict(clip=float("inf")), r"--clip must be a finite number >= 0 \(0: none\), got inf"),
    (dict(dropout=1.0), r"--dropout must be in \[0, 1\), got 1.0"),
    (dict(preset=None, backbone="b", config_override=["n_layer=1"]),
     r"--config_override applies to --preset only"),
    (dict(mode="evaluate"), r"--classifier_dir is required with --mode=evaluate"),
    (dict(mode="evaluate", classifier_dir="c", eval_data="e"),
     r"--train_data is for --mode=train, not --mode=evaluate"),
    (dict(mode="predict", classifier_dir="c", train_data=None, output_dir=None, preset=None),
     r"--predict_data is required with --mode=predict"),
])
def test_flags_wrong_on_their_own_are_named_before_anything_is_read(tmp_path, options, message):
    base = dict(train_data=str(tmp_path / "missing.tsv"), output_dir=str(tmp_path / "o"),
                preset="tiny")
    with pytest.raises(TrainingError, match=f"^{message}$"):
        classify.run(**{**base, **options})
    assert list(tmp_path.iterdir()) == []


def test_more_warmup_steps_than_training_steps_are_refused_before_writing(data, tmp_path):
    with pytest.raises(TrainingError, match=r"^--warmup_steps \(100\) exceeds the 2 training "
                                            r"steps$"):
        _train(data, tmp_path, warmup_steps=100)
    assert not (tmp_path / "out").exists()


def test_eval_data_outside_the_vocabulary_is_named_before_writing(data, tmp_path):
    strict = tmp_path / "strict"
    CharTokenizer(list("abmnxy \n"), unk_char=None).save(strict)
    bad = tmp_path / "eval.tsv"
    bad.write_text("ab\tab ab\nxy\txy qy\n", encoding="utf-8")
    with pytest.raises(TrainingError, match=r"^--eval_data: .*eval.tsv:2: character 'q'"):
        _train(data, tmp_path, backbone=None, preset="tiny", vocab_dir=str(strict),
               eval_data=str(bad))
    assert not (tmp_path / "out").exists()


def test_a_damaged_classifier_dir_names_the_file_at_fault(tmp_path):
    from txl_tf.classification import LabelSet
    folder = tmp_path / "clf"
    folder.mkdir()
    (folder / classify.MODEL_FILE).write_bytes(b"not a keras archive")
    (folder / "labels.json").write_text("{")
    with pytest.raises(TrainingError, match=r"^--classifier_dir: .*labels.json"):
        classify.load_classifier(str(folder))
    LabelSet(["ab", "xy"]).save(folder)
    with pytest.raises(TrainingError, match=r"^--classifier_dir: cannot read the tokenizer in "
                                            r".*clf/vocab: tokenizer file not found"):
        classify.load_classifier(str(folder))
    ByteTokenizer().save(folder / "vocab")
    with pytest.raises(TrainingError, match=rf"^cannot load .*clf/{classify.MODEL_FILE}: "):
        classify.load_classifier(str(folder))


def test_a_config_file_that_is_missing_broken_or_of_another_vocabulary_is_named(data, tmp_path):
    config = tmp_path / "config.json"
    with pytest.raises(TrainingError, match=r"^--config: .*config.json not found$"):
        _train(data, tmp_path, backbone=None, config=str(config))
    config.write_text("{")
    with pytest.raises(TrainingError, match=r"^--config .*config.json: "):
        _train(data, tmp_path, backbone=None, config=str(config))
    TransformerXLConfig.preset("tiny", n_token=100).to_json(str(config))
    with pytest.raises(TrainingError, match=r"^vocabulary/model size mismatch: the tokenizer has "
                                            r"256 tokens, the model \(--config .*config.json\) "
                                            r"has n_token=100$"):
        _train(data, tmp_path, backbone=None, config=str(config))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_a_fit_that_raises_leaves_no_heartbeat_running(data, tmp_path, monkeypatch):
    """Keras calls no `on_train_end` after a `fit` that raised: `run` (a call
    from Python) left the plain lines' heartbeat thread beating (review35)."""
    import threading

    from training.callbacks import StepLog

    def disk_full(self, batch, logs=None):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(StepLog, "on_train_batch_end", disk_full)
    with pytest.raises(OSError, match="No space left"):
        _train(data, tmp_path, verbose=1)  # not a terminal: `ProgressLine`
    assert not any(t.name == "heartbeat" for t in threading.enumerate())
