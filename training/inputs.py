"""Loading a corpus for a job, with checks that name the problem.

`model_tokenizer` needs no TensorFlow (`training.generate` on an ONNX
export, on a box without it); the corpus (`txl_tf.data`) does.
"""
import os

import numpy as np

from training.errors import TrainingError
from txl_tf.app.paths import path_in_the_way
from txl_tf.errors import ModelDirError
from txl_tf.text.model_vocab import load_vocab


def parse_options(items):
    """`["max_bytes=100000", "min_count=2"]` -> `{"max_bytes": 100000, ...}`
    (ints, floats, true/false/none are converted; anything else stays text)."""
    options = {}
    for item in items or ():
        if "=" not in item:
            raise TrainingError(f"--corpus_option {item!r} is not key=value")
        key, value = item.split("=", 1)
        options[key.strip()] = convert(value.strip())
    return options


def convert(text):
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def check_not_read(dataset, data_dir, folders):
    """Raises unless each of `folders` (`(flag, path)` pairs: the job's
    model directories) lies outside a `text` corpus folder, whose every non-hidden
    file is read (a hidden folder there is not): its files would be read as
    corpus text by the next load (a resume, an evaluation)."""
    if dataset != "text" or not data_dir or not os.path.isdir(data_dir):
        return
    from txl_tf.data.corpora import read_as_text
    for flag, path in folders:
        if read_as_text(path, data_dir):
            raise TrainingError(f"{flag} {path} is inside the corpus folder {data_dir}, whose "
                                "files are all read as text: the next load of the corpus would "
                                "read its files too; use a folder outside it")


def load(dataset, data_dir=None, cache_dir=None, options=None, tokenizer=None, progress=None,
         outside=None):
    """`txl_tf.data.load_corpus` with its errors turned into `TrainingError`;
    `tokenizer`: a trained model's, to read the corpus with; `progress`:
    False for no bar or lines while it is read (None: the default);
    `outside`: `(flag, folder)` pairs that must not be read as corpus text
    (`check_not_read`)."""
    from txl_tf.data import CorpusNotFoundError, EmptyCorpusError, load_corpus
    in_the_way = cache_dir and path_in_the_way("cache_dir", cache_dir)  # a file in the way
    if in_the_way:
        raise TrainingError(in_the_way)
    check_not_read(dataset, data_dir, outside or ())
    try:
        return load_corpus(dataset, data_dir or None, cache_dir=cache_dir or None,
                           tokenizer=tokenizer, progress=progress, **(options or {}))
    except CorpusNotFoundError as err:
        raise TrainingError(f"--data_dir: {err}") from None
    except EmptyCorpusError as err:
        raise TrainingError(f"empty corpus: {err}") from None
    except (ValueError, OSError) as err:
        raise TrainingError(f"cannot load corpus {dataset!r}: {err}") from None


def check_split(corpus, split, batch_size, tgt_len, what):
    """Raises unless `split` holds at least one segment of `batch_size` streams."""
    ids = corpus.split(split)
    need = batch_size * (tgt_len + 1)
    if len(ids) < need:
        raise TrainingError(
            f"the {split} split of corpus {corpus.name!r} has {len(ids):,} tokens, too few for "
            f"{what}: batch_size {batch_size} x (tgt_len {tgt_len} + 1) = {need:,} needed")
    return np.asarray(ids) if not isinstance(ids, np.ndarray) else ids


def check_valid_split(corpus, eval_batch_size, skip):
    """Raises unless the valid split gives `eval_batch_size` streams of at
    least one labelled id (2 ids each); `skip` names the flags that leave
    evaluation out. Returns the split's ids."""
    ids = corpus.valid
    if len(ids) < 2:
        raise TrainingError(f"the valid split of corpus {corpus.name!r} has {len(ids)} tokens; "
                            f"evaluation needs at least 2 (or pass {skip})")
    if len(ids) <= eval_batch_size:  # streams of 1 id: no label
        raise TrainingError(f"the valid split of corpus {corpus.name!r} has {len(ids)} tokens, "
                            f"too few for --eval_batch_size {eval_batch_size} (at least "
                            f"{eval_batch_size + 1} needed; or pass {skip})")
    return ids


def is_character_level(tokenizer):
    """True for byte / character tokenizers (report bits per character)."""
    return getattr(tokenizer, "kind", "") in ("byte", "char")


def model_tokenizer(name, vocab_dir, config):
    """The tokenizer in a model's `vocab_dir`, checked against its `config`
    (size and vocabulary fingerprint); else a `TrainingError` naming `name`."""
    try:
        return load_vocab(vocab_dir, config)
    except ModelDirError as err:
        raise TrainingError(f"{name}: {err}") from None
