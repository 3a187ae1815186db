"""The classifier of `training.classify`: choosing and building it (backbone,
preset or config, and the tokenizer that goes with it), loading a trained one
back with its labels and vocabulary, and running it over texts."""
import math
import os

from training.errors import TrainingError

MODEL_FILE = "classifier.keras"


# -- tokenizer and model ---------------------------------------------------------

def load_vocab(path, what):
    from txl_tf.text import load_tokenizer
    try:
        return load_tokenizer(path)
    except (OSError, ValueError, KeyError) as err:
        raise TrainingError(f"{what}: cannot read the tokenizer in {path}: {err}") from None


def check_vocab_size(tokenizer, n_token, where):
    if tokenizer.vocab_size != n_token:
        raise TrainingError(
            f"vocabulary/model size mismatch: the tokenizer has {tokenizer.vocab_size} tokens, "
            f"the model ({where}) has n_token={n_token}")


def choose_model(o, log=print):
    """`(build, tokenizer, config, description)`: `build(num_classes,
    label_names, policy)` makes the classifier; everything that can fail on
    bad input (paths, configs, vocabularies) is checked here, before any
    weight loads."""
    from txl_tf import TransformerXLClassifier
    from txl_tf.text import ByteTokenizer
    overrides = {} if o["dropout"] is None else {"dropout": o["dropout"]}
    kwargs = dict(segment_len=o["segment_len"], mem_len=o["mem_len"],
                  grad_segments=o["grad_segments"])
    if o["backbone"]:
        from txl_tf.weights import model_dir
        source = model_dir.resolve(o["backbone"])
        config = model_dir.load_config(source, **overrides)
        if o["vocab_dir"]:
            tokenizer = load_vocab(o["vocab_dir"], "--vocab_dir")
        elif source.vocab_dir:
            tokenizer = load_vocab(source.vocab_dir, "--backbone")
        else:
            raise TrainingError(
                f"--backbone {o['backbone']} has no vocabulary (no vocab/ folder beside its "
                f"weights); pass --vocab_dir with the tokenizer it was trained with")
        check_vocab_size(tokenizer, config.n_token, f"--backbone {o['backbone']}")

        def build(num_classes, label_names, policy):
            return TransformerXLClassifier.from_model_dir(
                o["backbone"], num_classes, config_overrides=overrides,
                label_names=label_names, dtype=policy, **kwargs)
        return build, tokenizer, config, f"backbone {o['backbone']}"

    tokenizer = load_vocab(o["vocab_dir"], "--vocab_dir") if o["vocab_dir"] else ByteTokenizer()
    if o["preset"]:
        from training.model_config import build_config, parse_overrides
        config = build_config(o["preset"], tokenizer.vocab_size, None,
                              {**parse_overrides(o["config_override"]), **overrides}, log=log)
        what = f"preset {o['preset']}, fresh weights"
    else:
        from txl_tf import ConfigError, TransformerXLConfig
        if not os.path.isfile(o["config"]):
            raise TrainingError(f"--config: {o['config']} not found")
        try:
            config = TransformerXLConfig.from_json(o["config"])
            config = config.replace(**overrides) if overrides else config
        except (ConfigError, ValueError, TypeError) as err:
            raise TrainingError(f"--config {o['config']}: {err}") from None
        check_vocab_size(tokenizer, config.n_token, f"--config {o['config']}")
        what = f"config {o['config']}, fresh weights"

    def build(num_classes, label_names, policy):
        return TransformerXLClassifier(config, num_classes, label_names=label_names,
                                       dtype=policy, **kwargs)
    return build, tokenizer, config, what


def check_lengths(o, config):
    segment_len = o["segment_len"] or config.tgt_len
    mem_len = config.mem_len if o["mem_len"] is None else o["mem_len"]
    most = math.ceil(o["max_length"] / segment_len)  # a document's segments at most
    if o["grad_segments"] > most:  # the rest would be padding, unrolled in the graph
        raise TrainingError(f"--grad_segments {o['grad_segments']} exceeds the {most} "
                            f"segments of {segment_len} tokens that a document of --max_length "
                            f"{o['max_length']} has")
    from txl_tf.checks.memory_budget import check_fits
    # Before anything is written; the last --grad_segments segments keep their
    # activations for the backward pass.
    check_fits(config, o["batch_size"], segment_len, mem_len, training=True,
               what="a training step", grad_segments=o["grad_segments"])
    return segment_len, mem_len


# -- evaluation and prediction ---------------------------------------------------

def predict_logits(model, texts, tokenizer, batch_size, max_length, keep, progress=None):
    """float32 logits `[N, C]` of `texts`, in order."""
    import keras
    import numpy as np
    from txl_tf.classification import classification_dataset
    ds = classification_dataset(texts, tokenizer, batch_size, max_length=max_length,
                                segment_len=model.segment_len, keep=keep)
    total = math.ceil(len(texts) / batch_size)

    class Report(keras.callbacks.Callback):
        def on_predict_batch_end(self, batch, logs=None):
            if progress:
                progress(batch + 1, total)
    logits = model.predict(ds, verbose=0, callbacks=[Report()])
    return np.asarray(logits, np.float32)


def evaluate_examples(model, examples, tokenizer, o, progress=None):
    """`classification_metrics` of `model` on `examples`."""
    from txl_tf.classification.metrics import classification_metrics
    logits = predict_logits(model, examples.texts, tokenizer, o["batch_size"],
                            o["max_length"], o["keep"], progress)
    return classification_metrics(logits, examples.label_ids, examples.labels.names)


def describe_metrics(metrics, what):
    per_class = ", ".join(f"{name} {m['accuracy']:.3f}" for name, m in
                          metrics["per_class"].items() if m["accuracy"] is not None)
    return (f"{what}: accuracy {metrics['accuracy']:.4f}, loss {metrics['loss']:.4f} over "
            f"{metrics['examples']:,} examples (per class: {per_class})")


def load_classifier(path):
    """`(model, labels, tokenizer)` of a --output_dir of mode train."""
    import keras
    import txl_tf  # noqa: F401  (registers the classifier's classes)
    from txl_tf.classification import LabelSet
    if not os.path.isdir(path):
        raise TrainingError(f"--classifier_dir {path} does not exist")
    model_file = os.path.join(path, MODEL_FILE)
    if not os.path.isfile(model_file):
        raise TrainingError(f"--classifier_dir {path} holds no {MODEL_FILE} (the "
                            "--output_dir of python -m training.classify --mode=train)")
    try:
        labels = LabelSet.load(path)
    except ValueError as err:
        raise TrainingError(f"--classifier_dir: {err}") from None
    tokenizer = load_vocab(os.path.join(path, "vocab"), "--classifier_dir")
    try:
        model = keras.saving.load_model(model_file, compile=False)
    except (ValueError, OSError, TypeError) as err:
        raise TrainingError(f"cannot load {model_file}: {err}") from None
    if model.num_classes != len(labels):
        raise TrainingError(f"{model_file} has {model.num_classes} classes but labels.json "
                            f"{len(labels)}")
    if model.label_names and list(model.label_names) != list(labels.names):
        raise TrainingError(f"{os.path.join(path, 'labels.json')} does not list the classes "
                            f"{model_file} was trained with, in its order "
                            f"({', '.join(model.label_names)}); restore labels.json")
    check_vocab_size(tokenizer, model.config.n_token, model_file)
    return model, labels, tokenizer
