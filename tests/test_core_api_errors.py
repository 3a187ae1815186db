"""Bad input to the core's public API, its layers used on their own, the data
functions and the decoder: one clear `TxlError`, raised by the library itself
(not a TensorFlow error from deep inside, not a StagingError from a trace, not
a silent truncation or broadcast)."""
import re

import numpy as np
import pytest

from txl_tf import ConfigError, Decoder, TransformerXL, TransformerXLConfig, TxlError
from txl_tf.config import as_config
from txl_tf.data.documents import document_segments, split_documents


@pytest.fixture(scope="module")
def core():
    return TransformerXL(TransformerXLConfig.preset("tiny", n_token=20, mem_len=4, tgt_len=4))


def raised(fn, *args, **kwargs):
    """The exception `fn(*args, **kwargs)` raises (it must raise)."""
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    return info.value


@pytest.mark.parametrize("attn_type", [1, 2, 3])
def test_a_decoder_of_a_type_without_a_decode_cache_is_the_cores_own_error(attn_type):
    config = TransformerXLConfig.preset("tiny", n_token=20, attn_type=attn_type)
    error = raised(Decoder, TransformerXL(config))  # before anything traces
    assert type(error) is TxlError, type(error)  # was a StagingError from the first generate
    assert f"attn_type {attn_type}" in str(error) and "decode cache" in str(error)


def test_a_decoder_names_a_core_that_is_not_one(core):
    with pytest.raises(TxlError, match="core must be a txl_tf.TransformerXL .* got str"):
        Decoder("tiny")
    with pytest.raises(TxlError, match=r"mem_len must be an integer >= 0, got 2\.5"):
        Decoder(core, mem_len=2.5)  # was cut to 2


@pytest.mark.parametrize("kwargs,message", [
    (dict(batch_size=1, mem_len=2.5), r"mem_len must be an integer >= 0, got 2\.5"),  # was 2
    (dict(batch_size=1, mem_len="3"), r"mem_len must be an integer >= 0, got '3'"),  # was 3
    (dict(batch_size=1, mem_len=True), r"mem_len must be an integer >= 0, got True"),  # was 1
    (dict(batch_size=1, mem_len=-1), r"mem_len must be an integer >= 0, got -1"),
    (dict(batch_size=2.5), r"batch_size must be an integer >= 1, got 2\.5"),  # a TypeError
    (dict(batch_size=-1), r"batch_size must be an integer >= 1, got -1"),  # a TF error
    (dict(batch_size="2"), r"batch_size must be an integer >= 1, got '2'"),
    (dict(batch_size=1, zero_filled="no"), r"zero_filled must be a boolean, got 'no'"),  # True
])
def test_initial_memory_takes_integers_and_a_flag_only(core, kwargs, message):
    with pytest.raises(TxlError, match=message):
        core.initial_memory(**kwargs)


def test_a_memory_longer_than_int32_holds_is_refused_not_wrapped(core):
    """In a graph the memory's shape is int32: mem_len 2**32 + 4 made 4 slots
    (10**10 made 1,410,065,408) without a word."""
    import tensorflow as tf
    for mem_len in (2 ** 31, 2 ** 32 + 4, 10 ** 10):
        shape = tf.function(lambda n: tf.shape(core.initial_memory(n, mem_len=mem_len).mem_mask),
                            autograph=False)  # autograph would wrap the error
        with pytest.raises(TxlError, match=rf"mem_len must be an integer in \[0, 2147483647\], "
                                           rf"got {mem_len}"):
            shape(tf.constant(1))


def test_grad_segments_times_a_numpy_segment_len_is_not_wrapped():
    """2**16 segments of np.int32(2**16) positions: the int32 product wrapped to 0."""
    from txl_tf.core import check_grad_segments
    with pytest.raises(TxlError, match=r"grad_segments \(65536\) x segment_len \(65536\)"):
        check_grad_segments(2 ** 16, np.int32(2 ** 16))
    assert check_grad_segments(np.int64(2), np.int32(2 ** 30 - 1)) == 2


def test_initial_memory_still_takes_numpy_integers_and_tensors(core):
    import tensorflow as tf
    assert core.initial_memory(np.int64(2), mem_len=np.int32(3)).mems.shape == (2, 2, 3, 32)
    assert core.initial_memory(tf.constant(2), 0, zero_filled=1).mem_mask.shape == (2, 0)


def test_a_preset_name_for_a_config_says_what_to_pass():
    error = raised(TransformerXL, "tiny")
    assert type(error) is ConfigError  # was a TypeError
    assert "TransformerXLConfig.preset('tiny')" in str(error)
    with pytest.raises(ConfigError, match=r"got str 'nope': a preset goes through "
                                          r"TransformerXLConfig.preset\(name\), one of"):
        as_config("nope")
    with pytest.raises(ConfigError, match="got int 3$"):
        as_config(3)
    assert as_config({"n_token": 7}).n_token == 7


@pytest.mark.parametrize("batch_size,tgt_len,message", [
    (2.5, 4, r"batch_size must be an integer >= 1, got 2\.5"),  # was a TypeError
    (0, 4, r"batch_size must be an integer >= 1, got 0"),
    (2, 1.5, r"tgt_len must be an integer >= 1, got 1\.5"),
    (True, 4, r"batch_size must be an integer >= 1, got True"),
])
def test_document_segments_take_integer_sizes(batch_size, tgt_len, message):
    with pytest.raises(TxlError, match=message):
        document_segments([[1, 2, 3]], batch_size, tgt_len)


def test_the_causal_lms_document_dataset_takes_integer_sizes():
    from txl_tf import TransformerXLBackbone, TransformerXLCausalLM
    config = TransformerXLConfig.preset("tiny", n_token=20, mem_len=4, tgt_len=4)
    causal_lm = TransformerXLCausalLM(TransformerXLBackbone(**config.to_dict()))
    docs = [[1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(TxlError, match=r"batch_size must be an integer >= 1, got 2\.5"):
        causal_lm.document_dataset(docs, batch_size=2.5)  # was a TypeError
    with pytest.raises(TxlError, match=r"segment_len must be an integer >= 1, got 2\.5"):
        causal_lm.document_dataset(docs, batch_size=2, segment_len=2.5)  # was cut to 2
    assert len(list(causal_lm.document_dataset(docs, batch_size=np.int64(2)))) == 1


@pytest.mark.parametrize("kwargs,message", [
    (dict(segment_len=2.5), r"segment_len must be an integer >= 1, got 2\.5"),  # were cut
    (dict(mem_len=4.5), r"mem_len must be an integer >= 0, got 4\.5"),
    (dict(grad_segments=1.5), r"grad_segments must be an integer >= 1, got 1\.5"),
    (dict(segment_len="2"), r"segment_len must be an integer >= 1, got '2'"),
])
def test_read_documents_takes_integer_sizes(core, kwargs, message):
    call = {"segment_len": 2, "mem_len": 4, **kwargs}
    with pytest.raises(TxlError, match=message):
        core.read_documents(np.ones([2, 3], np.int32), [3, 2], **call)


def test_the_decode_cache_calls_name_a_wrong_cache_ids_or_stopped_rows(core):
    memory = core.initial_memory(2)
    cache = core.decode_cache(memory)
    for method in (lambda c: core.call_with_cache(np.array([1, 2], np.int32), c),
                   core.cache_memory, core.decode_position_keys):
        with pytest.raises(TxlError, match=r"takes a DecodeCache .* got Memory"):  # AttributeError
            method(memory)
    cases = [  # TensorFlow's errors from deep inside, or a write=True read as "no"
        (dict(token_ids=np.int32(3)), r"token_ids must be \[batch\] .* got shape \(\)"),
        (dict(token_ids=np.ones([3], np.int32)), "token_ids have batch 3 but the cache has "
                                                 "batch 2"),
        (dict(stopped=np.array([0, 1])), r"stopped must be bool \[batch\] \(2\), got int64"),
        (dict(stopped=np.zeros([3], bool)), r"stopped must be bool .* of shape \(3,\)"),
        (dict(write="no"), "write must be a boolean or 'first', got 'no'"),
        (dict(write=None), "write must be a boolean, got None"),
    ]
    for kwargs, message in cases:
        call = {"token_ids": np.array([1, 2], np.int32), **kwargs}
        with pytest.raises(TxlError, match=message):
            core.call_with_cache(call.pop("token_ids"), cache, **call)
    hidden, new = core.call_with_cache(np.array([1, 2], np.int32), cache,
                                       stopped=np.array([False, True]))
    assert hidden.shape == (2, 32) and core.cache_memory(new).mems.shape == (2, 2, 4, 32)


def test_the_attention_layer_on_its_own_names_wrong_shapes_and_dtypes():
    import tensorflow as tf
    from txl_tf.layers.attention import RelativeMultiHeadAttention
    from txl_tf.layers.masks import attention_visibility
    layer = RelativeMultiHeadAttention(32, 2, 16)
    x, mem = tf.ones([2, 3, 32]), tf.ones([2, 4, 32])
    args = dict(inputs=x, pos_emb=tf.ones([7, 32]), memory=mem,
                visible=attention_visibility(3, tf.ones([2, 4], bool)),
                r_w_bias=tf.zeros([2, 16]), r_r_bias=tf.zeros([2, 16]))
    one_row = tf.ones([2, 1, 1, 7], bool)  # was broadcast to every query: the future seen
    assert layer(**args).shape == (2, 3, 32)
    for change, message in ((dict(visible=one_row), r"visible must be bool \[batch, 1, T, M \+ "
                                                    r"T\] \(T=3, M=4\), got bool of shape"),
                            (dict(visible=tf.cast(args["visible"], tf.float32)), "got float32"),
                            (dict(inputs=tf.ones([2, 3, 16])), r"inputs must be \[batch, length, "
                                                               r"d_model=32\]"),
                            (dict(memory=tf.ones([3, 4, 32])), "inputs have batch 2 but memory "
                                                               "has batch 3"),
                            (dict(pos_emb=tf.ones([5, 32])), r"pos_emb must be \[M \+ T, "
                                                             r"d_model\] \(7, 32\)"),
                            (dict(r_w_bias=tf.zeros([16])), r"r_w_bias must be \[n_head, "
                                                            r"d_head\] \(2, 16\)")):
        with pytest.raises(TxlError, match=message):  # TensorFlow's errors, or silent
            layer(**{**args, **change})


def test_the_attention_layers_check_reads_no_variable():
    """The check reads static shapes: u and v passed as variables (the
    core's, `untie_r=False`) get no `ReadVariableOp` that nothing uses."""
    import keras
    import tensorflow as tf
    from txl_tf.layers.attention import RelativeMultiHeadAttention
    layer = RelativeMultiHeadAttention(8, 2, 4)
    u, v = (keras.Variable(np.full([2, 4], k, np.float32)) for k in (0.0, 1.0))
    pos, mem, visible = tf.zeros([5, 8]), tf.zeros([1, 2, 8]), tf.ones([1, 1, 3, 5], bool)
    step = tf.function(lambda x: layer(x, pos, mem, visible, u, v))
    graph = step.get_concrete_function(tf.TensorSpec([1, 3, 8])).graph
    reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp"]
    assert reads and all(out.consumers() for op in reads for out in op.outputs), \
        [op.name for op in reads]
    with pytest.raises(TxlError, match=r"r_r_bias must be \[n_head, d_head\] \(2, 4\), got "
                                       r"shape \(4,\)"):
        layer(tf.zeros([1, 3, 8]), pos, mem, visible, u, keras.Variable(np.zeros([4], np.float32)))


def test_the_adaptive_layers_on_their_own_refuse_float_and_out_of_range_ids():
    import tensorflow as tf
    from txl_tf.layers.adaptive_embedding import AdaptiveEmbedding
    from txl_tf.layers.adaptive_softmax import AdaptiveLogSoftmax
    emb = AdaptiveEmbedding(20, 32, 32, cutoffs=[5, 10], div_val=2)
    crit = AdaptiveLogSoftmax(20, 32, 32, cutoffs=[5, 10], div_val=2, embedding=emb)
    hidden = tf.ones([2, 3, 32])
    with pytest.raises(TxlError, match="token_ids must be integers, got dtype float"):
        emb(np.array([[1.7]]))  # was id 1
    with pytest.raises(TxlError, match="token id 25 at position"):
        emb(np.array([[25]]))  # was a zero vector
    with pytest.raises(TxlError, match="target must be integer ids, got dtype float"):
        crit(hidden, np.full([2, 3], 1.5))  # was id 1
    with pytest.raises(TxlError, match="target id 25 at position"):
        crit(hidden, np.full([2, 3], 25, np.int32))  # a finite, wrong NLL
    with pytest.raises(TxlError, match=r"target has shape \(2, 1\) but hidden has"):
        crit(hidden, np.ones([2, 1], np.int32))
    with pytest.raises(TxlError, match=r"hidden must be floating point \[..., d_model=32\]"):
        crit(tf.ones([2, 3, 16]))
    assert crit(hidden, np.ones([2, 3], np.int32)).shape == (2, 3)


def test_the_memory_functions_name_wrong_rows_and_shapes():
    import tensorflow as tf
    from txl_tf.layers.memory import clear_invalid_slots, initial_memory, update_memory
    memory = initial_memory(2, 2, 4, 32)
    for rows, message in (([True, False, True], r"shape \(3,\)"), ([1, 0], "got int32"),
                          (True, r"shape \(\)")):
        with pytest.raises(TxlError, match=r"rows must be bool \[batch\] \(2\)"):
            memory.reset_rows(rows)
        with pytest.raises(TxlError, match=message):
            memory.reset_rows(rows)
    with pytest.raises(TxlError, match="zero_filled must be a boolean, got 'no'"):
        memory.reset_rows([True, False], zero_filled="no")  # was True
    with pytest.raises(TxlError, match=r"layer_inputs must be \[n_layer, batch, T, d_model\]"):
        update_memory(memory, tf.zeros([3, 2, 1, 32]))
    with pytest.raises(TxlError, match=r"token_valid must be bool \[batch, T\]"):
        update_memory(memory, tf.zeros([2, 2, 3, 32]), tf.ones([2, 3], tf.int32))
    with pytest.raises(TxlError, match=r"mem_mask must be \[batch, mem_len\]"):
        clear_invalid_slots(memory._replace(mem_mask=tf.ones([2, 5], bool)))


def test_the_stream_functions_take_integer_sizes_and_flags():
    from txl_tf.data.stream import num_segments, segment_dataset, stream_length
    ids = np.arange(100)
    for call, message in (
            (lambda: stream_length(100.5, 3), r"num_tokens must be an integer >= 0, got 100\.5"),
            (lambda: stream_length(-5, 3), "num_tokens must be an integer >= 0, got -5"),  # -2
            (lambda: stream_length(100, True), "batch_size must be a positive int, got True"),
            (lambda: num_segments("abcdefghij", 2, 2), "num_tokens must be a count or the 1-D "
                                                       "ids, got str"),  # was 2 segments
            (lambda: num_segments(np.zeros([10, 10]), 2, 2), r"got ndarray shape \(10, 10\)"),
            (lambda: num_segments(100.0, 2, 2), "got float"),  # a TypeError
            (lambda: segment_dataset(ids, 2, 4, start_step=True), "start_step must be an "
                                                                  "integer >= 0, got True"),
            (lambda: segment_dataset(ids, 2, 4, repeat="no"), "repeat must be a boolean"),
            (lambda: segment_dataset(ids / 2, 2, 4), "ids must be integers, got dtype float64"),
            (lambda: segment_dataset(ids.reshape(10, 10), 2, 4), r"ids must be 1-D, got shape "
                                                                 r"\(10, 10\)")):
        with pytest.raises(TxlError, match=message):
            call()
    assert num_segments(ids, 2, 4) == num_segments(100, 2, 4) == 12
    assert num_segments(1, 2, 4) == num_segments(0, 2, 4) == 0  # nothing to read


def test_the_adaptive_layers_name_sizes_they_cannot_be_built_with(core):
    from txl_tf.layers.adaptive_embedding import AdaptiveEmbedding
    from txl_tf.layers.adaptive_softmax import AdaptiveLogSoftmax
    for kwargs, message in ((dict(cutoffs=[10, 5], div_val=2), r"cutoffs must be strictly "
                                                               r"increasing .* got \[10, 5\]"),
                            (dict(cutoffs=[30]), "inside \\(0, n_token=20\\)"),  # Keras's error
                            (dict(cutoffs=[5], div_val=0), "div_val must be an integer >= 1"),
                            (dict(n_token=20.5), r"n_token must be an integer >= 1, got 20\.5")):
        call = {"n_token": 20, "d_embed": 32, "d_model": 32, **kwargs}
        with pytest.raises(TxlError, match=message):  # a ZeroDivisionError, or cut to 20
            AdaptiveEmbedding(call.pop("n_token"), call.pop("d_embed"), call.pop("d_model"),
                              **call)
    with pytest.raises(TxlError, match=r"the tied embedding has .* \(20, 32, 32, \[\], 1\), "
                                       r"this softmax \(30, 32, 32, \[\], 1\)"):
        AdaptiveLogSoftmax(30, 32, 32, embedding=AdaptiveEmbedding(20, 32, 32))
    with pytest.raises(TxlError, match="jit_compile must be a boolean, got 'no'"):
        Decoder(core, jit_compile="no")


def test_the_core_takes_ids_as_lists_and_names_a_memory_that_is_not_one(core):
    log_probs, _ = core([[1, 2]], core.initial_memory(1))  # was Keras's "keyword argument"
    assert log_probs.shape == (1, 2, 20)
    with pytest.raises(TxlError, match="token_ids must be integers, got dtype string"):
        core("abc", core.initial_memory(1))
    with pytest.raises(TxlError, match="memory must be a txl_tf.Memory .* got tuple"):
        core(np.ones([1, 2], np.int32), (1, 2, 3))
    mems, mem_mask = core.initial_memory(1)
    with pytest.raises(TxlError, match="memory dict needs keys 'mems' and 'mem_mask', missing "
                                       "'mem_mask'"):
        core([[1, 2]], {"mems": mems})
    as_dict, _ = core([[1, 2]], {"mems": mems, "mem_mask": mem_mask})
    np.testing.assert_array_equal(as_dict, log_probs)


@pytest.mark.parametrize("kwargs,message", [
    (dict(tgt_len=2.5), r"tgt_len must be an integer >= 1, got 2\.5"),  # was cut to 2
    (dict(tgt_len=0), "tgt_len must be an integer >= 1, got 0"),  # was the config's
    (dict(mem_len=1.5), r"mem_len must be an integer >= 0, got 1\.5"),
    (dict(max_segments=0), "max_segments must be an integer >= 1, got 0"),  # a loss of 0.0
])
def test_evaluate_ids_takes_integer_settings(core, kwargs, message):
    from txl_tf.learning.evaluation import evaluate_ids
    with pytest.raises(TxlError, match=message):
        evaluate_ids(core, np.arange(40) % 20, **kwargs)


def test_stream_ids_beyond_int32_are_refused_not_wrapped():
    from txl_tf.data.stream import eval_segment_dataset, segment_dataset
    ids = np.arange(100, dtype=np.int64)
    ids[7] = 2 ** 32 + 5  # its int32 window read it as 5
    for make in (segment_dataset, eval_segment_dataset):
        with pytest.raises(TxlError, match=r"ids must fit int32 .* from 0 to 4294967301"):
            make(ids, 2, 4)
    inputs, _ = next(iter(segment_dataset(np.arange(100, dtype=np.uint64), 2, 4)))
    assert inputs.numpy()[0].tolist() == [0, 1, 2, 3]


def test_document_ids_beyond_int32_are_refused_not_wrapped():
    with pytest.raises(TxlError, match="document 1 holds id 4294967301, beyond int32"):
        document_segments([[1, 2, 3], np.array([4, 2 ** 32 + 5], np.int64)], 2, 4)  # was 5


IDS = np.array([[1, 2, 3], [4, 5, 6]])
# Numpy arrays TensorFlow refuses with its own error (durations, dates,
# objects) or reads without their mask (the masked 6 was read as an id).
UNREADABLE = {"timedelta": lambda a: a.astype("m8[s]"), "datetime": lambda a: a.astype("M8[s]"),
              "objects": lambda a: a.astype(object),
              "masked": lambda a: np.ma.array(a, mask=np.arange(a.size).reshape(a.shape) == 1)}
UNREADABLE_MESSAGES = {"timedelta": r"must be {}, got dtype timedelta64\[s\]",
                       "datetime": r"must be {}, got dtype datetime64\[s\]",
                       "objects": r"must be {}, got dtype object",
                       "masked": r"is a masked array with masked entries"}
CORE_ARRAY_CALLS = {  # (the argument, what it must hold, call(core, value), a good value)
    "__call__": ("token_ids", "integers", lambda c, v: c(v, c.initial_memory(2)), IDS),
    "__call__ targets": ("targets", "integers",
                         lambda c, v: c(IDS, c.initial_memory(2), targets=v), IDS),
    "__call__ token_mask": ("token_mask", "bool",
                            lambda c, v: c(IDS, c.initial_memory(2), None, False, v), IDS > 0),
    "call": ("token_ids", "integers", lambda c, v: c.call(v, c.initial_memory(2)), IDS),
    "call targets": ("targets", "integers",
                     lambda c, v: c.call(IDS, c.initial_memory(2), targets=v), IDS),
    "hidden_states": ("token_ids", "integers",
                      lambda c, v: c.hidden_states(v, c.initial_memory(2)), IDS),
    "hidden_states token_mask": ("token_mask", "bool", lambda c, v: c.hidden_states(
        IDS, c.initial_memory(2), token_mask=v), IDS > 0),
    "read_documents": ("token_ids", "integers",
                       lambda c, v: c.read_documents(v, np.array([3, 2]), 2, 2), IDS),
    "read_documents lengths": ("lengths", "integers",
                               lambda c, v: c.read_documents(IDS, v, 2, 2), np.array([3, 2])),
    "call_with_cache": ("token_ids", "integers", lambda c, v: c.call_with_cache(
        v, c.decode_cache(c.initial_memory(2))), IDS[:, 0]),
    "call_with_cache stopped": ("stopped", "bool", lambda c, v: c.call_with_cache(
        IDS[:, 0], c.decode_cache(c.initial_memory(2)), stopped=v), np.array([False, True])),
}


@pytest.mark.parametrize("kind", sorted(UNREADABLE))
@pytest.mark.parametrize("entry", sorted(CORE_ARRAY_CALLS))
def test_the_core_names_numpy_arrays_tensorflow_would_refuse_or_misread(core, entry, kind):
    """Durations, dates and objects were TensorFlow's conversion error; a
    masked array was read without its mask (a silent wrong answer)."""
    name, holds, call, good = CORE_ARRAY_CALLS[entry]
    error = raised(call, core, UNREADABLE[kind](good))
    assert isinstance(error, TxlError), (type(error), error)
    assert str(error).startswith(name), error
    assert re.search(UNREADABLE_MESSAGES[kind].format(holds), str(error)), error


def test_the_core_reads_a_masked_array_without_masked_entries_as_its_values(core):
    memory = core.initial_memory(2)
    want = core(IDS, memory, targets=IDS)[0].numpy()
    got = core(np.ma.array(IDS), memory, targets=np.ma.array(IDS, mask=False))[0].numpy()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", ["timedelta", "bool", "objects"])
def test_the_decoders_read_cached_refuses_ids_that_are_not_integers(core, kind):
    """`tf.constant(ids, tf.int32)` cast durations, bools and objects to ids."""
    decoder = Decoder(core, mem_len=4, jit_compile=False)
    ids = {"timedelta": IDS.astype("m8[s]"), "bool": IDS > 2, "objects": IDS.astype(object)}[kind]
    cache = core.decode_cache(core.initial_memory(2))
    with pytest.raises(TxlError, match=r"ids must have an integer dtype, got"):
        decoder.read_cached(ids, cache)
    with pytest.raises(TxlError, match=r"ids is a masked array with masked entries"):
        decoder.read_cached(np.ma.masked_equal(IDS, 6), cache)


def test_generate_names_masked_stop_ids_and_duration_seeds(core):
    decoder = Decoder(core, mem_len=4, jit_compile=False)
    with pytest.raises(TxlError, match=r"stop_ids is a masked array with masked entries"):
        decoder.generate(IDS, 1, stop_ids=np.ma.array([3, 4], mask=[0, 1]))  # 4 was a stop id
    with pytest.raises(TxlError, match=r"seed must be an integer or 2 integers"):
        decoder.generate(IDS, 1, seed=np.array([3, 4], "m8[s]"))  # numpy's TypeError
    assert decoder.generate(IDS, 1, stop_ids=np.ma.array([3, 4])).ids.shape == (2, 1)


@pytest.mark.parametrize("call", ["segment_dataset", "batchify", "evaluate_ids",
                                  "document_segments", "split_documents"])
def test_the_data_functions_name_masked_ids(core, call):
    """The mask was dropped: the masked entries were read as ids."""
    from txl_tf.data import batchify, segment_dataset
    from txl_tf.learning.evaluation import evaluate_ids
    ids = np.ma.array(np.arange(12) % 5, mask=np.arange(12) == 7)
    calls = {"segment_dataset": lambda: segment_dataset(ids, 2, 2, repeat=False),
             "batchify": lambda: batchify(ids, 2),
             "evaluate_ids": lambda: evaluate_ids(core, ids, tgt_len=2, mem_len=2),
             "document_segments": lambda: document_segments([ids[:4], ids[4:]], 2, 2),
             "split_documents": lambda: split_documents(ids, 3)}
    with pytest.raises(TxlError, match=r"(ids|document 1) is a masked array with masked entries"):
        calls[call]()
    np.ma.getmaskarray(ids)[:] = False  # no masked entry: read as the plain ids
    calls[call]()


@pytest.mark.parametrize("dtype", ["m8[s]", "M8[s]", "O", "?"])
def test_split_documents_takes_integer_ids_only(dtype):
    """Durations, dates, objects and bools were split as if they were ids."""
    with pytest.raises(TxlError, match=r"ids must be integers, got dtype"):
        split_documents(np.array([5, 6, 1, 7, 1]).astype(dtype), separator=1)
