"""The Keras Model API a user tries first, on the public models: `summary`,
`export`, symbolic calls, `fit` options; each gives Keras's behaviour or one
clear error naming the limitation."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from bfloat16_cpu import needs_bfloat16_matmuls
from txl_tf import InputError, TransformerXLClassifier, TransformerXLConfig, TransformerXLLM

N_TOKEN, T, B = 40, 4, 2


def config():
    return TransformerXLConfig.preset("tiny", n_token=N_TOKEN, tgt_len=T, mem_len=T, dropout=0.0)


def test_the_classifier_summary_lists_its_layers_before_any_call(capsys):
    """Its head dropout was built on no shape, which Keras's summary could
    not print (a TypeError)."""
    model = TransformerXLClassifier(config(), num_classes=3)
    model.summary(expand_nested=True)
    out = capsys.readouterr().out
    assert "head_dropout" in out and "classifier" in out
    assert "Total params: {:,}".format(model.count_params()) in out


def test_the_classifiers_keras_export_serves_its_logits(tmp_path):
    """`model.export(path)` (Keras's SavedModel) needs no `input_signature`:
    Keras looks for the shapes of a first call, which a model built at
    construction never records ("The model provided has never called")."""
    model = TransformerXLClassifier(config(), num_classes=3, segment_len=3)
    inputs = {"token_ids": np.random.default_rng(0).integers(0, N_TOKEN, (3, 7)).astype(np.int32),
              "lengths": np.array([7, 2, 5], np.int32)}
    model(inputs)
    model.export(str(tmp_path / "saved"), verbose=False)
    served = tf.saved_model.load(str(tmp_path / "saved"))
    np.testing.assert_allclose(served.serve(inputs).numpy(), model.predict(inputs, verbose=0),
                               atol=1e-5)


def stream_arrays(rows):
    ids = np.random.default_rng(1).integers(0, N_TOKEN, (rows, T + 1)).astype(np.int32)
    return ids[:, :-1], ids[:, 1:]


def test_a_validation_split_off_the_stream_batches_is_one_clear_error():
    """Keras splits the rows before batching: a split that leaves part of a
    stream batch on either side was an assertion deep in the graph."""
    model = TransformerXLLM(config(), batch_size=B)
    model.compile(optimizer="adam")
    x, y = stream_arrays(3 * B)
    with pytest.raises(InputError, match=r"fit: validation_split=0.4 leaves 3 rows to train on "
                                         r"and 3 to validate; both must be multiples of the 2 "
                                         r"streams"):
        model.fit(x, y, batch_size=B, validation_split=0.4, verbose=0)
    history = model.fit(x, y, batch_size=B, validation_split=1 / 3, verbose=0).history
    assert np.isfinite(history["val_loss"][0])


def test_a_validation_split_beside_validation_data_is_ignored_as_keras_does():
    """Keras cuts no validation rows where `validation_data` is given; the
    split's check refused such a fit all the same."""
    model = TransformerXLLM(config(), batch_size=B)
    model.compile(optimizer="adam")
    x, y = stream_arrays(3 * B)
    history = model.fit(x, y, batch_size=B, validation_split=0.4, verbose=0,
                        validation_data=stream_arrays(B)).history
    assert np.isfinite(history["loss"][0]) and np.isfinite(history["val_loss"][0])


def test_the_stream_model_is_called_symbolically_and_wrapped_in_a_functional_model():
    """`TransformerXLLM` on a `keras.Input` gives its log-probs' spec (was
    "Output with path `` is not connected to `inputs`": Keras ran the
    functional graph of the parent, whose inputs are a dict)."""
    model = TransformerXLLM(config(), batch_size=B)
    spec = model.compute_output_spec(keras.KerasTensor((B, T), "int32"))
    assert spec.shape == (B, T, N_TOKEN) and spec.dtype == "float32"
    ids = keras.Input((T,), batch_size=B, dtype="int32")
    wrapped = keras.Model(ids, keras.ops.argmax(model(ids), -1))
    x, _ = stream_arrays(B)
    model.reset_memory()
    got = keras.ops.convert_to_numpy(wrapped(x))
    model.reset_memory()
    np.testing.assert_array_equal(got, np.argmax(model(x).numpy(), -1))


RAGGED = [[1, 2, 3], [4, 5]]


def ragged_calls():
    from txl_tf import TransformerXLBackbone, TransformerXLCausalLM
    ids = tf.ragged.constant(RAGGED)
    mask = tf.ragged.constant([[1] * len(row) for row in RAGGED])
    causal_lm = TransformerXLCausalLM(TransformerXLBackbone(**config().to_dict()))
    classifier = TransformerXLClassifier(config(), num_classes=3)
    stream = TransformerXLLM(config(), batch_size=B)
    return {"causal_lm": lambda: causal_lm({"token_ids": ids, "padding_mask": mask}),
            "backbone": lambda: causal_lm.backbone({"token_ids": ids, "padding_mask": mask}),
            "classifier": lambda: classifier({"token_ids": ids, "lengths": tf.constant([3, 2])}),
            "stream": lambda: stream(ids)}


@pytest.mark.parametrize("name", ["causal_lm", "backbone", "classifier", "stream"])
def test_ragged_ids_are_one_clear_error(name):
    """Was `TypeError: object of type 'RaggedTensor' has no len()`."""
    with pytest.raises(InputError, match=r"token_ids is a RaggedTensor: .*dense \[batch, "
                                         r"length\].*to_tensor\(\)"):
        ragged_calls()[name]()


def test_per_stream_weights_after_per_token_weights_train_alike():
    """A second `fit` with weights of another rank: Keras's step function
    retraces them as a tensor of unknown rank, which the per-stream branch
    (`[B]` weights) missed (a broadcast error in the graph)."""
    x, y = stream_arrays(2 * B)
    losses = []
    for weights in (np.ones((2 * B, T), np.float32), np.ones(2 * B, np.float32)):
        keras.utils.set_random_seed(0)
        model = TransformerXLLM(config(), batch_size=B)
        model.compile(optimizer="adam")
        model.fit(x, y, batch_size=B, sample_weight=np.ones((2 * B, T), np.float32), verbose=0)
        losses.append(model.fit(x, y, batch_size=B, sample_weight=weights,
                                verbose=0).history["loss"][0])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


@pytest.mark.parametrize("shape", [(2 * B, T + 1), (2 * B, T, 2)])
def test_stream_weights_of_another_shape_are_one_clear_error(shape):
    """Weights neither `[B]` (or `[B, 1]`) nor `[B, T]`: were a
    `BroadcastTo` ValueError from the step's graph."""
    x, y = stream_arrays(2 * B)
    model = TransformerXLLM(config(), batch_size=B)
    model.compile(optimizer="adam")
    with pytest.raises(InputError, match=r"sample_weight holds %d weights a row but the "
                                         r"targets %d tokens: give one weight a stream \[B\] or "
                                         r"one a token \[B, T\]" % (int(np.prod(shape[1:])), T)):
        model.fit(x, y, batch_size=B, sample_weight=np.ones(shape, np.float32), verbose=0)


@pytest.mark.parametrize("stream", [True, False])
def test_class_weight_is_one_clear_error_for_the_language_models(stream):
    """Keras turns `class_weight` into one weight per row, by the argmax of
    its `[B, T]` targets (a position, not a token): the stream model trained
    on those weights silently, the causal LM failed deep in its loss."""
    from txl_tf import TransformerXLBackbone, TransformerXLCausalLM
    x, y = stream_arrays(B)
    if stream:
        model = TransformerXLLM(config(), batch_size=B)
    else:
        model = TransformerXLCausalLM(TransformerXLBackbone(**config().to_dict()))
        x = {"token_ids": x, "padding_mask": np.ones_like(x)}
    model.compile(optimizer="adam")
    with pytest.raises(InputError, match=r"fit: class_weight .*sample_weight \[B, T\]"):
        model.fit(x, y, batch_size=B, class_weight={i: 1.0 for i in range(N_TOKEN)}, verbose=0)


@pytest.mark.parametrize("policy", ["float32",
                                    pytest.param("mixed_bfloat16", marks=needs_bfloat16_matmuls)])
def test_a_quantized_classifier_round_trips_through_a_keras_file(tmp_path, policy):
    """After `quantize("int8")` the config names the int8 layers (a dtype
    policy map, as keras-hub's backbones write): `load_model` and
    `from_config` + `load_weights` rebuild them (were "expected 2 variables,
    but received 0"), under the model's policy."""
    model = TransformerXLClassifier(config(), num_classes=3, dtype=policy)
    inputs = {"token_ids": np.random.default_rng(0).integers(0, N_TOKEN, (3, 7)).astype(np.int32),
              "lengths": np.array([7, 2, 5], np.int32)}
    model.quantize("int8")
    want = model.predict(inputs, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(loaded.predict(inputs, verbose=0), want)
    assert loaded.core.compute_dtype == model.core.compute_dtype
    model.save_weights(tmp_path / "model.weights.h5")
    rebuilt = TransformerXLClassifier.from_config(model.get_config())
    rebuilt.load_weights(tmp_path / "model.weights.h5")
    np.testing.assert_array_equal(rebuilt.predict(inputs, verbose=0), want)


@needs_bfloat16_matmuls
@pytest.mark.parametrize("stream", [True, False])
def test_a_quantized_mixed_precision_lm_reloads_in_its_policy(tmp_path, stream):
    """The backbone's config after `quantize` is a policy map over the
    model's policy: keras-hub's (no default policy) reloaded a
    `mixed_bfloat16` model in the global float32, with other outputs."""
    from txl_tf import TransformerXLBackbone, TransformerXLCausalLM
    x, _ = stream_arrays(B)
    if stream:
        model = TransformerXLLM(config(), batch_size=B, dtype="mixed_bfloat16")
    else:
        model = TransformerXLCausalLM(TransformerXLBackbone(**config().to_dict(),
                                                            dtype="mixed_bfloat16"))
        x = {"token_ids": x, "padding_mask": np.ones_like(x)}
    model.quantize("int8")
    want = np.asarray(model(x))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    if stream:
        loaded.reset_memory()
    assert loaded.core.compute_dtype == "bfloat16"
    np.testing.assert_array_equal(np.asarray(loaded(x)), want)


@pytest.mark.parametrize("kind", ["classifier", "causal_lm", "stream"])
def test_a_reloaded_quantized_model_saves_again(tmp_path, kind):
    """Loading gives each layer the whole dtype policy map, whose own
    quantization mode is None: Keras's `Dense.save_own_variables` then
    stored a None kernel scale ("Invalid dtype: object"), so a loaded
    quantized model could not be saved again."""
    from txl_tf import TransformerXLBackbone, TransformerXLCausalLM
    x, _ = stream_arrays(B)
    if kind == "classifier":
        model = TransformerXLClassifier(config(), num_classes=3)
        x = {"token_ids": x, "lengths": np.array([T, 2], np.int32)}
    elif kind == "stream":
        model = TransformerXLLM(config(), batch_size=B)
    else:
        model = TransformerXLCausalLM(TransformerXLBackbone(**config().to_dict()))
        x = {"token_ids": x, "padding_mask": np.ones_like(x)}
    model.quantize("int8")
    want = np.asarray(model(x))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    loaded.save(tmp_path / "again.keras")
    again = keras.saving.load_model(tmp_path / "again.keras")
    if kind == "stream":
        again.reset_memory()
    np.testing.assert_array_equal(np.asarray(again(x)), want)


def test_dense_packs_a_list_of_graph_tensors_and_names_rows_of_other_lengths():
    """Only what TensorFlow cannot convert is looked at as rows: a list of
    a graph's tensors still packs (numpy cannot read them)."""
    from txl_tf.checks.inputs import dense
    packed = tf.function(lambda a, b: dense([a, b]))(tf.constant([1, 2]), tf.constant([3, 4]))
    assert packed.numpy().tolist() == [[1, 2], [3, 4]]
    with pytest.raises(InputError, match=r"token_ids holds rows of other lengths"):
        dense(RAGGED)


def rows_calls():
    from txl_tf import TransformerXL
    stream = TransformerXLLM(config(), batch_size=B)
    core = TransformerXL(config())
    return {"core": lambda: core(RAGGED, None),
            "stream": lambda: stream(RAGGED),
            "stream_numpy": lambda: stream(np.array([np.array(row) for row in RAGGED],
                                                    dtype=object))}


@pytest.mark.parametrize("name", ["core", "stream", "stream_numpy"])
def test_rows_of_other_lengths_are_one_clear_error(name):
    """Ragged ids as Python lists (the usual way to have them): were
    numpy's ValueError 'setting an array element with a sequence' or
    TensorFlow's 'Failed to convert a NumPy array to a Tensor'. (The Keras
    models given a dict of lists stop at Keras's own check first.)"""
    with pytest.raises(InputError, match=r"token_ids .*rows of other lengths.*pad"):
        rows_calls()[name]()


class _Batches(keras.utils.PyDataset):
    """`batches` (a list) as a `PyDataset`."""

    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def __getitem__(self, index):
        return self.batches[index]

    @property
    def num_batches(self):
        return len(self.batches)


def python_batches(kind, batches):
    return iter_batches(batches) if kind == "generator" else _Batches(batches)


def iter_batches(batches):
    yield from batches


def lm(jit_compile=False):
    keras.utils.set_random_seed(0)
    model = TransformerXLLM(config(), batch_size=B)
    model.compile(optimizer="adam", jit_compile=jit_compile)
    return model


@pytest.mark.parametrize("kind", ["generator", "pydataset"])
def test_python_batches_of_other_rows_or_bad_ids_are_one_clear_error(kind):
    """Batches read in Python were not checked: one of other rows was an
    assertion about targets' shapes deep in the graph, and under XLA (a GPU's
    default), which drops the step's assertions, ids out of range trained on
    zeros without a word."""
    x, y = stream_arrays(3 * B)
    good = [(x[i:i + B], y[i:i + B]) for i in range(0, 2 * B, B)]
    with pytest.raises(InputError, match=r"^fit: a batch of 3 rows; the memory holds 2 streams"):
        lm().fit(python_batches(kind, good + [(x[:3], y[:3])]), verbose=0)
    bad = [(x[:B] + N_TOKEN, y[:B])]
    with pytest.raises(InputError, match=rf"^token id {N_TOKEN + x[0, 0]} at position \(0, 0\) "
                                         rf"is out of range for a vocabulary of {N_TOKEN}"):
        lm(jit_compile=True).fit(python_batches(kind, good + bad), verbose=0)
    with pytest.raises(InputError, match=r"^target id -1 at position \(0, 0\)"):
        lm().evaluate(python_batches(kind, [(x[:B], y[:B] * 0 - 1)]), verbose=0)


@pytest.mark.parametrize("kind", ["generator", "pydataset"])
def test_checked_python_batches_train_as_the_same_dataset(kind):
    x, y = stream_arrays(3 * B)
    batches = [(x[i:i + B], y[i:i + B]) for i in range(0, 3 * B, B)]
    from_python, from_dataset = lm(), lm()
    from_python.fit(python_batches(kind, batches), verbose=0)
    from_dataset.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(B, drop_remainder=True),
                     verbose=0)
    for a, b in zip(from_python.get_weights(), from_dataset.get_weights()):
        np.testing.assert_array_equal(a, b)


def causal_lm_model():
    from txl_tf import TransformerXLBackbone, TransformerXLCausalLM
    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(TransformerXLBackbone(**config().to_dict()))
    model.compile(optimizer="adam")
    return model


@pytest.mark.parametrize("kind", ["generator", "pydataset"])
def test_the_causal_lm_reads_python_batches_as_arrays_and_checks_them(kind):
    """keras-hub's `fit`, `evaluate` and `predict` read arrays or a dataset:
    plain batches from a generator or a PyDataset were TensorFlow's "Attempt
    to convert a value (<generator object ...>) with an unsupported type",
    so their ids and masked arrays were never checked."""
    x, y = stream_arrays(2 * B)
    inputs = {"token_ids": x, "padding_mask": x >= 0}
    batches = [({k: v[i:i + B] for k, v in inputs.items()}, y[i:i + B]) for i in (0, B)]
    model, quiet = causal_lm_model(), dict(verbose=0)
    assert model.evaluate(python_batches(kind, batches), **quiet) == \
        model.evaluate(inputs, y, batch_size=B, **quiet)
    np.testing.assert_allclose(model.predict(python_batches(kind, [b[:1] for b in batches]),
                                             **quiet),
                               model.predict(inputs, batch_size=B, **quiet), rtol=1e-6)
    from_python, from_arrays = causal_lm_model(), causal_lm_model()
    from_python.fit(python_batches(kind, batches), validation_data=(inputs, y), **quiet)
    from_arrays.fit(inputs, y, batch_size=B, **quiet)
    for a, b in zip(from_python.get_weights(), from_arrays.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    masked = [({**batches[0][0], "token_ids": np.ma.masked_equal(x[:B], x[0, 0])}, y[:B])]
    with pytest.raises(InputError, match=r"^token_ids is a masked array with masked entries"):
        model.fit(python_batches(kind, masked), **quiet)
    out_of_range = [batches[0], ({**batches[1][0], "token_ids": x[B:] + N_TOKEN}, y[B:])]
    with pytest.raises(InputError, match=rf"^token id {x[B, 0] + N_TOKEN} at position \(0, 0\)"):
        model.evaluate(python_batches(kind, out_of_range), **quiet)
    with pytest.raises(InputError, match=r"^fit: validation_data is a Python generator or a "
                                         r"PyDataset but the training data is not"):
        model.fit(inputs, y, validation_data=python_batches(kind, batches), **quiet)


def test_the_classifier_checks_a_generators_ids():
    model = TransformerXLClassifier(config(), num_classes=3, segment_len=T)
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ids = np.random.default_rng(0).integers(0, N_TOKEN, (2, 6)).astype(np.int32)
    batches = [({"token_ids": ids + shift, "lengths": np.array([6, 3], np.int32)},
                np.array([0, 2])) for shift in (0, N_TOKEN)]
    with pytest.raises(InputError, match=rf"^token id {ids[0, 0] + N_TOKEN} at position"):
        model.fit(iter_batches(batches), verbose=0)


@pytest.mark.parametrize("kind", ["generator", "pydataset"])
def test_the_classifier_checks_a_generators_class_labels(kind):
    """A generator's or a PyDataset's class labels went unchecked (arrays' and
    datasets' are checked): on CPU Keras's loss raised a graph error, and
    under XLA (a GPU's default) a label out of range gives a NaN loss."""
    model = TransformerXLClassifier(config(), num_classes=3, segment_len=T)
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    inputs = {"token_ids": np.random.default_rng(0).integers(0, N_TOKEN, (2, 6)).astype(np.int32),
              "lengths": np.array([6, 3], np.int32)}
    batches = [(inputs, np.array(labels)) for labels in ([0, 2], [1, 0], [2, 7])]
    with pytest.raises(InputError, match=r"^class label 7 is out of range for 3 classes"):
        model.fit(python_batches(kind, batches), verbose=0)
    with pytest.raises(InputError, match=r"^class label -1 is out of range for 3 classes"):
        model.evaluate(python_batches(kind, [(inputs, np.array([-1, 0]))]), verbose=0)
    model.fit(python_batches(kind, batches[:2]), verbose=0)  # labels in range: trains


@pytest.mark.parametrize("kind", ["generator", "pydataset", "filtered"])
def test_batches_of_unknown_count_report_the_same_loss_as_arrays(kind):
    """Data of unknown length (a generator, a PyDataset read through
    `from_generator`, a filtered dataset) ends with a step whose `get_next`
    fails; the metrics' token count, which did not wait for the batch (its
    shape is static), was still added: evaluate's loss came out 3/4 of the
    true one over 3 batches, fit's logged loss too."""
    x, y = stream_arrays(3 * B)
    batches = [(x[i:i + B], y[i:i + B]) for i in range(0, 3 * B, B)]

    def data():
        return (tf.data.Dataset.from_tensor_slices((x, y)).batch(B, drop_remainder=True)
                .filter(lambda *_: True) if kind == "filtered" else python_batches(kind, batches))
    want = lm().evaluate(x, y, batch_size=B, verbose=0)
    np.testing.assert_allclose(lm().evaluate(data(), verbose=0), want, rtol=1e-6)
    trained = lm().fit(x, y, batch_size=B, verbose=0).history["loss"]
    np.testing.assert_allclose(lm().fit(data(), verbose=0).history["loss"], trained, rtol=1e-6)


IDS = np.array([[1, 2, 3], [4, 5, 6]])
UNREADABLE = {  # TensorFlow's conversion error, or (masked) the mask dropped silently
    "timedelta": (lambda a: a.astype("m8[s]"), r"must be {}, got dtype timedelta64\[s\]"),
    "datetime": (lambda a: a.astype("M8[s]"), r"must be {}, got dtype datetime64\[s\]"),
    "objects": (lambda a: a.astype(object), r"must be {}, got dtype object"),
    "masked": (lambda a: np.ma.array(a, mask=np.arange(a.size).reshape(a.shape) == 1),
               r"is a masked array with masked entries")}


@pytest.fixture(scope="module")
def keras_models():
    from txl_tf import TransformerXLBackbone, TransformerXLCausalLM
    causal_lm = TransformerXLCausalLM(TransformerXLBackbone(**config().to_dict()))
    causal_lm.compile(sampler="greedy")
    classifier = TransformerXLClassifier(config(), num_classes=3, segment_len=2)
    classifier.compile(loss="sparse_categorical_crossentropy")
    stream = TransformerXLLM(config(), batch_size=B)
    stream.compile()
    return causal_lm, classifier, stream


def array_calls(causal_lm, classifier, stream):
    """`{entry: (argument, what it holds, call(value), a good value)}`."""
    mask, lengths, labels = IDS > 0, np.array([3, 2]), np.array([0, 2])

    def lm(ids=IDS, padding_mask=mask):
        return {"token_ids": ids, "padding_mask": padding_mask}

    def docs(ids=IDS, n=lengths):
        return {"token_ids": ids, "lengths": n}
    quiet = dict(verbose=0)
    return {
        "causal_lm": ("token_ids", "integers", lambda v: causal_lm(lm(v)), IDS),
        "causal_lm padding_mask": ("padding_mask", "bool or 0/1 flags",
                                   lambda v: causal_lm(lm(padding_mask=v)), mask),
        "causal_lm.predict": ("token_ids", "integers",
                              lambda v: causal_lm.predict(lm(v), **quiet), IDS),
        "causal_lm.evaluate y": ("targets", "integers",
                                 lambda v: causal_lm.evaluate(lm(), v, **quiet), IDS),
        "causal_lm.fit padding_mask": ("padding_mask", "bool or 0/1 flags",
                                       lambda v: causal_lm.fit(lm(padding_mask=v), IDS, **quiet),
                                       mask),
        "causal_lm.generate": ("token_ids", "integers", lambda v: causal_lm.generate(
            lm(v), stop_token_ids=None), IDS),
        "causal_lm.generate padding_mask": ("padding_mask", "bool or 0/1 flags",
                                            lambda v: causal_lm.generate(
                                                lm(padding_mask=v), stop_token_ids=None), mask),
        "backbone": ("token_ids", "integers", lambda v: causal_lm.backbone(lm(v)), IDS),
        "classifier": ("token_ids", "integers", lambda v: classifier(docs(v)), IDS),
        "classifier lengths": ("lengths", "integers", lambda v: classifier(docs(n=v)), lengths),
        "classifier.predict": ("token_ids", "integers",
                               lambda v: classifier.predict(docs(v), **quiet), IDS),
        "classifier.evaluate lengths": ("lengths", "integers", lambda v: classifier.evaluate(
            docs(n=v), labels, **quiet), lengths),
        "classifier.fit labels": ("labels", "numbers",
                                  lambda v: classifier.fit(docs(), v, **quiet), labels),
        "stream": ("token_ids", "integers", lambda v: stream(v), IDS),
        "stream.predict": ("token_ids", "integers",
                           lambda v: stream.predict(v, batch_size=B, **quiet), IDS),
        "stream.fit targets": ("targets", "integers",
                               lambda v: stream.fit(IDS, v, batch_size=B, **quiet), IDS),
        "stream.fit sample_weight": ("sample_weight", "numbers", lambda v: stream.fit(
            IDS, IDS, sample_weight=v, batch_size=B, **quiet), np.ones((2, 3), np.float32)),
    }


ARRAY_CALLS = sorted(array_calls(None, None, None))


@pytest.mark.parametrize("kind", sorted(UNREADABLE))
@pytest.mark.parametrize("entry", ARRAY_CALLS)
def test_the_keras_models_name_numpy_arrays_tensorflow_would_refuse_or_misread(
        keras_models, entry, kind):
    """Durations, dates and objects were TensorFlow's conversion error from
    inside Keras; a masked array lost its mask in Keras's conversion, its
    masked entries read as ids, lengths or labels (a silent wrong answer)."""
    name, holds, call, good = array_calls(*keras_models)[entry]
    make, message = UNREADABLE[kind]
    with pytest.raises(InputError, match=rf"^{name} " + message.format(holds)):
        call(make(good))


def test_the_keras_models_read_masked_arrays_without_masked_entries(keras_models):
    causal_lm, classifier, _ = keras_models
    inputs = {"token_ids": IDS, "padding_mask": IDS > 0}
    want = causal_lm.predict(inputs, verbose=0)
    got = causal_lm.predict({k: np.ma.array(v) for k, v in inputs.items()}, verbose=0)
    np.testing.assert_array_equal(got, want)
    docs = {"token_ids": np.ma.array(IDS, mask=False), "lengths": np.array([3, 2])}
    np.testing.assert_array_equal(classifier(docs).numpy(), classifier(
        {"token_ids": IDS, "lengths": np.array([3, 2])}).numpy())


def test_causal_lm_generate_names_masked_stop_token_ids(keras_models):
    """The masked 4 was a stop id (numpy dropped the mask)."""
    causal_lm = keras_models[0]
    inputs = {"token_ids": IDS, "padding_mask": IDS > 0}
    with pytest.raises(InputError, match=r"stop_token_ids is a masked array with masked entries"):
        causal_lm.generate(inputs, stop_token_ids=np.ma.array([3, 4], mask=[0, 1]))


@pytest.mark.parametrize("entry", ["causal_lm", "backbone", "causal_lm.generate",
                                   "causal_lm.evaluate y", "stream.fit targets"])
def test_bool_ids_and_targets_are_named_not_read_as_ids_0_and_1(keras_models, entry):
    """The functional models' int32 inputs cast bools to the ids 0 and 1."""
    name, holds, call, good = array_calls(*keras_models)[entry]
    with pytest.raises(InputError, match=rf"^{name} must be integers, got dtype bool"):
        call(good > 3)


CAST = {  # ids a functional model's int32 input cast silently (review35)
    "bool tensor": (lambda: tf.constant(IDS > 3), r"must be integers, got dtype bool"),
    "float array": (lambda: IDS + 0.7, r"must be integers, got dtype float64"),
    "float tensor": (lambda: tf.constant(IDS + 0.7, tf.float32), r"must be integers, got dtype "
                                                                  r"float32"),
    "wrapping int64": (lambda: np.where(IDS == 1, 2 ** 32 + 1, IDS),
                       r"id 4294967297 at position \(0, 0\) does not fit int32"),
    "wrapping int64 tensor": (lambda: tf.constant(np.where(IDS == 1, 2 ** 32 + 1, IDS)),
                              r"id 4294967297 at position \(0, 0\) does not fit int32"),
}


@pytest.mark.parametrize("kind", sorted(CAST))
@pytest.mark.parametrize("entry", ["causal_lm", "backbone", "causal_lm.generate"])
def test_ids_the_int32_input_would_cast_are_named(keras_models, entry, kind):
    """Keras cast them to the functional models' int32 `token_ids`: bools
    read as ids 0 and 1, 1.7 as 1, 2**32 + 1 as 1 (a silent wrong answer)."""
    causal_lm = keras_models[0]
    make, message = CAST[kind]
    ids = make()
    mask = tf.constant(IDS > 0) if tf.is_tensor(ids) else IDS > 0  # Keras: not mixed
    calls = {"causal_lm": lambda v: causal_lm({"token_ids": v, "padding_mask": mask}),
             "backbone": lambda v: causal_lm.backbone({"token_ids": v, "padding_mask": mask}),
             "causal_lm.generate": lambda v: causal_lm.generate(
                 {"token_ids": v, "padding_mask": mask}, stop_token_ids=None)}
    with pytest.raises(InputError, match=r"^token_ids:? " + message):
        calls[entry](ids)
    good = tf.constant(IDS, tf.int64) if tf.is_tensor(ids) else IDS.astype(np.int64)
    calls[entry](good)  # int64 ids that fit are read


NOT_FLAGS = {  # padding masks a cast read as other flags (review35): 0.4 as False, 2 as True
    "0.4": (np.array([[1, 1, 0.4], [1, 1, 1]]), r"0\.4"),
    "2": (np.array([[1, 1, 1], [1, 2, 0]]), r"2"),
    "-1 tensor": (tf.constant([[1, -1, 0], [1, 1, 1]]), r"-1"),
}


@pytest.mark.parametrize("kind", sorted(NOT_FLAGS))
@pytest.mark.parametrize("entry", ["causal_lm", "backbone", "causal_lm.predict",
                                   "causal_lm.evaluate dataset", "causal_lm.generate",
                                   "stream.evaluate"])
def test_padding_masks_that_are_not_flags_are_named(keras_models, entry, kind):
    """A padding mask must be bool or 0/1 (0.0/1.0 floats too, as keras-hub's
    backbones read them); other values were cast silently."""
    causal_lm, _, stream = keras_models
    mask, value = NOT_FLAGS[kind]
    ids = tf.constant(IDS) if tf.is_tensor(mask) else IDS  # Keras: not mixed
    quiet = dict(verbose=0)

    def lm(padding_mask):
        return {"token_ids": ids, "padding_mask": padding_mask}
    calls = {
        "causal_lm": lambda m: causal_lm(lm(m)),
        "backbone": lambda m: causal_lm.backbone(lm(m)),
        "causal_lm.predict": lambda m: causal_lm.predict(lm(m), **quiet),
        "causal_lm.evaluate dataset": lambda m: causal_lm.evaluate(
            tf.data.Dataset.from_tensor_slices((lm(m), IDS)).batch(2), **quiet),
        "causal_lm.generate": lambda m: causal_lm.generate(lm(m), stop_token_ids=None),
        "stream.evaluate": lambda m: stream.evaluate(
            {**lm(m), "document_start": np.array([True, True])}, IDS, batch_size=B, **quiet)}
    with pytest.raises(InputError, match=r"^padding_mask must be bool or 0/1 flags, got "
                                         + value):
        calls[entry](mask)
    if entry in ("causal_lm", "backbone"):  # 0.0 / 1.0 floats: the flags they stand for
        flags = IDS > 1
        as_given = tf.constant if tf.is_tensor(mask) else np.asarray
        np.testing.assert_array_equal(calls[entry](as_given(flags.astype(np.float32))),
                                      calls[entry](as_given(flags)))


def test_float_targets_are_token_ids_or_one_clear_error(keras_models):
    """keras-hub's sparse loss casts targets to integers: 1.5 was read as id
    1, and a float id outside the vocabulary went unchecked (TensorFlow's
    error, or a clamped loss under XLA) (review35). Whole floats are ids;
    one-hot targets `[B, T, n_token]` for a loss of one's own pass."""
    causal_lm, _, stream = keras_models
    x, quiet = {"token_ids": IDS, "padding_mask": IDS > 0}, dict(verbose=0)
    assert causal_lm.evaluate(x, IDS.astype(np.float32), **quiet) == \
        causal_lm.evaluate(x, IDS, **quiet)
    # The stateful model's step refused them ("targets must be integers"), in Keras's
    # "Exception encountered when calling TransformerXL.call()" text.
    assert stream.evaluate(IDS, IDS.astype(np.float32), batch_size=B, **quiet) == \
        stream.evaluate(IDS, IDS, batch_size=B, **quiet)
    cut = (r"^(target 1\.5 at position \(0, 0\) is not a whole number: targets are token ids "
           r"0\.\.39|targets must be whole numbers in 0\.\.39 \(token ids\), got 1\.5$)")
    for call in (lambda y: causal_lm.evaluate(x, y, **quiet),
                 lambda y: causal_lm.fit(x, y, **quiet),
                 lambda y: stream.evaluate(IDS, y, batch_size=B, **quiet)):
        with pytest.raises(InputError, match=cut):
            call(IDS + 0.5)
    with pytest.raises(InputError, match=r"^targets must be whole numbers in 0\.\.39 \(token "
                                         r"ids\), got 99$"):  # keras-hub's: a dataset
        causal_lm.evaluate(x, np.where(IDS == 6, 99.0, IDS), **quiet)
    with pytest.raises(InputError, match=r"^targets must be integers, got dtype bool"):
        causal_lm.evaluate(x, tf.constant(IDS > 3), **quiet)
    data = tf.data.Dataset.from_tensor_slices((x, np.where(IDS == 6, np.nan, IDS))).batch(2)
    with pytest.raises(InputError, match=r"^targets must be whole numbers in 0\.\.39 \(token "
                                         r"ids\), got nan$"):
        causal_lm.evaluate(data, **quiet)
    from txl_tf import TransformerXLCausalLM
    one_hot = TransformerXLCausalLM(causal_lm.backbone)
    one_hot.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=True),
                    weighted_metrics=[])
    loss = one_hot.evaluate(x, np.eye(N_TOKEN, dtype=np.float32)[IDS], **quiet)
    assert loss == pytest.approx(causal_lm.evaluate(x, IDS, **quiet)[0], rel=1e-5)


def test_bfloat16_masks_and_labels_are_read_as_flags_and_ids(keras_models):
    """bfloat16 arrays (numpy's `kind` 'V', from ml_dtypes) and tensors of
    0/1 flags or whole class ids were refused as no numbers by review35's
    checks (review36); a bfloat16 value that is no flag is still named."""
    from ml_dtypes import bfloat16
    causal_lm, classifier, _ = keras_models
    flags = IDS > 1
    x = {"token_ids": IDS, "padding_mask": flags}
    half = {"token_ids": IDS, "padding_mask": flags.astype(bfloat16)}
    np.testing.assert_array_equal(causal_lm(half), causal_lm(x))
    tensors = {key: tf.constant(value) for key, value in half.items()}
    np.testing.assert_array_equal(causal_lm.backbone(tensors), causal_lm.backbone(x))
    quiet = dict(verbose=0)
    assert causal_lm.evaluate(half, IDS, **quiet) == causal_lm.evaluate(x, IDS, **quiet)
    prompts = {"token_ids": IDS, "padding_mask": IDS > 0}
    np.testing.assert_array_equal(
        causal_lm.generate({**prompts, "padding_mask": (IDS > 0).astype(bfloat16)},
                           stop_token_ids=None)["token_ids"],
        causal_lm.generate(prompts, stop_token_ids=None)["token_ids"])
    docs, labels = {"token_ids": IDS, "lengths": np.array([3, 2])}, np.array([0, 2])
    assert classifier.evaluate(docs, labels.astype(bfloat16), **quiet) == \
        classifier.evaluate(docs, labels, **quiet)
    with pytest.raises(InputError, match=r"^padding_mask must be bool or 0/1 flags, got 0\.5"):
        causal_lm({"token_ids": IDS, "padding_mask": np.full(IDS.shape, 0.5, bfloat16)})


def test_ragged_int64_ids_are_an_input_error_not_a_type_error(keras_models):
    """`check_int32_ids` read a ragged tensor as a dense one: numpy's
    TypeError ("RaggedTensor may not be used as a boolean") (review36)."""
    ragged = tf.ragged.constant([[1, 2], [3]], tf.int64)
    with pytest.raises(InputError):
        keras_models[0].backbone({"token_ids": ragged, "padding_mask": ragged > 0})


def test_generate_names_float_ids_of_lists_and_datasets(keras_models):
    """The int32 check of `generate` read numpy arrays and tensors only:
    lists and datasets of 1.5 were continued from id 1 (review36)."""
    causal_lm = keras_models[0]
    prompts = {"token_ids": (IDS + 0.5).tolist(), "padding_mask": (IDS > 0).tolist()}
    data = tf.data.Dataset.from_tensor_slices({key: np.array(value)
                                               for key, value in prompts.items()}).batch(2)
    for given in (prompts, data):
        with pytest.raises(InputError, match=r"^token_ids must be integers, got dtype float"):
            causal_lm.generate(given, stop_token_ids=None)
    good = {"token_ids": IDS.tolist(), "padding_mask": (IDS > 0).tolist()}
    np.testing.assert_array_equal(
        causal_lm.generate(good, stop_token_ids=None)["token_ids"],
        causal_lm.generate({key: np.array(value) for key, value in good.items()},
                           stop_token_ids=None)["token_ids"])
