r"""Fine-tunes, evaluates and applies a Transformer-XL text classifier (absl app).

    python -m training.classify --train_data=data/train.tsv --eval_data=data/valid.tsv \
        --backbone=runs/lm --output_dir=runs/cls --epochs=3 --export=saved_model,onnx
    python -m training.classify --mode=evaluate --classifier_dir=runs/cls \
        --eval_data=data/test.tsv --output=test.json
    python -m training.classify --mode=predict --classifier_dir=runs/cls \
        --predict_data=texts.txt --output=predictions.tsv

Data (`--train_data`, `--eval_data`) is a `label<TAB>text` file or a folder
with one sub-folder per class (`txl_tf.classification.read_examples`); the labels of
the training data are saved as `labels.json` and the evaluation data must use
them. `--predict_data` is a text file, one document a line.

The model: `--backbone` (a model directory or training run directory,
`txl_tf.weights.model_dir`) gives pretrained weights and, in its `vocab/`, the
tokenizer; `--preset` (with `--config_override`) or `--config` (a
`config.json`) give fresh weights, with the tokenizer of `--vocab_dir` or,
by default, bytes. `--vocab_dir` overrides the backbone's vocabulary too.
The tokenizer's vocabulary size must be the model's `n_token`.

Layout of `--output_dir` (mode train):

    classifier.keras   the fine-tuned TransformerXLClassifier
                       (keras.saving.load_model; --classifier_dir of the other modes)
    labels.json        the class names in id order
    vocab/             the tokenizer
    flags.json         the options of the run
    train_log.jsonl    step, time, lr, loss, accuracy every --log_every steps
                       (with --overwrite, the kept classifier's log is
                       train_log.previous.jsonl until the new one is saved)
    metrics.json       the final evaluation on --eval_data (when given)
    export/            with --export: classifier.json, saved_model/, model.onnx,
                       vocab/ (export.export_classifier; open with
                       export.open_classifier)

Bad input ends in one `error:` line and exit status 2 (`txl_tf.app.cli`),
before anything is written.
"""
import json
import math
import os
import sys
import time

from training.classifier_model import (MODEL_FILE, check_lengths, choose_model,
                                       describe_metrics, evaluate_examples, load_classifier,
                                       predict_logits)
from training.errors import TrainingError
from training.files import LOG_FILE, run_files_in, set_aside_log, write_atomically
from txl_tf.app.files import parse_json
from txl_tf.app.flagspec import merge, option, values
from txl_tf.app.paths import output_over_an_input, path_in_the_way
from txl_tf.app.tf_logs import logging_as_found

MODES = ("train", "evaluate", "predict")
EXPORT_FORMATS = ("saved_model", "onnx")
METRICS_FILE = "metrics.json"

SPEC = (
    option("enum", "mode", "train", "train: fine-tune (and evaluate); evaluate: score "
           "--eval_data with --classifier_dir; predict: label --predict_data.", list(MODES)),
    option("string", "train_data", None, "Training examples: a label<TAB>text file or a "
           "folder of class folders."),
    option("string", "eval_data", None, "Evaluation examples (same layouts); labels must "
           "be those of the training data."),
    option("string", "predict_data", None, "Texts to label (mode predict): one a line; a "
           "blank line is an error unless --skip_blank."),
    option("bool", "skip_blank", False, "Mode predict: leave blank lines out (the output "
           "rows keep the input's line numbers)."),
    option("string", "backbone", None, "Pretrained backbone: a model directory or training "
           "run directory (its vocab/ gives the tokenizer)."),
    option("string", "preset", None, "Fresh weights from this preset (instead of --backbone)."),
    option("multi_string", "config_override", [], "field=value changes to --preset."),
    option("string", "config", None, "Fresh weights from this config.json (instead of "
           "--backbone)."),
    option("string", "vocab_dir", None, "Tokenizer folder (default: the backbone's vocab/; "
           "bytes for --preset/--config)."),
    option("integer", "num_classes", None, "Number of classes (default: the training data's "
           "labels; an error if they differ)."),
    option("integer", "segment_len", None, "Tokens per segment (default: the backbone's "
           "tgt_len)."),
    option("integer", "mem_len", None, "Memory length; 0 for none (default: the backbone's)."),
    option("integer", "grad_segments", 1, "Segments the gradient flows through, the last "
           "ones, through the memory (1: the paper's cut; more lets a classifier learn from "
           "what its memory carries of earlier segments, at the memory cost of keeping them; "
           "at most the segments of a --max_length document; "
           "docs/classification.md, \"Memory reach\")."),
    option("integer", "max_length", None, "Tokens kept per document, in [1, 2**31 - 1] "
           "(default: 512 in mode train; the trained run's in modes evaluate and predict)."),
    option("enum", "keep", None, "Which part of a longer document is kept (default: start "
           "in mode train; the trained run's in modes evaluate and predict).",
           ["start", "end"]),
    option("float", "dropout", None, "Dropout of the backbone and the head (default: the "
           "backbone's)."),
    option("integer", "batch_size", 32, "Documents per batch."),
    option("float", "learning_rate", 2.5e-4, "Peak Adam learning rate (linear warm-up, "
           "cosine decay to 0)."),
    option("integer", "warmup_steps", None, "Warm-up steps (default: a tenth of the steps)."),
    option("float", "clip", 1.0, "Global gradient-norm clip (0: none)."),
    option("integer", "steps", None, "Training steps (or --epochs; default: 1 epoch)."),
    option("integer", "epochs", None, "Passes over the training data (or --steps)."),
    option("integer", "seed", 0, "Seed of the head's (and fresh) weights and the shuffling."),
    option("enum", "mixed_precision", "auto", "Keras dtype policy; auto: mixed_bfloat16 "
           "where the hardware has native bfloat16, else float32 (none).",
           ["auto", "none", "mixed_float16", "mixed_bfloat16"]),
    option("string", "output_dir", None, "Where mode train writes the classifier."),
    option("bool", "overwrite", False, "Replace a classifier already in --output_dir."),
    option("string", "export", "", "Comma-separated export formats written to "
           "<output_dir>/export: saved_model, onnx."),
    option("string", "classifier_dir", None, "A --output_dir of mode train (modes evaluate, "
           "predict)."),
    option("string", "output", None, "Mode evaluate: write the metrics JSON here; mode "
           "predict: the predictions (a header row, then line<TAB>label<TAB>probabilities "
           "per input line; default stdout)."),
    option("integer", "log_every", 50, "Steps between log lines and train_log.jsonl lines."),
    option("integer", "verbose", 1, "1: a progress bar on a terminal, else a line every "
           "--log_every steps; 0: silent."),
    option("bool", "progress", None, "Evaluation/prediction progress on stderr (default: a "
           "bar on a terminal, else a line every 10%); --noprogress also quiets the data "
           "files' bar."),
)


# -- checks of the flags alone (nothing imported) ----------------------------------

def export_formats(text):
    """`--export` as a tuple of formats."""
    formats = tuple(f.strip() for f in (text or "").split(",") if f.strip())
    unknown = sorted(set(formats) - set(EXPORT_FORMATS))
    if unknown:
        raise TrainingError(f"--export: unknown format(s) {', '.join(unknown)}; known: "
                            f"{', '.join(EXPORT_FORMATS)}")
    return formats


def _require(o, *names):
    for name in names:
        if not o[name]:
            raise TrainingError(f"--{name} is required with --mode={o['mode']}")


def check_options(o):
    """Raises `TrainingError` for flags that are wrong on their own."""
    if o["mode"] not in MODES:
        raise TrainingError(f"--mode must be one of {', '.join(MODES)}, got {o['mode']!r}")
    from txl_tf.checks.numpy_checks import MAX_POSITIONS  # lengths are int32
    if o["max_length"] is not None and not 0 < o["max_length"] <= MAX_POSITIONS:
        raise TrainingError(f"--max_length must be in [1, {MAX_POSITIONS}], got "
                            f"{o['max_length']}")
    for name in ("batch_size", "log_every"):
        if o[name] is None or o[name] <= 0:
            raise TrainingError(f"--{name} must be a positive integer, got {o[name]}")
    if o["verbose"] not in (0, 1):
        raise TrainingError(f"--verbose must be 0 or 1, got {o['verbose']}")
    if o["grad_segments"] is None or not 1 <= o["grad_segments"] <= MAX_POSITIONS:
        raise TrainingError(f"--grad_segments must be in [1, {MAX_POSITIONS}], got "
                            f"{o['grad_segments']}")
    for name in ("segment_len", "num_classes", "steps", "epochs"):
        if o[name] is not None and o[name] <= 0:
            raise TrainingError(f"--{name} must be a positive integer, got {o[name]}")
    for name in ("mem_len", "warmup_steps"):
        if o[name] is not None and o[name] < 0:
            raise TrainingError(f"--{name} must be >= 0, got {o[name]}")
    from training.train import check_seed
    check_seed(o["seed"])
    exported = bool(export_formats(o["export"]))  # TensorFlow and ONNX write there
    for name, kind in (("output_dir", "folder"), ("output", "file")):  # written after the work
        utf8 = exported and name == "output_dir"  # the export's own absolute path
        in_the_way = o[name] and path_in_the_way(
            name, os.path.abspath(o[name]) if utf8 else o[name], kind, utf8_paths=utf8)
        if in_the_way:
            raise TrainingError(in_the_way)
    if o["mode"] == "train":
        _require(o, "train_data", "output_dir")
        held = run_files_in(o["output_dir"])
        if os.path.exists(os.path.join(o["output_dir"], MODEL_FILE)):  # a classifier's export/
            held = [name for name in held if name != "export"]
        if held:  # the classifier's files would replace its flags.json, vocab/, delete export/
            raise TrainingError(f"--output_dir: {o['output_dir']} holds a model or training run "
                                f"({', '.join(held)}), not a classifier; choose another "
                                "--output_dir")
        if o["steps"] is not None and o["epochs"] is not None:
            raise TrainingError("pass --steps or --epochs, not both")
        if not 0 < o["learning_rate"] < float("inf"):
            raise TrainingError(f"--learning_rate must be a finite number > 0, got "
                                f"{o['learning_rate']}")
        if not 0 <= o["clip"] < float("inf"):  # inf: NaN weights (inf x 0), not "no clip"
            raise TrainingError(f"--clip must be a finite number >= 0 (0: none), got "
                                f"{o['clip']}")
        if o["dropout"] is not None and not 0 <= o["dropout"] < 1:
            raise TrainingError(f"--dropout must be in [0, 1), got {o['dropout']}")
        sources = [f"--{n}" for n in ("backbone", "preset", "config") if o[n]]
        if len(sources) != 1:
            raise TrainingError(
                "pass exactly one of --backbone (pretrained weights), --preset or --config "
                f"(fresh weights); got {', '.join(sources) if sources else 'none'}")
        if o["config_override"] and not o["preset"]:
            raise TrainingError("--config_override applies to --preset only")
        export_formats(o["export"])
    else:
        data = "eval_data" if o["mode"] == "evaluate" else "predict_data"
        _require(o, "classifier_dir", data)
        classifier_files = [(f"the classifier's {name}", os.path.join(o["classifier_dir"], name))
                            for name in (MODEL_FILE, "labels.json", "flags.json", "vocab")]
        over_an_input = o["output"] and output_over_an_input(
            "output", o["output"], [(f"the documents (--{data})", o[data]), *classifier_files])
        if over_an_input:
            raise TrainingError(over_an_input)
        for name in ("train_data", "backbone", "preset", "config", "output_dir"):
            if o[name]:
                raise TrainingError(f"--{name} is for --mode=train, not --mode={o['mode']}")


# -- the modes ---------------------------------------------------------------------

@logging_as_found()
def run(**options):
    """Runs the job with `options` (the flags by name); returns a summary dict."""
    o = merge(SPEC, options)
    check_options(o)
    from txl_tf.app import cli
    cli.quiet_tensorflow_import()
    return {"train": train, "evaluate": evaluate, "predict": predict}[o["mode"]](o)


def _progress(o, desc):
    from txl_tf.app import cli
    return cli.Progress(desc, enabled=o["progress"] is not False)


def _read(o, labels, flag):
    """The examples of the option `flag` (a path); `--noprogress` quiets its bar."""
    from txl_tf.classification import ClassificationDataError, UnknownLabelError, read_examples
    from txl_tf.data import CorpusNotFoundError
    try:
        return read_examples(o[flag], labels, progress=False if o["progress"] is False else None)
    except (ClassificationDataError, CorpusNotFoundError, UnknownLabelError) as err:
        raise TrainingError(f"--{flag}: {err}") from None


def check_encodable(texts, sources, tokenizer, flag):
    """Raises `TrainingError` naming the first text that `tokenizer` cannot
    encode (a vocabulary without an unknown entry, `unk_id` < 0): inside
    tf.data that would fail mid-run with a TensorFlow traceback."""
    from txl_tf.errors import TxlError
    if getattr(tokenizer, "unk_id", 0) >= 0:
        return
    for text, source in zip(texts, sources):
        try:
            tokenizer.encode(text)
        except TxlError as err:
            raise TrainingError(f"--{flag}: {source}: {err}") from None


def train(o):
    import keras

    from training.callbacks import ProgressLine, StepLog, StopOnNonFinite
    from txl_tf.app.files import stage
    from training.train_data import release_input_iterators
    from txl_tf.app.progress import interactive
    from txl_tf.classification import classification_dataset
    from txl_tf.learning.optimizer import ReplicaClippedAdam
    from txl_tf.keras_support.precision import resolve as resolve_precision
    from txl_tf.learning.schedule import WarmupCosineDecay

    def log(message):
        if o["verbose"]:
            print(message, flush=True)

    start = time.time()
    o = {**o, "max_length": o["max_length"] or 512, "keep": o["keep"] or "start"}
    examples = _read(o, None, "train_data")
    labels = examples.labels
    if len(labels) < 2:
        raise TrainingError(f"the training data has one label ({labels.names[0]}); a classifier "
                            "needs examples of two or more")
    if o["num_classes"] is not None and o["num_classes"] != len(labels):
        raise TrainingError(f"--num_classes={o['num_classes']} but the training data has "
                            f"{len(labels)} labels ({', '.join(labels.names[:10])}"
                            f"{', ...' if len(labels) > 10 else ''})")
    eval_examples = _read(o, labels, "eval_data") if o["eval_data"] else None
    build, tokenizer, config, what = choose_model(o, log)
    check_encodable(examples.texts, examples.sources, tokenizer, "train_data")
    if eval_examples is not None:
        check_encodable(eval_examples.texts, eval_examples.sources, tokenizer, "eval_data")
    segment_len, mem_len = check_lengths(o, config)
    output_dir = o["output_dir"]
    if os.path.exists(os.path.join(output_dir, MODEL_FILE)) and not o["overwrite"]:
        raise TrainingError(f"--output_dir {output_dir} already holds a classifier "
                            f"({MODEL_FILE}); pass --overwrite or choose another folder")
    formats = export_formats(o["export"])

    precision = resolve_precision(o["mixed_precision"])
    log(f"precision: {precision.describe()}")
    keras.utils.set_random_seed(o["seed"])
    model = build(len(labels), labels.names, precision.policy)
    per_epoch = math.ceil(len(examples) / o["batch_size"])
    steps = o["steps"] or per_epoch * (o["epochs"] or 1)
    warmup = steps // 10 if o["warmup_steps"] is None else o["warmup_steps"]
    if warmup > steps:
        raise TrainingError(f"--warmup_steps ({warmup}) exceeds the {steps} training steps")
    # Checked: from here on the job writes.
    os.makedirs(output_dir, exist_ok=True)
    log_path = os.path.join(output_dir, LOG_FILE)
    # --overwrite: the kept classifier's log is train_log.previous.jsonl until this one is saved.
    previous_log = set_aside_log(output_dir, os.path.exists(os.path.join(output_dir, MODEL_FILE)))

    params = sum(int(v.numpy().size) for v in model.trainable_weights)
    counts = ", ".join(f"{k} {v}" for k, v in examples.class_counts().items())
    log(f"model: {what}, {params:,} trainable parameters, {len(labels)} classes; "
        f"segment_len {segment_len}, mem_len {mem_len}, max_length {o['max_length']}")
    log(f"data: {len(examples):,} training examples ({counts})"
        + (f", {len(eval_examples):,} evaluation examples" if eval_examples else "")
        + f"; {steps} steps of batch {o['batch_size']} ({steps / per_epoch:.2f} epochs)")

    schedule = WarmupCosineDecay(o["learning_rate"], steps, warmup, min_lr_ratio=0.0)
    model.compile(ReplicaClippedAdam(learning_rate=schedule, global_clipnorm=o["clip"] or None),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=precision.jit_compile)
    ds = classification_dataset(examples, tokenizer, o["batch_size"],
                                max_length=o["max_length"], segment_len=segment_len,
                                keep=o["keep"], shuffle=True, seed=o["seed"], repeat=True,
                                drop_remainder=True, bucket=True)
    # A NaN or inf loss or weight ends the job before the model is saved.
    callbacks = [StopOnNonFinite(None, precision.policy),
                 StepLog(log_path, o["log_every"], schedule=schedule)]
    verbose = 1 if o["verbose"] and interactive() else 0
    if o["verbose"] and not verbose:  # a log file: plain lines, no bar
        callbacks.append(ProgressLine(steps, o["log_every"], o["batch_size"], schedule, log,
                                      fields=(("loss", 4), ("accuracy", 4)), unit="examples"))
    fit_start = time.time()
    try:
        history = model.fit(ds, steps_per_epoch=steps, epochs=1, callbacks=callbacks,
                            shuffle=False, verbose=verbose)
    except BaseException:
        for callback in callbacks:  # a heartbeat's thread (Keras calls no on_train_end)
            if hasattr(callback, "end_after_failure"):
                callback.end_after_failure()
        raise
    train_seconds = time.time() - fit_start
    release_input_iterators()
    model_file = os.path.join(output_dir, MODEL_FILE)
    vocab_dir = os.path.join(output_dir, "vocab")
    # The run's files replace a previous run's together, classifier.keras last
    # (txl_tf.app.files): a run killed before leaves the previous classifier
    # whole, with its own flags, labels and vocabulary; its metrics and export
    # go with it.
    with stage(model_file) as files:
        write_atomically(files.path(os.path.join(output_dir, "flags.json")),
                         json.dumps(o, indent=2, sort_keys=True) + "\n")
        labels.save(files.path(os.path.join(output_dir, "labels.json")))
        tokenizer.save(files.path(vocab_dir))
        model.save(files.path(model_file))
        files.drop(os.path.join(output_dir, METRICS_FILE))
        files.drop(os.path.join(output_dir, "export"))
        files.drop(previous_log)
    log(f"saved {model_file}")

    result = {"mode": "train", "steps": steps, "train_seconds": train_seconds,
              "train_loss": float(history.history["loss"][-1]),
              "train_accuracy": float(history.history["accuracy"][-1]),
              "labels": labels.names, "output_dir": output_dir, "parameters": params,
              "eval": None, "export": None}
    if eval_examples is not None:
        metrics = evaluate_examples(model, eval_examples, tokenizer, o,
                                    _progress(o, "evaluating"))
        metrics.update({"eval_data": o["eval_data"], "step": steps,
                        "segment_len": segment_len, "mem_len": mem_len,
                        "max_length": o["max_length"], "keep": o["keep"]})
        write_atomically(os.path.join(output_dir, METRICS_FILE),
                         json.dumps(metrics, indent=2) + "\n")
        result["eval"] = metrics
        log(describe_metrics(metrics, f"eval {o['eval_data']}"))
    if formats:
        from export import export_classifier
        written = export_classifier(model, os.path.join(output_dir, "export"), formats,
                                    label_names=labels.names, vocab_dir=vocab_dir)
        result["export"] = written
        log(f"exported {', '.join(formats)} to {os.path.join(output_dir, 'export')}")
    log(f"done in {time.time() - start:.0f}s")
    return result


def reading_settings(o):
    """`o` with `--max_length` / `--keep` taken from the trained run's
    flags.json where not given (as training read its documents), said in a line."""
    saved = {}
    path = os.path.join(o["classifier_dir"], "flags.json")
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                saved = parse_json(f.read())
        except ValueError as err:  # not JSON, or not UTF-8
            raise TrainingError(f"--classifier_dir: cannot read {path}: {err}") from None
        length, keep = (saved.get("max_length"), saved.get("keep")) \
            if isinstance(saved, dict) else (None, None)
        if not isinstance(saved, dict) or not (
                length is None or type(length) is int and 1 <= length <= 2**31 - 1) \
                or keep not in (None, "start", "end"):
            raise TrainingError(f"--classifier_dir: {path} is not a training run's flags "
                                "(a JSON object whose max_length is an integer in "
                                "[1, 2**31 - 1] and keep start or end)")
    taken = {}
    for name, fallback in (("max_length", 512), ("keep", "start")):
        if o[name] is None:
            taken[name] = saved.get(name) or fallback
    if taken:
        print("reading documents as the classifier was trained: "
              + ", ".join(f"--{k}={v}" for k, v in taken.items()), file=sys.stderr, flush=True)
    return {**o, **taken}


def evaluate(o):
    model, labels, tokenizer = load_classifier(o["classifier_dir"])
    o = reading_settings(o)
    examples = _read(o, labels, "eval_data")
    check_encodable(examples.texts, examples.sources, tokenizer, "eval_data")
    metrics = evaluate_examples(model, examples, tokenizer, o, _progress(o, "evaluating"))
    metrics.update({"eval_data": o["eval_data"], "classifier_dir": o["classifier_dir"],
                    "segment_len": model.segment_len, "mem_len": model.mem_len,
                    "max_length": o["max_length"], "keep": o["keep"]})
    if o["output"]:  # through a rename: a kill never leaves half of it
        write_atomically(o["output"], json.dumps(metrics, indent=2))
    print(describe_metrics(metrics, f"eval {o['eval_data']}"), flush=True)
    return {"mode": "evaluate", "eval": metrics}


def read_texts(path, skip_blank=False):
    """`(line numbers, texts)` of a UTF-8 file, one document a line; a blank
    line is an error naming it, unless `skip_blank` leaves it out."""
    from txl_tf.classification.data import ClassificationDataError, read_lines
    if not os.path.isfile(path):
        raise TrainingError(f"--predict_data: {path} not found (a text file, one document "
                            "a line)")
    try:
        texts = read_lines(path)  # as --train_data / --eval_data lines are read
    except ClassificationDataError as err:
        raise TrainingError(f"--predict_data: {err}") from None
    blank = [n for n, t in enumerate(texts, 1) if not t.strip()]
    if blank and not skip_blank:
        listed = ", ".join(map(str, blank[:10])) + (", ..." if len(blank) > 10 else "")
        raise TrainingError(f"--predict_data: {path} line(s) {listed} blank (pass --skip_blank "
                            "to leave blank lines out; rows keep their line numbers)")
    numbers = [n for n, t in enumerate(texts, 1) if t.strip()]
    if not numbers:
        raise TrainingError(f"--predict_data: {path} has no text")
    return numbers, [texts[n - 1] for n in numbers]


def predict(o):
    import numpy as np
    model, labels, tokenizer = load_classifier(o["classifier_dir"])
    o = reading_settings(o)
    numbers, texts = read_texts(o["predict_data"], o["skip_blank"])
    check_encodable(texts, [f"{o['predict_data']}:{n}" for n in numbers], tokenizer,
                    "predict_data")
    logits = predict_logits(model, texts, tokenizer, o["batch_size"], o["max_length"],
                            o["keep"], _progress(o, "predicting"))
    shifted = logits - logits.max(-1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)
    lines = ["line\tlabel\t" + "\t".join(labels.names)]
    lines += [f"{n}\t{labels.name(int(p.argmax()))}\t" + "\t".join(f"{x:.6f}" for x in p)
              for n, p in zip(numbers, probs)]
    text = "\n".join(lines) + "\n"
    if o["output"]:  # through a rename: a kill never leaves half of it
        write_atomically(o["output"], text)
    else:
        sys.stdout.write(text)
    return {"mode": "predict", "lines": numbers,
            "labels": [labels.name(int(i)) for i in probs.argmax(-1)], "probabilities": probs}


def main(argv):
    """The command-line entry (run through `txl_tf.app.cli.run`)."""
    options = values(SPEC)
    check_options(merge(SPEC, options))  # bad flags fail before TensorFlow loads
    run(**options)
    sys.stdout.flush()


def console():
    """The installed command (see setup.py's console scripts)."""
    from txl_tf.app import cli
    cli.run(main, SPEC, doc=__doc__)


if __name__ == "__main__":
    console()
