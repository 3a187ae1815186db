"""`TransformerXLCausalLMPreprocessor`: strings to `(x, y, sample_weight)`
for `fit`, and to prompts for `generate`."""
import keras
import keras_hub
import tensorflow as tf

from txl_tf.models.transformer_xl.transformer_xl_backbone import TransformerXLBackbone
from txl_tf.models.transformer_xl.transformer_xl_tokenizer import TransformerXLTokenizer
from txl_tf.text.prompt import without_open_line_end


@keras.saving.register_keras_serializable(package="txl_tf")
class TransformerXLCausalLMPreprocessor(keras_hub.models.CausalLMPreprocessor):
    """keras-hub's causal LM preprocessing with a `TransformerXLTokenizer`.

    Args:
        tokenizer: a `TransformerXLTokenizer`.
        sequence_length: the padded length of each row (also `generate`'s
            default `max_length`).
        add_start_token, add_end_token: False: the paper's streams have no
            start or end token.

    `generate_preprocess` reads a prompt as `python -m training.generate`
    does (`txl_tf.text.prompt`): a last line the prompt does not end gets no
    `<eos>`.
    """

    backbone_cls = TransformerXLBackbone
    tokenizer_cls = TransformerXLTokenizer

    def __init__(self, tokenizer, sequence_length=1024, add_start_token=False,
                 add_end_token=False, **kwargs):
        super().__init__(tokenizer=tokenizer, sequence_length=sequence_length,
                         add_start_token=add_start_token, add_end_token=add_end_token,
                         **kwargs)

    def generate_preprocess(self, x, sequence_length=None):
        """Prompts to ids for `generate`, each without the `<eos>` of an
        unfinished last line.

        Args:
            x: a prompt string or a batch of them.
            sequence_length: the padded length (default the preprocessor's).

        Returns:
            `{"token_ids", "padding_mask"}`, right-padded.
        """
        if not self.built:
            self.build(None)
        inner = self.tokenizer._inner()
        eos_id = getattr(inner, "eos_id", -1)
        if eos_id < 0 or isinstance(x, dict):
            return super().generate_preprocess(x, sequence_length=sequence_length)
        x = tf.convert_to_tensor(x, tf.string)
        ids = without_open_line_end(x, self.tokenizer.tokenize(x), eos_id, inner.kind == "word")
        token_ids, padding_mask = self.packer(ids, sequence_length=sequence_length,
                                              add_end_value=False)
        return {"token_ids": token_ids, "padding_mask": padding_mask}
