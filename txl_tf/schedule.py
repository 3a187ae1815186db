"""The paper's learning-rate schedule: linear warm-up, then cosine decay."""
import keras


@keras.saving.register_keras_serializable(package="txl_tf")
class WarmupCosineDecay(keras.optimizers.schedules.CosineDecay):
    """`peak * step / warmup_steps` during warm-up, then cosine decay from
    `peak` to `peak * min_lr_ratio` at `total_steps` (constant after).

    This is the paper's TF code (`tf.train.cosine_decay(peak, step - warmup,
    total - warmup, alpha=min_lr_ratio)` after warm-up; `step` is the number
    of updates already applied) in the arguments of the training job, over
    Keras's `CosineDecay` with `warmup_target`: tests/test_schedule.py shows the
    two equal at every step within 1 float32 ulp.
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
