"""The stateful Keras model: fit/evaluate/predict, tf.distribute, precision, XLA, learning."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import ReplicaClippedAdam, TransformerXLConfig, TransformerXLLM
from txl_tf.data import eval_segment_dataset
from txl_tf.generation.decoder import Decoder
from txl_tf.learning.evaluation import evaluate_ids
from txl_tf.weights.checkpoints import get_weights, set_weights
from training.strategy import mirrored_strategy
from bfloat16_cpu import needs_bfloat16_matmuls

T = 8


def stream_batches(streams, steps, tgt_len=T):
    """Segment s of every stream: inputs [B, T] and next-token labels."""
    xs = [streams[:, s * tgt_len:(s + 1) * tgt_len] for s in range(steps)]
    ys = [streams[:, s * tgt_len + 1:(s + 1) * tgt_len + 1] for s in range(steps)]
    return tf.data.Dataset.from_tensor_slices((np.stack(xs), np.stack(ys)))


def tiny(**overrides):
    return TransformerXLConfig.preset("tiny", dropout=0.0, tgt_len=T, mem_len=T, **overrides)


def test_fit_evaluate_predict_and_memory_carry():
    keras.utils.set_random_seed(0)
    model = TransformerXLLM(tiny(), batch_size=2)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    streams = np.random.default_rng(0).integers(0, 256, (2, 4 * T + 1)).astype(np.int32)
    data = stream_batches(streams, 4)
    history = model.fit(data, epochs=1, verbose=0)
    assert set(history.history) == {"loss", "bpc", "ppl"}
    loss = history.history["loss"][0]
    assert history.history["bpc"][0] == pytest.approx(loss / np.log(2), rel=1e-5)
    assert history.history["ppl"][0] == pytest.approx(np.exp(loss), rel=1e-5)
    assert model.memory.mem_mask.numpy().all()
    # Calling the model carries memory too: its layer-0 slots are now the embeddings.
    model(streams[:, :T])
    emb = model.core.word_emb(streams[:, :T]).numpy()
    np.testing.assert_allclose(model.memory.mems.numpy()[0], emb, atol=1e-6)
    model.reset_memory()
    assert not model.memory.mem_mask.numpy().any() and not model.memory.mems.numpy().any()
    model(streams[:, :T])
    model.reset_state()  # Keras's name for it
    assert not model.memory.mem_mask.numpy().any() and not model.memory.mems.numpy().any()
    result = model.evaluate(data, verbose=0, return_dict=True)
    assert np.isfinite(result["loss"])
    log_probs = model.predict(data.map(lambda x, y: x), verbose=0)
    assert log_probs.shape == (8, T, 256)


def test_keras_file_round_trip_keeps_outputs_and_memory(tmp_path):
    keras.utils.set_random_seed(1)
    model = TransformerXLLM(tiny(cutoffs=[100, 200], div_val=2), batch_size=2)
    x = np.random.default_rng(1).integers(0, 256, (2, T)).astype(np.int32)
    model(x)  # fills the memory
    path = str(tmp_path / "lm.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.config == model.config
    np.testing.assert_array_equal(loaded.mems.numpy(), model.mems.numpy())
    np.testing.assert_array_equal(loaded(x).numpy(), model(x).numpy())


def test_keras_file_keeps_the_lengths_generate_reads_with(tmp_path):
    model = TransformerXLLM(tiny(), batch_size=2, mem_len=5, segment_len=3)
    model.save(str(tmp_path / "lm.keras"))
    loaded = keras.models.load_model(str(tmp_path / "lm.keras"))
    assert (loaded.mem_len, loaded.segment_len, loaded.batch_size) == (5, 3, 2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch_size=0), "batch_size must be a positive integer, got 0"),
    (dict(batch_size=2.5), "batch_size must be a positive integer, got 2.5"),
    (dict(batch_size=2, mem_len="16"), "mem_len must be an integer >= 0"),
    (dict(batch_size=2, memlen=16), r"unknown arguments \['memlen'\]"),  # was dropped
])
def test_bad_constructor_arguments_are_named(kwargs, match):
    from txl_tf import TxlError
    with pytest.raises(TxlError, match=match):
        TransformerXLLM(tiny(), **kwargs)


def padded_corpus(batch, seed):
    """Ids whose streams do not fill the last segment (and one stream is shorter)."""
    return np.random.default_rng(seed).integers(0, 256, batch * 3 * T + batch - 1)


def test_evaluate_weights_tokens_like_evaluate_ids():
    keras.utils.set_random_seed(6)
    model = TransformerXLLM(tiny(), batch_size=3)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    ids = padded_corpus(3, seed=6)
    weights = np.concatenate([w.numpy() for _, _, w in eval_segment_dataset(ids, 3, T)])
    assert 0 < weights.sum() < weights.size  # the last segment really is padded
    result = model.evaluate(eval_segment_dataset(ids, 3, T), verbose=0, return_dict=True)
    expected = evaluate_ids(model.core, ids, batch_size=3, tgt_len=T, mem_len=model.mem_len)
    assert result["loss"] == pytest.approx(expected["loss"], abs=1e-5)
    assert result["bpc"] == pytest.approx(expected["bpc"], abs=1e-5)


def test_training_weights_drop_masked_positions_from_loss_and_gradient():
    keras.utils.set_random_seed(8)
    streams = np.random.default_rng(8).integers(0, 256, (2, T + 1)).astype(np.int32)
    x, y = streams[:, :T], streams[:, 1:]
    w = np.ones((2, T), np.float32)
    w[:, T // 2:] = 0.0
    y_other = np.where(w > 0, y, (y + 1) % 256)  # differs only where the weight is 0
    weights = get_weights(TransformerXLLM(tiny(), batch_size=2).core)
    results = []
    for labels in (y, y_other):
        model = TransformerXLLM(tiny(), batch_size=2)
        set_weights(model.core, weights)
        nll = model.core(x, model.core.initial_memory(2), targets=labels)[0].numpy()
        model.compile(optimizer=keras.optimizers.Adam(1e-2))
        loss = model.fit(x, labels, sample_weight=w, batch_size=2, verbose=0).history["loss"][0]
        assert loss == pytest.approx((nll * w).sum() / w.sum(), rel=1e-5)
        results.append(get_weights(model.core))
    for name, value in results[0].items():
        np.testing.assert_array_equal(results[1][name], value, err_msg=name)


def test_evaluation_never_touches_the_training_memory():
    keras.utils.set_random_seed(7)
    streams = np.random.default_rng(7).integers(0, 256, (2, 3 * T + 1)).astype(np.int32)
    valid_ids = padded_corpus(2, seed=9)
    valid = eval_segment_dataset(valid_ids, 2, T)
    weights = get_weights(TransformerXLLM(tiny(), batch_size=2).core)
    runs = {}
    for validate in (False, True):
        model = TransformerXLLM(tiny(), batch_size=2)
        set_weights(model.core, weights)
        model.compile(optimizer=keras.optimizers.Adam(1e-2))
        if validate:  # leaves evaluation's memory full before fit validates
            model.evaluate(valid, verbose=0)
        history = model.fit(stream_batches(streams, 2), verbose=0,
                            validation_data=valid if validate else None).history
        if validate:  # what fit's validation should report, from a fresh memory
            expected = evaluate_ids(model.core, valid_ids, batch_size=2, tgt_len=T)["loss"]
        memory = (model.mems.numpy(), model.mem_mask.numpy())
        next_loss = model.fit(stream_batches(streams, 3).skip(2), verbose=0).history["loss"]
        runs[validate] = memory, next_loss
    np.testing.assert_array_equal(runs[True][0][0], runs[False][0][0])
    np.testing.assert_array_equal(runs[True][0][1], runs[False][0][1])
    assert runs[True][1] == runs[False][1]
    assert history["val_loss"][0] == pytest.approx(expected, abs=1e-5)  # via evaluate()
    first = model.evaluate(valid, verbose=0, return_dict=True)
    assert model.evaluate(valid, verbose=0, return_dict=True) == first


OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(1e-2),
    # A clip small enough to act on every step: it must see the summed gradient.
    "clipped": lambda: ReplicaClippedAdam(1e-2, global_clipnorm=0.05),
}


def _losses_and_memory(strategy, weights, streams, optimizer, token_weights, steps=3):
    with strategy.scope():
        model = TransformerXLLM(tiny(), batch_size=4 // strategy.num_replicas_in_sync)
        set_weights(model.core, weights)
        model.compile(optimizer=OPTIMIZERS[optimizer]())
    data = stream_batches(streams, steps)
    if token_weights is not None:
        data = tf.data.Dataset.zip((data, tf.data.Dataset.from_tensor_slices(token_weights)))
        data = data.map(lambda xy, w: (xy[0], xy[1], w))
    logged = []  # what a callback reads after each step (the job's train_log.jsonl)
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: logged.append(float(logs["loss"])))
    history = model.fit(data.repeat(), epochs=steps, steps_per_epoch=1, verbose=0,
                        callbacks=[record])
    assert logged == pytest.approx(history.history["loss"], rel=1e-6)
    per_replica = strategy.experimental_local_results(
        strategy.run(lambda: tf.convert_to_tensor(model.mems)))
    evaluation = model.evaluate(eval_segment_dataset(padded_corpus(4, seed=3), 4, T),
                                verbose=0, return_dict=True)
    return history.history["loss"], [np.asarray(m) for m in per_replica], model, evaluation


@pytest.mark.parametrize("optimizer,weighted", [("adam", False), ("clipped", False),
                                                ("adam", True)])
def test_one_replica_equals_two_replicas_with_memory_carried(optimizer, weighted):
    keras.utils.set_random_seed(2)
    weights = get_weights(TransformerXLLM(tiny(), batch_size=4).core)
    streams = np.random.default_rng(2).integers(0, 256, (4, 3 * T + 1)).astype(np.int32)
    # Uneven weights: replica 1 (streams 2-3) holds fewer weighted tokens than replica 0.
    token_weights = ((np.random.default_rng(4).random((3, 4, T)) < [[.9], [.9], [.3], [.3]])
                     .astype(np.float32) if weighted else None)
    one, (mem_one,), single, eval_one = _losses_and_memory(
        tf.distribute.OneDeviceStrategy("/cpu:0"), weights, streams, optimizer, token_weights)
    two, mems_two, double, eval_two = _losses_and_memory(
        mirrored_strategy(["/cpu:0", "/cpu:1"]), weights, streams, optimizer,
        token_weights)
    np.testing.assert_allclose(two, one, rtol=1e-4)
    assert len(set(np.round(one, 4))) == 3  # the three steps really differ
    # Replica 0 keeps streams 0-1, replica 1 streams 2-3, exactly as one device does.
    assert len(mems_two) == 2 and mems_two[0].shape[1] == 2
    np.testing.assert_allclose(mems_two[0], mem_one[:, :2], atol=1e-4)
    np.testing.assert_allclose(mems_two[1], mem_one[:, 2:], atol=1e-4)
    for a, b in zip(get_weights(single.core).values(), get_weights(double.core).values()):
        np.testing.assert_allclose(a, b, atol=1e-4)
    assert eval_two["loss"] == pytest.approx(eval_one["loss"], rel=1e-4)


@pytest.mark.parametrize("policy,tolerance", [
    ("mixed_float16", 0.02), pytest.param("mixed_bfloat16", 0.15, marks=needs_bfloat16_matmuls)])
def test_mixed_precision_is_finite_and_close_to_float32(policy, tolerance):
    keras.utils.set_random_seed(3)
    cfg = tiny(cutoffs=[100, 200], div_val=2)
    reference = TransformerXLLM(cfg, batch_size=2)
    x = np.random.default_rng(3).integers(0, 256, (2, T)).astype(np.int32)
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = TransformerXLLM(cfg, batch_size=2)
        set_weights(model.core, get_weights(reference.core))
        for _ in range(2):  # the second call attends to the (float32) memory
            expected, got = reference(x).numpy(), model(x).numpy()
        assert got.dtype == np.float32 and np.isfinite(got).all()
        assert np.abs(np.exp(got) - np.exp(expected)).max() < tolerance
        assert np.abs(got - expected).mean() < tolerance
        model.compile(optimizer=keras.optimizers.Adam(1e-3))
        history = model.fit(stream_batches(np.tile(x, (1, 3))[:, :2 * T + 1], 2),
                            epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("softmax", [
    dict(cutoffs=[100], div_val=2),
    dict(cutoffs=[60, 120, 200], div_val=1, d_embed=24),  # one table sliced per bin, projected
    dict(cutoffs=[60, 120, 200], div_val=2, tie_projs=[False, True, False, True])])
def test_jit_compiled_fit_steps_match_graph_steps(softmax, monkeypatch):
    """`fit` with XLA and without, from the same weights and seed, with the
    job's optimizer (clip), dropout and the adaptive softmax (one tail bin or
    three, read in chunks under XLA: `layers.tail_nll`): the same loss at
    each of 3 steps and the same weights after them, within float32
    round-off. Dropout draws its words from the counter hash in both (the
    graph's dropout told it is under XLA; without XLA it draws Philox's), so
    the masks are the same."""
    from txl_tf.layers import dropout
    streams = np.random.default_rng(4).integers(0, 256, (2, 3 * T + 1)).astype(np.int32)
    config = tiny(n_layer=1, dropatt=0.1, **softmax).replace(dropout=0.1)
    losses, trained = [], []
    weights = None
    for jit in (False, True):
        monkeypatch.setattr(dropout, "compiling_with_xla", lambda: True)
        keras.utils.set_random_seed(4)
        model = TransformerXLLM(config, batch_size=2)
        weights = weights or get_weights(model.core)
        set_weights(model.core, weights)
        model.compile(optimizer=ReplicaClippedAdam(1e-2, global_clipnorm=0.25), jit_compile=jit)
        history = model.fit(stream_batches(streams, 3), epochs=3, steps_per_epoch=1, verbose=0)
        assert model.jit_compile is jit and len(history.history["loss"]) == 3
        losses.append(history.history["loss"])
        trained.append(get_weights(model.core))
    np.testing.assert_allclose(losses[1], losses[0], rtol=2e-6)
    for name, value in trained[0].items():
        # Adam divides by the root of the squared gradients: where those are
        # near 0 it magnifies their round-off (up to ~3e-5 seen): a hundredth
        # of a step of the rate 1e-2 is allowed.
        np.testing.assert_allclose(trained[1][name], value, rtol=1e-5, atol=1e-4, err_msg=name)



def _xla_run_under(device, weights, streams):
    """Losses of `fit`, `train_on_batch`, `evaluate`, `predict` with XLA
    under `OneDeviceStrategy(device)`, and where the memory lives."""
    with tf.distribute.OneDeviceStrategy(device).scope():
        model = TransformerXLLM(tiny(n_layer=1), batch_size=2)
        set_weights(model.core, weights)
        model.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=True)
    data = stream_batches(streams, 3)
    history = model.fit(data.take(2), epochs=1, verbose=0)
    x, y = next(iter(data.skip(2)))
    step = model.train_on_batch(x, y, return_dict=True)
    evaluation = model.evaluate(data, verbose=0, return_dict=True)
    log_probs = model.predict(data.map(lambda x, y: x), verbose=0)
    prompts = {"token_ids": streams[:, :T], "padding_mask": np.ones((2, T), bool)}
    generated = model.generate(prompts, max_length=T + 3)["token_ids"]
    decoded = Decoder(model.core).generate(streams[:, :T], 3, seed=0).ids
    return ([*history.history["loss"], step["loss"], evaluation["loss"]], log_probs,
            (np.asarray(generated), decoded), model.mems.value.device)


def test_xla_steps_run_on_the_device_of_a_one_device_strategy():
    """Under a `OneDeviceStrategy` of a device other than the default one (the
    CPU of a machine with a GPU, a second GPU; here the second logical CPU),
    the XLA steps, `generate` and a `Decoder` of its core run there, beside
    the variables the strategy put there (they ran on the default device:
    "Trying to access resource ... located in device"), and compute what
    they compute on the default one."""
    keras.utils.set_random_seed(5)
    weights = get_weights(TransformerXLLM(tiny(n_layer=1), batch_size=2).core)
    streams = np.random.default_rng(5).integers(0, 256, (2, 3 * T + 1)).astype(np.int32)
    losses, log_probs, ids, device = _xla_run_under("/cpu:0", weights, streams)
    other_losses, other_log_probs, other_ids, other_device = _xla_run_under(
        "/cpu:1", weights, streams)
    assert device.endswith("CPU:0") and other_device.endswith("CPU:1")
    np.testing.assert_allclose(other_losses, losses, rtol=1e-6)
    np.testing.assert_allclose(other_log_probs, log_probs, atol=1e-6)
    for other, reference in zip(other_ids, ids):  # keras-hub's generate, the Decoder's
        np.testing.assert_array_equal(other, reference)


def test_out_of_range_ids_are_one_clear_error_under_xla():
    """XLA drops the core's range assertion (a bad id would be clamped by the
    gather, a bad target give NaN): `fit`, `evaluate` and `predict` check ids
    and targets in the input pipeline instead, raising `InputError` with the
    graph check's message (that in-range data trains as without XLA:
    `test_jit_compiled_fit_steps_match_graph_steps`)."""
    from txl_tf import InputError
    model = TransformerXLLM(tiny(n_layer=1), batch_size=2)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=True)
    streams = np.random.default_rng(7).integers(0, 256, (2, 2 * T + 1)).astype(np.int32)
    x, y = (np.stack([streams[:, s:s + T], streams[:, s + T:s + 2 * T]]) for s in (0, 1))
    vocab = "empty or out of range for a vocabulary of 256 tokens; min id: "
    bad = {"token_ids": (x.copy(), 300), "targets": (y.copy(), -5)}
    for name, (ids, value) in bad.items():
        ids[1, 0, 3] = value
        data = (ids, y) if name == "token_ids" else (x, ids)
        low, high = min(value, ids.min()), max(value, ids.max())
        for call in (model.fit, model.evaluate):
            with pytest.raises(InputError, match=f"^{name} {vocab}{low} max id: {high}$"):
                call(tf.data.Dataset.from_tensor_slices(data), verbose=0)
    with pytest.raises(InputError, match="^token_ids " + vocab):
        model.predict(tf.data.Dataset.from_tensor_slices(bad["token_ids"][0]), verbose=0)
    with pytest.raises(InputError, match="token id 300 at position"):  # arrays: at once
        model.fit(bad["token_ids"][0][1], y[1], verbose=0)


def copy_task_streams(n_streams, n_chunks, vocab, seed):
    """Each stream is chunks of T random tokens, every chunk written twice."""
    rng = np.random.default_rng(seed)
    chunks = rng.integers(0, vocab, (n_streams, n_chunks, 1, T))
    return np.repeat(chunks, 2, axis=2).reshape(n_streams, -1).astype(np.int32)


def recall_accuracy(model, streams):
    """Accuracy on the repeated chunks, whose answers lie a full segment back."""
    model.reset_memory()
    correct = total = 0
    for s in range(streams.shape[1] // T - 1):
        x = streams[:, s * T:(s + 1) * T]
        y = streams[:, s * T + 1:(s + 1) * T + 1]
        pred = np.argmax(model(x).numpy(), -1)
        if s % 2 == 1:  # second copy: labels 0..T-2 are copies of the previous segment
            correct += (pred[:, :T - 1] == y[:, :T - 1]).sum()
            total += y[:, :T - 1].size
    return correct / total


def test_memory_lets_a_tiny_model_recall_beyond_the_segment():
    vocab, batch = 16, 16
    cfg = tiny(n_token=vocab, n_layer=2, d_model=64, n_head=4, d_head=16, d_inner=128)
    train = copy_task_streams(batch, 300, vocab, seed=5)
    test = copy_task_streams(batch, 10, vocab, seed=6)
    accuracy = {}
    for mem_len in (T, 0):
        keras.utils.set_random_seed(5)
        model = TransformerXLLM(cfg, batch_size=batch, mem_len=mem_len)
        model.compile(optimizer=keras.optimizers.Adam(3e-3, global_clipnorm=0.25))
        model.fit(stream_batches(train, train.shape[1] // T - 1), epochs=1, verbose=0)
        accuracy[mem_len] = recall_accuracy(model, test)
    assert accuracy[T] >= 0.9, accuracy
    assert accuracy[0] < 0.2, accuracy  # chance is 1/16


def test_batches_of_another_size_are_one_clear_error():
    """A dataset without drop_remainder, or arrays / a batch_size that do not
    fit the memory's batch: an error naming the model's batch size and the fix."""
    from txl_tf import InputError
    model = TransformerXLLM(tiny(), batch_size=2)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    streams = np.random.default_rng(2).integers(0, 256, (5, 2 * T + 1)).astype(np.int32)
    x, y = streams[:, :T], streams[:, 1:T + 1]
    unbatched = tf.data.Dataset.from_tensor_slices((x, y))
    fix = "this model holds memory for batches of 2 streams.*drop_remainder=True"
    for call in (lambda: model.fit(unbatched.batch(2), verbose=0),
                 lambda: model.evaluate(unbatched.batch(2), verbose=0),
                 lambda: model.predict(unbatched.map(lambda a, b: a).batch(2), verbose=0)):
        with pytest.raises(InputError, match="no fixed size; " + fix):
            call()
    with pytest.raises(InputError, match="batches of 4; " + fix):
        model.fit(unbatched.batch(4, drop_remainder=True), verbose=0)
    with pytest.raises(InputError, match=r"5 rows \(not a multiple of 2\); " + fix):
        model.predict(x, verbose=0)
    with pytest.raises(InputError, match="batch_size=4; " + fix):
        model.predict(x[:4], batch_size=4, verbose=0)
    assert model.predict(x[:4], verbose=0).shape == (4, T, 256)  # Keras's default 32 not used
    model.fit(x[:4], y[:4], verbose=0)
    model.fit(unbatched.batch(2, drop_remainder=True), verbose=0)
    with pytest.raises(InputError, match="shuffle=True would move rows between batches"):
        model.fit(x[:4], y[:4], shuffle=True, verbose=0)  # Keras's default for arrays


def test_keras_file_of_a_compiled_model_goes_on_training_where_it_stopped(tmp_path):
    """`.keras` keeps compile()'s arguments and the optimizer's state (Adam's
    slots, the step driving the schedule), so save / load / fit equals one fit."""
    from txl_tf import WarmupCosineDecay
    streams = np.random.default_rng(3).integers(0, 256, (2, 6 * T + 1)).astype(np.int32)
    first, second = stream_batches(streams, 3), stream_batches(streams[:, 3 * T:], 3)

    def compiled():
        keras.utils.set_random_seed(4)
        model = TransformerXLLM(tiny(), batch_size=2)
        model.compile(optimizer=ReplicaClippedAdam(
            learning_rate=WarmupCosineDecay(1e-2, total_steps=6, warmup_steps=2),
            global_clipnorm=0.25))
        return model

    straight = compiled()
    straight.fit(first.concatenate(second), verbose=0)
    model = compiled()
    model.fit(first, verbose=0)
    model.save(str(tmp_path / "lm.keras"))
    loaded = keras.models.load_model(str(tmp_path / "lm.keras"))
    assert isinstance(loaded.optimizer, ReplicaClippedAdam)
    assert int(loaded.optimizer.iterations.numpy()) == 3
    loaded.fit(second, verbose=0)
    for a, b in zip(get_weights(straight.core).values(), get_weights(loaded.core).values()):
        np.testing.assert_array_equal(a, b)
