"""Evaluation equals the token-weighted mean NLL computed by hand from the core:
streams scored one by one, memory carried, the shorter last segment included."""
import json
import math
import shutil

import keras
import numpy as np
import pytest

from job_helpers import write_text_corpus
from training import evaluate
from training.errors import TrainingError
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.learning.evaluation import evaluate_ids, make_scorer, position_bands
from txl_tf.text import ByteTokenizer, WordTokenizer
from txl_tf.weights import load_pretrained, save_pretrained


def hand_nll(core, ids, streams, tgt_len, mem_len, by_position=None):
    """Sum of NLL and count over every id but the first of each of `streams`
    contiguous streams of ceil(N / streams) ids, one stream at a time, in
    segments of `tgt_len` (the last one shorter, unpadded), memory carried.
    `by_position`, a list, receives every id's NLL by its position in its
    segment."""
    ids = np.asarray(ids, np.int32)
    length = -(-len(ids) // streams)
    total, count = 0.0, 0
    for k in range(streams):
        stream = ids[k * length:(k + 1) * length]
        memory = core.initial_memory(1, mem_len)
        for start in range(0, len(stream) - 1, tgt_len):
            labels = stream[start + 1:start + 1 + tgt_len]
            inputs = stream[start:start + len(labels)]
            nll, memory = core(inputs[None], memory, targets=labels[None], training=False)
            total += float(np.sum(nll.numpy(), dtype=np.float64))
            count += len(labels)
            if by_position is not None:
                by_position.extend(enumerate(nll.numpy()[0].tolist()))
    return total, count


@pytest.fixture(scope="module")
def core():
    # Large initial weights: attention is peaked, so the memory matters.
    keras.utils.set_random_seed(5)
    return TransformerXL(TransformerXLConfig.preset("tiny", n_token=50, tgt_len=8, mem_len=8,
                                                    init_std=0.3))


@pytest.mark.parametrize("batch_size,mem_len", [(1, 8), (3, 8), (3, 0), (4, 20)])
def test_evaluate_ids_matches_hand_computation(core, batch_size, mem_len):
    ids = np.random.default_rng(0).integers(0, 50, size=101).astype(np.int32)
    result = evaluate_ids(core, ids, batch_size=batch_size, tgt_len=8, mem_len=mem_len)
    total, count = hand_nll(core, ids, batch_size, 8, mem_len)
    assert result["tokens"] == count == len(ids) - batch_size
    assert result["loss"] == pytest.approx(total / count, rel=1e-5)
    assert result["bpc"] == pytest.approx(result["loss"] / math.log(2), rel=1e-9)
    assert result["segments"] == math.ceil((math.ceil(101 / batch_size) - 1) / 8)


@pytest.mark.parametrize("batch_size,mem_len", [(3, 8), (2, 0)])
def test_the_loss_by_position_is_each_positions_mean_by_hand(core, batch_size, mem_len):
    ids = np.random.default_rng(2).integers(0, 50, size=101).astype(np.int32)
    result = evaluate_ids(core, ids, batch_size=batch_size, tgt_len=8, mem_len=mem_len,
                          by_position=True)
    scores = []
    hand_nll(core, ids, batch_size, 8, mem_len, by_position=scores)
    expected = [np.mean([nll for p, nll in scores if p == position]) for position in range(8)]
    np.testing.assert_allclose(result["loss_by_position"], expected, rtol=1e-5)
    assert "loss_by_position" not in evaluate_ids(core, ids, batch_size=batch_size, tgt_len=8,
                                                  mem_len=mem_len)


def test_random_lengths_and_batches_match_a_numpy_loop_over_the_log_probs(core):
    """Seeded random corpus lengths (most not dividing into the streams),
    stream counts, segment and memory lengths: the loss is the mean of
    -log p(label) read from the core's own log-probs, every label of the
    paper's order (each stream's ids but its first) once, none dropped."""
    rng = np.random.default_rng(11)
    for _ in range(4):
        batch_size, tgt_len = int(rng.integers(1, 6)), int(rng.integers(3, 10))
        mem_len = int(rng.choice([0, 3, 8]))
        ids = rng.integers(0, 50, size=int(rng.integers(batch_size + 1, 45))).astype(np.int32)
        length = -(-len(ids) // batch_size)
        nll, predicted = [], []
        for k in range(batch_size):
            stream, memory = ids[k * length:(k + 1) * length], core.initial_memory(1, mem_len)
            for start in range(0, len(stream) - 1, tgt_len):
                labels = stream[start + 1:start + 1 + tgt_len]
                log_probs, memory = core(stream[start:start + len(labels)][None], memory,
                                         training=False)
                for p, label in enumerate(labels):
                    nll.append(-float(log_probs[0, p, label]))
                    predicted.append(k * length + start + 1 + p)
        firsts = set(range(0, len(ids), length))
        assert sorted(predicted) == sorted(set(range(len(ids))) - firsts)
        result = evaluate_ids(core, ids, batch_size=batch_size, tgt_len=tgt_len,
                              mem_len=mem_len)
        case = f"{len(ids)} ids, batch {batch_size}, tgt_len {tgt_len}, mem_len {mem_len}"
        assert result["tokens"] == len(nll), case
        assert result["loss"] == pytest.approx(np.mean(nll), rel=2e-5), case


def test_evaluating_again_reuses_the_cores_scorer(core):
    # A server or notebook evaluating every so often: one graph, not one per call.
    ids = np.random.default_rng(2).integers(0, 50, size=61).astype(np.int32)
    shapes = [(2, 8), (3, 4), (1, 0)]
    scorer = make_scorer(core)
    for batch_size, mem_len in shapes:
        evaluate_ids(core, ids, batch_size=batch_size, tgt_len=8, mem_len=mem_len)
    traces = scorer.experimental_get_tracing_count()
    assert traces >= 1
    for batch_size, mem_len in shapes * 3:
        evaluate_ids(core, ids, batch_size=batch_size, tgt_len=8, mem_len=mem_len)
    assert make_scorer(core) is scorer and scorer.experimental_get_tracing_count() == traces


def test_position_bands_double_in_width():
    assert [(a, b) for a, b, _ in position_bands([0.0] * 64)] == [
        (0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63)]
    assert position_bands([1.0, 2.0, 3.0, 5.0, 7.0]) == [(0, 0, 1.0), (1, 1, 2.0), (2, 3, 4.0),
                                                         (4, 4, 7.0)]


def test_memory_changes_the_loss(core):
    ids = np.random.default_rng(1).integers(0, 50, size=80).astype(np.int32)
    with_memory = evaluate_ids(core, ids, batch_size=1, tgt_len=8, mem_len=16)
    without = evaluate_ids(core, ids, batch_size=1, tgt_len=8, mem_len=0)
    assert with_memory["tokens"] == without["tokens"] == 79
    assert abs(with_memory["loss"] - without["loss"]) > 1e-3


def test_evaluate_job_on_a_corpus(tmp_path):
    text = tmp_path / "corpus.txt"
    write_text_corpus(text, 3_000, seed=4)
    model = TransformerXL(TransformerXLConfig.preset("tiny", tgt_len=8, mem_len=8))
    save_pretrained(model, tmp_path / "model", ByteTokenizer())
    output = tmp_path / "out" / "eval.json"
    result = evaluate.run(model_dir=str(tmp_path / "model"), dataset="text",
                          data_dir=str(text), cache_dir=str(tmp_path / "cache"), split="valid",
                          batch_size=2, tgt_len=8, mem_len=12, clamp_len=5, same_length=True,
                          output=str(output))
    valid = np.frombuffer(text.read_bytes()[2700:], np.uint8).astype(np.int32)
    reloaded = load_pretrained(tmp_path / "model", clamp_len=5, same_length=True)
    total, count = hand_nll(reloaded, valid, 2, 8, 12)
    assert result["tokens"] == count == len(valid) - 2 == 298
    assert result["loss"] == pytest.approx(total / count, rel=1e-5)
    written = json.loads(output.read_text())
    assert written["bpc"] == pytest.approx(result["bpc"])
    assert (written["clamp_len"], written["same_length"], written["mem_len"]) == (5, True, 12)
    assert "bpc" in evaluate.describe(result)
    assert "loss_by_position" not in written and "by position" not in evaluate.describe(result)
    by_position = evaluate.run(model_dir=str(tmp_path / "model"), dataset="text",
                               data_dir=str(text), cache_dir=str(tmp_path / "cache"),
                               split="valid", batch_size=2, tgt_len=8, mem_len=12,
                               by_position=True)
    assert len(by_position["loss_by_position"]) == 8
    assert "loss by position in the segment: 0: " in evaluate.describe(by_position)


def test_noprogress_also_quiets_the_corpus_read(tmp_path, monkeypatch, capsys):
    """`--noprogress` left the corpus reader's progress on (its bar on a
    terminal, its lines in a log)."""
    from txl_tf.data import corpora
    monkeypatch.setattr(corpora, "PROGRESS_MIN_BYTES", 10)  # 32 MiB, made small
    text = tmp_path / "corpus.txt"
    write_text_corpus(text, 3_000, seed=4)
    save_pretrained(TransformerXL(TransformerXLConfig.preset("tiny")), tmp_path / "model",
                    ByteTokenizer())
    options = dict(model_dir=str(tmp_path / "model"), dataset="text", data_dir=str(text),
                   max_segments=1)
    evaluate.run(cache_dir=str(tmp_path / "a"), **options)
    assert "corpus.txt: " in capsys.readouterr().err  # a log: lines
    evaluate.run(cache_dir=str(tmp_path / "b"), progress=False, **options)
    assert capsys.readouterr().err == ""


def test_a_model_with_nan_weights_is_one_error_line(tmp_path, capsys):
    """`txl-evaluate` of a model whose weights hold NaN printed `bpc nan` and
    exited 0; it is one `error:` line naming the weights file and the weight
    (the load refuses it), exit status 2, and no `--output`."""
    from txl_tf.app.exits import exit_on_error
    text = write_text_corpus(tmp_path / "corpus.txt", 3_000, seed=4)
    model = TransformerXL(TransformerXLConfig.preset("tiny", tgt_len=8, mem_len=8))
    kernel = next(w for w in model.weights if w.path.endswith("layer_0/ff/layer_1/kernel"))
    kernel.assign(np.where(np.arange(kernel.shape[1]) == 3, np.nan, kernel.numpy()))
    save_pretrained(model, tmp_path / "model", ByteTokenizer())
    output = tmp_path / "eval.json"
    with pytest.raises(SystemExit) as exited:
        exit_on_error(lambda: evaluate.run(
            model_dir=str(tmp_path / "model"), dataset="text", data_dir=str(text),
            cache_dir=str(tmp_path / "cache"), batch_size=2, max_segments=2,
            output=str(output), progress=False))
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: cannot load weights '{tmp_path / 'model' / 'weights.npz'}'")
    assert "layer_0/ff/layer_1/kernel holds NaN or inf values" in err[0]
    assert not output.exists()


def test_loss_by_position_moves_with_the_memory_and_equals_evaluate_ids_without_it(tmp_path):
    """What `benchmarks.quality --part=memory_use` tables: the job's loss by position at
    two memory lengths, memory 0 being `evaluate_ids`'s on the split."""
    text = tmp_path / "corpus.txt"
    write_text_corpus(text, 3_000, seed=4)
    keras.utils.set_random_seed(3)
    model = TransformerXL(TransformerXLConfig.preset("tiny", tgt_len=8, mem_len=8, init_std=0.3))
    save_pretrained(model, tmp_path / "model", ByteTokenizer())
    by_memory = {mem_len: evaluate.run(model_dir=str(tmp_path / "model"), dataset="text",
                                       data_dir=str(text), cache_dir=str(tmp_path / "cache"),
                                       split="valid", batch_size=10, mem_len=mem_len,
                                       by_position=True, progress=False)
                 for mem_len in (0, 12)}
    assert by_memory[0]["loss_by_position"] != by_memory[12]["loss_by_position"]
    valid = np.frombuffer(text.read_bytes()[2700:], np.uint8).astype(np.int32)
    direct = evaluate_ids(model, valid, batch_size=10, tgt_len=8, mem_len=0, by_position=True)
    np.testing.assert_allclose(by_memory[0]["loss_by_position"], direct["loss_by_position"],
                               rtol=1e-5)


def test_evaluate_accepts_every_model_directory_form(tmp_path, capsys):
    """A model dir, a training run dir (its export/, else its newest
    checkpoint, or --checkpoint) give the same model; progress goes to stderr."""
    import tensorflow as tf
    from txl_tf.weights.checkpoints import weight_dict
    text = write_text_corpus(tmp_path / "corpus.txt", 3_000, seed=2)
    keras.utils.set_random_seed(3)
    trained = TransformerXL(TransformerXLConfig.preset("tiny", tgt_len=8, mem_len=8,
                                                       init_std=0.3))
    run = tmp_path / "run"
    run.mkdir()
    trained.config.to_json(str(run / "config.json"))
    ByteTokenizer().save(run / "vocab")  # as training writes it at start
    tf.train.CheckpointManager(tf.train.Checkpoint(weights=weight_dict(trained)),
                               str(run / "checkpoints"), 2).save(checkpoint_number=7)
    common = dict(dataset="text", data_dir=str(text), cache_dir=str(tmp_path / "cache"),
                  batch_size=2, max_segments=3)
    from_checkpoint = evaluate.run(model_dir=str(run), **common)
    named = evaluate.run(model_dir=str(run), checkpoint="ckpt-7", **common)
    save_pretrained(trained, run / "export", ByteTokenizer())
    from_export = evaluate.run(model_dir=str(run), **common)
    from_model_dir = evaluate.run(model_dir=str(run / "export"), **common)
    losses = {r["loss"] for r in (from_checkpoint, named, from_export, from_model_dir)}
    assert len(losses) == 1 and from_export["segments"] == 3
    progress = capsys.readouterr().err.splitlines()
    assert "evaluating valid: 3/3 (100%)" in progress


def test_progress_lines_stay_few():
    import io
    from txl_tf.app.cli import Progress
    stream = io.StringIO()
    report = Progress("scoring", stream=stream)
    for done in range(1, 1001):
        report(done, 1000)
    lines = stream.getvalue().splitlines()
    assert len(lines) <= 11 and lines[-1] == "scoring: 1000/1000 (100%)"
    silent = io.StringIO()
    Progress("scoring", enabled=False, stream=silent)(1, 1)
    assert silent.getvalue() == ""


def _word_corpus(folder, train_lines, valid_lines):
    folder.mkdir()
    for split, lines in (("train", train_lines), ("valid", valid_lines), ("test", valid_lines)):
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def word_model(tmp_path_factory):
    """A word model saved with the vocabulary of corpus `a` (same valid file
    as corpus `b`, whose training split has other word frequencies but the
    same words: a vocabulary rebuilt from it has the same size, other order)."""
    root = tmp_path_factory.mktemp("words")
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(30)]
    valid = [" ".join(rng.choice(words, 12)) for _ in range(40)]
    corpus_a = _word_corpus(root / "a", [" ".join(words[:i + 1]) for i in range(30)], valid)
    corpus_b = _word_corpus(root / "b", [" ".join(words[i:]) for i in range(30)], valid)
    tokenizer = WordTokenizer.build((corpus_a / "train.txt").read_text())
    rebuilt = WordTokenizer.build((corpus_b / "train.txt").read_text())
    assert rebuilt.vocab_size == tokenizer.vocab_size and rebuilt.vocab != tokenizer.vocab
    keras.utils.set_random_seed(7)
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=tokenizer.vocab_size,
                                                    tgt_len=8, mem_len=8, init_std=0.3))
    save_pretrained(core, root / "model", tokenizer)
    return root, core, tokenizer


def test_evaluate_reads_the_corpus_with_the_models_vocabulary(word_model, tmp_path):
    """The same valid text through two corpus folders whose training splits
    differ gives the same perplexity: the model's vocab/ is used, not one
    rebuilt from the folder's training split (ppl 669 vs 611 before)."""
    root, core, tokenizer = word_model
    results = [evaluate.run(model_dir=str(root / "model"), dataset="wt2",
                            data_dir=str(root / name), cache_dir=str(tmp_path / "cache"),
                            split="valid", batch_size=2, progress=False)
               for name in ("a", "b")]
    assert results[0]["ppl"] == results[1]["ppl"]
    ids = tokenizer.encode((root / "a" / "valid.txt").read_text())
    total, count = hand_nll(core, ids, 2, 8, 8)
    assert results[1]["loss"] == pytest.approx(total / count, rel=1e-5)


def test_evaluate_counts_words_outside_the_vocabulary(word_model, tmp_path):
    root, _, _ = word_model
    other = _word_corpus(tmp_path / "c", ["w1 w2"], ["w1 zz w2 zz", "yy"])
    result = evaluate.run(model_dir=str(root / "model"), dataset="wt2", data_dir=str(other),
                          cache_dir=str(tmp_path / "cache"), split="valid", batch_size=1,
                          progress=False)
    assert result["unknown_tokens"] == 3
    assert "3 tokens" in evaluate.describe(result)


def test_unknown_words_are_counted_among_the_tokens_scored(word_model, tmp_path):
    """With --max_segments the count was the whole split's: `10 tokens
    (125.00%) are the model's unknown token` of 8 scored, none of them unknown."""
    root, _, _ = word_model
    other = _word_corpus(tmp_path / "c", ["w1 w2"], ["w1 w2 " * 6 + "zz " * 10, "w3 zz"])
    options = dict(model_dir=str(root / "model"), dataset="wt2", data_dir=str(other),
                   cache_dir=str(tmp_path / "cache"), split="valid", progress=False)
    first = evaluate.run(batch_size=1, max_segments=1, **options)  # ids 1-8: w2 w1 ... w1
    assert (first["tokens"], first["unknown_tokens"]) == (8, 0)
    assert "unknown" not in evaluate.describe(first)
    two = evaluate.run(batch_size=1, max_segments=2, **options)  # ids 9-16: w2 w1 w2 zz x5
    assert (two["tokens"], two["unknown_tokens"]) == (16, 5)
    assert "5 tokens (31.25%)" in evaluate.describe(two)
    rows = evaluate.run(batch_size=2, **options)  # all but ids 0 and 13 (a zz), of 26
    assert (rows["tokens"], rows["unknown_tokens"]) == (24, 10)


def _copy_without_vocab(word_model, tmp_path):
    """A copy of the word model's directory, its vocab/ removed; and a
    function that evaluates a model directory on corpus `a`."""
    root = word_model[0]
    model = tmp_path / "model"
    shutil.copytree(root / "model", model)
    shutil.rmtree(model / "vocab")

    def evaluate_on_a(model_dir, **options):
        return evaluate.run(model_dir=str(model_dir), dataset="wt2", data_dir=str(root / "a"),
                            cache_dir=str(tmp_path / "cache"), progress=False, **options)
    return model, evaluate_on_a


def test_an_edited_vocabulary_is_an_error(word_model, tmp_path):
    model, evaluate_on_a = _copy_without_vocab(word_model, tmp_path)
    shutil.copytree(word_model[0] / "model" / "vocab", model / "vocab")
    vocab = model / "vocab" / "vocab.txt"
    lines = vocab.read_text().split("\n")
    lines[4], lines[5] = lines[5], lines[4]
    vocab.write_text("\n".join(lines))
    with pytest.raises(TrainingError, match="vocabulary files changed since they were saved"):
        evaluate_on_a(model)


def test_another_vocabulary_of_the_same_size_is_an_error(word_model, tmp_path):
    model, evaluate_on_a = _copy_without_vocab(word_model, tmp_path)
    WordTokenizer.build((word_model[0] / "b" / "train.txt").read_text()).save(model / "vocab")
    with pytest.raises(TrainingError, match="is not the vocabulary the model was trained with"):
        evaluate_on_a(model)


def test_a_model_without_a_vocabulary_needs_one_given(word_model, tmp_path):
    model, evaluate_on_a = _copy_without_vocab(word_model, tmp_path)
    with pytest.raises(TrainingError, match="the model has no vocabulary"):
        evaluate_on_a(model)
    word_model[2].save(tmp_path / "given")
    assert evaluate_on_a(model, vocab_dir=str(tmp_path / "given"))["tokens"] > 0
