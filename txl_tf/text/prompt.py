"""How a prompt is read: a word or SentencePiece tokenizer ends every line
with its end-of-line id, but a prompt's last line that the prompt does not
end with a newline is one the model continues, so that id is dropped. One
rule for `python -m training.generate` (`prompt_ids`, numpy: no TensorFlow
needed) and the keras-hub preprocessor's `generate` (`without_open_line_end`,
in the graph); tests/test_text.py compares the two."""
import numpy as np


def without_open_line_end(texts, ids, eos_id, cr_ends_line=False):
    """Prompt ids without the end-of-line id of an unfinished last line.

    Args:
        texts: the prompts, a scalar or 1-D tf.string tensor.
        ids: their ids, a 1-D tensor (scalar `texts`) or a ragged `[B, None]`.
        eos_id: the tokenizer's end-of-line id (-1: none, nothing dropped).
        cr_ends_line: a final `\\r` ends the line too (a word tokenizer's lines).

    Returns:
        `ids` of the same kind, the last id dropped from each row of more than
        one id that ends in `eos_id` while its text does not end in a newline.
    """
    import tensorflow as tf
    texts = tf.convert_to_tensor(texts, tf.string)
    scalar = not isinstance(ids, tf.RaggedTensor)
    if scalar:
        texts = tf.reshape(texts, [1])
        ids = tf.RaggedTensor.from_tensor(tf.expand_dims(ids, 0))
    lengths = ids.row_lengths()
    # Each row's last id; an empty row reads the -1 appended (no gather out of range).
    flat = tf.concat([ids.flat_values, tf.constant([-1], ids.dtype)], 0)
    appended = tf.shape(flat, out_type=lengths.dtype)[0] - 1
    last = tf.gather(flat, tf.where(lengths > 0, ids.row_limits() - 1, appended))
    size = tf.strings.length(texts)
    last_byte = tf.strings.substr(texts, tf.maximum(size - 1, 0), tf.ones_like(size))
    ends_line = tf.equal(last_byte, "\n")
    if cr_ends_line:
        ends_line |= tf.equal(last_byte, "\r")
    drop = (lengths > 1) & tf.equal(last, tf.cast(eos_id, last.dtype)) & ~ends_line
    keep = tf.ragged.range(lengths) < tf.expand_dims(lengths - tf.cast(drop, lengths.dtype), 1)
    ids = tf.ragged.boolean_mask(ids, keep)
    return ids.flat_values if scalar else ids


def prompt_ids(tokenizer, prompt):
    """The ids `tokenizer` gives `prompt`, read as `without_open_line_end` says.

    Args:
        tokenizer: a `txl_tf.text` tokenizer.
        prompt: the prompt text (str or UTF-8 bytes).

    Returns:
        A 1-D int32 numpy array.
    """
    ids = np.asarray(tokenizer.encode(prompt), np.int32)
    eos = getattr(tokenizer, "eos_id", -1)
    last = prompt[-1:]  # a str or bytes; a line end is one byte of UTF-8
    last = last.decode("latin-1") if isinstance(last, (bytes, bytearray)) else last
    ends = ("\n", "\r") if getattr(tokenizer, "kind", None) == "word" else ("\n",)
    if ids.size > 1 and eos >= 0 and ids[-1] == eos and last not in ends:
        return ids[:-1]
    return ids
