"""`TransformerXLCausalLMPreprocessor`: strings to `(x, y, sample_weight)`
for `fit`, and to prompts for `generate`."""
import keras
import keras_hub

from txl_tf.models.transformer_xl.transformer_xl_backbone import TransformerXLBackbone
from txl_tf.models.transformer_xl.transformer_xl_tokenizer import TransformerXLTokenizer


@keras.saving.register_keras_serializable(package="txl_tf")
class TransformerXLCausalLMPreprocessor(keras_hub.models.CausalLMPreprocessor):
    """keras-hub's causal LM preprocessing with a `TransformerXLTokenizer`.

    Args:
        tokenizer: a `TransformerXLTokenizer`.
        sequence_length: the padded length of each row (also `generate`'s
            default `max_length`).
        add_start_token, add_end_token: False: the paper's streams have no
            start or end token.
    """

    backbone_cls = TransformerXLBackbone
    tokenizer_cls = TransformerXLTokenizer

    def __init__(self, tokenizer, sequence_length=1024, add_start_token=False,
                 add_end_token=False, **kwargs):
        super().__init__(tokenizer=tokenizer, sequence_length=sequence_length,
                         add_start_token=add_start_token, add_end_token=add_end_token,
                         **kwargs)
