"""float16 loss scaling (`CountingLossScaleOptimizer` around the project's
`ReplicaClippedAdam`): the clip sees the unscaled gradient, a skipped step
still counts as a step but not in Adam's bias correction, and the scale is
saved and restored with the optimizer."""
import json

import numpy as np
import tensorflow as tf

from txl_tf.keras_support.keras_compat import CountingLossScaleOptimizer, counting_loss_scale
from txl_tf.learning.optimizer import ReplicaClippedAdam

# Global norm 13, clipped to 0.25.
GRADS = (np.array([3.0, 4.0, 0.0], np.float32), np.array([[12.0]], np.float32))


def _variables():
    return [tf.Variable([1.0, -2.0, 3.0]), tf.Variable([[0.5]])]


def _scaled(scale):
    return CountingLossScaleOptimizer(ReplicaClippedAdam(0.1, global_clipnorm=0.25),
                                      initial_scale=scale)


def test_the_clip_acts_on_the_unscaled_gradient():
    """Adam's moments after two steps show the gradient it was given: with a
    scale of 1024 they equal those of the plain optimizer on the unscaled
    gradient (clipping the scaled one would leave them 1024 times smaller)."""
    plain, scaled = ReplicaClippedAdam(0.1, global_clipnorm=0.25), _scaled(1024.0)
    plain_vars, scaled_vars = _variables(), _variables()
    for _ in range(2):
        plain.apply([tf.constant(g) for g in GRADS], plain_vars)
        scaled.apply([tf.constant(g * 1024.0) for g in GRADS], scaled_vars)
    for mine, theirs in zip(scaled.inner_optimizer.variables, plain.variables):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6, err_msg=mine.name)
    for mine, theirs in zip(scaled_vars, plain_vars):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6)
    assert float(scaled.dynamic_scale.numpy()) == 1024.0


def test_a_skipped_step_counts_and_changes_nothing_else():
    optimizer, variables = _scaled(2.0 ** 15), _variables()
    before = [v.numpy() for v in variables]
    optimizer.apply([tf.constant([np.inf, 0.0, 0.0]), tf.constant(GRADS[1])], variables)
    assert int(optimizer.iterations.numpy()) == 1  # the batch is spent
    assert float(optimizer.dynamic_scale.numpy()) == 2.0 ** 14
    for v, value in zip(variables, before):
        np.testing.assert_array_equal(v.numpy(), value)
    moments = [v for v in optimizer.inner_optimizer.variables
               if v.name.endswith(("momentum", "velocity"))]
    assert len(moments) == 4 and not any(np.any(v.numpy()) for v in moments)
    optimizer.apply([tf.constant(g) for g in GRADS], variables)
    assert int(optimizer.iterations.numpy()) == 2


def test_after_skipped_steps_adam_updates_as_a_fresh_adam():
    """Three skipped steps, then two applied, XLA-compiled: the weights follow
    a fresh Adam's first two updates (bias correction by applied steps), at the
    learning rate of the global steps 3 and 4 (the schedule counts every
    step), while `iterations` counts all five."""
    import keras
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    scaled = CountingLossScaleOptimizer(ReplicaClippedAdam(schedule, global_clipnorm=0.25),
                                        initial_scale=2.0 ** 15)
    scaled_vars = _variables()
    scaled.build(scaled_vars)
    # As in a compiled train step (the skip and the update are branches of a cond).
    apply = tf.function(lambda grads: scaled.apply(grads, scaled_vars), jit_compile=True)
    for _ in range(3):
        apply([tf.constant([np.inf, 0.0, 0.0]), tf.constant(GRADS[1])])
    fresh = ReplicaClippedAdam(keras.optimizers.schedules.ExponentialDecay(
        0.1 * 0.5 ** 3, decay_steps=1, decay_rate=0.5), global_clipnorm=0.25)
    fresh_vars = _variables()
    for _ in range(2):
        scale = float(scaled.dynamic_scale.numpy())
        apply([tf.constant(g * scale) for g in GRADS])
        fresh.apply([tf.constant(g) for g in GRADS], fresh_vars)
        for mine, theirs in zip(scaled_vars, fresh_vars):
            np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6)
    assert int(scaled.iterations.numpy()) == 5
    assert int(scaled.skipped_steps.numpy()) == 3


def test_keras_wrapping_is_replaced_with_its_settings():
    import keras
    keras_lso = keras.optimizers.LossScaleOptimizer(ReplicaClippedAdam(0.1), initial_scale=8.0,
                                                    dynamic_growth_steps=5)
    mine = counting_loss_scale(keras_lso)
    assert isinstance(mine, CountingLossScaleOptimizer)
    assert (mine.initial_scale, mine.dynamic_growth_steps) == (8.0, 5)
    assert mine.inner_optimizer is keras_lso.inner_optimizer
    assert counting_loss_scale(mine) is mine
    adam = ReplicaClippedAdam(0.1)
    assert counting_loss_scale(adam) is adam


def test_compile_under_float16_counts_skipped_steps():
    from txl_tf import TransformerXLConfig, TransformerXLLM
    model = TransformerXLLM(TransformerXLConfig.preset("tiny"), batch_size=2,
                            dtype="mixed_float16")
    adam = ReplicaClippedAdam(0.1, global_clipnorm=0.25)
    model.compile(optimizer=adam, jit_compile=False)
    assert isinstance(model.optimizer, CountingLossScaleOptimizer)
    assert model.optimizer.inner_optimizer is adam


def test_the_scale_is_checkpointed_with_the_optimizer(tmp_path):
    optimizer, variables = _scaled(2.0 ** 15), _variables()
    optimizer.apply([tf.constant([np.inf, 0.0, 0.0]), tf.constant(GRADS[1])], variables)
    for _ in range(3):
        optimizer.apply([tf.constant(g) for g in GRADS], variables)
    path = tf.train.Checkpoint(optimizer=optimizer).save(str(tmp_path / "ckpt"))
    assert any("dynamic_scale" in name for name, _ in tf.train.list_variables(path))

    restored = _scaled(2.0 ** 15)
    restored.build(_variables())
    tf.train.Checkpoint(optimizer=restored).restore(path).assert_existing_objects_matched()
    assert float(restored.dynamic_scale.numpy()) == 2.0 ** 14
    assert int(restored.step_counter.numpy()) == 3
    assert int(restored.iterations.numpy()) == 4
    assert int(restored.skipped_steps.numpy()) == 1


def test_a_float16_checkpoint_without_the_skipped_steps_is_refused_by_name(tmp_path):
    """A float16 run checkpointed before skipped steps were counted apart
    (Keras's own loss-scale optimizer here), whose loss scale shows a skip,
    cannot resume this one: one `TrainingError` naming why, not an assertion
    from TensorFlow (one showing none resumes: test_v0_3_0_artifacts)."""
    import keras
    import pytest
    from training.checkpointing import TrainingCheckpoint
    from training.errors import TrainingError
    from txl_tf import TransformerXLConfig, TransformerXLLM
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    model = TransformerXLLM(TransformerXLConfig.preset("tiny"), batch_size=1)
    for optimizer, save in ((keras.optimizers.LossScaleOptimizer(ReplicaClippedAdam(0.1)), True),
                            (_scaled(2.0 ** 15), False)):
        optimizer.build(model.trainable_variables)
        checkpoint = TrainingCheckpoint(model, optimizer, str(tmp_path), strategy)
        if save:
            optimizer.dynamic_scale.assign(2.0 ** 14)  # halved: a step was skipped
            checkpoint.save()
    with pytest.raises(TrainingError, match="txl_tf 0.3.0, which did not count the steps"):
        checkpoint.restore_latest()


def test_the_job_trains_in_float16_and_resumes_with_its_scale(tmp_path):
    """`--mixed_precision=mixed_float16`: finite losses, the loss scale in the
    checkpoint, and a run stopped at step 2 and resumed ends with the weights
    and scale of an uninterrupted one."""
    from job_helpers import write_text_corpus
    from training import train
    write_text_corpus(tmp_path / "corpus.txt", 10_000, seed=5)

    def run(name, steps):
        return train.run(model_dir=str(tmp_path / name), dataset="text",
                         data_dir=str(tmp_path / "corpus.txt"), cache_dir=str(tmp_path / "cache"),
                         preset="tiny", batch_size=2, train_steps=steps, checkpoint_every=2,
                         log_every=1, final_eval=False, verbose=0, learning_rate=0.01, seed=4,
                         min_lr_ratio=1.0, warmup_steps=0,  # the rate does not depend on steps
                         strategy="one_device", mixed_precision="mixed_float16")

    run("full", 4)
    run("resumed", 2)
    run("resumed", 4)
    losses = [json.loads(line)["loss"] for line in open(tmp_path / "full" / "train_log.jsonl")]
    assert len(losses) == 4 and np.all(np.isfinite(losses))
    checkpoints = {}
    for name in ("full", "resumed"):
        path = tf.train.latest_checkpoint(str(tmp_path / name / "checkpoints"))
        reader = tf.train.load_checkpoint(path)
        scale = [n for n in reader.get_variable_to_shape_map() if "dynamic_scale" in n]
        assert len(scale) == 1, sorted(reader.get_variable_to_shape_map())
        checkpoints[name] = reader.get_tensor(scale[0])
    assert checkpoints["resumed"] == checkpoints["full"] > 0
    with np.load(tmp_path / "full" / "export" / "weights.npz") as a, \
            np.load(tmp_path / "resumed" / "export" / "weights.npz") as b:
        for name in a.files:
            np.testing.assert_array_equal(b[name], a[name], err_msg=name)


def _v030_store(optimizer):
    """The store Keras saves of `optimizer` as txl_tf 0.3.0 laid it out: the
    same variables in the same order, without `skipped_steps`."""
    return {str(i): v.numpy() for i, v in
            enumerate(v for v in optimizer.variables if v is not optimizer.skipped_steps)}


def _skip_then_apply(optimizer, variables, applied=2):
    optimizer.apply([tf.constant([np.inf, 0.0, 0.0]), tf.constant(GRADS[1])], variables)
    for _ in range(applied):
        optimizer.apply([tf.constant(g) for g in GRADS], variables)


def test_an_optimizer_saved_by_0_3_0_is_read_with_its_scale_and_counter():
    """A 0.3.0 store (no `skipped_steps`) around a plain Adam: every variable
    read, the halved scale and the growth counter included (Keras alone
    skipped the store with a warning, and the resumed fit started again at
    the initial scale)."""
    import keras
    saved, variables = CountingLossScaleOptimizer(keras.optimizers.Adam(0.1)), _variables()
    _skip_then_apply(saved, variables)
    restored = CountingLossScaleOptimizer(keras.optimizers.Adam(0.1))
    restored.build(_variables())
    restored.load_own_variables(_v030_store(saved))
    assert float(restored.dynamic_scale.numpy()) == 2.0 ** 14
    assert int(restored.step_counter.numpy()) == 2
    assert int(restored.iterations.numpy()) == 3
    assert int(restored.skipped_steps.numpy()) == 0
    for mine, theirs in zip(restored.inner_optimizer.variables, saved.inner_optimizer.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=mine.name)


def test_a_0_3_0_replica_clipped_adam_is_read_without_skips_and_refused_after_one():
    """Around `ReplicaClippedAdam` (whose bias correction needs the count):
    a 0.3.0 store whose scale shows no skipped step is read exactly with
    `skipped_steps` 0; one that skipped steps is one `TxlError` naming 0.3.0."""
    import pytest
    from txl_tf.errors import TxlError
    clean, variables = _scaled(2.0 ** 15), _variables()
    for _ in range(3):
        clean.apply([tf.constant(g) for g in GRADS], variables)
    restored = _scaled(2.0 ** 15)
    restored.build(_variables())
    restored.load_own_variables(_v030_store(clean))
    assert (int(restored.iterations.numpy()), int(restored.step_counter.numpy())) == (3, 3)
    assert int(restored.skipped_steps.numpy()) == 0
    for mine, theirs in zip(restored.inner_optimizer.variables, clean.inner_optimizer.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=mine.name)

    skipped = _scaled(2.0 ** 15)
    _skip_then_apply(skipped, _variables())
    refusing = _scaled(2.0 ** 15)
    refusing.build(_variables())
    with pytest.raises(TxlError, match="saved by txl_tf 0.3.0.*compile=False"):
        refusing.load_own_variables(_v030_store(skipped))
    assert float(refusing.dynamic_scale.numpy()) == 2.0 ** 15  # nothing half-read


def test_a_keras_file_of_0_3_0_keeps_its_loss_scale(tmp_path, monkeypatch):
    """End to end through a `.keras` file: the optimizer written with 0.3.0's
    variables (its class had no `skipped_steps`) is loaded whole, with no
    "Skipping variable loading" warning."""
    import warnings
    import keras
    with monkeypatch.context() as patch:  # 0.3.0's build: Keras's, nothing added
        patch.setattr(CountingLossScaleOptimizer, "build",
                      keras.optimizers.LossScaleOptimizer.build)
        model = keras.Sequential([keras.Input([3]), keras.layers.Dense(1)])
        optimizer = CountingLossScaleOptimizer(keras.optimizers.Adam(0.1))
        model.compile(optimizer=optimizer, loss="mse")
        optimizer.build(model.trainable_variables)
        assert not hasattr(optimizer, "skipped_steps")
        optimizer.dynamic_scale.assign(2.0 ** 13)  # as after two skipped steps, then one
        optimizer.step_counter.assign(1)
        optimizer.iterations.assign(3)
        model.save(tmp_path / "old.keras")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Skipping variable loading")
        loaded = keras.models.load_model(tmp_path / "old.keras")
    assert float(loaded.optimizer.dynamic_scale.numpy()) == 2.0 ** 13
    assert int(loaded.optimizer.step_counter.numpy()) == 1
    assert int(loaded.optimizer.iterations.numpy()) == 3
    assert int(loaded.optimizer.skipped_steps.numpy()) == 0
    loaded.fit(np.ones([4, 3], np.float32), np.ones([4, 1], np.float32), verbose=0)
    assert int(loaded.optimizer.iterations.numpy()) == 4
