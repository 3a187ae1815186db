"""The training job's calls of the train function: several steps per call
(`--steps_per_execution`) train exactly like one, the callbacks know the
global step without reading it from the device after each call, the train
step is traced once, and the first call's compile seconds are reported."""
import json
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from job_helpers import write_text_corpus
from training import train
from training.callbacks import (CompileTime, GlobalStepTensorBoard, ProgressBar, ProgressLine,
                                StepEvents, StepLog)
from training.errors import TrainingError
from txl_tf.app import progress
from txl_tf import TransformerXLLM


def _options(**changes):
    o = {"log_every": 100, "checkpoint_every": 1000, "train_steps": 1000, "eval_every": 0,
         "steps_per_execution": 0, "profile_steps": None}
    o.update(changes)
    return o


@pytest.mark.parametrize("changes,start,expected", [
    ({}, 0, 25),                                    # gcd 100: 25 is the largest k <= 32
    ({"log_every": 1}, 0, 1),
    ({"log_every": 8, "checkpoint_every": 24, "train_steps": 96}, 0, 8),
    ({"log_every": 64, "checkpoint_every": 64, "train_steps": 640}, 0, 32),
    ({"eval_every": 30}, 0, 10),
    ({}, 37, 1),                                    # resumed after a signal at step 37
    ({}, 250, 25),
    ({"steps_per_execution": 5}, 35, 5),            # given: taken as it is...
    ({"steps_per_execution": 5}, 37, 1),            # ...where it divides the step resumed from
    ({"profile_steps": "20,30"}, 0, 10),
])
def test_steps_per_call_divide_every_event(changes, start, expected):
    assert train.steps_per_execution(_options(**changes), start) == expected


def test_steps_per_call_that_split_an_event_are_refused():
    o = train.merge(train.SPEC, {"model_dir": "x", "log_every": 10, "steps_per_execution": 4})
    with pytest.raises(TrainingError, match=r"--steps_per_execution 4 does not divide "
                                            r"--log_every 10"):
        train._check_options(o)


@pytest.mark.parametrize("value", ["5", "0,3", "4,2", "1,2000", "a,b"])
def test_bad_profile_steps_are_refused(value):
    o = train.merge(train.SPEC, {"model_dir": "x", "profile_steps": value})
    with pytest.raises(TrainingError, match="--profile_steps must be START,END"):
        train._check_options(o)


def _fit_with_the_job_callbacks(tmp_path, monkeypatch, steps_per_execution):
    """A one-weight model fitted 3 epochs x 4 steps with the job's callbacks;
    returns (steps seen by StepEvents, train_log steps, reads of
    `iterations` from the device, the CompileTime)."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=steps_per_execution,
                  jit_compile=steps_per_execution == 2)  # XLA, reported, in one of the two
    x = np.arange(8, dtype="float32")[:, None]
    data = tf.data.Dataset.from_tensor_slices((x, 2 * x)).batch(2).repeat()
    seen, lines = [], []
    timer = CompileTime()
    callbacks = [timer, StepEvents(lambda step: seen.append(step)),
                 StepLog(str(tmp_path / "log.jsonl"), every=4, compile_time=timer),
                 ProgressLine(12, 4, 10, log=lines.append, compile_time=timer),
                 ProgressBar(12), GlobalStepTensorBoard(log_dir=str(tmp_path / "tb"),
                                                        update_freq=4)]
    model.optimizer.build(model.trainable_variables)
    reads = []
    variable_type = type(model.optimizer.iterations)
    numpy = variable_type.numpy

    def counted(self):
        if self is model.optimizer.iterations:
            reads.append(1)
        return numpy(self)

    monkeypatch.setattr(variable_type, "numpy", counted)
    model.fit(data, epochs=3, steps_per_epoch=4, callbacks=callbacks, verbose=0, shuffle=False)
    monkeypatch.undo()
    assert int(model.optimizer.iterations.numpy()) == 12
    with open(tmp_path / "log.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    return seen, records, len(reads), timer, lines


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_callbacks_count_steps_without_reading_the_device(tmp_path, monkeypatch,
                                                          steps_per_execution):
    seen, records, reads, timer, lines = _fit_with_the_job_callbacks(
        tmp_path, monkeypatch, steps_per_execution)
    assert seen == list(range(steps_per_execution, 13, steps_per_execution))
    assert [r["step"] for r in records] == [4, 8, 12]
    assert reads == 5  # once per callback at the start of fit, never per step
    assert timer.seconds is not None and len(timer.calls) == 2
    assert "compile_s" in records[0] and "compile_s" not in records[1]
    assert records[0]["jit_compile"] is (steps_per_execution == 2)
    # The first call's end has its line (its tracing and compile), then every 4th step.
    assert lines[0].startswith(f"first call done at step {steps_per_execution}/12 in "), lines
    lines = lines[1:]
    assert [line.split()[1] for line in lines] == ["4/12", "8/12", "12/12"]
    xla = "(XLA)" if steps_per_execution == 2 else "(no XLA)"
    assert lines[0].endswith(f"s {xla}") and " compile " in lines[0]
    assert " compile " not in lines[1]


def test_calls_of_several_steps_train_like_single_steps(tmp_path, monkeypatch):
    """The job with 2 steps per call (auto) and with 1: the same losses at
    every log line and the same weights; the train step traced once. The
    auto run records a profile of steps 1-2 (`--profile_steps`)."""
    write_text_corpus(tmp_path / "corpus.txt", 10_000, seed=3)
    traces = []
    train_step = TransformerXLLM.train_step

    def counted(self, data):
        traces.append(1)
        return train_step(self, data)

    monkeypatch.setattr(TransformerXLLM, "train_step", counted)
    runs = {}
    for name, steps_per_execution, profile in (("single", 1, None), ("auto", 0, "2,2")):
        traces.clear()
        result = train.run(model_dir=str(tmp_path / name), dataset="text",
                           data_dir=str(tmp_path / "corpus.txt"),
                           cache_dir=str(tmp_path / "cache"), preset="tiny", batch_size=2,
                           train_steps=4, checkpoint_every=2, log_every=2, final_eval=False,
                           verbose=0, learning_rate=0.01, seed=1, strategy="one_device",
                           mixed_precision="none", steps_per_execution=steps_per_execution,
                           profile_steps=profile)
        assert len(traces) == 1, f"{name}: the train step was traced {len(traces)} times"
        assert result["compile_s"] is not None and result["compile_s"] >= 0
        assert result["jit_compile"] is False  # auto, on a CPU
        with open(tmp_path / name / "train_log.jsonl", encoding="utf-8") as f:
            runs[name] = ([json.loads(line)["loss"] for line in f], result)
    (single, single_result), (auto, auto_result) = runs["single"], runs["auto"]
    assert (single_result["steps_per_execution"], auto_result["steps_per_execution"]) == (1, 2)
    assert len(single) == 2
    profiles = list((tmp_path / "auto" / "logs" / "train").glob("plugins/profile/*/*.xplane.pb"))
    assert len(profiles) == 1 and profiles[0].stat().st_size > 0
    assert not (tmp_path / "single" / "logs" / "train" / "plugins").exists()
    np.testing.assert_array_equal(auto, single)
    with np.load(tmp_path / "single" / "export" / "weights.npz") as a, \
            np.load(tmp_path / "auto" / "export" / "weights.npz") as b:
        for name in a.files:
            np.testing.assert_array_equal(b[name], a[name], err_msg=name)


def _first_call_of(display, beats):
    """`display`'s hooks around a first call of the train function that
    runs until its heartbeat has shown `beats` times (a wait standing in for
    tracing and compiling: no sleep to outlast on a loaded machine), then a
    second call; a one-weight model's optimizer at step 0."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    model.optimizer.build(model.trainable_variables)
    shown, waiting = [], display.waiting
    enough = threading.Event()

    def counted(seconds):
        waiting(seconds)
        shown.append(seconds)
        if len(shown) >= beats:
            enough.set()
    display.waiting = counted
    display.set_model(model)
    display.on_train_begin()
    for batch in range(2):
        display.on_train_batch_begin(batch)
        if batch == 0:
            assert enough.wait(60), shown
        display.on_train_batch_end(batch, {"loss": 1.0})
    display.on_train_end()


def test_a_long_first_call_has_lines_while_it_runs():
    """Minutes of tracing and XLA's compile (the paper's sizes on a GPU) had no
    line until the call ended: now one every `every` seconds, none after."""
    lines = []
    display = ProgressLine(12, 4, 10, log=lines.append)
    assert (display.beat_seconds, display.every) == (30.0, 4)  # seconds apart from steps apart
    display.beat_seconds = 0.05
    _first_call_of(display, 3)
    waiting = [i for i, line in enumerate(lines) if line.startswith("first call: ")]
    done = [i for i, line in enumerate(lines) if line.startswith("first call done at step 1/12")]
    assert len(waiting) >= 3 and len(done) == 1 and max(waiting) < done[0], lines
    assert lines[waiting[0]].endswith("s so far (it traces and compiles the step)"), lines
    assert lines[-1].startswith("step 2/12 "), lines  # the end's line, nothing after it
    assert not any(t.name == "heartbeat" for t in threading.enumerate())


def test_the_terminal_bar_counts_the_first_calls_seconds(capsys):
    display = ProgressBar(12)
    display.beat_seconds = 0.1  # Keras's bar draws at most every 0.05 s
    _first_call_of(display, 3)
    frames = capsys.readouterr().out.split("\r")
    assert sum("compile_s" in frame and "0/12" in frame for frame in frames) >= 2, frames
    assert not any(t.name == "heartbeat" for t in threading.enumerate())


def test_an_error_line_stops_the_heartbeat():
    """`close_bars` (before a job's `error:` line) stops the beats: the
    error stays the last line."""
    beats, two = [], threading.Event()

    def beat(seconds):
        beats.append(seconds)
        if len(beats) >= 2:
            two.set()
    heartbeat = progress.Heartbeat(0.02, beat)
    heartbeat.start()
    assert two.wait(60), beats
    progress.close_bars()  # returns after any beat under way: none comes after it
    seen = len(beats)
    assert not any(t.name == "heartbeat" for t in threading.enumerate())
    assert seen >= 2 and len(beats) == seen and beats == sorted(beats)
    heartbeat.stop()  # stopped twice: nothing to do


def test_a_reader_gone_ends_the_beats_without_a_traceback(monkeypatch):
    """`txl-train | head -n 3`: a beat's print met the closed pipe, and its
    thread printed `Exception in thread heartbeat: Traceback ...
    BrokenPipeError` on stderr (the job itself ends quietly with 141 at its
    next line, `exits.reader_gone`) (review35)."""
    raised, tried = [], threading.Event()
    monkeypatch.setattr(threading, "excepthook", raised.append)

    def beat(seconds):
        tried.set()
        raise BrokenPipeError(32, "Broken pipe")
    heartbeat = progress.Heartbeat(0.01, beat)
    heartbeat.start()
    assert tried.wait(60)
    heartbeat.stop()  # joins the thread: its exception, if any, is reported by then
    assert raised == []


def test_a_closed_stream_ends_the_beats_quietly_and_a_bug_keeps_its_traceback(monkeypatch):
    """A beat's write to a closed stream (`ValueError: I/O operation on
    closed file`) ends the beats quietly; any other `ValueError` from a beat
    (a bug in its own code) was swallowed as well, ending the beats with no
    word: it is reported as the thread's exception."""
    raised = []
    monkeypatch.setattr(threading, "excepthook", raised.append)
    for error in (ValueError("I/O operation on closed file."), ValueError("a bug")):
        tried = threading.Event()

        def beat(seconds, error=error, tried=tried):
            tried.set()
            raise error
        heartbeat = progress.Heartbeat(0.01, beat)
        heartbeat.start()
        assert tried.wait(60)
        heartbeat.stop()  # joins the thread: its exception, if any, is reported by then
    assert [str(args.exc_value) for args in raised] == ["a bug"]


def test_a_first_call_that_raises_leaves_no_heartbeat_running(tmp_path, monkeypatch):
    """Keras calls no `on_train_end` after a `fit` that raised: the job's
    `run` (a call from Python, no `error:` line's `close_bars`) left the
    heartbeat's thread beating `first call: ..s so far` for the process's
    life (review35)."""
    def disk_full(self, batch, logs=None):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(StepEvents, "on_train_batch_end", disk_full)  # a checkpoint's write
    with pytest.raises(OSError, match="No space left"):
        train.run(model_dir=str(tmp_path / "run"), dataset="text", preset="tiny",
                  data_dir=str(write_text_corpus(tmp_path / "corpus.txt", 5_000)),
                  cache_dir=str(tmp_path / "cache"), strategy="one_device", train_steps=2,
                  batch_size=2, verbose=1)
    assert not any(t.name == "heartbeat" for t in threading.enumerate())


def test_the_first_calls_heartbeat_stops_before_the_steps_evaluation(tmp_path, monkeypatch):
    """The display comes after `StepEvents` (a step's evaluation and
    checkpoint) in the job's callbacks: its heartbeat went on with `first
    call: ..s so far (it traces and compiles the step)` while the first
    call's evaluation compiled, after the call had returned (review35)."""
    running = []
    step_events = StepEvents.on_train_batch_end

    def evaluating(self, batch, logs=None):
        running.append(any(t.name == "heartbeat" for t in threading.enumerate()))
        return step_events(self, batch, logs)
    monkeypatch.setattr(StepEvents, "on_train_batch_end", evaluating)
    train.run(model_dir=str(tmp_path / "run"), dataset="text", preset="tiny",
              data_dir=str(write_text_corpus(tmp_path / "corpus.txt", 5_000)),
              cache_dir=str(tmp_path / "cache"), strategy="one_device", train_steps=2,
              batch_size=2, verbose=1)
    assert running and not any(running), running
