"""Concrete cases found by property-based fuzzing of the public API (each was a
silent wrong answer, or an error from inside TensorFlow, numpy or Python
instead of one `TxlError` naming the argument)."""
import fractions

import numpy as np
import pytest

from txl_tf import TransformerXLConfig, TransformerXLLM, TxlError

TINY = dict(n_token=11, n_layer=1, d_model=8, n_head=1, d_head=4, d_inner=8, mem_len=4, tgt_len=3)


@pytest.fixture(scope="module")
def config():
    return TransformerXLConfig.preset("tiny", **TINY)


@pytest.mark.parametrize("zero_filled", ["no", 2])
def test_stream_model_refuses_a_zero_filled_that_is_not_a_flag(config, zero_filled):
    with pytest.raises(TxlError, match="zero_filled must be a boolean"):
        TransformerXLLM(config, 2, zero_filled=zero_filled)  # "no" was a zero-filled memory
    assert TransformerXLLM(config, 2, zero_filled=np.bool_(False)).zero_filled is False


@pytest.fixture(scope="module")
def causal_lm():
    from txl_tf import (TransformerXLBackbone, TransformerXLCausalLM,
                        TransformerXLCausalLMPreprocessor, TransformerXLTokenizer)
    from txl_tf.text import ByteTokenizer
    config = TransformerXLConfig.preset("tiny", **dict(TINY, n_token=256))
    preprocessor = TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(ByteTokenizer()),
                                                     sequence_length=8)
    return TransformerXLCausalLM(TransformerXLBackbone(**config.to_dict()), preprocessor)


def _samplers():
    import keras_hub
    s = keras_hub.samplers
    nan = float("nan")
    return [  # (sampler, what the error names); each ran, or failed deep in the graph
        (None, "compile a sampler"), ("bogus", "compile a sampler"),  # 'NoneType' not callable
        (s.GreedySampler(temperature=nan), "temperature"),  # any id, silently
        (s.RandomSampler(temperature=0.0), "temperature"),  # NaN probabilities
        (s.RandomSampler(temperature=-1.0), "temperature"),  # the least likely ids
        (s.TopKSampler(k=0), "k must be"),  # always id 0
        (s.TopKSampler(k=257), "k must be"),  # TopKV2's error from the graph
        (s.TopKSampler(k=-1), "k must be"),
        (s.TopPSampler(p=nan), "p must be"), (s.TopPSampler(p=-0.1), "p must be"),  # greedy
        (s.BeamSampler(num_beams=0), "num_beams"),  # a strided slice's error from the graph
        (s.ContrastiveSampler(k=257), "k must be"),
        (s.ContrastiveSampler(alpha=nan), "alpha"),
        (s.TopKSampler(k=2.0), "k must be"),  # TopKV2 takes an int32 k
    ]


@pytest.mark.parametrize("case", range(14))
def test_generate_refuses_a_sampler_it_cannot_run_as_asked(causal_lm, case):
    sampler, message = _samplers()[case]
    causal_lm.compile(sampler=sampler)
    with pytest.raises(TxlError, match=message):
        causal_lm.generate("import", max_length=8)


def test_generate_takes_a_sampler_setting_held_in_a_tensor(causal_lm):
    import keras
    import keras_hub
    import tensorflow as tf
    for temperature in (tf.constant(0.7), keras.Variable(0.7), np.float32(0.7),
                        np.array(0.7)):
        causal_lm.compile(sampler=keras_hub.samplers.TopKSampler(k=tf.constant(3),
                                                                 temperature=temperature))
        assert causal_lm.generate("import", max_length=8).startswith("import")  # was refused
    causal_lm.compile(sampler=keras_hub.samplers.RandomSampler(temperature=tf.constant(0.0)))
    with pytest.raises(TxlError, match="temperature must be"):  # still checked
        causal_lm.generate("import", max_length=8)


def test_generate_refuses_an_empty_list_of_prompts(causal_lm):
    causal_lm.compile(sampler="greedy")
    with pytest.raises(TxlError, match="no prompts"):  # was the tokenizer's dtype error
        causal_lm.generate([], max_length=8)


@pytest.mark.parametrize("ids", [[1.7, 65.2], [True, False], np.array([66.0])])
def test_detokenize_refuses_ids_that_are_not_integers(ids):
    from txl_tf import TransformerXLTokenizer
    from txl_tf.text import ByteTokenizer
    with pytest.raises(TxlError, match="integer ids"):  # were cast: 1.7 read as id 1
        TransformerXLTokenizer(ByteTokenizer()).detokenize(ids)


@pytest.mark.parametrize("ids, message", [(5, "1-D sequence of ids"), ("hello", "1-D sequence"),
                                         ([np.uint64(2 ** 64 - 1)], "is out of range")])
def test_detokenize_names_bad_ids(ids, message):
    from txl_tf import TransformerXLTokenizer
    from txl_tf.text import ByteTokenizer
    with pytest.raises(TxlError, match=message):  # TypeError, int()'s ValueError, OverflowError
        TransformerXLTokenizer(ByteTokenizer()).detokenize(ids)


@pytest.mark.parametrize("ids", [np.ma.masked_equal([[65, 66], [67, 68]], 68),
                                 np.ma.masked_equal([65, 66], 66)])
def test_detokenize_names_masked_ids(ids):
    from txl_tf import TransformerXLTokenizer
    from txl_tf.text import ByteTokenizer
    tokenizer = TransformerXLTokenizer(ByteTokenizer())
    with pytest.raises(TxlError, match="ids is a masked array with masked entries"):
        tokenizer.detokenize(ids)  # the masked ids were decoded: "CD", "AB"
    assert tokenizer.detokenize(np.ma.array([65, 66])) == "AB"


def test_detokenize_of_good_ids_is_unchanged():
    import tensorflow as tf
    from txl_tf import TransformerXLTokenizer
    from txl_tf.text import ByteTokenizer
    tokenizer = TransformerXLTokenizer(ByteTokenizer())
    assert tokenizer.detokenize([104, 105]) == "hi"
    assert tokenizer.detokenize(np.array([[104, 105], [111, 107]], np.uint8)) == ["hi", "ok"]
    assert tokenizer.detokenize(tf.ragged.constant([[104], [111, 107]])) == ["h", "ok"]


def _tokenizers():
    from txl_tf.text import ByteTokenizer, CharTokenizer, WordTokenizer
    return {"byte": ByteTokenizer(), "char": CharTokenizer.build("hello world\n"),
            "char_no_unk": CharTokenizer.build("hello world\n", unk_char=None),
            "word": WordTokenizer.build("hello world\n")}


@pytest.mark.parametrize("kind, text", [("char", b"\xff\xfe"), ("char_no_unk", b"\xff\xfe"),
                                        ("word", b"\xff\xfe"), ("char", "\ud800"),
                                        ("char_no_unk", "\ud800"), ("word", "a\ud800b c")])
def test_encode_names_text_that_is_not_utf8(kind, text):
    # A word holding a lone surrogate was <unk> (encode_tf refused the text)
    with pytest.raises(TxlError, match="UTF-8"):  # was UnicodeDecodeError / UnicodeEncodeError
        _tokenizers()[kind].encode(text)


@pytest.mark.parametrize("kind", ["char", "char_no_unk"])
def test_encode_tf_eagerly_names_text_that_is_not_utf8(kind):
    with pytest.raises(TxlError, match="UTF-8"):  # was TensorFlow's InvalidArgumentError
        _tokenizers()[kind].encode_tf(b"ok \xff")


def test_encode_tf_eagerly_names_a_character_outside_the_vocabulary():
    with pytest.raises(TxlError, match="not in the vocabulary"):  # was an assertion's error
        _tokenizers()["char_no_unk"].encode_tf("hex")


@pytest.mark.parametrize("kind", ["byte", "char", "word"])
def test_decode_names_rows_of_other_lengths(kind):
    with pytest.raises(TxlError, match="1-D"):  # was numpy's "inhomogeneous shape"
        _tokenizers()[kind].decode([[1, 2], [3]])


@pytest.fixture(scope="module")
def decoder(config):
    from txl_tf import Decoder, TransformerXL
    return Decoder(TransformerXL(config), jit_compile=False)


def test_decoder_generate_takes_the_memory_as_a_pair_of_arrays(decoder):
    memory = decoder.initial_memory(2)
    pair = (memory.mems.numpy(), memory.mem_mask.numpy())  # was 'tuple' has no attribute 'mems'
    with_pair = decoder.generate([[1, 2, 3], [4]], 3, temperature=0, memory=pair)
    with_memory = decoder.generate([[1, 2, 3], [4]], 3, temperature=0, memory=memory)
    np.testing.assert_array_equal(with_pair.ids, with_memory.ids)
    with_list = decoder.generate([[1, 2, 3], [4]], 3, temperature=0, memory=list(pair))
    np.testing.assert_array_equal(with_list.ids, with_memory.ids)  # as the core takes it
    with pytest.raises(TxlError, match=r"memory must be a txl_tf.Memory .* or a \(mems, "
                                       r"mem_mask\) pair, got str"):
        decoder.generate([[1, 2, 3]], 3, temperature=0, memory="memory")


def test_generate_names_a_prompt_of_ragged_rows(decoder):
    with pytest.raises(TxlError, match="prompt 0"):  # was numpy's "inhomogeneous shape"
        decoder.generate([[[1, 2], [3]]], 2)


@pytest.mark.parametrize("setting", [dict(temperature=np.complex64(1)),  # imaginary part dropped
                                     dict(temperature=1e308),  # inf in float32
                                     dict(temperature=2 ** 1100),  # OverflowError
                                     dict(repetition_penalty=1e308),  # inf in float32
                                     dict(top_p=np.complex128(0.5))])
def test_generate_refuses_sampling_numbers_float32_cannot_hold(decoder, setting):
    with pytest.raises(TxlError, match=next(iter(setting))):
        decoder.generate([[1, 2]], 2, **setting)


@pytest.mark.parametrize("session_id", [[1], {"a"}, {"k": 1}])
def test_session_table_names_a_session_id_that_is_not_hashable(decoder, session_id):
    from export import SessionTable
    table = SessionTable(decoder, max_batch=2)
    for verb, args in (("open", ([1, 2], 3)), ("reset", ([1],)), ("close", ())):
        with pytest.raises(TxlError, match="session_id must be hashable"):  # was a TypeError
            getattr(table, verb)(session_id, *args)


@pytest.mark.parametrize("session_id", [float("nan"), np.float32("nan")])
def test_session_table_names_a_session_id_that_is_not_equal_to_itself(decoder, session_id):
    """A NaN id opened a session that no id could step, reset or close (each
    NaN is unequal to every other): its row served for ever, never closed."""
    from export import SessionTable
    table = SessionTable(decoder, max_batch=2)
    for verb, args in (("open", ([1, 2], 3)), ("reset", ([1],)), ("close", ())):
        with pytest.raises(TxlError, match=r"^session_id must equal itself, got "
                                           r"(np\.float32\()?nan"):
            getattr(table, verb)(session_id, *args)
    assert not table.active()


@pytest.mark.parametrize("ids", [[1, 2, 12, 3, 4], np.array([1, -1, 2, 3], np.int64)])
def test_evaluate_ids_names_an_id_outside_the_vocabulary(config, ids):
    from txl_tf import InputError, TransformerXL
    from txl_tf.learning.evaluation import evaluate_ids
    with pytest.raises(InputError, match="out of range for a vocabulary of 11"):
        evaluate_ids(TransformerXL(config), ids)  # was TensorFlow's InvalidArgumentError


@pytest.fixture(scope="module")
def classifier(config):
    from txl_tf import TransformerXL, TransformerXLClassifier
    return TransformerXLClassifier(TransformerXL(config), num_classes=3, segment_len=3,
                                   mem_len=4)


IDS = np.arange(10).reshape(2, 5) % 11


@pytest.mark.parametrize("lengths, message", [
    (np.array([0, 5]), r"lengths\[0\] = 0 is out of range"),  # InvalidArgumentError
    (np.array([5, 6]), r"lengths\[1\] = 6 is out of range"),
    (np.array([5, 5, 5]), "lengths has 3 entries but token_ids have 2 rows"),  # AttributeError
])
def test_classifier_predict_names_bad_lengths(classifier, lengths, message):
    with pytest.raises(TxlError, match=message):
        classifier.predict({"token_ids": IDS, "lengths": lengths}, verbose=0)


def test_classifier_evaluate_names_bad_lengths_of_a_dataset(classifier):
    import tensorflow as tf
    data = tf.data.Dataset.from_tensor_slices(
        ({"token_ids": IDS, "lengths": np.array([0, 5])}, np.array([0, 1]))).batch(2)
    classifier.compile(loss="sparse_categorical_crossentropy")
    with pytest.raises(TxlError, match="lengths must be one per row"):  # the pipeline's assertion
        classifier.evaluate(data, verbose=0)


@pytest.mark.parametrize("lengths, message", [
    ([0, 5], r"lengths\[0\] = 0 is out of range"), ([5, 6], r"lengths\[1\] = 6 is out of range"),
    ([5, 5, 5], "lengths has 3 entries but token_ids have 2 rows"),
    ([5.0, 5.0], "lengths must be integers")])
def test_classifier_names_bad_lengths_of_a_generator_under_xla(classifier, lengths, message):
    def batches():
        yield {"token_ids": IDS, "lengths": np.array(lengths)}, np.array([0, 1])
    classifier.compile(loss="sparse_categorical_crossentropy", jit_compile=True)
    try:  # XLA drops the step's assertion: [0, 5] gave a loss of garbage, silently
        with pytest.raises(TxlError, match=message):
            classifier.evaluate(batches(), verbose=0)
    finally:
        classifier.compile(loss="sparse_categorical_crossentropy")


def test_stream_model_evaluate_names_labels_of_another_shape(config):
    model = TransformerXLLM(config, 2)
    model.compile()
    ids = np.arange(6).reshape(2, 3) % 11
    for length in (3, 2):  # traced again for a new length: the shapes are unknown there
        model.evaluate(ids[:, :length], ids[:, :length], batch_size=2, verbose=0)
    with pytest.raises(TxlError, match="targets have shape"):  # was an InvalidArgumentError
        model.evaluate(ids, ids[:, :2], batch_size=2, verbose=0)


def test_stream_model_names_labels_of_another_shape_in_a_generator(config):
    model = TransformerXLLM(config, 2)
    model.compile()
    ids = np.arange(6).reshape(2, 3) % 11
    for labels in (ids[:, :2], ids[:1]):
        def batches():
            yield ids, labels
        with pytest.raises(TxlError, match="targets have shape"):  # TensorFlow's error
            model.evaluate(batches(), verbose=0)


@pytest.mark.parametrize("field, value", [("dropout", np.float32(0.25)), ("init_std", np.int64(1)),
                                          ("layer_norm_epsilon", fractions.Fraction(1, 8))])
def test_config_keeps_real_fields_as_floats_that_json_writes(field, value):
    config = TransformerXLConfig.preset("tiny", **{field: value})
    assert type(getattr(config, field)) is float  # to_json raised "not JSON serializable"
    assert TransformerXLConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize("attn_type", [1.0, np.True_, [0], np.int64(1)])
def test_config_attn_type_must_be_an_int(attn_type):
    from txl_tf import ConfigError
    with pytest.raises(ConfigError, match="attn_type must be one of"):  # 1.0 and True were kept
        TransformerXLConfig.preset("tiny", attn_type=attn_type)


@pytest.mark.parametrize("name", [["tiny"], None, b"tiny"])
def test_config_preset_names_a_name_that_is_not_a_string(name):
    from txl_tf import ConfigError
    with pytest.raises(ConfigError, match="unknown preset"):  # a list was a TypeError
        TransformerXLConfig.preset(name)


def test_config_from_json_takes_a_path_object_and_names_other_types(tmp_path):
    from txl_tf import ConfigError
    path = tmp_path / "config.json"
    path.write_text('{"n_token": 7}')
    assert TransformerXLConfig.from_json(path).n_token == 7  # was an AttributeError
    for value in (None, 5, b"{}"):
        with pytest.raises(ConfigError, match="JSON text or a file's path"):
            TransformerXLConfig.from_json(value)


@pytest.mark.parametrize("directory, tokenizer, message", [
    ("", None, "directory"),  # was written into the working directory, which load refuses
    ("model", "vocab", "tokenizer must be"),  # was an AttributeError
    ("model", 5, "tokenizer must be"),
])
def test_save_pretrained_names_a_bad_directory_or_tokenizer(config, tmp_path, monkeypatch,
                                                            directory, tokenizer, message):
    from txl_tf import TransformerXL
    from txl_tf.weights import save_pretrained
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TxlError, match=message):
        save_pretrained(TransformerXL(config), directory, tokenizer=tokenizer)
    assert not list(tmp_path.iterdir())  # nothing written


def test_core_takes_a_memory_of_nested_lists(config):
    from txl_tf import TransformerXL
    core = TransformerXL(config)
    memory = core.initial_memory(2)
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    lists = [memory.mems.numpy().tolist(), memory.mem_mask.numpy().tolist()]
    got, _ = core(ids, lists)  # was Keras's "only input tensors may be passed positionally"
    want, _ = core(ids, memory)
    np.testing.assert_allclose(got.numpy(), want.numpy())


@pytest.mark.parametrize("rows", [None, "ab"])
def test_reset_rows_names_rows_that_are_not_flags(config, rows):
    from txl_tf import TransformerXL
    memory = TransformerXL(config).initial_memory(2)
    with pytest.raises(TxlError, match="rows must be bool"):  # None was TensorFlow's ValueError
        memory.reset_rows(rows)


def test_core_initial_memory_too_large_for_this_machine_is_refused_up_front(config):
    import tensorflow as tf
    from txl_tf import TransformerXL
    from txl_tf.checks.memory_budget import MemoryBudgetError
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("the check is of host memory; a GPU's memory is TensorFlow's to refuse")
    core = TransformerXL(config)
    with pytest.raises(MemoryBudgetError):  # was TensorFlow's ResourceExhaustedError (OOM)
        core.initial_memory(2 ** 40)
    with pytest.raises(MemoryBudgetError):
        core.initial_memory(1, mem_len=2 ** 31 - 1)


def test_byte_encode_names_a_lone_surrogate():
    with pytest.raises(TxlError, match="UTF-8"):  # was UnicodeEncodeError
        _tokenizers()["byte"].encode("a\ud800")


@pytest.mark.parametrize("token", [np.array([]), np.array([[1, 2]]), 5, None])
def test_token_to_id_names_a_token_that_is_not_text(token):
    from txl_tf import TransformerXLTokenizer
    for inner in _tokenizers().values():
        with pytest.raises(TxlError, match="token must be"):  # numpy's "truth value" error
            TransformerXLTokenizer(inner).token_to_id(token)


@pytest.mark.parametrize("ids", [None, 5])
def test_evaluate_ids_names_ids_that_are_not_a_sequence(config, ids):
    from txl_tf import InputError, TransformerXL
    from txl_tf.learning.evaluation import evaluate_ids
    with pytest.raises(InputError, match="1-D"):  # was "object of type 'NoneType' has no len()"
        evaluate_ids(TransformerXL(config), ids)


@pytest.mark.parametrize("part", ["token_ids", "lengths", "labels"])
def test_classifier_names_masked_arrays_in_a_generators_batches(classifier, part):
    """Keras converted each batch, dropping the mask: the masked entries
    were read as ids, lengths or labels."""
    inputs, labels = {"token_ids": IDS, "lengths": np.array([5, 4])}, np.array([0, 1])
    if part == "labels":
        labels = np.ma.array(labels, mask=[0, 1])
    else:
        inputs[part] = np.ma.array(inputs[part], mask=np.arange(inputs[part].size).reshape(
            inputs[part].shape) == 1)

    def batches():
        yield inputs, labels
    classifier.compile(loss="sparse_categorical_crossentropy")
    with pytest.raises(TxlError, match=rf"{part} is a masked array with masked entries"):
        classifier.evaluate(batches(), verbose=0)


def test_stream_model_names_masked_targets_in_a_generators_batches(config):
    model = TransformerXLLM(config, 2)
    model.compile()
    ids = np.arange(6).reshape(2, 3) % 11

    def batches():
        yield ids, np.ma.masked_equal(ids, 4)
    with pytest.raises(TxlError, match=r"targets is a masked array with masked entries"):
        model.evaluate(batches(), verbose=0)
