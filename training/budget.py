"""Sizing a run to a time budget: time a few steps, then pick `train_steps`
so that the learning-rate schedule ends when the budget does."""
import contextlib
import io
import json
import os
import statistics
import tempfile
import time

from training import train


def seconds_per_step(options, probe_steps=20):
    """Median wall time of one training step with `options` (train.run
    options; model_dir is replaced by a temporary one)."""
    with tempfile.TemporaryDirectory(prefix="txl-probe-") as model_dir:
        probe = dict(options, model_dir=model_dir, train_steps=probe_steps,
                     checkpoint_every=probe_steps, log_every=1, final_eval=False,
                     eval_every=0, verbose=0, warmup_steps=0, max_time_s=0)
        with contextlib.redirect_stdout(io.StringIO()):
            train.run(**probe)
        with open(os.path.join(model_dir, "train_log.jsonl"), encoding="utf-8") as f:
            times = [json.loads(line)["time"] for line in f]
    gaps = [b - a for a, b in zip(times[2:], times[3:])]  # skip tracing
    return statistics.median(gaps)


def steps_for_budget(seconds, options, probe_steps=20, margin=0.92):
    """`(train_steps, seconds_per_step)` that fit in `seconds` of training."""
    per_step = seconds_per_step(options, probe_steps)
    return max(int(seconds * margin / per_step), 1), per_step


def train_within(seconds, options, model_dir, warmup_steps=100, checkpoints=4, log_every=10):
    """Trains with `options` for about `seconds` (sized by `steps_for_budget`,
    warm-up at most a tenth of the steps). Returns `(train.run's summary,
    steps, seconds_per_step, seconds trained)`."""
    steps, per_step = steps_for_budget(seconds, options)
    print(f"{per_step * 1000:.0f} ms/step -> {steps} steps in {seconds:.0f}s; training in "
          f"{model_dir}", flush=True)
    start = time.time()
    result = train.run(**options, model_dir=model_dir, train_steps=steps,
                       warmup_steps=min(warmup_steps, steps // 10),
                       checkpoint_every=max(steps // checkpoints, 1), log_every=log_every,
                       final_eval=False, max_time_s=seconds * 1.15, verbose=2)
    return result, steps, per_step, time.time() - start
