"""Keras callbacks of the training job: step log, plain progress line, time limit."""
import contextlib
import json
import signal
import threading
import time

import keras


class StepLog(keras.callbacks.Callback):
    """Appends `{"step", "time", "lr", <metrics>}` as JSON lines to `path`
    every `every` steps and at the last step trained (`time`: seconds since
    the job's callbacks were made; `lr`: the rate of that step; the metrics
    are Keras's running means since the start of the epoch)."""

    def __init__(self, path, every=1, schedule=None):
        super().__init__()
        self.path, self.every = path, max(int(every), 1)
        self.schedule = schedule  # a LearningRateSchedule, or None for a constant rate
        self.start = time.time()
        self.written, self.logs = None, {}

    def on_train_batch_end(self, batch, logs=None):
        self.logs = logs or {}
        step = int(self.model.optimizer.iterations.numpy())
        if step % self.every == 0:
            self._write(step)

    def on_train_end(self, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if self.logs and step != self.written:
            self._write(step)

    def _write(self, step):
        if self.schedule is not None:
            lr = self.schedule(step - 1)  # the rate this step used
        else:
            lr = self.model.optimizer.learning_rate
        record = {"step": step, "time": round(time.time() - self.start, 4),
                  "lr": float(keras.ops.convert_to_numpy(lr))}
        record.update({k: float(v) for k, v in self.logs.items()})
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
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


class StopOnSignal(keras.callbacks.Callback):
    """SIGINT / SIGTERM end `fit` after the step in flight, whose update is
    whole (the caller then checkpoints that step): `received` is the signal.
    A second signal interrupts at once. The handlers are in place only inside
    `with stop.installed():` (and only in the main thread, where Python
    delivers signals)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        super().__init__()
        self.received = None

    def _handle(self, signum, frame):
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def on_train_batch_end(self, batch, logs=None):
        if self.received is not None:
            self.model.stop_training = True


class StepEvents(keras.callbacks.Callback):
    """Runs `on_step(step)` after every training step, with the global step
    (the optimizer's `iterations`): checkpoints, evaluation and the stop at
    the requested step hang off it."""

    def __init__(self, on_step):
        super().__init__()
        self.on_step = on_step

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if self.on_step(step):
            self.model.stop_training = True


def tensorboard_available():
    """Whether the `tensorboard` package (needed by tf.summary) is installed."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class GlobalStepTensorBoard(keras.callbacks.TensorBoard):
    """Keras's TensorBoard callback with batch summaries at the global step
    (Keras counts from 0 in every `fit`, so a resumed job would draw its
    curves over the first run's)."""

    def on_train_begin(self, logs=None):
        from txl_tf.keras_support.keras_compat import start_tensorboard_batches_at  # private Keras state
        super().on_train_begin(logs)
        start_tensorboard_batches_at(self, int(self.model.optimizer.iterations.numpy()))


class ProgressBar(keras.callbacks.Callback):
    """A terminal bar over the whole run, global step of `total_steps` (Keras's
    own bar restarts at every `fit` epoch: every checkpoint), with its ETA."""

    def __init__(self, total_steps, metrics=("loss", "ppl")):
        super().__init__()
        self.total, self.metrics, self.bar = int(total_steps), tuple(metrics), None

    def _step(self):
        return int(self.model.optimizer.iterations.numpy())

    def on_train_begin(self, logs=None):
        self.bar = keras.utils.Progbar(self.total, stateful_metrics=self.metrics,
                                       unit_name="step")
        self.bar.update(self._step())  # a resumed run starts where it stopped

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        self.bar.update(min(self._step(), self.total),
                        [(k, float(logs[k])) for k in self.metrics if k in logs])


class ProgressLine(keras.callbacks.Callback):
    """Prints one plain line every `every` global steps and at the end of
    training (`tokens_per_step`: global batch x tgt_len, for tok/s, or
    whatever `unit` counts; `schedule`: the learning-rate schedule, or None;
    `fields`: the logged metrics shown, with their digits)."""

    FIELDS = (("loss", 4), ("bpc", 4), ("ppl", 2))

    def __init__(self, total_steps, every, tokens_per_step, schedule=None, log=print,
                 fields=FIELDS, unit="tok"):
        super().__init__()
        self.total, self.every = int(total_steps), max(int(every), 1)
        self.tokens_per_step, self.schedule, self.log = tokens_per_step, schedule, log
        self.fields, self.unit = tuple(fields), unit
        self.last = self.last_time = None
        self.logs = {}

    def _step(self):
        return int(self.model.optimizer.iterations.numpy())

    def on_train_begin(self, logs=None):
        self.last, self.last_time = self._step(), time.time()

    def on_train_batch_end(self, batch, logs=None):
        self.logs = logs or {}
        step = self._step()
        if step % self.every == 0 or step >= self.total:
            self._print(step)

    def on_train_end(self, logs=None):
        step = self._step()
        if step != self.last:
            self._print(step)

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
        self.log(" ".join(parts))
        self.last, self.last_time = step, now
