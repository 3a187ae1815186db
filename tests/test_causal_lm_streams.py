"""`TransformerXLCausalLM` on streams: `fit` carries the memory from batch to
batch, each step the paper's gradient step on the continuous stream,
and over separate documents each row's memory is cleared where its next
document starts; documents as text go through the preprocessor."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import (TransformerXLBackbone, TransformerXLCausalLM, TransformerXLConfig,
                    TransformerXLLM, TxlError)
from txl_tf.text import ByteTokenizer
from txl_tf.models.transformer_xl.transformer_xl_causal_lm_preprocessor import (
    TransformerXLCausalLMPreprocessor)
from txl_tf.models.transformer_xl.transformer_xl_tokenizer import TransformerXLTokenizer

N_TOKEN, T, M, B = 40, 4, 8, 2


def config(n_token=N_TOKEN, **overrides):
    return TransformerXLConfig.preset("tiny", n_token=n_token, tgt_len=T, mem_len=M,
                                      dropout=0.0, **overrides)


class StepLosses(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        self.losses = getattr(self, "losses", []) + [float(logs["loss"])]


def test_fit_on_the_continuous_stream_is_the_papers_step_with_memory_carried():
    """Each `fit` step is an Adam step on the gradient of the mean NLL the
    core gives with the memory the step before left (written out here), and
    `TransformerXLLM` (the config-built stream model) steps the same."""
    keras.utils.set_random_seed(0)
    causal_lm = TransformerXLCausalLM(TransformerXLBackbone(**config().to_dict()))
    stateful = TransformerXLLM(config(), batch_size=B)
    reference = TransformerXLBackbone.from_core(causal_lm.core).transformer
    start = reference.r_w_bias.numpy().copy()
    stateful.core.set_weights(causal_lm.core.get_weights())
    stream = np.random.default_rng(0).integers(0, N_TOKEN, (B, 6 * T + 1)).astype(np.int32)
    xs = np.stack([stream[:, s * T:(s + 1) * T] for s in range(6)])
    ys = np.stack([stream[:, s * T + 1:(s + 1) * T + 1] for s in range(6)])
    optimizer = keras.optimizers.Adam(1e-2)
    memory, expected = reference.initial_memory(B), []
    for x, y in zip(xs, ys):
        with tf.GradientTape() as tape:
            nll, memory = reference(x, memory, targets=y, training=True)
            loss = tf.reduce_mean(nll)
        variables = reference.trainable_variables
        optimizer.apply(tape.gradient(loss, variables), variables)
        expected.append(float(loss))
    continuing = np.zeros([6, B], bool)  # one stream per row: never a document start
    causal_lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    stateful.compile(optimizer=keras.optimizers.Adam(1e-2))
    steps = [StepLosses(), StepLosses()]
    causal_lm.fit(tf.data.Dataset.from_tensor_slices(
        ({"token_ids": xs, "padding_mask": np.ones_like(xs), "document_start": continuing}, ys)),
        verbose=0, callbacks=[steps[0]])
    stateful.fit(tf.data.Dataset.from_tensor_slices((xs, ys)), verbose=0, callbacks=[steps[1]])
    # Keras reports the running mean of the epoch's losses.
    running = np.cumsum(expected) / np.arange(1, 7)
    for logged in steps:
        np.testing.assert_allclose(logged.losses, running, atol=1e-5)
    trained = reference.r_w_bias.numpy()
    assert np.abs(trained - start).max() > 1e-3  # the steps moved the weights
    np.testing.assert_allclose(causal_lm.core.r_w_bias.numpy(), trained, atol=1e-5)
    np.testing.assert_allclose(stateful.core.r_w_bias.numpy(), trained, atol=1e-5)


def read_alone(core, doc):
    """Log-probs of one document read segment by segment from an empty memory."""
    memory, out = core.initial_memory(1, mem_len=M), []
    for start in range(0, len(doc) - 1, T):
        lp, memory = core(np.asarray(doc[:-1][None, start:start + T], np.int32), memory)
        out.append(lp.numpy()[0])
    return np.concatenate(out)


def test_documents_stream_per_row_and_each_reads_as_if_alone():
    keras.utils.set_random_seed(1)
    causal_lm = TransformerXLCausalLM(TransformerXLBackbone(**config(init_std=0.3).to_dict()))
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, N_TOKEN, n).astype(np.int32) for n in (10, 6, 13, 7, 9)]
    data = causal_lm.document_dataset(docs, batch_size=B)
    steps = [(x["token_ids"].numpy(), y.numpy(), w.numpy(), x["document_start"].numpy())
             for x, y, w in data]
    assert any(start[row] for _, _, _, start in steps[1:] for row in range(B))  # resets occur
    log_probs = causal_lm.predict(data.map(lambda x, y, w: x), verbose=0)
    log_probs = log_probs.reshape(len(steps), B, T, N_TOKEN)
    # Each row's segments in order, cut into its documents at each start.
    read = {}

    def keep(pieces):
        document = np.concatenate(pieces) if pieces else np.zeros([0])
        if len(document):  # a row that ended early reads empty segments
            read[len(document)] = document

    for row in range(B):
        pieces = []
        for step, (_, _, weights, start) in enumerate(steps):
            if start[row]:
                keep(pieces)
                pieces = []
            pieces.append(log_probs[step, row][weights[row] > 0])
        keep(pieces)
    assert sorted(read) == sorted(len(d) - 1 for d in docs)  # lengths tell the documents apart
    for doc in docs:
        np.testing.assert_allclose(read[len(doc) - 1], read_alone(causal_lm.core, doc),
                                   atol=1e-5)
    # The loss of evaluate and of fit (learning rate 0) is that of these log-probs:
    # the NLL per document token (padding weighs 0), and bpc / ppl of it.
    nll = -np.take_along_axis(log_probs, np.stack([y for _, y, _, _ in steps])[..., None], -1)
    weights = np.stack([w for _, _, w, _ in steps])
    expected = (nll[..., 0] * weights).sum() / weights.sum()
    causal_lm.compile(optimizer=keras.optimizers.SGD(0.0))
    result = causal_lm.evaluate(data, verbose=0, return_dict=True)
    assert result["loss"] == pytest.approx(expected, abs=1e-5)
    assert result["bpc"] == pytest.approx(expected / np.log(2), abs=1e-5)
    assert result["ppl"] == pytest.approx(np.exp(expected), rel=1e-5)
    history = causal_lm.fit(data, verbose=0)
    assert set(history.history) == {"loss", "bpc", "ppl"}
    assert history.history["loss"][0] == pytest.approx(expected, abs=1e-5)


def test_documents_as_text_go_through_the_preprocessor_and_fit_learns():
    keras.utils.set_random_seed(2)
    cfg = config(n_token=256)
    preprocessor = TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(ByteTokenizer()),
                                                     sequence_length=T)
    causal_lm = TransformerXLCausalLM(TransformerXLBackbone(**cfg.to_dict()),
                                      preprocessor=preprocessor)
    docs = ["def f(x):\n    return x\n", "import os\nprint(os.sep)\n", "a = 1\nb = a + 1\n"]
    data = causal_lm.document_dataset(docs, batch_size=B)
    first_ids = next(iter(data))[0]["token_ids"].numpy()
    np.testing.assert_array_equal(first_ids[0], np.frombuffer(docs[0].encode()[:T], np.uint8))
    causal_lm.compile(optimizer=keras.optimizers.Adam(3e-3))
    history = causal_lm.fit(data.repeat(), steps_per_epoch=20, epochs=4, verbose=0)
    assert history.history["loss"][-1] < 0.8 * history.history["loss"][0]
    assert isinstance(causal_lm.generate("import", max_length=12), str)


def test_stream_errors_are_one_clear_line():
    causal_lm = TransformerXLCausalLM(TransformerXLBackbone(**config().to_dict()))
    causal_lm.compile()
    ids = np.zeros([4, T], np.int32)
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids), "document_start": np.zeros([4], bool)}
    with pytest.raises(TxlError, match="shuffle=True would move rows"):
        causal_lm.fit(x, ids, batch_size=B, shuffle=True, verbose=0)
    with pytest.raises(TxlError, match="not a multiple of 3"):
        causal_lm.fit(x, ids, batch_size=3, verbose=0)
    unbatched = tf.data.Dataset.from_tensor_slices((x, ids)).batch(3)
    with pytest.raises(TxlError, match="fixed batch size"):
        causal_lm.evaluate(unbatched, verbose=0)
    with pytest.raises(TxlError, match="documents as text need a preprocessor"):
        causal_lm.document_dataset(["some text"], batch_size=B)


def test_fit_takes_keras_hubs_positional_arguments_in_its_order():
    """`fit(x, y, batch_size, sample_weight, validation_data,
    validation_split)` as keras-hub's `fit` orders them: the fourth
    positional argument was taken as `shuffle` (a weight array: "truth value
    of an array is ambiguous"; `fit(x, y, 2, 3)`: one shuffled epoch)."""
    causal_lm = TransformerXLCausalLM(TransformerXLBackbone(**config().to_dict()))
    causal_lm.compile(optimizer="adam")
    ids = np.ones([B, T], np.int32)
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    streams = dict(x, document_start=np.zeros([B], bool))
    for data in (x, streams):
        weighted = causal_lm.fit(data, ids, B, np.ones([B, T], np.float32), verbose=0)
        unweighted = causal_lm.fit(data, ids, B, np.zeros([B, T], np.float32), verbose=0)
        assert weighted.history["loss"][0] > 0 and unweighted.history["loss"] == [0.0]
        history = causal_lm.fit(data, ids, B, None, (data, ids), None, verbose=0)
        assert "val_loss" in history.history


def test_validation_data_of_another_batch_size_or_kind_is_one_clear_error():
    """Validation runs through `evaluate` between epochs: another batch size
    re-made the memories and dropped the train function (epoch 2 was a
    TypeError), as did validation data of the other kind."""
    causal_lm = TransformerXLCausalLM(TransformerXLBackbone(**config().to_dict()))
    causal_lm.compile(optimizer="adam")
    docs = [np.arange(1, n) % N_TOKEN for n in (9, 13, 7, 11)]
    train = causal_lm.document_dataset(docs, batch_size=B)
    with pytest.raises(TxlError, match="batches of 4; validation_data must come in batches of "
                                       "the training data's 2 streams"):
        causal_lm.fit(train, validation_data=causal_lm.document_dataset(docs, batch_size=4),
                      epochs=2, verbose=0)
    plain = tf.data.Dataset.from_tensor_slices(
        ({"token_ids": np.ones([2, T], np.int32), "padding_mask": np.ones([2, T], np.int32)},
         np.ones([2, T], np.int32))).batch(B)
    with pytest.raises(TxlError, match="but validation_data does not"):
        causal_lm.fit(train, validation_data=plain, epochs=2, verbose=0)
    with pytest.raises(TxlError, match="validation_data holds stream batches"):
        causal_lm.fit(plain, validation_data=train, epochs=2, verbose=0)


def test_ids_given_to_a_model_with_a_preprocessor_are_one_error():
    """`generate({"token_ids", "padding_mask"})` on a model with a
    preprocessor was the tokenizer's `ValueError` traceback."""
    from txl_tf.checks.inputs import InputError
    preprocessor = TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(ByteTokenizer()),
                                                     sequence_length=T)
    causal_lm = TransformerXLCausalLM(TransformerXLBackbone(**config(n_token=256).to_dict()),
                                      preprocessor=preprocessor)
    ids = {"token_ids": np.array([[1, 2, 0]], np.int32),
           "padding_mask": np.array([[1, 1, 0]], bool)}
    with pytest.raises(InputError, match=r"^generate with a preprocessor takes text; .*"
                                         r"`causal_lm\.preprocessor = None` first$"):
        causal_lm.generate(ids, max_length=6)
    causal_lm.preprocessor = None
    out = causal_lm.generate(ids, stop_token_ids=None)
    assert list(np.asarray(out["token_ids"])[0, :2]) == [1, 2]
    assert np.asarray(out["padding_mask"]).all()  # the padding slot was generated


def test_a_stream_batch_with_a_key_of_another_kind_is_named():
    from txl_tf.checks.inputs import InputError
    tiny = TransformerXLConfig.preset("tiny", n_token=30)
    lm = TransformerXLCausalLM(TransformerXLBackbone(**tiny.to_dict()), mem_len=4,
                               segment_len=4)
    lm.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy())
    x = {"token_ids": np.ones([2, 4], np.int32), "document_start": np.array([True, True]),
         "segment_ids": np.ones([2, 4], np.int32)}
    with pytest.raises(InputError, match=r"^inputs as a dict take 'token_ids' and optionally "
                                         r"'document_start', 'padding_mask', got keys "
                                         r"\['document_start', 'segment_ids', 'token_ids'\]$"):
        lm.evaluate(x, np.ones([2, 4], np.int32), batch_size=2, verbose=0)
