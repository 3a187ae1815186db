"""The paper's learning-rate schedule: linear warm-up, then cosine decay.

The warm-up defaults to a tenth of the steps (at most `MAX_DEFAULT_WARMUP`):
without one, a small model at a high learning rate sits on a loss plateau for
hundreds of steps and leaves it at a moment that float round-off decides
(held-out ppl 260 to 530 by seed on one recipe; 212 to 220 with the warm-up;
docs/training.md, "The warm-up by default").
"""
import math

import keras

from txl_tf.errors import TxlError

DEFAULT_WARMUP_FRACTION = 0.1
MAX_DEFAULT_WARMUP = 4000  # the paper's warm-up of its large enwik8 / text8 models


def default_warmup_steps(total_steps):
    """The warm-up used when none is given: a tenth of `total_steps`, at most
    `MAX_DEFAULT_WARMUP`."""
    return min(int(total_steps * DEFAULT_WARMUP_FRACTION), MAX_DEFAULT_WARMUP)


@keras.saving.register_keras_serializable(package="txl_tf")
class WarmupCosineDecay(keras.optimizers.schedules.CosineDecay):
    """`peak * step / warmup_steps` during warm-up, then cosine decay from
    `peak` to `peak * min_lr_ratio` at `total_steps` (constant after).

    This is the paper's TF code (`tf.train.cosine_decay(peak, step - warmup,
    total - warmup, alpha=min_lr_ratio)` after warm-up; `step` is the number
    of updates already applied) in the arguments of the training job, over
    Keras's `CosineDecay` with `warmup_target`: tests/test_schedule.py shows the
    two equal at every step within 1 float32 ulp.

    Args:
        peak_learning_rate: the rate warm-up reaches, > 0.
        total_steps: updates over the whole run, > 0.
        warmup_steps: in [0, total_steps] (None:
            `default_warmup_steps(total_steps)`; 0: no warm-up).
        min_lr_ratio: the final rate over the peak, in [0, 1].
        name: the schedule's name.

    Raises:
        TxlError: a value out of its range.
    """

    def __init__(self, peak_learning_rate, total_steps, warmup_steps=None, min_lr_ratio=0.004,
                 name="warmup_cosine"):
        if not 0 < peak_learning_rate < math.inf:  # NaN fails it too
            raise TxlError(f"learning rate must be a finite number > 0, got {peak_learning_rate}")
        if not 0 < total_steps < math.inf or int(total_steps) != total_steps:
            raise TxlError(f"total_steps must be an integer > 0, got {total_steps}")
        if warmup_steps is None:
            warmup_steps = default_warmup_steps(total_steps)
        if not 0 <= warmup_steps <= total_steps or int(warmup_steps) != warmup_steps:
            raise TxlError(f"warmup_steps must be an integer in [0, total_steps={total_steps}], "
                           f"got {warmup_steps}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise TxlError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = int(total_steps)
        self.min_lr_ratio = float(min_lr_ratio)
        warmup = int(warmup_steps)
        super().__init__(
            initial_learning_rate=0.0 if warmup else self.peak_learning_rate,
            # Keras needs decay_steps > 0: warm-up over all steps decays in one step.
            decay_steps=max(self.total_steps - warmup, 1), alpha=self.min_lr_ratio,
            name=name, warmup_target=self.peak_learning_rate if warmup else None,
            warmup_steps=warmup)

    def get_config(self):
        return {"peak_learning_rate": self.peak_learning_rate,
                "total_steps": self.total_steps, "warmup_steps": self.warmup_steps,
                "min_lr_ratio": self.min_lr_ratio, "name": self.name}
