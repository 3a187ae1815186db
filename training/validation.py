"""Validation during training: evaluate, log a line, append JSON, TensorBoard."""
import os

import tensorflow as tf

from training.files import log_record
from txl_tf.app.progress import Progress, interactive
from txl_tf.learning.evaluation import evaluate_ids, make_scorer


class Validator:
    """`validator(step)` evaluates `core` on `ids` (see `txl_tf.learning.evaluation.evaluate_ids`),
    prints a line, logs the result in `model_dir/eval_log.jsonl` (one line per
    step: an evaluation at a step logged before replaces that line) and, with
    `tensorboard`, writes scalars under `model_dir/logs/eval`. With
    `progress_lines`, a line on stderr every ~10% of the evaluation
    (`step N: evaluating valid: 3/30 (10%)`)."""

    def __init__(self, core, ids, model_dir, batch_size, tgt_len, mem_len, max_segments=None,
                 character_level=True, tensorboard=False, log=print, progress_lines=False):
        self.core, self.ids, self.model_dir = core, ids, model_dir
        self.progress_lines = progress_lines
        self.settings = dict(batch_size=batch_size, tgt_len=tgt_len, mem_len=mem_len,
                             max_segments=max_segments)
        self.character_level, self.log = character_level, log
        self.scorer = make_scorer(core)
        self.writer = (tf.summary.create_file_writer(os.path.join(model_dir, "logs", "eval"))
                       if tensorboard else None)
        self.results = []

    def __call__(self, step):
        progress = Progress(f"step {step}: evaluating valid", enabled=self.progress_lines,
                            bar=False)
        result = evaluate_ids(self.core, self.ids, scorer=self.scorer, progress=progress,
                              **self.settings)
        result["step"] = int(step)
        self.results = [r for r in self.results if r["step"] != result["step"]] + [result]
        headline = (f"bpc {result['bpc']:.4f}" if self.character_level
                    else f"ppl {result['ppl']:.2f}")
        newline = "\n" if interactive() else ""  # ends a progress bar's line
        self.log(f"{newline}step {step}: valid {headline} (loss {result['loss']:.4f} over "
                 f"{result['tokens']:,} tokens, {result['seconds']:.1f}s)")
        log_record(os.path.join(self.model_dir, "eval_log.jsonl"), result)
        if self.writer is not None:
            with self.writer.as_default(step=int(step)):
                for key in ("loss", "bpc", "ppl"):
                    tf.summary.scalar(key, result[key])
            self.writer.flush()
        return result
