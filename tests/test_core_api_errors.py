"""Bad input to the core's public API, its layers used on their own, the data
functions and the decoder: one clear `TxlError`, raised by the library itself
(not a TensorFlow error from deep inside, not a StagingError from a trace, not
a silent truncation or broadcast)."""
import numpy as np
import pytest

from txl_tf import ConfigError, Decoder, TransformerXL, TransformerXLConfig, TxlError
from txl_tf.config import as_config
from txl_tf.data.documents import document_segments


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
