"""The paper's learning-rate schedule: linear warm-up, then cosine decay."""
import math

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="txl_tf")
class WarmupCosineDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`peak * step / warmup_steps` during warm-up, then cosine decay from
    `peak` to `peak * min_lr_ratio` at `total_steps` (constant after).

    Matches the paper's TF code: `tf.train.cosine_decay(peak, step - warmup,
    total - warmup, alpha=min_lr_ratio)` after warm-up; `step` is the number
    of updates already applied (the optimizer's `iterations`).
    """

    def __init__(self, peak_learning_rate, total_steps, warmup_steps=0, min_lr_ratio=0.004,
                 name="warmup_cosine"):
        if peak_learning_rate <= 0:
            raise ValueError(f"learning rate must be > 0, got {peak_learning_rate}")
        if total_steps <= 0:
            raise ValueError(f"total_steps must be > 0, got {total_steps}")
        if not 0 <= warmup_steps <= total_steps:
            raise ValueError(f"warmup_steps must be in [0, total_steps={total_steps}], "
                             f"got {warmup_steps}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.min_lr_ratio = float(min_lr_ratio)
        self.name = name

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        peak = self.peak_learning_rate
        warmup = float(self.warmup_steps)
        decay_steps = float(max(self.total_steps - self.warmup_steps, 1))
        progress = tf.clip_by_value((step - warmup) / decay_steps, 0.0, 1.0)
        cosine = 0.5 * (1.0 + tf.cos(math.pi * progress))
        decayed = peak * ((1.0 - self.min_lr_ratio) * cosine + self.min_lr_ratio)
        if self.warmup_steps == 0:
            return decayed
        return tf.where(step < warmup, peak * step / warmup, decayed)

    def get_config(self):
        return {"peak_learning_rate": self.peak_learning_rate,
                "total_steps": self.total_steps, "warmup_steps": self.warmup_steps,
                "min_lr_ratio": self.min_lr_ratio, "name": self.name}
