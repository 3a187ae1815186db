"""Progress for logs: a plain line every few steps instead of Keras's bar.

Keras's progress bar rewrites its line with `\\r` and ANSI colours; written
to a file (a log, CI, `nohup`) that is one frame per step. `ProgressLine`
prints `step N/M loss .. bpc .. lr .. tok/s ..` every `every` steps and at
the last one.
"""
import sys
import time

import keras


def interactive(stream=None):
    """Whether `stream` (default stdout) is a terminal."""
    stream = sys.stdout if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


class ProgressLine(keras.callbacks.Callback):
    """Prints one plain line every `every` global steps and at the end of
    training (`tokens_per_step`: global batch x tgt_len, for tok/s;
    `schedule`: the learning-rate schedule, or None)."""

    def __init__(self, total_steps, every, tokens_per_step, schedule=None, log=print):
        super().__init__()
        self.total, self.every = int(total_steps), max(int(every), 1)
        self.tokens_per_step, self.schedule, self.log = tokens_per_step, schedule, log
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
        for key, digits in (("loss", 4), ("bpc", 4), ("ppl", 2)):
            if key in self.logs:
                parts.append(f"{key} {float(self.logs[key]):.{digits}f}")
        if self.schedule is not None:
            lr = float(keras.ops.convert_to_numpy(self.schedule(step - 1)))
            parts.append(f"lr {lr:.3g}")
        seconds = now - self.last_time
        if seconds > 0 and step > self.last:
            parts.append(f"{(step - self.last) * self.tokens_per_step / seconds:,.0f} tok/s")
        self.log(" ".join(parts))
        self.last, self.last_time = step, now
