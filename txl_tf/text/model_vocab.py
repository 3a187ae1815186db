"""A model's vocabulary: the tokenizer in its `vocab/` folder, checked
against its config (size and fingerprint). No TensorFlow: an ONNX export's
server reads its `vocab/` with it too (`txl_tf.weights.model_dir`
re-exports both names)."""
from txl_tf.errors import ModelDirError


def load_vocab(vocab_dir, config):
    """The tokenizer in a model's `vocab_dir`, checked against the model's
    `config`: `n_token` entries and, where the config records one, the
    fingerprint of the vocabulary it was trained with (a vocabulary edited or
    swapped for another of the same size is an error, never wrong ids)."""
    from txl_tf.text import load_tokenizer
    if vocab_dir is None:
        raise ModelDirError("the model has no vocabulary: no vocab/ folder beside its "
                            "config.json (training writes one): copy it there, or pass "
                            "--vocab_dir to a job that takes one")
    try:
        tokenizer = load_tokenizer(vocab_dir)
    except (OSError, ValueError, KeyError) as err:
        raise ModelDirError(f"cannot read the vocabulary in {vocab_dir}: {err}") from None
    return check_vocab(tokenizer, config, vocab_dir)


def check_vocab(tokenizer, config, where):
    """Refuses a tokenizer that is not the model's vocabulary.

    Args:
        tokenizer: a `txl_tf.text.Tokenizer`.
        config: the model's `TransformerXLConfig`.
        where: where the tokenizer came from, for the message.

    Returns:
        `tokenizer`, of `n_token` entries and, where the config records one,
        of the fingerprint of the vocabulary the model was trained with
        (else a `ModelDirError`).
    """
    if tokenizer.vocab_size != config.n_token:
        raise ModelDirError(f"vocabulary/model size mismatch: {where} has "
                            f"{tokenizer.vocab_size} tokens, the model has "
                            f"n_token={config.n_token}")
    expected = config.vocab_fingerprint
    if expected is not None and tokenizer.fingerprint() != expected:
        raise ModelDirError(f"{where} is not the vocabulary the model was trained with "
                            f"(fingerprint {tokenizer.fingerprint()}; the model's config "
                            f"records {expected})")
    return tokenizer
