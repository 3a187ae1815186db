"""Bad input to the jobs gives one clear message, never a TensorFlow traceback."""
import pytest

from job_helpers import write_text_corpus
from training import evaluate, train
from training.errors import TrainingError
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.errors import TxlError
from txl_tf.weights import save_pretrained


def _train(tmp_path, **options):
    base = dict(model_dir=str(tmp_path / "run"), dataset="text", preset="tiny",
                cache_dir=str(tmp_path / "cache"), strategy="one_device", train_steps=2,
                batch_size=2, verbose=0)
    base.update(options)
    return train.run(**base)


@pytest.fixture
def corpus(tmp_path):
    return str(write_text_corpus(tmp_path / "corpus.txt", 5_000))


def test_missing_data_dir(tmp_path):
    with pytest.raises(TrainingError, match=r"--data_dir: data directory not found: .*nowhere"):
        _train(tmp_path, data_dir=str(tmp_path / "nowhere"))
    assert not (tmp_path / "run").exists()  # a refused job creates no directory


def test_a_failed_first_start_leaves_the_directory_as_it_found_it(tmp_path, corpus,
                                                                   monkeypatch):
    """A first start that fails before its first checkpoint (here: out of
    memory in the first step) removes its config.json, vocab/ and logs, so the
    corrected retry is not refused as "a run of another model"."""
    import keras
    import tensorflow as tf

    def out_of_memory(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
    with monkeypatch.context() as patch:
        patch.setattr(keras.Model, "fit", out_of_memory)
        with pytest.raises(tf.errors.ResourceExhaustedError):
            _train(tmp_path, data_dir=corpus, mem_len=64)
    assert not (tmp_path / "run").exists()
    (tmp_path / "empty").mkdir()
    with monkeypatch.context() as patch:
        patch.setattr(keras.Model, "fit", out_of_memory)
        with pytest.raises(tf.errors.ResourceExhaustedError):
            _train(tmp_path, data_dir=corpus, model_dir=str(tmp_path / "empty"))
    assert (tmp_path / "empty").is_dir() and not list((tmp_path / "empty").iterdir())
    assert _train(tmp_path, data_dir=corpus, mem_len=8)["step"] == 2


def test_a_first_start_killed_before_its_first_checkpoint_does_not_block_the_retry(
        tmp_path, corpus, monkeypatch, capsys):
    """Killed (SIGKILL, the OOM killer: no clean-up runs) before its first
    checkpoint, a first start left its config.json: the retry with a smaller
    --mem_len was refused as "a run of another model", though nothing had
    been trained."""
    import keras

    def killed(*args, **kwargs):
        raise KeyboardInterrupt
    with monkeypatch.context() as patch:
        patch.setattr(keras.Model, "fit", killed)
        patch.setattr(train, "_empty", lambda folder, remove: None)  # a kill cleans nothing
        with pytest.raises(KeyboardInterrupt):
            _train(tmp_path, data_dir=corpus, mem_len=64)
    assert (tmp_path / "run" / "config.json").exists()
    capsys.readouterr()
    assert _train(tmp_path, data_dir=corpus, mem_len=8)["step"] == 2
    assert "from a run stopped before its first checkpoint (nothing was trained)" in \
        capsys.readouterr().err
    with pytest.raises(TrainingError, match="holds a run of another model"):  # now trained
        _train(tmp_path, data_dir=corpus, mem_len=64)



def test_a_model_dir_inside_a_text_corpus_folder_is_refused(tmp_path):
    """`--dataset=text` reads every non-hidden file of a folder: a run's
    directory there (checkpoints, logs, export) would be read as corpus text
    by its resume or an evaluation. Refused before anything is written."""
    folder = tmp_path / "texts"
    folder.mkdir()
    write_text_corpus(folder / "a.txt", 5_000)
    with pytest.raises(TrainingError, match=r"^--model_dir .*texts/run is inside the corpus "
                                            r"folder .*texts, whose files are all read as text"):
        _train(tmp_path, data_dir=str(folder), model_dir=str(folder / "run"))
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt"]
    from txl_tf.text import ByteTokenizer
    save_pretrained(TransformerXL(TransformerXLConfig.preset("tiny", n_token=256)),
                    folder / "model", ByteTokenizer())
    with pytest.raises(TrainingError, match=r"^--model_dir .*texts/model is inside the corpus"):
        evaluate.run(model_dir=str(folder / "model"), dataset="text", data_dir=str(folder),
                     cache_dir=str(tmp_path / "cache"))
    from training import recl
    with pytest.raises(TrainingError, match=r"^--model_dir .*texts/model is inside the corpus"):
        recl.run(model_dir=[str(folder / "model")], dataset="text", data_dir=str(folder),
                 cache_dir=str(tmp_path / "cache"))
    # an evaluation's JSON written into the folder: read as text by the next load
    (folder / "model").rename(tmp_path / "model")
    with pytest.raises(TrainingError, match=r"^--output .*texts/results.json is inside the corpus"):
        evaluate.run(model_dir=str(tmp_path / "model"), dataset="text", data_dir=str(folder),
                     cache_dir=str(tmp_path / "cache"), output=str(folder / "results.json"))
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt"]


def test_a_recl_output_dir_inside_a_text_corpus_folder_is_refused(tmp_path):
    """recl.json and recl.png written into the folder were read as corpus
    text by the next load (review35: `--output` of txl-evaluate was refused,
    txl-recl's `--output_dir` was not)."""
    from training import recl
    from txl_tf.text import ByteTokenizer
    folder = tmp_path / "texts"
    folder.mkdir()
    write_text_corpus(folder / "a.txt", 5_000)
    save_pretrained(TransformerXL(TransformerXLConfig.preset("tiny", n_token=256)),
                    tmp_path / "model", ByteTokenizer())
    with pytest.raises(TrainingError, match=r"^--output_dir .*texts/recl is inside the corpus"):
        recl.run(model_dir=[str(tmp_path / "model")], dataset="text", data_dir=str(folder),
                 cache_dir=str(tmp_path / "cache"), output_dir=str(folder / "recl"),
                 max_context=64, context_step=32, first_context=32)
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt"]


def test_log_batches_with_document_separator_is_refused_before_the_data_is_read(tmp_path):
    with pytest.raises(TrainingError, match=r"^--log_batches reads the continuous stream: it "
                                            r"does not go with --document_separator$"):
        _train(tmp_path, data_dir=str(tmp_path / "nowhere"), log_batches=True,
               document_separator=10)
    assert not (tmp_path / "run").exists()


def test_log_batches_on_several_replicas_is_refused_before_the_data_is_read(tmp_path):
    # Refused once the model was built (training_input), with no flag named.
    with pytest.raises(TrainingError, match=r"^--log_batches needs a single replica; the "
                                            r"MirroredStrategy has 2$"):
        _train(tmp_path, data_dir=str(tmp_path / "nowhere"), log_batches=True,
               strategy="mirrored")
    assert not (tmp_path / "run").exists()


def test_bfloat16_where_onednn_has_no_kernel_is_refused_before_the_data_is_read(tmp_path,
                                                                               monkeypatch):
    from txl_tf.keras_support import precision
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    monkeypatch.setattr(precision, "_gpu_capabilities", lambda: [])
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    with pytest.raises(TxlError, match=r"^--mixed_precision=mixed_bfloat16: .*ONEDNN_MAX_CPU_"
                                       r"ISA=AVX2 leaves oneDNN no bfloat16 dot products"):
        _train(tmp_path, data_dir=str(tmp_path / "nowhere"), mixed_precision="mixed_bfloat16")
    assert not (tmp_path / "run").exists()


def test_a_model_dir_that_cannot_be_made_names_the_flag_and_the_fix(tmp_path, monkeypatch):
    def refused(path, exist_ok=False):
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(train.os, "makedirs", refused)
    with pytest.raises(TrainingError, match=r"^--model_dir: cannot create .*run \(Permission "
                                            r"denied\); choose another --model_dir$"):
        _train(tmp_path, data_dir=str(tmp_path / "nowhere"))


def test_empty_corpus(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(TrainingError, match=r"empty corpus: .*the train split is empty"):
        _train(tmp_path, data_dir=str(tmp_path / "empty.txt"))


def test_corpus_too_small_for_the_batch(tmp_path):
    (tmp_path / "small.txt").write_text("abc " * 20)
    with pytest.raises(TrainingError, match=r"train split .* too few for training: "
                                            r"batch_size 8 x \(tgt_len 16 \+ 1\)"):
        _train(tmp_path, data_dir=str(tmp_path / "small.txt"), batch_size=8)


def test_vocabulary_model_size_mismatch(tmp_path, corpus):
    with pytest.raises(TrainingError, match=r"vocabulary/model size mismatch: the corpus "
                                            r"tokenizer has 256 tokens .* n_token=100"):
        _train(tmp_path, data_dir=corpus, n_token=100)


def test_evaluate_vocabulary_mismatch(tmp_path, corpus):
    from txl_tf.text import ByteTokenizer
    save_pretrained(TransformerXL(TransformerXLConfig.preset("tiny", n_token=300)),
                    tmp_path / "model", ByteTokenizer())
    with pytest.raises(TrainingError, match=r"vocabulary/model size mismatch: .*vocab has "
                                            r"256 tokens, the model has n_token=300"):
        evaluate.run(model_dir=str(tmp_path / "model"), dataset="text", data_dir=corpus,
                     cache_dir=str(tmp_path / "cache"))


def test_resume_with_another_vocabulary(tmp_path, corpus):
    (tmp_path / "run").mkdir()
    config = TransformerXLConfig.preset("tiny", n_token=27)
    config.to_json(str(tmp_path / "run" / "config.json"))
    save_pretrained(TransformerXL(config), tmp_path / "run" / "export")  # a trained run
    with pytest.raises(TrainingError, match=r"vocabulary/model size mismatch: .*config.json "
                                            r"was trained with n_token=27"):
        _train(tmp_path, data_dir=corpus)


def test_unknown_preset(tmp_path, corpus):
    with pytest.raises(TrainingError, match=r"unknown preset 'huge'; known presets: .*tiny"):
        _train(tmp_path, data_dir=corpus, preset="huge")


def test_bad_flag_values(tmp_path, corpus):
    with pytest.raises(TrainingError, match=r"--warmup_steps \(5\) exceeds --train_steps \(2\)"):
        _train(tmp_path, data_dir=corpus, warmup_steps=5)
    with pytest.raises(TrainingError, match=r"--config_override 'untie_r' is not field=value"):
        _train(tmp_path, data_dir=corpus, config_override=["untie_r"])
    with pytest.raises(TrainingError, match=r"invalid model configuration .*dropout must be"):
        _train(tmp_path, data_dir=corpus, dropout=1.5)


@pytest.mark.parametrize("value", ["abc", "[1]", "1e400", "256.5"])
def test_a_config_override_n_token_that_is_not_an_integer_is_named(tmp_path, corpus, value):
    """Was int()'s ValueError/TypeError/OverflowError traceback, or (256.5)
    taken as 256."""
    with pytest.raises(TrainingError, match=r"--config_override n_token must be an integer, "
                                            r"got "):
        _train(tmp_path, data_dir=corpus, config_override=[f"n_token={value}"])


@pytest.mark.parametrize("flag, value, message", [
    ("seed", -1, r"--seed must be in \[0, 4294967295\], got -1"),  # was numpy's traceback
    ("seed", 2 ** 32, r"--seed must be in \[0, 4294967295\], got 4294967296"),
    ("max_time_s", -5.0, r"--max_time_s must be >= 0 \(0: no limit\), got -5.0"),
    ("num_cpu_devices", -1, r"--num_cpu_devices must be in \[0, 1024\], got -1"),
    ("verbose", 7, r"--verbose must be 0, 1 or 2, got 7"),
])
def test_flag_values_refused_at_the_start(tmp_path, corpus, flag, value, message):
    with pytest.raises(TrainingError, match=message):
        _train(tmp_path, data_dir=corpus, **{flag: value})
    assert not (tmp_path / "run").exists()


def test_classify_seed_is_checked_with_the_flags():
    from training import classify
    from txl_tf.app.flagspec import merge
    options = merge(classify.SPEC, dict(train_data="t.tsv", output_dir="o", preset="tiny",
                                        seed=-1))
    with pytest.raises(TrainingError, match=r"--seed must be in \[0, 4294967295\], got -1"):
        classify.check_options(options)


@pytest.mark.parametrize("flag, value, message", [
    # 2**63 was an OverflowError traceback once training began
    ("grad_segments", 2 ** 63,
     r"--grad_segments must be in \[1, 2147483647\], got 9223372036854775808"),
    ("grad_segments", 0, r"--grad_segments must be in \[1, 2147483647\], got 0"),
    # 2**63 hung making a bucket per segment count
    ("max_length", 2 ** 63, r"--max_length must be in \[1, 2147483647\], got 9223372036854775808"),
    ("max_length", 0, r"--max_length must be in \[1, 2147483647\], got 0"),
])
def test_classify_lengths_are_checked_with_the_flags(flag, value, message):
    from training import classify
    from txl_tf.app.flagspec import merge
    options = merge(classify.SPEC, dict(train_data="t.tsv", output_dir="o", preset="tiny",
                                        **{flag: value}))
    with pytest.raises(TrainingError, match=message):
        classify.check_options(options)


def test_eval_max_segments_must_be_positive(tmp_path, corpus):
    """0 evaluated nothing and reported valid bpc 0 / ppl 1 as the result."""
    for bad in (0, -1):
        with pytest.raises(TrainingError, match=rf"--eval_max_segments must be a positive "
                                                rf"integer, got {bad}"):
            _train(tmp_path, data_dir=corpus, eval_max_segments=bad)
    assert not (tmp_path / "run").exists()


def test_a_valid_split_too_short_for_the_eval_batch_is_refused_before_training(tmp_path):
    """8 eval streams over 6 valid ids give no segment: refused at the start,
    not after the whole run (the final evaluation failed then)."""
    (tmp_path / "small.txt").write_text("abcdefghij" * 6)  # 54 train ids, 6 valid
    with pytest.raises(TrainingError, match=r"valid split of corpus .text. has 6 tokens, "
                                            r"too few for --eval_batch_size 8 \(at least 9"):
        _train(tmp_path, data_dir=str(tmp_path / "small.txt"), tgt_len=4, eval_batch_size=8)
    assert not (tmp_path / "run").exists()
    assert _train(tmp_path, data_dir=str(tmp_path / "small.txt"), tgt_len=4, mem_len=4,
                  eval_batch_size=5)["final_eval"]["tokens"] == 3


def test_command_line_error_is_one_line(tmp_path, jobs):
    proc = jobs.run("training.train", ["--preset=huge", f"--model_dir={tmp_path / 'run'}"])
    assert proc.returncode == 2
    assert "error: unknown preset 'huge'; known presets:" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_float16_loss_scaling_is_refused_on_several_replicas(tmp_path, corpus):
    with pytest.raises(TrainingError, match="mixed_float16 with several replicas"):
        _train(tmp_path, data_dir=corpus, strategy="mirrored", mixed_precision="mixed_float16")


@pytest.mark.parametrize("error", [
    lambda: TrainingError("bad flag\nsecond line"),
    lambda: __import__("txl_tf").InputError("bad ids"),
    lambda: __import__("txl_tf").ConfigError("bad config"),
    lambda: __import__("export").ModelDirError("bad model dir"),
    lambda: __import__("export").RuntimeInputError("bad memory"),
    lambda: __import__("absl.flags").flags.IllegalFlagValueError("bad value"),
    lambda: __import__("absl.app").app.UsageError("bad usage"),
    lambda: __import__("txl_tf.data").data.CorpusNotFoundError("bad/dir", "x.txt"),
    lambda: __import__("txl_tf.data").data.EmptyCorpusError("bad (empty) corpus"),
    lambda: __import__("export").ExportError("bad output folder"),
    lambda: __import__("export").ParityError("bad parity"),
    lambda: PermissionError("bad permissions"),
], ids=["training", "input", "config", "model_dir", "runtime", "flag", "usage", "corpus",
        "empty_corpus", "export", "parity", "os"])
def test_bad_input_is_one_error_line_and_exit_2(error, capsys):
    from txl_tf.app.exits import exit_on_error

    def fails():
        raise error()
    with pytest.raises(SystemExit) as exit_info:
        exit_on_error(fails)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "bad" in err


def test_ctrl_c_in_any_job_is_one_line_and_exit_130(capsys):
    """E.g. during an export (whose staging folder is removed on the way out:
    tests/test_export_job.py)."""
    from txl_tf.app.exits import exit_on_error

    def interrupted():
        raise KeyboardInterrupt
    with pytest.raises(SystemExit) as exit_info:
        exit_on_error(interrupted)
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_bugs_keep_their_traceback():
    from txl_tf.app.exits import exit_on_error

    def bug():
        raise KeyError("a bug")
    with pytest.raises(KeyError):
        exit_on_error(bug)
    with pytest.raises(ValueError):  # a plain ValueError is not mistaken for bad input
        exit_on_error(lambda: int("x"))


def test_every_error_of_the_project_is_a_txl_error():
    """One family, no list of names: an error class added anywhere in the
    packages without the base would be a traceback in the jobs."""
    import importlib
    import inspect
    import pkgutil

    import export
    import training
    import txl_tf
    from txl_tf.errors import TxlError

    found = []
    for package in (txl_tf, training, export):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ == info.name and issubclass(cls, Exception):
                    found.append(cls)
    assert len(found) >= 15, found
    assert [c for c in found if not issubclass(c, TxlError)] == []


def test_a_full_disk_during_a_checkpoint_is_one_error_and_leaves_no_partial_files(
        tmp_path, corpus, monkeypatch):
    import tensorflow as tf
    _train(tmp_path, data_dir=corpus, train_steps=4, checkpoint_every=2)
    checkpoints = tmp_path / "run" / "checkpoints"
    real_save = tf.train.CheckpointManager.save

    def disk_full(self, checkpoint_number=None, **kwargs):
        (checkpoints / f"ckpt-{checkpoint_number}_temp").mkdir()
        (checkpoints / f"ckpt-{checkpoint_number}_temp" / "part").write_bytes(b"\0" * 10)
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")
    monkeypatch.setattr(tf.train.CheckpointManager, "save", disk_full)
    summaries = tf.summary.experimental.get_step(), bool(tf.summary.should_record_summaries())
    with pytest.raises(TrainingError, match=r"cannot write checkpoint ckpt-6 in .*checkpoints: "
                                            r"ResourceExhaustedError: No space left on device"):
        _train(tmp_path, data_dir=corpus, train_steps=8, checkpoint_every=2)
    # The process's summary state is as it was (TensorBoard's writer of the
    # run was left the default, at step 6: later summaries went into its file).
    assert (tf.summary.experimental.get_step(),
            bool(tf.summary.should_record_summaries())) == summaries
    assert not list(checkpoints.glob("*_temp*"))
    assert (checkpoints / "ckpt-4.index").exists()
    monkeypatch.setattr(tf.train.CheckpointManager, "save", real_save)
    assert _train(tmp_path, data_dir=corpus, train_steps=8, checkpoint_every=2)["step"] == 8


def test_a_nan_loss_stops_the_job_at_its_step_and_keeps_the_last_good_checkpoint(tmp_path,
                                                                                 corpus):
    """A run resumed at a learning rate that overflows the weights: without
    the check it trained on NaN to the end, saved NaN checkpoints over the
    good ones and exported them."""
    _train(tmp_path, data_dir=corpus, checkpoint_every=2, final_eval=False)
    with pytest.raises(TrainingError, match=r"^the training loss is nan at steps 3 to 4 \(one "
                                            r"call of the train function\): training stopped "
                                            r"there and the newest checkpoint, step 2, is kept; "
                                            r"lower --learning_rate$"):
        _train(tmp_path, data_dir=corpus, train_steps=6, checkpoint_every=2, log_every=2,
               steps_per_execution=2, learning_rate=1e30, final_eval=False,
               mixed_precision="none")
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert [n for n in names if n.startswith("ckpt-")] == ["ckpt-2.data-00000-of-00001",
                                                           "ckpt-2.index"]


def test_weights_made_nan_by_a_finite_loss_stop_training():
    """A gradient of NaN norm under a finite loss (d sqrt(|w|) at w = 0):
    the clip spreads the NaN to every weight, and the loss shows it only a
    step later (after a checkpoint of those weights could be written)."""
    import keras
    import numpy as np

    from training.callbacks import StopOnNonFinite

    class Root(keras.layers.Layer):
        def build(self, input_shape):
            self.w = self.add_weight(shape=(), initializer="zeros")

        def call(self, x):
            return x * 0.0 + keras.ops.sqrt(keras.ops.abs(self.w))

    model = keras.Sequential([keras.Input((1,)), Root()])
    model.compile(keras.optimizers.Adam(global_clipnorm=0.25), loss=lambda y, p: p)
    seen = []
    logger = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(logs))
    with pytest.raises(TrainingError, match=r"^the weights hold NaN or inf \(the loss was "
                                            r"finite.*\) at step 1: training stopped there and "
                                            r"the newest checkpoint, step 0, is kept"):
        model.fit(np.zeros((4, 1)), np.zeros((4, 1)), batch_size=4, epochs=3, verbose=0,
                  callbacks=[logger, StopOnNonFinite(lambda: 0)])
    assert len(seen) == 1 and seen[0]["loss"] == 0.0


def test_a_folder_of_another_kind_is_not_taken_for_a_killed_first_start(tmp_path, corpus):
    """The retry of a first start killed before its first checkpoint took any
    folder without checkpoints or weights.npz for one: a keras-hub preset
    (its config.json not a TransformerXLConfig, its weights in
    model.weights.h5) was trained into, its config.json replaced."""
    import json
    run = tmp_path / "run"
    run.mkdir()
    preset = json.dumps({"module": "txl_tf.models", "class_name": "TransformerXLBackbone",
                         "config": {"n_layer": 2}, "registered_name": "TransformerXLBackbone"})
    (run / "config.json").write_text(preset)
    (run / "model.weights.h5").write_bytes(b"weights")
    with pytest.raises(TrainingError, match=r"cannot read .*config\.json"):
        _train(tmp_path, data_dir=corpus)
    assert (run / "config.json").read_text() == preset
    assert not {"vocab", "flags.json", "checkpoints", "export"} & {p.name for p in run.iterdir()}


def test_the_non_finite_check_is_one_read_compiled_as_the_train_step():
    """The check read the loss and then ran a graph of one reduction per
    weight (two waits for the device per call, a kernel per weight on a
    GPU): it is one function of the loss, XLA-compiled where the train step
    is, whose one result is read."""
    import keras
    import numpy as np
    import tensorflow as tf

    from training.callbacks import StopOnNonFinite

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2)])
    model.compile("adam", "mse", jit_compile=True)
    check = StopOnNonFinite(None)
    check.set_model(model)
    check.on_train_begin()
    assert check._finite._jit_compile
    for step, (kernel, loss) in enumerate((([[1.0, 0.0]], 1.0), ([[1.0, 0.0]], np.inf),
                                           ([[np.nan, 0.0]], 1.0))):
        model.layers[0].kernel.assign(kernel)
        check.on_train_batch_begin(step)
        if step == 0:
            check.on_train_batch_end(step, {"loss": tf.constant(loss)})
            continue
        with pytest.raises(TrainingError, match="loss is inf" if step == 1 else "weights hold"):
            check.on_train_batch_end(step, {"loss": tf.constant(loss)})


def test_the_non_finite_check_runs_beside_the_weights_of_a_one_device_strategy():
    """Under `OneDeviceStrategy` of a device other than the default one (the
    CPU of a machine with a GPU; here the second logical CPU) the check's
    XLA function ran on the default device, away from the weights it reads
    ("Trying to access resource ... located in device"), as the train step
    did before `StepsOnStrategyDevice`."""
    import keras
    import tensorflow as tf

    from training.callbacks import StopOnNonFinite

    with tf.distribute.OneDeviceStrategy("/cpu:1").scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2)])
        model.compile("adam", "mse", jit_compile=True)
    check = StopOnNonFinite(None)
    check.set_model(model)
    check.on_train_begin()
    check.on_train_batch_begin(0)
    check.on_train_batch_end(0, {"loss": tf.constant(1.0)})  # finite: no error
    model.layers[0].kernel.assign([[float("nan"), 0.0]])
    check.on_train_batch_begin(1)
    with pytest.raises(TrainingError, match="weights hold NaN"):
        check.on_train_batch_end(1, {"loss": tf.constant(1.0)})


def test_under_float16_only_a_non_finite_loss_says_the_weights_were_left_unchanged():
    """Loss scaling skips the update of a step whose loss is not finite (the
    message says the weights stayed); weights made NaN under a finite loss
    were not left as they were, and the message must not claim it."""
    import keras
    import tensorflow as tf

    from training.callbacks import StopOnNonFinite

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    check = StopOnNonFinite(lambda: 4, policy="mixed_float16")
    check.set_model(model)
    check.on_train_begin()
    unchanged = " (float16 loss scaling left the weights of that step as they were)"
    advice = ("; lower --learning_rate, or train in float32 (--mixed_precision=none; this run: "
              "mixed_float16)")
    check.on_train_batch_begin(0)
    with pytest.raises(TrainingError) as raised:
        check.on_train_batch_end(0, {"loss": tf.constant(float("inf"))})
    assert str(raised.value) == (f"the training loss is inf at step 1{unchanged}: training "
                                 "stopped there and the newest checkpoint, step 4, is kept"
                                 f"{advice}")
    model.layers[0].kernel.assign([[float("nan"), 0.0]])
    check.on_train_batch_begin(1)
    with pytest.raises(TrainingError, match=r"^the weights hold NaN or inf") as raised:
        check.on_train_batch_end(1, {"loss": tf.constant(1.0)})
    assert "loss scaling left" not in str(raised.value)
    assert str(raised.value).endswith(f"at step 2: training stopped there and the newest "
                                      f"checkpoint, step 4, is kept{advice}")
    check.on_train_batch_begin(2)  # NaN weights and a NaN loss (several steps in one call)
    with pytest.raises(TrainingError, match=r"^the training loss is nan") as raised:
        check.on_train_batch_end(2, {"loss": tf.constant(float("nan"))})
    assert "loss scaling left" not in str(raised.value)


def test_a_saved_model_folder_is_not_trained_into(tmp_path, corpus):
    """A folder of `save_pretrained` (or `txl-convert`, `txl-train`'s export/) as
    --model_dir, with the run's own config and vocabulary: the job trained from
    scratch beside its weights.npz, which it never reads (txl-train does not
    fine-tune), and wrote its vocab/, flags.json and checkpoints into the model."""
    first = _train(tmp_path, data_dir=corpus, final_eval=False)  # this run's config
    model = tmp_path / "run" / "export"
    before = {p.name: p.stat().st_mtime_ns for p in model.iterdir()}
    with pytest.raises(TrainingError, match=r"--model_dir .*export holds a saved model "
                       r"\(weights\.npz\), not a training run: .* choose another --model_dir"):
        _train(tmp_path, data_dir=corpus, model_dir=str(model), final_eval=False)
    assert {p.name: p.stat().st_mtime_ns for p in model.iterdir()} == before
    assert first["step"] == 2


def test_corpus_options_and_loading_errors_are_named(tmp_path):
    from training import inputs
    assert inputs.parse_options(["a=true", "b = None", "c=3", "d=1.5", "e=wiki", "f=x=y"]) == {
        "a": True, "b": None, "c": 3, "d": 1.5, "e": "wiki", "f": "x=y"}
    with pytest.raises(TrainingError, match=r"^--corpus_option 'max_bytes' is not key=value$"):
        inputs.parse_options(["max_bytes"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainingError, match=r"^empty corpus: no files in .*empty"):
        inputs.load("text", str(tmp_path / "empty"))
    with pytest.raises(TrainingError, match=r"^cannot load corpus 'pystdlib': max_bytes must be "
                                            r"a positive int"):
        inputs.load("pystdlib", options=inputs.parse_options(["max_bytes=0"]))
    with pytest.raises(TrainingError, match=r"^--cache_dir: .*corpus.txt exists and is not a "
                                            r"folder"):
        inputs.load("text", str(tmp_path), cache_dir=write_text_corpus(tmp_path / "corpus.txt",
                                                                       100))


@pytest.mark.parametrize("options, message", [
    (dict(model_dir=""), r"--model_dir is required"),
    (dict(keep_checkpoints=0), r"--keep_checkpoints must be a positive integer, got 0"),
    (dict(eval_mem_len=-1), r"--eval_mem_len must be >= 0, got -1"),
    (dict(learning_rate=float("inf")), r"--learning_rate must be a finite number > 0, got inf"),
    (dict(min_lr_ratio=1.5), r"--min_lr_ratio must be in \[0, 1\], got 1.5"),
    (dict(clip=-1.0), r"--clip must be a finite number >= 0 \(0: none\), got -1.0"),
    (dict(adam_beta2=1.0), r"--adam_beta2 must be in \[0, 1\), got 1.0"),
    (dict(steps_per_execution=-1), r"--steps_per_execution must be >= 0, got -1"),
    (dict(adam_epsilon=0.0), r"--adam_epsilon must be a finite number > 0, got 0.0"),
])
def test_training_flags_wrong_on_their_own_are_named_before_anything_is_read(tmp_path, options,
                                                                            message):
    with pytest.raises(TrainingError, match=f"^{message}$"):
        _train(tmp_path, data_dir=str(tmp_path / "nowhere"), **options)
    assert list(tmp_path.iterdir()) == []


def test_a_batch_the_replicas_cannot_split_is_named_before_anything_is_read(tmp_path):
    with pytest.raises(TrainingError, match=r"^--batch_size 3 is not divisible by the 2 replicas "
                                            r"of the MirroredStrategy$"):
        _train(tmp_path, data_dir=str(tmp_path / "nowhere"), strategy="mirrored", batch_size=3)
    assert list(tmp_path.iterdir()) == []
