"""Logs of a job whose output is not a terminal: plain lines, no progress-bar
frames, and a train_log.jsonl line even for a run shorter than --log_every."""
import json
import logging

from job_helpers import write_text_corpus
from process_state import unconfigured_logging
from txl_tf.keras_support.precision import choose


def test_piped_output_is_plain_lines(tmp_path, jobs):
    write_text_corpus(tmp_path / "corpus.txt", 10_000, seed=7)
    run = tmp_path / "run"
    proc = jobs.run("training.train", [
        f"--model_dir={run}", "--dataset=text", f"--data_dir={tmp_path / 'corpus.txt'}",
        f"--cache_dir={tmp_path / 'cache'}", "--preset=tiny", "--batch_size=4",
        "--train_steps=12", "--checkpoint_every=5", "--log_every=10", "--nofinal_eval",
        "--strategy=one_device", "--verbose=1"], check=True)
    output = proc.stdout + proc.stderr
    assert "\r" not in output and "\x1b[" not in output, repr(output[-2000:])
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["10/12", "12/12"], proc.stdout
    assert " loss " in lines[0] and " bpc " in lines[0] and " tok/s" in lines[0]
    # The first call's end (XLA's compile: minutes at the paper's sizes) has a line of its
    # own: a log otherwise showed nothing from `train step: ...` to --log_every's first line.
    out = proc.stdout.splitlines()
    first = [i for i, line in enumerate(out) if line.startswith("first call done at step ")]
    assert len(first) == 1 and first[0] < out.index(lines[0]), proc.stdout
    assert out[first[0]].endswith("then a line every 10 steps"), out[first[0]]
    records = [json.loads(line) for line in open(run / "train_log.jsonl")]
    assert [r["step"] for r in records] == [10, 12]
    # No precision flags: the hardware's choice, said in the log (the job
    # runs with CUDA_VISIBLE_DEVICES="", so on the CPU whatever this test sees).
    assert f"precision: {choose(gpus=[]).describe()}" in proc.stdout, proc.stdout
    # No --learning_rate: the small presets' default, 1e-3 (the paper's presets: 2.5e-4).
    assert "learning rate: peak 0.001," in proc.stdout, proc.stdout


def test_a_piped_validation_shows_its_progress(tmp_path, jobs):
    # The final evaluation reads the whole valid split (minutes at the paper's
    # sizes): a log showed nothing between the last step's line and its result.
    write_text_corpus(tmp_path / "corpus.txt", 10_000, seed=7)
    proc = jobs.run("training.train", [
        f"--model_dir={tmp_path / 'run'}", "--dataset=text",
        f"--data_dir={tmp_path / 'corpus.txt'}", f"--cache_dir={tmp_path / 'cache'}",
        "--preset=tiny", "--batch_size=4", "--train_steps=4", "--checkpoint_every=4",
        "--eval_batch_size=2", "--strategy=one_device", "--verbose=1"], check=True)
    lines = [line for line in proc.stderr.splitlines()
             if line.startswith("step 4: evaluating valid: ")]
    assert 2 <= len(lines) <= 11 and lines[-1].endswith("(100%)"), proc.stderr
    assert "\r" not in proc.stderr
    assert "step 4: valid bpc " in proc.stdout, proc.stdout


def test_run_shorter_than_log_every_is_logged(tmp_path, monkeypatch, capsys):
    write_text_corpus(tmp_path / "corpus.txt", 10_000, seed=7)
    from training import train
    from txl_tf.data import corpora
    monkeypatch.setattr(corpora, "PROGRESS_MIN_BYTES", 10)  # --verbose=0 quiets its lines too
    with unconfigured_logging():  # as in a notebook: the run configures no logging
        train.run(model_dir=str(tmp_path / "run"), dataset="text",
                  data_dir=str(tmp_path / "corpus.txt"), cache_dir=str(tmp_path / "cache"),
                  preset="tiny", batch_size=2, train_steps=3, log_every=100, verbose=0,
                  strategy="one_device", final_eval=False)
        assert logging.root.handlers == [] and logging.getLogger("absl").level == logging.NOTSET
    records = [json.loads(line) for line in open(tmp_path / "run" / "train_log.jsonl")]
    assert [r["step"] for r in records] == [3] and "loss" in records[0]
    assert capsys.readouterr().err == ""


def test_the_terminal_bar_counts_to_train_steps(tmp_path, monkeypatch, capsys):
    """On a terminal the bar is over --train_steps (Keras's own would count to
    --checkpoint_every and restart at every checkpoint)."""
    from training import train
    from txl_tf.app import progress
    monkeypatch.setattr(progress, "interactive", lambda stream=None: True)
    write_text_corpus(tmp_path / "corpus.txt", 10_000, seed=7)
    train.run(model_dir=str(tmp_path / "run"), dataset="text",
              data_dir=str(tmp_path / "corpus.txt"), cache_dir=str(tmp_path / "cache"),
              preset="tiny", batch_size=2, train_steps=12, checkpoint_every=5, verbose=1,
              strategy="one_device", final_eval=False)
    out = capsys.readouterr().out
    assert "12/12" in out and "/5" not in out, out[-2000:]


def test_tensorboard_available_imports_the_package(monkeypatch):
    """Its import is only a probe (pyflakes saw an unused import): it must
    still answer False where the package cannot be imported."""
    import sys

    from training.callbacks import tensorboard_available
    assert tensorboard_available()  # installed with tensorflow
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import` raises ImportError
    assert not tensorboard_available()


def test_a_resume_drops_the_lines_logged_past_its_checkpoint(tmp_path):
    """A job killed after its last checkpoint logged steps that the resumed
    job trains and logs again: each appeared twice (and a line cut short by a
    full disk ran into the next)."""
    from training.files import trim_log
    log = tmp_path / "train_log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (5, 10, 15))
                   + '{"step": 20, "lo')
    assert trim_log(str(log), 10) == 2
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [5, 10]
    assert trim_log(str(log), 10) == 0 and trim_log(str(tmp_path / "none.jsonl"), 0) == 0


def test_a_resumed_run_logs_each_step_once(tmp_path):
    """The state a kill after the last checkpoint leaves: lines past it."""
    from training import train
    options = dict(model_dir=str(tmp_path / "run"), dataset="text", preset="tiny",
                   data_dir=str(write_text_corpus(tmp_path / "corpus.txt", 5_000)),
                   cache_dir=str(tmp_path / "cache"), strategy="one_device", batch_size=2,
                   log_every=1, verbose=0)
    train.run(train_steps=2, final_eval=False, **options)
    log = tmp_path / "run" / "train_log.jsonl"
    with open(log, "a", encoding="utf-8") as f:  # the killed job's steps 3 and 4
        f.write(json.dumps({"step": 3, "loss": 9.0}) + "\n" + json.dumps({"step": 4}) + "\n")
    train.run(train_steps=4, final_eval=False, **options)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4] and records[2]["loss"] != 9.0


def test_a_finished_job_run_again_logs_its_final_evaluation_once(tmp_path):
    """The final evaluation of a finished job run again (nothing to train)
    was appended to eval_log.jsonl a second time at the same step."""
    from training import train
    options = dict(model_dir=str(tmp_path / "run"), dataset="text", preset="tiny",
                   data_dir=str(write_text_corpus(tmp_path / "corpus.txt", 5_000)),
                   cache_dir=str(tmp_path / "cache"), strategy="one_device", batch_size=2,
                   train_steps=2, eval_every=1, eval_max_segments=1, verbose=0)
    train.run(**options)
    result = train.run(**options)
    records = [json.loads(line) for line in (tmp_path / "run" / "eval_log.jsonl").open()]
    assert [r["step"] for r in records] == [1, 2]
    assert [r["step"] for r in result["evaluations"]] == [2]


def test_an_evaluation_at_a_logged_step_replaces_its_line(tmp_path):
    from training.files import log_record
    log = tmp_path / "eval_log.jsonl"
    for record in ({"step": 1, "bpc": 3.0}, {"step": 2, "bpc": 2.0}, {"step": 2, "bpc": 1.5}):
        log_record(str(log), record)
    assert [json.loads(line) for line in log.read_text().splitlines()] == [
        {"step": 1, "bpc": 3.0}, {"step": 2, "bpc": 1.5}]
