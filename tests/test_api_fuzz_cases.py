"""Concrete cases found by property-based fuzzing of the public API (each was a
silent wrong answer, or an error from inside TensorFlow, numpy or Python
instead of one `TxlError` naming the argument)."""
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
