"""A `tf.RaggedTensor` of rows of other lengths where 1-D ids are read."""
import pytest
import tensorflow as tf

from txl_tf.data.stream import batchify
from txl_tf.errors import TxlError
from txl_tf.generation.request import check_prompts
from txl_tf.text import ByteTokenizer

RAGGED = tf.ragged.constant([[1, 2], [3]])


@pytest.mark.parametrize("call", [lambda: ByteTokenizer().decode(RAGGED),
                                  lambda: batchify(RAGGED, 1),
                                  lambda: check_prompts([RAGGED], 10)],
                         ids=["decode", "batchify", "check_prompts"])
def test_a_ragged_tensor_is_named_as_rows_of_other_lengths(call):
    """Its `.numpy()` is an object array of rows, which the checks read as
    ids of dtype object ("must be integers, got dtype object")."""
    with pytest.raises(TxlError, match=r"holds rows of other lengths"):
        call()
