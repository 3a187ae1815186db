"""`TransformerXLCausalLMPreprocessor`: strings to `(x, y, sample_weight)`
for `fit`, and to prompts for `generate`."""
import keras
import keras_hub
import tensorflow as tf

from txl_tf.models.transformer_xl.transformer_xl_backbone import TransformerXLBackbone
from txl_tf.models.transformer_xl.transformer_xl_tokenizer import TransformerXLTokenizer


def without_open_line_end(texts, ids, eos_id):
    """Prompt ids without the end-of-line id that a word or SentencePiece
    tokenizer adds to a last line the text did not end (the model continues
    that line), as `training.generate.prompt_ids` does.

    Args:
        texts: the prompts, a scalar or 1-D tf.string tensor.
        ids: their ids, a 1-D tensor (scalar `texts`) or a ragged `[B, None]`.
        eos_id: the tokenizer's end-of-line id.

    Returns:
        `ids` of the same kind, the last id dropped from each row of more than
        one id that ends in `eos_id` while its text does not end in a newline.
    """
    texts = tf.convert_to_tensor(texts, tf.string)
    scalar = not isinstance(ids, tf.RaggedTensor)
    if scalar:
        texts = tf.reshape(texts, [1])
        ids = tf.RaggedTensor.from_tensor(tf.expand_dims(ids, 0))
    lengths = ids.row_lengths()
    last = tf.gather(ids.flat_values, tf.maximum(ids.row_limits() - 1, 0))
    size = tf.strings.length(texts)
    last_byte = tf.strings.substr(texts, tf.maximum(size - 1, 0), tf.ones_like(size))
    ends_line = tf.equal(last_byte, "\n")
    drop = (lengths > 1) & tf.equal(last, tf.cast(eos_id, last.dtype)) & ~ends_line
    keep = tf.ragged.range(lengths) < tf.expand_dims(lengths - tf.cast(drop, lengths.dtype), 1)
    ids = tf.ragged.boolean_mask(ids, keep)
    return ids.flat_values if scalar else ids


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
    does: a last line the prompt does not end gets no `<eos>`.
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
        eos_id = getattr(self.tokenizer._inner(), "eos_id", -1)
        if eos_id < 0 or isinstance(x, dict):
            return super().generate_preprocess(x, sequence_length=sequence_length)
        x = tf.convert_to_tensor(x, tf.string)
        ids = without_open_line_end(x, self.tokenizer.tokenize(x), eos_id)
        token_ids, padding_mask = self.packer(ids, sequence_length=sequence_length,
                                              add_end_value=False)
        return {"token_ids": token_ids, "padding_mask": padding_mask}
