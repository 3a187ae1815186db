"""The LSTM baseline: a numpy LSTM gives its log-probs, its state carried over
segments equals one pass, a memory of no slots starts each segment afresh,
its files round-trip, its job learns, and evaluation and RECL read it."""
import contextlib
import json

import keras
import numpy as np
import pytest

from training import evaluate, recl, train_lstm
from training.errors import TrainingError
from txl_tf.baselines import LSTMConfig, LSTMLanguageModel, load_lstm, lstm_scorer, save_lstm
from txl_tf.checks.inputs import InputError
from txl_tf.errors import TxlError
from txl_tf.learning.context_length import sample_positions
from txl_tf.learning.evaluation import evaluate_ids
from txl_tf.text import ByteTokenizer

CONFIG = LSTMConfig(n_token=11, d_model=6, n_layer=2, tgt_len=5, dropout=0.0)


def make_model(seed=0, config=CONFIG):
    keras.utils.set_random_seed(seed)
    model = LSTMLanguageModel(config)
    model.build()
    return model


def numpy_log_probs(model, ids):
    """The model written out in numpy: Keras's gate order i, f, c, o."""
    def sigmoid(x):
        return 1 / (1 + np.exp(-x))
    weights = {v.path.split("/", 1)[1]: v.numpy().astype(np.float64) for v in model.weights}
    d = model.config.d_model
    x = weights["embedding/embeddings"][ids]
    for i in range(model.config.n_layer):
        kernel = weights[f"lstm_{i}/lstm_cell/kernel"]
        recurrent = weights[f"lstm_{i}/lstm_cell/recurrent_kernel"]
        bias = weights[f"lstm_{i}/lstm_cell/bias"]
        h, c, outputs = np.zeros([len(ids), d]), np.zeros([len(ids), d]), []
        for t in range(ids.shape[1]):
            z = x[:, t] @ kernel + h @ recurrent + bias
            gate_i, gate_f = sigmoid(z[:, :d]), sigmoid(z[:, d:2 * d])
            c = gate_f * c + gate_i * np.tanh(z[:, 2 * d:3 * d])
            h = sigmoid(z[:, 3 * d:]) * np.tanh(c)
            outputs.append(h)
        x = np.stack(outputs, axis=1)
    logits = x @ weights["softmax/kernel"] + weights["softmax/bias"]
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def test_the_log_probs_are_a_numpy_lstms():
    model = make_model()
    ids = np.random.default_rng(0).integers(0, CONFIG.n_token, (3, 9)).astype(np.int32)
    log_probs, _ = model(ids, model.initial_memory(3))
    np.testing.assert_allclose(log_probs.numpy(), numpy_log_probs(model, ids), atol=1e-5)


def test_carried_state_over_segments_equals_one_pass_and_no_slots_resets():
    model = make_model()
    ids = np.random.default_rng(1).integers(0, CONFIG.n_token, (2, 12)).astype(np.int32)
    whole, _ = model(ids, model.initial_memory(2))
    memory, fresh, parts, alone = model.initial_memory(2), model.initial_memory(2, 0), [], []
    for start in range(0, 12, 4):
        out, memory = model(ids[:, start:start + 4], memory)
        parts.append(out.numpy())
        out, fresh = model(ids[:, start:start + 4], fresh)
        alone.append(out.numpy())
        assert fresh.mems.shape[2] == 0
    np.testing.assert_allclose(np.concatenate(parts, 1), whole.numpy(), atol=1e-6)
    for start, out in zip(range(0, 12, 4), alone):
        np.testing.assert_allclose(out, numpy_log_probs(model, ids[:, start:start + 4]),
                                   atol=1e-5)
    assert np.abs(alone[1] - parts[1]).max() > 1e-3  # the carried state matters


def test_targets_give_the_nll_of_the_log_probs():
    model = make_model()
    ids = np.random.default_rng(2).integers(0, CONFIG.n_token, (2, 6)).astype(np.int32)
    log_probs, _ = model(ids[:, :-1], None)
    nll, _ = model(ids[:, :-1], None, targets=ids[:, 1:])
    picked = np.take_along_axis(log_probs.numpy(), ids[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(nll.numpy(), -picked, atol=1e-5)


def test_the_scorer_reads_each_window_from_the_zero_state():
    model = make_model()
    windows = np.random.default_rng(3).integers(0, CONFIG.n_token, (4, 7)).astype(np.int32)
    np.testing.assert_allclose(lstm_scorer(model)(windows),
                               numpy_log_probs(model, windows)[:, -1], atol=1e-5)


def test_random_configurations_evaluate_like_a_numpy_lstm_over_each_stream():
    rng = np.random.default_rng(11)
    for case in range(3):
        config = LSTMConfig(n_token=int(rng.integers(3, 20)), d_model=int(rng.integers(1, 7)),
                            n_layer=int(rng.integers(1, 4)), tgt_len=int(rng.integers(1, 6)),
                            dropout=float(rng.choice([0.0, 0.5])))
        model = make_model(case, config)
        for variable in model.weights:  # larger than the init, so that the gates differ
            variable.assign(rng.normal(0, 0.8, variable.shape).astype(np.float32))
        ids = rng.integers(0, config.n_token, int(rng.integers(8, 30)))
        batch = int(rng.integers(1, 4))
        width = -(-len(ids) // batch)  # the streams evaluate_ids cuts
        streams = [ids[b * width:(b + 1) * width] for b in range(batch)]
        for mem_len in (None, 0):  # the state carried over segments, or none
            total, count = 0.0, 0
            for stream in streams:
                step = len(stream) if mem_len is None else config.tgt_len
                for start in range(0, len(stream) - 1, step):
                    piece = stream[start:start + step + 1]
                    log_probs = numpy_log_probs(model, piece[None, :-1])[0]
                    total -= log_probs[np.arange(len(piece) - 1), piece[1:]].sum()
                    count += len(piece) - 1
            result = evaluate_ids(model, ids, batch_size=batch, mem_len=mem_len)
            assert result["tokens"] == count, (case, mem_len)
            assert result["loss"] == pytest.approx(total / count, abs=1e-5), (case, mem_len)


def test_ids_of_any_integer_dtype_are_read_and_bad_ids_are_one_error():
    # Before, int64 ids (numpy's default) failed with a conversion error, and
    # an id or target out of range failed deep in TensorFlow's kernels.
    model = make_model()
    ids = np.random.default_rng(4).integers(0, CONFIG.n_token, (2, 5))
    log_probs, _ = model(ids, None)
    np.testing.assert_allclose(log_probs.numpy(), numpy_log_probs(model, ids), atol=1e-5)
    with pytest.raises(InputError, match="token id 11"):
        model(np.array([[1, 11]], np.int32), None)
    with pytest.raises(InputError, match="target id -1"):
        model(np.array([[1, 2]], np.int32), None, targets=np.array([[2, -1]], np.int32))


def test_files_round_trip_and_a_foreign_folder_is_one_error(tmp_path):
    model = make_model(seed=4)
    save_lstm(model, str(tmp_path / "m"), ByteTokenizer())
    make_model(seed=5)  # another instance: the saved names must not depend on it
    loaded = load_lstm(str(tmp_path / "m"))
    assert loaded.config == CONFIG
    ids = np.arange(10, dtype=np.int32).reshape(2, 5) % CONFIG.n_token
    np.testing.assert_allclose(loaded(ids, None)[0].numpy(), model(ids, None)[0].numpy(),
                               atol=0)
    with pytest.raises(TxlError, match="no LSTM baseline"):
        load_lstm(str(tmp_path))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"model": "lstm", "d_model": 0}))
    with pytest.raises(TxlError, match="d_model must be a positive int"):
        load_lstm(str(tmp_path / "bad"))


def test_a_model_saved_before_its_first_call_loads(tmp_path):
    """`save_lstm` of a model never called (not built: no weights yet)
    saves the weights it computes with; it wrote a file `load_lstm` refused."""
    keras.utils.set_random_seed(6)
    model = LSTMLanguageModel(CONFIG)
    save_lstm(model, str(tmp_path / "m"))
    loaded = load_lstm(str(tmp_path / "m"))
    ids = np.arange(10, dtype=np.int32).reshape(2, 5) % CONFIG.n_token
    np.testing.assert_allclose(loaded(ids, None)[0].numpy(), model(ids, None)[0].numpy(),
                               atol=0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("lstm_job")
    text = root / "text.txt"
    text.write_text("def add(x, y):\n    return x + y\n\n" * 200)
    options = dict(dataset="text", data_dir=str(text), cache_dir=str(root / "cache"))
    result = train_lstm.run(model_dir=str(root / "run"), d_model=32, n_layer=1, tgt_len=16,
                            batch_size=4, train_steps=60, log_every=10, learning_rate=1e-2,
                            eval_max_segments=10, **options)
    return root, options, result


def test_the_job_learns_and_its_export_is_evaluated_like_a_transformer_xls(trained):
    root, options, result = trained
    log = [json.loads(line) for line in (root / "run" / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 60 and log[-1]["loss"] < 0.5 * log[0]["loss"]
    carried = evaluate.run(model_dir=str(root / "run"), batch_size=4, progress=False, **options)
    reset = evaluate.run(model_dir=str(root / "run"), batch_size=4, mem_len=0, progress=False,
                         **options)
    assert carried["loss"] == pytest.approx(
        evaluate_ids(load_lstm(result["export_dir"]), _valid(root, options), 4)["loss"])
    assert carried["loss"] < reset["loss"]  # the state carried across segments helps
    with pytest.raises(TrainingError, match="--checkpoint: the LSTM baseline keeps no"):
        evaluate.run(model_dir=str(root / "run"), checkpoint="ckpt-60", **options)


def test_recl_reads_lstms(trained):
    root, options, _ = trained
    run = str(root / "run")
    result = recl.run(model_dir=[f"a={run}", f"b={run}"], first_context=4, context_step=4,
                      max_context=12, positions=12, batch_size=8, progress=False, **options)
    assert result["mean_loss"]["a"] == result["mean_loss"]["b"]
    assert set(result["recl"]["0.5"]) == {"a", "b"}
    assert "LSTM from the zero state" in result["how"]
    scorer, ids = lstm_scorer(load_lstm(run)), np.asarray(_valid(root, options))
    for c, mean_loss in zip([4, 8, 12], result["mean_loss"]["a"]):
        by_hand = [-scorer(ids[None, t - c:t].astype(np.int32))[0, ids[t]]
                   for t in sample_positions(len(ids), 12, 12, seed=0)]
        assert mean_loss == pytest.approx(np.mean(by_hand), abs=1e-5)


def test_bad_flags_are_one_error(tmp_path):
    with pytest.raises(TrainingError, match="--model_dir is required"):
        train_lstm.run()
    with pytest.raises(TrainingError, match="--d_model must be a positive integer"):
        train_lstm.run(model_dir=str(tmp_path), d_model=0)


def _valid(root, options):
    from training import inputs
    return inputs.load(options["dataset"], options["data_dir"], options["cache_dir"]).valid


def test_a_save_killed_anywhere_leaves_one_whole_save_or_an_error(tmp_path,
                                                                  killed_at_file_operation):
    """save_lstm wrote config.json in place before the weights: a save over
    another killed before its weights were renamed in left the new config
    (another tgt_len) beside the old weights, loaded without a word."""
    old = make_model(0)
    new = make_model(1, LSTMConfig(n_token=11, d_model=6, n_layer=2, tgt_len=7, dropout=0.0))
    outcomes, k = set(), 0
    while "new" not in outcomes:
        k += 1
        folder = str(tmp_path / f"k{k}")
        save_lstm(old, folder, ByteTokenizer())
        killed_at_file_operation(lambda: save_lstm(new, folder, ByteTokenizer()), k)
        try:
            loaded = load_lstm(folder)
        except TxlError as err:
            assert "no LSTM baseline" in str(err)
            outcomes.add("refused")
            continue
        expected = new if loaded.config.tgt_len == 7 else old
        for got, want in zip(loaded.weights, expected.weights):
            np.testing.assert_array_equal(got.numpy(), want.numpy(), f"killed at {k}")
        outcomes.add("new" if expected is new else "old")
    assert outcomes == {"old", "refused", "new"}


def test_a_rerun_that_fails_before_its_save_keeps_the_saved_models_log(trained, tmp_path,
                                                                       monkeypatch):
    """The job truncated train_log.jsonl at its start: a run stopped before its
    save left the previous export beside the stopped run's log."""
    import shutil
    import txl_tf.baselines
    root, options, _ = trained
    run = tmp_path / "run"
    shutil.copytree(root / "run", run)
    log = (run / "train_log.jsonl").read_bytes()
    weights = (run / "export" / "model.weights.h5").read_bytes()
    again = dict(model_dir=str(run), d_model=32, n_layer=1, tgt_len=16, batch_size=4,
                 train_steps=2, log_every=1, final_eval=False, **options)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(txl_tf.baselines, "save_lstm", stopped)
    with pytest.raises(KeyboardInterrupt):
        train_lstm.run(**again)
    assert (run / "train_log.previous.jsonl").read_bytes() == log
    assert len((run / "train_log.jsonl").read_text().splitlines()) == 2  # the stopped run's
    assert (run / "export" / "model.weights.h5").read_bytes() == weights
    monkeypatch.undo()
    train_lstm.run(**again)
    assert not (run / "train_log.previous.jsonl").exists()
    assert len((run / "train_log.jsonl").read_text().splitlines()) == 2


def test_the_job_shows_its_progress_unless_told_not_to(trained, tmp_path, capsys):
    """Training and the final evaluation report progress on stderr (lines in a
    log); `--noprogress` quiets both, as it does the other jobs."""
    _, options, _ = trained
    base = dict(d_model=8, n_layer=1, tgt_len=8, batch_size=2, train_steps=2,
                eval_max_segments=1, **options)
    train_lstm.run(model_dir=str(tmp_path / "shown"), **base)
    err = capsys.readouterr().err
    assert "training the LSTM: 2/2 (100%)" in err and "evaluating valid: 1/1 (100%)" in err, err
    train_lstm.run(model_dir=str(tmp_path / "quiet"), progress=False, **base)
    err = capsys.readouterr().err
    assert "training the LSTM" not in err and "evaluating" not in err, err


def test_an_eval_batch_too_large_for_the_valid_split_is_refused_before_training(tmp_path):
    """`--eval_batch_size` larger than the valid split can hold was refused
    only after the whole training run (the transformer job checks first)."""
    text = tmp_path / "text.txt"
    text.write_text("def add(x, y):\n    return x + y\n\n" * 200)
    with pytest.raises(TrainingError, match="too few for --eval_batch_size 100000"):
        train_lstm.run(model_dir=str(tmp_path / "run"), d_model=8, n_layer=1, tgt_len=8,
                       batch_size=2, train_steps=2, eval_batch_size=100000, dataset="text",
                       data_dir=str(text), cache_dir=str(tmp_path / "cache"))
    assert not (tmp_path / "run").exists()  # nothing trained, nothing written


@contextlib.contextmanager
def _first_weight_removed(folder):
    """A saved LSTM's weights file open for writing, its first dataset deleted:
    `(file, name, values)` for the test to write a damaged one in its place."""
    import h5py
    save_lstm(make_model(), str(folder), ByteTokenizer())
    with h5py.File(next(folder.rglob("*.h5")), "r+") as f:
        names = []
        f.visititems(lambda name, item: names.append(name)
                     if isinstance(item, h5py.Dataset) else None)
        value = f[names[0]][()]
        del f[names[0]]
        yield f, names[0], value


@pytest.mark.parametrize("damage", ["a huge unwritten dataset", "NaN", "integers"])
def test_lstm_weights_are_checked_before_they_are_read(tmp_path, damage):
    """An HDF5 dataset declares its shape and stores only the chunks written:
    a few KB declaring 2**36 floats was read into memory (a MemoryError)
    before its shape was compared; NaN weights and integer ones were assigned
    without a word."""
    with _first_weight_removed(tmp_path / "m") as (f, name, value):
        if damage == "a huge unwritten dataset":
            f.create_dataset(name, shape=(2**36,), dtype="float32", chunks=(1024,))
            problem = r"\(68719476736,\)"
        elif damage == "NaN":
            value.flat[0] = np.nan
            f[name] = value
            problem = "NaN or inf"
        else:
            f[name] = value.astype(np.int32)
            problem = "int32"
    with pytest.raises(TxlError, match=rf"{name}.*{problem}"):
        load_lstm(str(tmp_path / "m"))


@pytest.mark.parametrize("storage", ["external", "virtual"])
def test_lstm_weights_stored_in_another_file_are_refused(tmp_path, storage):
    """An HDF5 dataset may keep its values in another file (external raw
    storage names any path; a virtual dataset maps another HDF5 file's): a
    weights.h5 naming a file outside the model's folder read that file's
    bytes into the weights."""
    import h5py
    with _first_weight_removed(tmp_path / "m") as (f, name, value):
        outside = tmp_path / "outside.bin"
        if storage == "external":
            outside.write_bytes(np.ones(value.shape, value.dtype).tobytes())
            f.create_dataset(name, shape=value.shape, dtype=value.dtype,
                             external=[(str(outside), 0, value.nbytes)])
        else:
            with h5py.File(outside, "w") as other:
                other["x"] = np.ones(value.shape, value.dtype)
            layout = h5py.VirtualLayout(shape=value.shape, dtype=value.dtype)
            layout[...] = h5py.VirtualSource(str(outside), "x", shape=value.shape)
            f.create_virtual_dataset(name, layout)
    with pytest.raises(TxlError, match=rf"{name}.* in another file"):
        load_lstm(str(tmp_path / "m"))


@pytest.mark.parametrize("kind", ["timedelta", "datetime", "objects", "masked"])
@pytest.mark.parametrize("argument", ["token_ids", "targets", "targets_positional"])
def test_ids_and_targets_tensorflow_would_refuse_or_misread_are_one_error(argument, kind):
    """TensorFlow's conversion error from inside Keras, or (masked) the mask
    dropped and the masked entries read as ids."""
    model = make_model()
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    bad = {"timedelta": ids.astype("m8[s]"), "datetime": ids.astype("M8[s]"),
           "objects": ids.astype(object), "masked": np.ma.masked_equal(ids, 5)}[kind]
    message = r"is a masked array with masked entries" if kind == "masked" else \
        r"must be integers, got dtype"
    name = argument.split("_")[0] if argument != "token_ids" else argument
    with pytest.raises(InputError, match=rf"^{name} {message}"):
        if argument == "token_ids":
            model(bad, None)
        elif argument == "targets":
            model(ids, None, targets=bad)
        else:
            model(ids, None, bad)
