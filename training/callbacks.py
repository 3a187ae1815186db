"""Keras callbacks of the training job: step log, plain progress line, time limit."""
import contextlib
import importlib
import json
import os
import signal
import socket
import sys
import threading
import time

import keras

from training.checkpointing import metric_values, set_metric_values
from training.errors import TrainingError
from txl_tf.app import progress as progress_lib
from txl_tf.app.exits import running_a_command, stop_now
from txl_tf.app.files import naming


class GlobalStep(keras.callbacks.Callback):
    """Base of the callbacks that act on the global step (the optimizer's
    `iterations`) without reading it from the device after every step: it
    is read once when `fit` starts, then `step` counts the steps Keras
    reports (a call of the train function runs `steps_per_execution` of
    them: batches `begin..end`). Every step advances `iterations` by one
    (`txl_tf.keras_support.keras_compat.CountingLossScaleOptimizer` also counts
    the steps that float16 loss scaling skips), so the count stays exact."""

    step = None

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.step = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch, logs)
        self._first_batch = batch

    def on_train_batch_end(self, batch, logs=None):
        self.step += batch - self._first_batch + 1
        super().on_train_batch_end(batch, logs)


class CompileTime(keras.callbacks.Callback):
    """Measures what the first call of the train function costs beyond the
    second (both run `steps_per_execution` steps, so the difference is the
    tracing and XLA compilation): `seconds`, None until known. A run with a
    single call gets that call's whole time (an upper bound). Only those two
    calls wait for the device. Put it first among the callbacks, so that the
    others' work (a checkpoint) is not timed. `jit_compile`: whether Keras
    compiled the train function with XLA (read when `fit` starts)."""

    def __init__(self):
        super().__init__()
        self.calls, self.seconds, self.jit_compile = [], None, None

    def on_train_begin(self, logs=None):
        self.jit_compile = bool(self.model.jit_compile)

    def describe(self):
        """E.g. `compile 31.0s (XLA)`, or `compile 3.2s (no XLA)`."""
        return f"compile {self.seconds:.1f}s ({'XLA' if self.jit_compile else 'no XLA'})"

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter() if len(self.calls) < 2 else None

    def on_train_batch_end(self, batch, logs=None):
        if self._start is None:
            return
        keras.tree.map_structure(keras.ops.convert_to_numpy, logs or {})  # waits for the step
        self.calls.append(time.perf_counter() - self._start)
        if len(self.calls) == 2:
            self.seconds = max(self.calls[0] - self.calls[1], 0.0)

    def on_train_end(self, logs=None):
        if self.seconds is None and self.calls:
            self.seconds = self.calls[0]


class StepLog(GlobalStep):
    """Appends `{"step", "time", "lr", <metrics>}` as JSON lines to `path`
    every `every` steps and at the last step trained (`time`: seconds since
    the job's callbacks were made; `lr`: the rate of that step; the metrics
    are running means since the start of the epoch, see `MetricWindow`). With a
    `CompileTime`, the first line written after it is known also has
    `compile_s` and `jit_compile` (whether the train step is XLA-compiled)."""

    def __init__(self, path, every=1, schedule=None, compile_time=None):
        super().__init__()
        self.path, self.every = path, max(int(every), 1)
        self.schedule = schedule  # a LearningRateSchedule, or None for a constant rate
        self.compile_time = compile_time
        self.start = time.time()
        self.written, self.logs = None, {}

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        self.logs = logs or {}
        if self.step % self.every == 0:
            self._write(self.step)

    def on_train_end(self, logs=None):
        if self.logs and self.step != self.written:
            self._write(self.step)

    def _write(self, step):
        if self.schedule is not None:
            lr = self.schedule(step - 1)  # the rate this step used
        else:
            lr = self.model.optimizer.learning_rate
        record = {"step": step, "time": round(time.time() - self.start, 4),
                  "lr": float(keras.ops.convert_to_numpy(lr))}
        record.update({k: float(v) for k, v in self.logs.items()})
        if self.compile_time is not None and self.compile_time.seconds is not None:
            record["compile_s"] = round(self.compile_time.seconds, 3)
            record["jit_compile"] = self.compile_time.jit_compile
            self.compile_time = None  # once
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as err:  # a full disk names no file: the log is named
            raise naming(err, self.path) from err
        self.written = step


class TimeLimit(keras.callbacks.Callback):
    """Stops training once `seconds` have passed since `start` (a
    `time.time()` value; default: when the callback is made)."""

    def __init__(self, seconds, start=None):
        super().__init__()
        self.seconds = float(seconds)
        self.start = time.time() if start is None else start
        self.reached = False

    def on_train_batch_end(self, batch, logs=None):
        if time.time() - self.start >= self.seconds:
            self.reached = True
            self.model.stop_training = True


def _in_a_del(frame):
    """Whether `frame` (a signal handler's) is inside a `__del__`."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


class StopOnSignal(keras.callbacks.Callback):
    """SIGINT / SIGTERM end `fit` after the step in flight, whose update is
    whole (the caller then checkpoints that step): `received` is the signal.
    The first one says so on stderr at once (`announce`), also while the
    step is one long call into TensorFlow (the first step's XLA compile),
    during which Python's own handlers wait: a thread reads the signals from
    the wakeup fd (`signal.set_wakeup_fd`). A second signal ends the process
    at once (`txl_tf.app.exits.stop_now`: `interrupted`, status 128 + the
    signal), from that thread or the handler, whichever is first; outside
    the project's commands (a notebook's kernel, a script calling
    `training.train.run`) a second SIGINT raises `KeyboardInterrupt` from
    the handler instead (none inside a `__del__`, where Python would print
    and drop it), so that the process (the kernel and what it holds) goes
    on. The handlers are in place only inside `with stop.installed():` (and
    only in the main thread, where Python delivers signals)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, after_bar=None):
        """`after_bar`: whether a progress bar is drawn on stdout (None: stdout
        is a terminal)."""
        super().__init__()
        self.received = None
        self._announced = threading.Lock()  # taken by the first announcement, never released
        self._seen = 0  # `SIGNALS` the wakeup fd's thread read
        # The bar's frame holds its line: on the same terminal the announcement starts one.
        after_bar = progress_lib.interactive() if after_bar is None else after_bar
        self._newline = "\n" if after_bar and progress_lib.interactive(sys.stderr) else ""

    @staticmethod
    def _second_ends_the_process(signum):
        """Whether a second `signum` ends the process (not a notebook's or a
        user's script's SIGINT: that one raises `KeyboardInterrupt`)."""
        return signum != signal.SIGINT or running_a_command()

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = signum
            self.announce(signum)
            # Python runs its handler once for the signals that came during
            # one long call into TensorFlow: a second the watcher read counts.
            if self._seen < 2:
                return
        if not self._second_ends_the_process(signum):
            # A notebook's second interrupt: not the kernel's end. In a
            # `__del__` it would be printed and dropped: the graceful stop
            # goes on, and a next interrupt lands elsewhere.
            if not _in_a_del(frame):
                raise KeyboardInterrupt
            return
        stop_now(signum, new_line=bool(self._newline))

    def announce(self, signum):
        """Writes `<SIGNAL>: stopping after the step in flight ...` to
        stderr, once (from the handler or the wakeup fd's thread, whichever
        is first; an unbuffered write, safe in either).

        Args:
            signum: the signal's number.
        """
        if not self._announced.acquire(blocking=False):
            return
        name = signal.Signals(signum).name
        line = (f"{self._newline}{name}: stopping after the step in flight, which is then "
                f"saved (another {name} ends the job without saving it)\n")
        try:
            os.write(2, line.encode())
        except OSError:  # stderr gone: the stop goes on
            pass

    def _watch(self, reader, forward):
        """Announces the first of `SIGNALS` read from the wakeup socket
        `reader` and ends the process at a second one that ends it
        (`stop_now`), also while the main thread is in one long call into
        TensorFlow (the handler raises a notebook's); passes every
        byte on to the wakeup fd `forward`, when one was set; returns when
        the socket's other end is closed."""
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            if forward != -1:
                try:
                    os.write(forward, data)
                except OSError:
                    pass
            for signum in data:
                if signum in self.SIGNALS:
                    self._seen += 1
                    if self._seen > 1 and self._second_ends_the_process(signum):
                        stop_now(signum, flush=False, new_line=bool(self._newline))
                    self.announce(signum)

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        forward = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        watcher = threading.Thread(target=self._watch, args=(reader, forward), daemon=True,
                                   name="StopOnSignal")
        watcher.start()
        try:
            yield self
        finally:
            signal.set_wakeup_fd(forward)
            for s, handler in previous.items():
                signal.signal(s, handler)
            writer.close()  # the watcher reads the end of the socket and returns
            watcher.join()
            reader.close()

    def on_train_batch_end(self, batch, logs=None):
        if self.received is not None:
            self.model.stop_training = True


class MetricWindow(GlobalStep):
    """Keeps the running training metrics a function of the global step: the
    mean since the last multiple of `every` (--checkpoint_every, one Keras
    epoch). Keras resets them at each of its epochs, and a run resumed at a
    step s between multiples of `every` starts its epochs at s: there this
    puts back at each Keras epoch what the metrics held (restored from the
    checkpoint, or at the end of the previous epoch), and resets them at each
    multiple of `every` inside a Keras epoch. A run that starts on a multiple
    (not resumed, or resumed from a periodic checkpoint) is left to Keras."""

    def __init__(self, every):
        super().__init__()
        self.every, self.shifted, self.carry = int(every), False, None

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)  # before Keras's first reset: the restored values
        self.shifted = self.step % self.every != 0
        self.carry = metric_values(self.model) if self.shifted else None

    def on_epoch_begin(self, epoch, logs=None):
        if self.carry is not None:
            set_metric_values(self.model, self.carry)
            self.carry = None

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch, logs)
        if self.shifted and self.step % self.every == 0:
            self.model.reset_metrics()

    def on_epoch_end(self, epoch, logs=None):
        if self.shifted and self.step % self.every:
            self.carry = metric_values(self.model)


class StopOnNonFinite(GlobalStep):
    """Ends `fit` with a `TrainingError` after the first call of the train
    function whose loss is NaN or infinite or that leaves a NaN or infinite
    weight, naming the step (the call's steps when it runs several): put it
    before `StepEvents`, so that no checkpoint, evaluation or export of
    those weights is made. Without it a job trained on NaN to the end,
    replaced its good checkpoints with NaN ones and exported them. A
    gradient of NaN or infinite norm makes every weight NaN even where the
    loss is finite (the global-norm clip multiplies each gradient by
    `clip / norm`), hence the weights' check.

    Args:
        last_saved: a callable giving the step of the newest checkpoint
            (None: none), for the message; None for a job that saves only
            at its end.
        policy: the dtype policy trained in (under "mixed_float16" loss
            scaling leaves the weights of a step whose gradients are not
            finite as they were).
    """

    def __init__(self, last_saved, policy="float32"):
        super().__init__()
        self.last_saved, self.policy = last_saved, str(policy)
        self._finite = None

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        import tensorflow as tf

        from txl_tf.keras_support.placement import on_device, strategy_device
        variables = list(self.model.trainable_variables)

        def finite(loss):  # [loss finite, weights finite]: one read per call
            weights = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables])
            return tf.stack([tf.reduce_all(tf.math.is_finite(loss)), weights])
        # Compiled as the train step is: on a GPU one fused reduction, not a
        # kernel per weight; run where the step runs (an XLA function runs on
        # the device it is called from, not beside the variables it reads).
        self._finite = on_device(tf.function(finite, jit_compile=bool(self.model.jit_compile),
                                             autograph=False),
                                 strategy_device(self.model.distribute_strategy))

    def on_train_batch_end(self, batch, logs=None):
        import tensorflow as tf
        first = self.step + 1
        super().on_train_batch_end(batch, logs)
        loss = (logs or {}).get("loss")
        loss_finite, weights_finite = self._finite(
            tf.cast(0.0 if loss is None else loss, tf.float32)).numpy()
        if not loss_finite:
            problem = f"the training loss is {float(loss)}"
        elif not weights_finite:
            problem = ("the weights hold NaN or inf (the loss was finite: a NaN or infinite "
                       "gradient, which a global-norm clip spreads to every weight)")
        else:
            return
        steps = (f"step {self.step}" if first >= self.step else
                 f"steps {first} to {self.step} (one call of the train function)")
        saved = None if self.last_saved is None else self.last_saved()
        kept = ("nothing was saved" if self.last_saved is None else
                f"the newest checkpoint, step {saved}, is kept" if saved is not None else
                "no checkpoint was written")
        unchanged = (" (float16 loss scaling left the weights of that step as they were)"
                     if self.policy == "mixed_float16" and not loss_finite and weights_finite
                     else "")  # weights already NaN were not left as they were
        advice = "lower --learning_rate" + (
            "" if self.policy == "float32" else
            f", or train in float32 (--mixed_precision=none; this run: {self.policy})")
        raise TrainingError(f"{problem} at {steps}{unchanged}: training stopped there and "
                            f"{kept}; {advice}")


class StepEvents(GlobalStep):
    """Runs `on_step(step)` after every call of the train function, with the
    global step (the optimizer's `iterations`): checkpoints, evaluation and
    the stop at the requested step hang off it."""

    def __init__(self, on_step):
        super().__init__()
        self.on_step = on_step

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if self.on_step(self.step):
            self.model.stop_training = True


def tensorboard_available():
    """Whether the `tensorboard` package (needed by tf.summary) is installed."""
    try:
        importlib.import_module("tensorboard")  # imported to see that it imports, not used
    except ImportError:
        return False
    return True


class GlobalStepTensorBoard(GlobalStep, keras.callbacks.TensorBoard):
    """Keras's TensorBoard callback with batch summaries at the global step
    (Keras counts calls of the train function from 0 in every `fit`, so a
    resumed job would draw its curves over the first run's, and with
    `steps_per_execution` > 1 at the wrong steps)."""

    _running = False

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._running = True

    def on_train_end(self, logs=None):
        self._running = False
        super().on_train_end(logs)

    def end_after_failure(self):
        """Ends what `on_train_begin` started, for a `fit` that raised (Keras
        then calls no `on_train_end`): TensorFlow's default summary writer,
        step and recording condition are given back and the event files
        closed. Left, the process's later summaries went into this run's
        file at its step, and the callback (so the model) stayed alive."""
        if self._running:
            self.on_train_end()

    def on_train_batch_begin(self, batch, logs=None):
        # Private Keras state.
        from txl_tf.keras_support.keras_compat import start_tensorboard_batches_at
        # Keras adds one per call: its count ends at the step this call reaches.
        start_tensorboard_batches_at(self, self.step + self.model.steps_per_execution - 1)
        super().on_train_batch_begin(batch, logs)


class FirstCallWatch(GlobalStep):
    """Base of the progress displays: `waiting(seconds)` every
    `beat_seconds` while the train function's first call runs (its tracing and
    compiling: minutes with XLA at the paper's sizes on a GPU, with no step
    to show), from a thread (`progress.Heartbeat`). `calls`: the calls ended
    in this `fit`."""

    beat_seconds = 30.0
    _watch = None

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._watch = progress_lib.Heartbeat(self.beat_seconds, self.waiting)
        self.calls = 0

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch, logs)
        if not self.calls:
            self._watch.start()

    def on_train_batch_end(self, batch, logs=None):
        self._watch.stop()
        self.calls += 1
        super().on_train_batch_end(batch, logs)

    def on_train_end(self, logs=None):
        self._watch.stop()
        super().on_train_end(logs)

    def end_after_failure(self):
        """Stops the heartbeat, for a `fit` that raised (Keras then calls no
        `on_train_end`): its thread went on beating."""
        self.stop_heartbeat()

    def stop_heartbeat(self):
        """Stops the heartbeat's thread, if one runs."""
        if self._watch is not None:  # None: `fit` raised before it began
            self._watch.stop()

    def call_returned(self):
        """A callback that stops the heartbeat as the train function's call
        returns: first in `fit`'s list, so that the callbacks before this
        display (`StepEvents`: an evaluation or a checkpoint at that step,
        whose own first calls compile) run without its lines."""
        return _CallReturned(self)

    def waiting(self, seconds):
        """Shows that the first call has run `seconds` so far."""
        raise NotImplementedError


class _CallReturned(keras.callbacks.Callback):
    """`FirstCallWatch.call_returned`'s callback."""

    def __init__(self, watch):
        super().__init__()
        self.watch = watch

    def on_train_batch_end(self, batch, logs=None):
        self.watch.stop_heartbeat()


class ProgressBar(FirstCallWatch):
    """A terminal bar over the whole run, global step of `total_steps` (Keras's
    own bar restarts at every `fit` epoch: every checkpoint), with its ETA
    (and `compile_s` once a `CompileTime` knows it; while the first call
    runs, its seconds so far, every second)."""

    beat_seconds = 1.0

    def __init__(self, total_steps, metrics=("loss", "ppl"), compile_time=None):
        super().__init__()
        self.total, self.metrics, self.bar = int(total_steps), tuple(metrics), None
        self.compile_time = compile_time

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.bar = keras.utils.Progbar(self.total, stateful_metrics=self.metrics + ("compile_s",),
                                       unit_name="step")
        self.bar.update(self.step)  # a resumed run starts where it stopped
        progress_lib.open_line(self, lambda: print(flush=True))  # an error ends its line

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        progress_lib.closed_line(self)
        if self.bar is not None and self.step < self.total:  # stopped: the line is left open
            print(flush=True)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        logs = logs or {}
        values = [(k, float(logs[k])) for k in self.metrics if k in logs]
        if self.compile_time is not None and self.compile_time.seconds is not None:
            values.append(("compile_s", self.compile_time.seconds))
        self.bar.update(min(self.step, self.total), values)

    def waiting(self, seconds):
        self.bar.update(min(self.step, self.total), [("compile_s", seconds)])


class ProgressLine(FirstCallWatch):
    """Prints one plain line every `every` global steps and at the end of
    training (`tokens_per_step`: global batch x tgt_len, for tok/s, or
    whatever `unit` counts; `schedule`: the learning-rate schedule, or None;
    `fields`: the logged metrics shown, with their digits). With a
    `CompileTime`, the first line printed after it is known ends with
    `compile <seconds>s (XLA)` or `(no XLA)`. The first call of the train
    function (its tracing and compilation: minutes with XLA at the paper's
    sizes) has a line every `beat_seconds` while it runs, and one as it
    ends unless a step's line is due there."""

    FIELDS = (("loss", 4), ("bpc", 4), ("ppl", 2))

    def __init__(self, total_steps, every, tokens_per_step, schedule=None, log=print,
                 fields=FIELDS, unit="tok", compile_time=None):
        super().__init__()
        self.total, self.every = int(total_steps), max(int(every), 1)
        self.tokens_per_step, self.schedule, self.log = tokens_per_step, schedule, log
        self.fields, self.unit = tuple(fields), unit
        self.compile_time = compile_time
        self.last = self.last_time = None
        self.logs = {}

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.last, self.last_time = self.step, time.time()

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        self.logs = logs or {}
        if self.step % self.every == 0 or self.step >= self.total:
            self._print(self.step)
        elif self.calls == 1:
            self.log(f"first call done at step {self.step}/{self.total} in "
                     f"{time.time() - self.last_time:.1f}s (it traces and compiles the step); "
                     f"then a line every {self.every} steps")

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self.step != self.last:
            self._print(self.step)

    def waiting(self, seconds):
        self.log(f"first call: {seconds:.0f}s so far (it traces and compiles the step)")

    def _print(self, step):
        now = time.time()
        parts = [f"step {step}/{self.total}"]
        for key, digits in self.fields:
            if key in self.logs:
                parts.append(f"{key} {float(self.logs[key]):.{digits}f}")
        if self.schedule is not None:
            lr = float(keras.ops.convert_to_numpy(self.schedule(step - 1)))
            parts.append(f"lr {lr:.3g}")
        seconds = now - self.last_time
        if seconds > 0 and step > self.last:
            parts.append(f"{(step - self.last) * self.tokens_per_step / seconds:,.0f} "
                         f"{self.unit}/s")
        if self.compile_time is not None and self.compile_time.seconds is not None:
            parts.append(self.compile_time.describe())
            self.compile_time = None  # once
        self.log(" ".join(parts))
        self.last, self.last_time = step, now
