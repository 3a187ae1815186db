"""Keras's own workflows with the stream models: `BackupAndRestore`,
`ModelCheckpoint` then `load_model` / `load_weights`, `clone_model`; each
resumed run equals the run that never stopped, bit for bit (weights,
optimizer state, memory)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import (InputError, ReplicaClippedAdam, TransformerXLBackbone,
                    TransformerXLCausalLM, TransformerXLConfig, TransformerXLLM, TxlError)

N_TOKEN, T, B, STEPS = 40, 4, 2, 3


def config():
    return TransformerXLConfig.preset("tiny", n_token=N_TOKEN, tgt_len=T, mem_len=T, dropout=0.0)


def streams():
    """STEPS stream batches: `(token_ids, labels)` [B, T], each continuing the last."""
    ids = np.random.default_rng(0).integers(0, N_TOKEN, (B, STEPS * T + 1)).astype(np.int32)
    xs = np.stack([ids[:, s * T:(s + 1) * T] for s in range(STEPS)])
    ys = np.stack([ids[:, s * T + 1:(s + 1) * T + 1] for s in range(STEPS)])
    return tf.data.Dataset.from_tensor_slices((xs, ys))


def documents():
    """The same batches as stream batches of documents that start at each epoch."""
    first = np.arange(STEPS) == 0
    return streams().enumerate().map(lambda s, xy: (
        {"token_ids": xy[0], "document_start": tf.fill([B], tf.gather(first, s))}, xy[1]))


def stateful(seed=0):
    keras.utils.set_random_seed(seed)
    model = TransformerXLLM(config(), batch_size=B)
    model.compile(optimizer=ReplicaClippedAdam(1e-2, global_clipnorm=0.25))
    return model


def causal_lm(seed=0):
    keras.utils.set_random_seed(seed)
    model = TransformerXLCausalLM(TransformerXLBackbone(**config().to_dict()))
    model.compile(optimizer=ReplicaClippedAdam(1e-2, global_clipnorm=0.25), sampler="greedy")
    return model


def training_state(model):
    memory = model._streams.value[0]
    return ([v.numpy() for v in model.weights] + [v.numpy() for v in model.optimizer.variables]
            + [memory.mems.numpy(), memory.mem_mask.numpy()])


def assert_same_state(a, b):
    state_a, state_b = training_state(a), training_state(b)
    assert len(state_a) == len(state_b)
    for x, y in zip(state_a, state_b):
        np.testing.assert_array_equal(x, y)


class Interrupted(Exception):
    pass


class InterruptAt(keras.callbacks.Callback):
    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise Interrupted()


def test_backup_and_restore_resumes_as_the_uninterrupted_run(tmp_path, make=stateful,
                                                             data=streams):
    """Interrupted in its second epoch, `fit` with the same `BackupAndRestore`
    in a new model goes on from the first epoch's end: weights, Adam's state
    and the memory equal the run that was not interrupted. A later `fit` of
    that model starts at its own first epoch again (Keras leaves the
    restored epoch set)."""
    straight = make()
    straight.fit(data(), epochs=2, verbose=0)
    backup = str(tmp_path / "backup")
    with pytest.raises(Interrupted):
        make().fit(data(), epochs=2, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(backup), InterruptAt(1, 1)])
    resumed = make(seed=1)
    history = resumed.fit(data(), epochs=2, verbose=0,
                          callbacks=[keras.callbacks.BackupAndRestore(backup)])
    assert len(history.history["loss"]) == 1
    assert_same_state(straight, resumed)
    steps = int(resumed.optimizer.iterations.numpy())
    resumed.fit(data(), epochs=1, verbose=0)  # was: no epoch run
    assert int(resumed.optimizer.iterations.numpy()) == steps + STEPS


def test_a_weights_checkpoint_restores_the_optimizer_and_the_memory(tmp_path):
    """`ModelCheckpoint(save_weights_only=True)`, then `load_weights` into a
    new compiled model and `fit` on: as one `fit` (Keras skipped the
    optimizer's state of a file loaded before the optimizer was built)."""
    straight = stateful()
    straight.fit(streams(), epochs=2, verbose=0)
    path = str(tmp_path / "lm.weights.h5")
    stateful().fit(streams(), verbose=0, callbacks=[
        keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
    model = stateful(seed=1)
    model.load_weights(path)
    assert int(model.optimizer.iterations.numpy()) == STEPS
    model.fit(streams(), epochs=2, initial_epoch=1, verbose=0)
    assert_same_state(straight, model)


def test_a_keras_checkpoint_of_the_causal_lm_restores_its_compile(tmp_path):
    """`load_model` of a compiled `TransformerXLCausalLM` gets its optimizer,
    Adam's state and sampler (Keras skipped keras-hub's custom `compile`,
    leaving its default Adam(2e-5)), and `fit` goes on as one `fit`."""
    straight = causal_lm()
    straight.fit(documents(), epochs=2, verbose=0)
    path = str(tmp_path / "lm.keras")
    causal_lm().fit(documents(), verbose=0, callbacks=[keras.callbacks.ModelCheckpoint(path)])
    model = keras.models.load_model(path)
    assert isinstance(model.optimizer, ReplicaClippedAdam)
    assert int(model.optimizer.iterations.numpy()) == STEPS
    assert isinstance(model.sampler, type(straight.sampler))
    model.fit(documents(), epochs=2, initial_epoch=1, verbose=0)
    assert_same_state(straight, model)


def test_the_causal_lms_memory_is_cleared_by_load_weights(tmp_path):
    """Its memory is not saved: weights loaded over a run leave none of the
    memory the old weights computed, as a new model would have."""
    model = causal_lm()
    continuous = streams().map(lambda x, y: (
        {"token_ids": x, "document_start": tf.zeros([B], tf.bool)}, y))
    model.fit(continuous, verbose=0)
    path = str(tmp_path / "lm.weights.h5")
    model.save_weights(path)
    assert model._streams.value[0].mem_mask.numpy().all()
    model.load_weights(path)
    assert not model._streams.value[0].mem_mask.numpy().any()


def test_backups_within_an_epoch_are_one_clear_error(tmp_path):
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), save_freq=2)
    with pytest.raises(InputError, match=r"BackupAndRestore\(save_freq=2\) backs up within an "
                                         r"epoch.*use save_freq='epoch'"):
        stateful().fit(streams(), verbose=0, callbacks=[backup])


def test_clone_model_is_one_clear_error():
    model = stateful()
    with pytest.raises(TxlError, match=r"keras.models.clone_model rebuilds a model layer by "
                                       r"layer: copy a Transformer-XL model with "
                                       r"type\(model\).from_config"):
        keras.models.clone_model(model)
    copy = type(model).from_config(model.get_config())
    copy.set_weights(model.get_weights())
    assert type(copy) is TransformerXLLM


def test_a_step_interrupted_before_its_update_leaves_the_memory_of_its_batch():
    """Ctrl-C (or an error) inside an eager stream step, after the batch is
    read but before the optimizer applies: the memory stays the one that
    batch reads, so `fit` on the batches from `optimizer.iterations` on is
    one uninterrupted `fit`."""
    def eager():
        model = stateful()
        model.compile(optimizer=model.optimizer, run_eagerly=True)
        return model
    straight = eager()
    straight.fit(streams(), verbose=0)
    model = eager()
    apply, calls = model.optimizer.apply, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return apply(*args, **kwargs)
    model.optimizer.apply = interrupted
    with pytest.raises(KeyboardInterrupt):
        model.fit(streams(), verbose=0)
    model.optimizer.apply = apply
    assert int(model.optimizer.iterations.numpy()) == 1
    model.fit(streams().skip(1), verbose=0)
    assert_same_state(straight, model)


def test_evaluate_builds_no_optimizer_slots_and_fit_still_trains():
    """`evaluate` reads no optimizer slot: it built Adam's two (twice the
    weights: 6.7 GB at lm1b_large, 3.6x the weights in all at batch 1); `fit`
    builds them, and a model evaluated first trains as one that was not."""
    evaluated, fresh = stateful(), stateful()
    evaluated.evaluate(streams(), verbose=0)
    slots = sum(int(np.prod(v.shape)) for v in evaluated.optimizer.variables)
    assert not evaluated.optimizer.built and slots <= 2  # its iteration and learning rate
    for model in (evaluated, fresh):
        model.reset_memory()
        model.fit(streams(), epochs=1, verbose=0)
    assert evaluated.optimizer.built and len(evaluated.optimizer.variables) > 2
    for a, b in zip(evaluated.weights + evaluated.optimizer.variables,
                    fresh.weights + fresh.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fit_without_a_strategy_leaves_nothing_in_tensorflows_gradient_registry():
    """Keras's gradient sum under the default strategy registers a gradient
    function in TensorFlow's process-wide registry at each trace, keeping the
    train step's graph alive after the model is gone (tensorflow/tensorflow
    #97697); `ReplicaClippedAdam` has one replica's gradients to sum there and
    skips it, so models made and fitted in a loop do not grow the process."""
    from tensorflow.python.framework import ops  # the registry is TensorFlow's own

    def registered():
        return {name for name in ops._gradient_registry.list()
                if name.startswith("CustomGradient")}
    before = registered()
    stateful().fit(streams(), epochs=1, verbose=0)
    assert registered() == before
