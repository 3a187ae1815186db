"""The sequence classifier: memory carries a label across segments, padding
changes nothing, Keras round trip, pretrained backbones, clear input errors."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import (InputError, TransformerXL, TransformerXLClassifier, TransformerXLConfig,
                    TxlError)
from txl_tf.weights import get_weights, save_pretrained
from bfloat16_cpu import needs_bfloat16_matmuls

SEG, N_TOKEN = 8, 16


def tiny_config(**overrides):
    return TransformerXLConfig(**{**dict(n_token=N_TOKEN, n_layer=2, d_model=32, n_head=2,
                                         d_head=16, d_inner=64, dropout=0.0, tgt_len=SEG,
                                         mem_len=16), **overrides})


def marker_task(n, seed):
    """Documents of 17 to 24 noise tokens (ids 3..15) with one marker, id 1
    or 2 (the label), somewhere before the last segment of 8 tokens."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2 * SEG + 1, 3 * SEG + 1, n)
    ids = rng.integers(3, N_TOKEN, (n, 3 * SEG)).astype(np.int32)
    labels = rng.integers(0, 2, n).astype(np.int32)
    for b in range(n):
        ids[b, lengths[b]:] = 0
        ids[b, rng.integers(0, lengths[b] - SEG)] = 1 + labels[b]
    return {"token_ids": ids, "lengths": lengths.astype(np.int32)}, labels


@pytest.mark.parametrize("mem_len,low,high", [(16, 0.9, 1.0), (0, 0.35, 0.65)])
def test_memory_carries_a_label_from_earlier_segments(mem_len, low, high):
    keras.utils.set_random_seed(0)
    model = TransformerXLClassifier(tiny_config(), 2, segment_len=SEG, mem_len=mem_len,
                                    head_dropout=0.0)
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    x, y = marker_task(150 * 32, 1)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    x_test, y_test = marker_task(512, 2)
    _, accuracy = model.evaluate(x_test, y_test, batch_size=128, verbose=0)
    # The marker is never in the last segment: without memory the last
    # token cannot see it, with 16 slots it always can.
    assert low <= accuracy <= high


def documents(lengths, seed=3):
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), max(lengths) + 2), np.int32)  # extra right padding
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(0, N_TOKEN, n)
    return {"token_ids": ids, "lengths": np.asarray(lengths, np.int32)}


@pytest.mark.parametrize("mem_len", [5, 16])
def test_padding_never_changes_a_prediction(mem_len):
    keras.utils.set_random_seed(1)
    model = TransformerXLClassifier(tiny_config(dropout=0.1), 3, segment_len=SEG,
                                    mem_len=mem_len)
    batch = documents([19, 3, 40, 8, 25])
    together = model.predict_probabilities(batch).numpy()
    graph = model.predict(batch, verbose=0)  # tf.function path
    for b, n in enumerate(batch["lengths"]):
        alone = {"token_ids": batch["token_ids"][b:b + 1, :n], "lengths": np.int32([n])}
        np.testing.assert_allclose(model.predict_probabilities(alone).numpy()[0],
                                   together[b], atol=1e-5)
    np.testing.assert_allclose(tf.nn.softmax(graph).numpy(), together, atol=1e-5)
    # ...and it does depend on the segment before the last one (through memory).
    changed = {k: v.copy() for k, v in batch.items()}
    earlier = slice(40 - 2 * SEG, 40 - SEG)
    changed["token_ids"][2, earlier] = (changed["token_ids"][2, earlier] + 1) % N_TOKEN
    moved = model.predict_probabilities(changed).numpy()
    assert np.abs(moved[2] - together[2]).max() > 1e-5  # float noise is ~1e-7
    np.testing.assert_allclose(np.delete(moved, 2, 0), np.delete(together, 2, 0), atol=1e-6)


def read_alone_unpadded(core, document, segment_len, mem_len):
    """The last hidden state of one document read with no padding at all:
    chunks of `[len % segment_len or segment_len, segment_len, ...]` (the
    cut `read_documents` makes after right-aligning) through `hidden_states`,
    the memory carried from one to the next."""
    first = len(document) % segment_len or segment_len
    chunks = [document[:first]] + [document[i:i + segment_len]
                                   for i in range(first, len(document), segment_len)]
    memory = core.initial_memory(1, mem_len, zero_filled=False)
    for chunk in chunks:
        hidden, memory = core.hidden_states(np.asarray([chunk], np.int32), memory,
                                            training=False)
    return hidden.numpy()[0, -1]


@pytest.mark.parametrize("lengths,width,segment_len,mem_len,zero_filled", [
    ([3, 5, 1], 7, 6, 8, False),      # every document fits one segment
    ([13, 2, 11], 13, 6, 8, False),   # L not a multiple of segment_len
    ([17], 17, 6, 8, False),          # batch 1
    ([13, 2, 11], 14, 6, 0, False),   # no memory
    ([20, 9], 20, 6, 2, False),       # mem_len < segment_len
    ([4, 2], 5, 1, 3, False),         # one-token segments
    ([13, 2, 11], 13, 6, 8, True),    # the memory starts empty whatever the config says
])
def test_read_documents_equals_each_document_read_alone_without_padding(
        lengths, width, segment_len, mem_len, zero_filled):
    """Unlike a reference that goes through `read_documents` itself, this one
    never sees a padded position: a classifier that attends to padding fails."""
    keras.utils.set_random_seed(0)
    core = TransformerXL(tiny_config(init_std=0.3,  # sharp attention: padding would show
                                     zero_filled_memory=zero_filled))
    rng = np.random.default_rng(len(lengths) * 100 + width)
    ids = rng.integers(0, N_TOKEN, (len(lengths), width)).astype(np.int32)  # random padding
    lengths = np.int32(lengths)
    want = np.stack([read_alone_unpadded(core, list(ids[b, :n]), segment_len, mem_len)
                     for b, n in enumerate(lengths)])
    eager = core.read_documents(ids, lengths, segment_len, mem_len, training=False)
    graph = tf.function(
        lambda i, n: core.read_documents(i, n, segment_len, mem_len, training=False),
        input_signature=[tf.TensorSpec([None, None], tf.int32),
                         tf.TensorSpec([None], tf.int32)])(ids, lengths)
    np.testing.assert_allclose(eager.numpy(), want, atol=1e-5)
    np.testing.assert_allclose(graph.numpy(), want, atol=1e-5)


def test_gradients_reach_the_backbone_through_the_last_segment_only():
    keras.utils.set_random_seed(2)
    model = TransformerXLClassifier(tiny_config(), 2, segment_len=SEG, mem_len=16)
    batch = documents([20, 12])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(batch, training=True)[:, 0])
    grads = dict(zip([w.path for w in model.trainable_weights],
                     tape.gradient(loss, model.trainable_weights)))
    assert all(g is not None for g in grads.values())
    assert not any("adaptive_softmax" in path for path in grads)  # the LM softmax is frozen
    assert any("layer_0" in path for path in grads)


def test_keras_round_trip_and_config(tmp_path):
    keras.utils.set_random_seed(4)
    model = TransformerXLClassifier(tiny_config(cutoffs=[8], div_val=2, d_embed=32), 4,
                                    segment_len=6, mem_len=7, head_dropout=0.2,
                                    label_names=["a", "b", "c", "d"])
    batch = documents([14, 3, 9])
    before = model(batch).numpy()
    path = str(tmp_path / "classifier.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, TransformerXLClassifier)
    np.testing.assert_array_equal(loaded(batch).numpy(), before)
    assert (loaded.segment_len, loaded.mem_len, loaded.head_dropout, loaded.label_names) == (
        6, 7, 0.2, ["a", "b", "c", "d"])
    clone = TransformerXLClassifier.from_config(model.get_config())
    assert clone.get_config() == model.get_config()


def test_fine_tunes_a_pretrained_backbone_from_a_model_dir(tmp_path):
    keras.utils.set_random_seed(5)
    core = TransformerXL(tiny_config())
    save_pretrained(core, str(tmp_path / "lm"))
    model = TransformerXLClassifier.from_model_dir(str(tmp_path / "lm"), 2,
                                                   config_overrides={"dropout": 0.05})
    assert model.config.dropout == 0.05 and model.segment_len == SEG and model.mem_len == 16
    loaded = get_weights(model.core)
    for name, value in get_weights(core).items():
        np.testing.assert_array_equal(loaded[name], value)
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = marker_task(64, 6)
    model.fit(x, y, batch_size=32, verbose=0)
    tuned = get_weights(model.core)
    changed = [n for n in tuned if not np.array_equal(tuned[n], loaded[n])]
    assert any("layer_1/rel_attn" in n for n in changed)  # the backbone is fine-tuned
    assert not any("softmax" in n for n in changed)


@needs_bfloat16_matmuls
def test_dtype_reaches_a_pretrained_backbone(tmp_path):
    from txl_tf.keras_support.precision import choose
    keras.utils.set_random_seed(5)
    core = TransformerXL(tiny_config())
    save_pretrained(core, str(tmp_path / "lm"))
    auto = choose(tf.distribute.get_strategy()).policy
    for dtype, want in (("mixed_bfloat16", "mixed_bfloat16"), ("auto", auto)):
        model = TransformerXLClassifier.from_model_dir(str(tmp_path / "lm"), 2, dtype=dtype)
        assert model.dtype_policy.name == want and model.core.dtype_policy.name == want
        assert model.core.compute_dtype == model.head.compute_dtype
        loaded = get_weights(model.core)  # variables stay float32: the weights are exact
        for name, value in get_weights(core).items():
            np.testing.assert_array_equal(loaded[name], value)
    # A core passed in: its policy is the model's, unless another is asked for.
    mixed_core = TransformerXL(tiny_config(), dtype="mixed_bfloat16")
    model = TransformerXLClassifier(mixed_core, 2)
    assert model.dtype_policy.name == "mixed_bfloat16" and model.head.compute_dtype == "bfloat16"
    assert model(documents([9, 3])).dtype == tf.float32
    with pytest.raises(ValueError, match="backbone computes under the dtype policy 'float32' "
                                         "but the classifier was asked for 'mixed_bfloat16'"):
        TransformerXLClassifier(core, 2, dtype="mixed_bfloat16")
    clone = TransformerXLClassifier.from_config(model.get_config())
    assert clone.core.dtype_policy.name == "mixed_bfloat16"


@needs_bfloat16_matmuls
def test_batches_of_any_width_and_float32_logits_under_mixed_precision():
    keras.utils.set_random_seed(6)
    model = TransformerXLClassifier(tiny_config(), 3)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    shapes = [documents([5, 30]), documents([2, 9, 11]), documents([17])]
    data = tf.data.Dataset.from_generator(
        lambda: ((d, np.zeros(len(d["lengths"]), np.int32)) for d in shapes),
        output_signature=({"token_ids": tf.TensorSpec([None, None], tf.int32),
                           "lengths": tf.TensorSpec([None], tf.int32)},
                          tf.TensorSpec([None], tf.int32))
    ).apply(tf.data.experimental.assert_cardinality(len(shapes)))
    history = model.fit(data, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][0])
    mixed = TransformerXLClassifier(tiny_config(), 3, dtype="mixed_bfloat16")
    assert mixed.core.compute_dtype == "bfloat16"
    logits = mixed(shapes[0])
    assert logits.dtype == tf.float32 and logits.shape == (2, 3)


@pytest.mark.parametrize("graph", [False, True])
def test_bad_inputs_are_named(graph):
    model = TransformerXLClassifier(tiny_config(), 2)
    run = (lambda x: model.predict(x, verbose=0)) if graph else model
    ids = np.ones((2, 5), np.int32)
    errors = (InputError, tf.errors.InvalidArgumentError)
    with pytest.raises(errors, match="lengths"):
        run({"token_ids": ids, "lengths": np.int32([0, 3])})
    with pytest.raises(errors, match="lengths"):
        run({"token_ids": ids, "lengths": np.int32([6, 3])})
    bad = ids.copy()
    bad[1, 4] = N_TOKEN
    with pytest.raises(errors, match="out of range"):
        run({"token_ids": bad, "lengths": np.int32([5, 3])})



def test_out_of_range_ids_are_one_clear_error_under_xla():
    """XLA drops the core's range assertion: `fit` and `evaluate` check the
    ids in the input pipeline instead (`checked_data`)."""
    model = TransformerXLClassifier(tiny_config(n_layer=1), 2)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    ids = np.ones((4, 5), np.int32)
    ids[3, 1] = N_TOKEN
    data = tf.data.Dataset.from_tensor_slices(
        ({"token_ids": ids, "lengths": np.int32([5, 3, 5, 2])}, np.int32([0, 1, 0, 1])))
    for call in (model.fit, model.evaluate):
        with pytest.raises(InputError, match=f"^token_ids empty or out of range for a "
                           f"vocabulary of {N_TOKEN} tokens; min id: 1 max id: {N_TOKEN}$"):
            call(data.batch(2), verbose=0)

def test_labels_out_of_range_are_one_clear_error_under_xla():
    """Keras's loss raised a TensorFlow error on a label >= num_classes, and
    gave a NaN loss under XLA: `fit` and `evaluate` check integer labels
    (arrays at once, a dataset's in the input pipeline)."""
    model = TransformerXLClassifier(tiny_config(n_layer=1), 3)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    x = {"token_ids": np.ones((4, 5), np.int32), "lengths": np.int32([5, 3, 5, 2])}
    labels = np.int32([0, 1, 2, 3])
    with pytest.raises(InputError, match=r"^class label 3 is out of range for 3 classes "
                                         r"\(valid labels are 0..2\)$"):
        model.evaluate(x, labels, verbose=0)
    with pytest.raises(InputError, match=r"^class label 3 is out of range for 3 classes"):
        model.fit(x, labels % 3, validation_data=(x, labels), verbose=0)  # arrays, before fit
    data = tf.data.Dataset.from_tensor_slices((x, labels)).batch(2)
    for call in (lambda: model.fit(data, verbose=0), lambda: model.evaluate(data, verbose=0),
                 lambda: model.fit(data.take(1), validation_data=data, verbose=0)):
        with pytest.raises(InputError, match=r"^class labels out of range for 3 classes "
                                             r"\(valid labels are 0..2\); min: 2 max: 3$"):
            call()


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_lengths_that_int32_would_wrap_are_refused(graph, dtype):
    model = TransformerXLClassifier(tiny_config(), 2)
    ids = np.ones((2, 5), np.int32)
    run = model
    if graph:  # unknown shapes: the check is a graph assertion, made in int64
        spec = [tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.as_dtype(dtype))]
        fn = tf.function(lambda i, n: model({"token_ids": i, "lengths": n}),
                         input_signature=spec)
        run = lambda x: fn(x["token_ids"], x["lengths"])  # noqa: E731
    errors = (InputError, tf.errors.InvalidArgumentError)
    for bad in (2 ** 32 + 5, 2 ** 32, 2 ** 63 + 5):  # as int32: 5 (valid), 0, 5
        if dtype is np.int64 and bad >= 2 ** 63:
            continue
        with pytest.raises(errors, match="lengths"):
            run({"token_ids": ids, "lengths": np.array([bad, 3], dtype)})
    good = run({"token_ids": ids, "lengths": np.array([5, 3], dtype)})
    np.testing.assert_allclose(good, model({"token_ids": ids, "lengths": np.int32([5, 3])}),
                               atol=1e-6)


def test_malformed_inputs_are_named():
    model = TransformerXLClassifier(tiny_config(), 2)
    ids = np.ones((2, 5), np.int32)
    with pytest.raises(InputError, match="dict with keys"):
        model(ids)
    with pytest.raises(InputError, match="2 rows"):
        model({"token_ids": ids, "lengths": np.int32([5, 3, 1])})
    with pytest.raises(InputError, match="integers"):
        model({"token_ids": ids, "lengths": np.float32([5, 3])})
    with pytest.raises(ValueError, match="label_names"):
        TransformerXLClassifier(tiny_config(), 2, label_names=["x"])
    with pytest.raises(ValueError, match="num_classes"):
        TransformerXLClassifier(tiny_config(), 0)
    # One logit: the softmax probabilities were 1 and every prediction class 0.
    with pytest.raises(ValueError, match="num_classes=1: .* num_classes=2"):
        TransformerXLClassifier(tiny_config(), 1)
    for kwargs, match in ((dict(mem_len=2.5), "mem_len must be an integer >= 0, got 2.5"),
                          (dict(mem_len="8"), "mem_len must be an integer >= 0, got '8'"),
                          (dict(head_dropout="0.1"), r"head_dropout must be in \[0, 1\)"),
                          (dict(label_names="ab"), "label_names must be a list"),
                          # were OverflowError/ValueError from int(): no name, no value
                          (dict(segment_len=float("inf")), "segment_len must be a positive"),
                          (dict(mem_len=float("nan")), "mem_len must be an integer >= 0"),
                          (dict(grad_segments=np.float64("inf")), "grad_segments must be"),
                          # an int beyond a float: math.isfinite's OverflowError
                          (dict(segment_len=2 ** 1024), r"grad_segments \(1\) x segment_len")):
        with pytest.raises(TxlError, match=match):  # were cut to 2, ValueErrors, ['a', 'b']
            TransformerXLClassifier(tiny_config(), 2, **kwargs)


def test_fit_takes_keras_positional_batch_size_and_epochs():
    """`fit(x, y, batch_size, epochs)` as Keras orders them: the third
    positional argument was taken as `validation_data` ("Unrecognized data
    type: x=8")."""
    model = TransformerXLClassifier(tiny_config(), 2)
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = marker_task(16, 3)
    history = model.fit(x, y, 8, 2, verbose=0)
    assert history.params["epochs"] == 2 and history.params["steps"] == 2


def test_keras_file_of_a_compiled_classifier_keeps_the_optimizer(tmp_path):
    keras.utils.set_random_seed(6)
    model = TransformerXLClassifier(tiny_config(), 2)
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = marker_task(32, 7)
    model.fit(x, y, batch_size=16, verbose=0)
    model.save(str(tmp_path / "classifier.keras"))
    loaded = keras.models.load_model(str(tmp_path / "classifier.keras"))
    assert int(loaded.optimizer.iterations.numpy()) == 2
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    loaded.fit(x, y, batch_size=16, verbose=0)
    assert int(loaded.optimizer.iterations.numpy()) == 4


def test_gradient_through_the_memory_reaches_earlier_segments():
    """`grad_segments`: the same logits, and a gradient that reaches a token
    read only in the document's first segment (three segments back, two
    layers, memory of one segment) when the memory keeps its gradient."""
    keras.utils.set_random_seed(3)
    config = tiny_config(dropout=0.0)
    first_only = N_TOKEN - 1  # appears in the first segment only
    rng = np.random.default_rng(4)
    ids = rng.integers(0, N_TOKEN - 1, (2, 3 * SEG)).astype(np.int32)
    ids[:, 2] = first_only
    batch = {"token_ids": ids, "lengths": np.array([3 * SEG, 3 * SEG - 2], np.int32)}
    short = {"token_ids": ids[:, :SEG + 3], "lengths": np.array([SEG + 3, 4], np.int32)}
    rows = {}
    for k in (1, 3, 5):
        model = TransformerXLClassifier(config, 2, segment_len=SEG, mem_len=SEG,
                                        grad_segments=k)
        if k == 1:
            weights = model.get_weights()
        model.set_weights(weights)
        with tf.GradientTape() as tape:
            logits = model(batch, training=True)
            loss = tf.reduce_sum(logits[:, 0])
        table = model.core.word_emb.trainable_weights[0]
        grad = tf.convert_to_tensor(tape.gradient(loss, table))
        rows[k] = (logits.numpy(), float(tf.norm(grad[first_only])),
                   model(short, training=True).numpy())
    np.testing.assert_allclose(rows[3][0], rows[1][0], atol=1e-6)
    np.testing.assert_allclose(rows[5][0], rows[1][0], atol=1e-6)
    np.testing.assert_allclose(rows[5][2], rows[1][2], atol=1e-6)  # fewer segments than k
    assert rows[1][1] == 0.0  # the memory cut: the first segment gets no gradient
    assert rows[3][1] > 1e-6 and rows[5][1] == pytest.approx(rows[3][1], rel=1e-4)


@pytest.mark.parametrize("grad_segments", [2 ** 28, 2 ** 63])
def test_grad_segments_an_int32_length_cannot_hold_are_refused(grad_segments):
    """2**63 was Python's OverflowError inside `call` (`read_documents` padding
    to grad_segments x segment_len positions)."""
    with pytest.raises(TxlError, match=rf"grad_segments \({grad_segments}\) x segment_len "
                                       r"\(8\) must be at most 2147483647 positions"):
        TransformerXLClassifier(tiny_config(), 2, segment_len=8, grad_segments=grad_segments)
    core = TransformerXLClassifier(tiny_config(), 2, segment_len=8).core
    with pytest.raises(TxlError, match=r"must be at most 2147483647 positions"):
        core.read_documents(np.ones((1, 8), np.int32), np.int32([8]), 8, 4,
                            grad_segments=grad_segments)


def test_xla_steps_run_on_the_device_of_a_one_device_strategy():
    """Under `OneDeviceStrategy` of a device other than the default one (here
    the second logical CPU), `fit`, `evaluate` and `predict` with XLA run
    beside the variables the strategy put there, as on the default device."""
    x, labels = marker_task(4, seed=6)
    data = tf.data.Dataset.from_tensor_slices((x, labels)).batch(2)
    keras.utils.set_random_seed(6)
    weights = TransformerXLClassifier(tiny_config(n_layer=1), 2).get_weights()
    results = []
    for device in ("/cpu:0", "/cpu:1"):
        with tf.distribute.OneDeviceStrategy(device).scope():
            model = TransformerXLClassifier(tiny_config(n_layer=1), 2)
            model.set_weights(weights)
            model.compile(keras.optimizers.Adam(1e-2),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          jit_compile=True)
        history = model.fit(data, verbose=0, shuffle=False)
        results.append([*history.history["loss"], model.evaluate(data, verbose=0),
                        *model.predict(x, verbose=0).ravel()])
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)


def test_evaluate_builds_no_optimizer_slots_and_fit_does():
    """`evaluate` reads no optimizer slot (Adam's: twice the weights), so
    only a train function builds them (`PrebuiltModel`)."""
    model = TransformerXLClassifier(tiny_config(), 2, segment_len=SEG)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = marker_task(4, 0)
    model.evaluate(x, y, batch_size=4, verbose=0)
    assert not model.optimizer.built
    model.fit(x, y, batch_size=4, verbose=0)
    assert model.optimizer.built and len(model.optimizer.variables) > 2


def test_labels_that_are_not_class_ids_are_one_clear_error():
    """Keras's sparse loss casts labels to integers: 1.5 was read as class 1,
    True as 1, and NaN, inf or 3.0 met TensorFlow's own error (a NaN loss
    under XLA) (review35). Whole floats (pandas' 1.0) are class ids, and
    one-hot rows of floats pass as before."""
    model = TransformerXLClassifier(tiny_config(n_layer=1), 3)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = {"token_ids": np.ones((4, 5), np.int32), "lengths": np.int32([5, 3, 5, 2])}
    whole = model.evaluate(x, np.float64([0, 1, 2, 1]), verbose=0)
    assert whole == model.evaluate(x, np.int32([0, 1, 2, 1]), verbose=0)
    for bad, message in (([0, 1.5, 2, 1], r"^class label 1\.5 is not a whole number"),
                         ([[0], [1], [2.5], [1]], r"^class label 2\.5 is not a whole number"),
                         ([0, np.nan, 2, 1], r"^class label nan is not a whole number"),
                         ([0, np.inf, 2, 1], r"^class label inf is out of range for 3 classes"),
                         ([0, 3.0, 2, 1], r"^class label 3\.0 is out of range for 3 classes")):
        labels = np.float32(bad)
        with pytest.raises(InputError, match=message):
            model.evaluate(x, labels, verbose=0)
        with pytest.raises(InputError, match=message):
            model.fit(x, labels, verbose=0)
        with pytest.raises(InputError, match=message):  # a generator's batches
            model.evaluate((batch for batch in [(x, labels)]), verbose=0)
        if labels.ndim == 2:  # (one rank of labels for Keras's traced step)
            continue
        data = tf.data.Dataset.from_tensor_slices((x, labels)).batch(4)
        with pytest.raises(InputError, match=r"^class labels must be whole numbers in 0\.\.2 "
                                             r"\(3 classes\); first bad label: "):
            model.evaluate(data, verbose=0)
    flags = np.array([True, False, True, True])
    for labels in (flags, tf.data.Dataset.from_tensor_slices((x, flags)).batch(2)):
        with pytest.raises(InputError, match=r"^labels must be class ids \(integers 0\.\.2\), "
                                             r"got dtype bool$"):
            model.evaluate(*((x, labels) if isinstance(labels, np.ndarray) else (labels,)),
                           verbose=0)
    one_hot = TransformerXLClassifier(tiny_config(n_layer=1), 3)
    one_hot.compile(keras.optimizers.Adam(1e-3),
                    keras.losses.CategoricalCrossentropy(from_logits=True))
    one_hot.evaluate(x, np.eye(3, dtype=np.float32)[[0, 1, 2, 1]], verbose=0)
