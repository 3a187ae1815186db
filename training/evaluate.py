r"""Evaluates a trained model on a corpus split the way the paper does (absl app).

    python -m training.evaluate --model_dir=runs/enwik8_base \
        --dataset=enwik8 --data_dir=data/enwik8 --split=test \
        --paper_settings=enwik8_base --output=test.json

`--model_dir` is a model directory (config.json + weights.npz, e.g. the
`export/` written by training.train) or a training run directory (its
`export/` if present, else its newest checkpoint; `--checkpoint` picks one,
see `txl_tf.weights.model_dir`). The corpus is read with the model's own vocabulary
(its `vocab/`, checked against the fingerprint in its config; `--vocab_dir`
for a model without one), never one rebuilt from the corpus: words outside
it are read as its unknown token, and counted. Every
token of the split except the first of each of the `--batch_size` streams is
predicted exactly once, segment by segment with the memory carried; the
loss is weighted by tokens. With `--paper_settings` (or `--drop_remainder`)
the streams are the paper's: the last N mod batch_size tokens are dropped.
Prints and writes (`--output`) loss, bpc, ppl.
Bad input ends in one `error:` line and exit status 2 (`txl_tf.app.cli`).
"""
import json
import math
import os

from training.errors import TrainingError
from training.files import write_atomically
from txl_tf.app import cli
from txl_tf.app.flagspec import merge, option, values
from txl_tf.app.paths import output_over_an_input, path_in_the_way
from txl_tf.app.tf_logs import logging_as_found

SPEC = (
    option("string", "model_dir", None, "Model directory, or a training run's directory (a "
           "Transformer-XL, or the LSTM baseline of training.train_lstm)."),
    option("string", "checkpoint", None, "A training checkpoint (ckpt-N prefix, or a name in "
           "the run's checkpoints/) to evaluate instead of the exported weights."),
    option("string", "vocab_dir", None, "The model's tokenizer folder, for a model without "
           "a vocab/ (default: the model's own)."),
    option("string", "dataset", "pystdlib", "Corpus name."),
    option("string", "data_dir", None, "Corpus folder."),
    option("string", "cache_dir", None, "Corpus cache folder."),
    option("multi_string", "corpus_option", [], "key=value options of load_corpus."),
    option("enum", "split", "valid", "Split to evaluate.", ["train", "valid", "test"]),
    option("string", "paper_settings", None, "Take tgt_len/mem_len/clamp_len/same_length "
           "from the paper's evaluation of this preset (txl_tf.config.eval_settings)."),
    option("integer", "tgt_len", None, "Segment length (default: the model's)."),
    option("integer", "mem_len", None, "Memory length; 0 for none (default: the model's)."),
    option("integer", "clamp_len", None, "Clamp relative distances (<= 0: off; default: the "
           "model's)."),
    option("bool", "same_length", None, "Every query sees the same number of keys "
           "(default: the model's)."),
    option("integer", "batch_size", 10, "Streams evaluated side by side."),
    option("bool", "drop_remainder", None, "Drop the last N mod batch_size ids, so that each "
           "stream has N // batch_size ids, as the paper's eval.py does (default: on with "
           "--paper_settings, else every id but each stream's first is scored)."),
    option("integer", "max_segments", None, "Stop after this many segments (an estimate)."),
    option("string", "output", None, "Write the results as JSON here."),
    option("bool", "by_position", False, "Also report the loss at each position of a segment "
           "(how far back the context helps; `loss_by_position` in the JSON)."),
    option("bool", "progress", None, "Show progress on stderr (default: a bar on a terminal, "
           "else a line every 10%)."),
)


def load_core(model_dir, checkpoint=None, vocab_dir=None, **overrides):
    """`(core, source)`: a `TransformerXL` from a model or training run
    directory, with config `overrides` (clamp_len, same_length); see
    `txl_tf.weights.model_dir`."""
    from txl_tf.weights.model_dir import load
    return load(model_dir, checkpoint, vocab_dir=vocab_dir, **overrides)


def _check_options(o, settings):
    if settings.get("tgt_len") is not None and settings["tgt_len"] <= 0:
        raise TrainingError(f"--tgt_len must be positive, got {settings['tgt_len']}")
    if settings.get("mem_len") is not None and settings["mem_len"] < 0:
        raise TrainingError(f"--mem_len must be >= 0, got {settings['mem_len']}")
    if o["batch_size"] <= 0:
        raise TrainingError(f"--batch_size must be positive, got {o['batch_size']}")
    if o["max_segments"] is not None and o["max_segments"] <= 0:
        raise TrainingError(f"--max_segments must be positive, got {o['max_segments']}")
    if not o["model_dir"]:
        raise TrainingError("--model_dir is required")
    if o["output"] and path_in_the_way("output", o["output"], "file"):  # written at the end
        raise TrainingError(path_in_the_way("output", o["output"], "file"))
    model_files = [(f"the model's {name}", os.path.join(o["model_dir"], name))
                   for name in ("config.json", "weights.npz", "vocab", "checkpoints", "export")]
    over_an_input = o["output"] and output_over_an_input("output", o["output"], [
        *model_files, ("the vocabulary (--vocab_dir)", o["vocab_dir"]),
        *[("the corpus (--data_dir)", path) for path in _corpus_files(o)]])
    if over_an_input:
        raise TrainingError(over_an_input)


def _corpus_files(o):
    """The corpus files the job reads: a `text` corpus's file (a text
    folder's are `inputs.check_not_read`'s), another corpus's split files."""
    if o["dataset"] == "text":
        return [o["data_dir"]] if o["data_dir"] and os.path.isfile(o["data_dir"]) else []
    from training import inputs
    from txl_tf.data.corpora import corpus_sources
    return corpus_sources(o["dataset"], o["data_dir"] or None,
                          **inputs.parse_options(o["corpus_option"]))


@logging_as_found()
def run(**options):
    """Evaluates with `options` (the flags by name); returns the results dict."""
    o = merge(SPEC, options)
    given = {name: o[name] for name in ("tgt_len", "mem_len", "clamp_len", "same_length")
             if o[name] is not None}
    _check_options(o, given)
    cli.quiet_tensorflow_import()
    settings = {}
    if o["paper_settings"]:
        from txl_tf.config import ConfigError, eval_settings
        try:
            settings = eval_settings(o["paper_settings"])
        except ConfigError as err:
            raise TrainingError(f"--paper_settings: {err}") from None
    settings.update(given)
    from training import inputs
    from txl_tf.learning.evaluation import evaluate_ids

    overrides = {k: settings[k] for k in ("clamp_len", "same_length") if k in settings}
    from txl_tf.checks.memory_budget import check_fits
    from txl_tf.baselines import load_lstm, lstm_folder
    lstm = lstm_folder(o["model_dir"])
    if lstm is not None:  # the LSTM baseline: its state is carried unless --mem_len=0
        if o["checkpoint"]:
            raise TrainingError("--checkpoint: the LSTM baseline keeps no checkpoints (its "
                                "job trains without resuming); its export/ is evaluated")
        core = load_lstm(lstm)
        tokenizer = inputs.model_tokenizer(o["model_dir"], os.path.join(lstm, "vocab"),
                                           core.config)
        settings["mem_len"] = None if settings.get("mem_len") else settings.get("mem_len")
    else:
        core, source = load_core(o["model_dir"], o["checkpoint"], o["vocab_dir"], **overrides)
        tokenizer = inputs.model_tokenizer(o["model_dir"], source.vocab_dir, core.config)
        mem_len = settings.get("mem_len")
        check_fits(core.config, o["batch_size"], settings.get("tgt_len") or core.config.tgt_len,
                   core.config.mem_len if mem_len is None else mem_len,
                   what="an evaluation step")
    corpus = inputs.load(o["dataset"], o["data_dir"], o["cache_dir"],
                         inputs.parse_options(o["corpus_option"]), tokenizer=tokenizer,
                         progress=False if o["progress"] is False else None,
                         outside=[("--model_dir", o["model_dir"])]
                         + ([("--output", o["output"])] if o["output"] else []))
    ids = corpus.split(o["split"])
    if len(ids) < 2:
        raise TrainingError(f"empty corpus: the {o['split']} split of {corpus.name!r} has "
                            f"{len(ids)} tokens (at least 2 needed)")
    drop = bool(o["paper_settings"]) if o["drop_remainder"] is None else o["drop_remainder"]
    if drop:  # the paper's LMOrderedIterator: N // B ids a stream
        ids = ids[:o["batch_size"] * (len(ids) // o["batch_size"])]
        if len(ids) < 2 * o["batch_size"]:
            raise TrainingError(f"the {o['split']} split of {corpus.name!r} is too short for "
                                f"--batch_size {o['batch_size']} with --drop_remainder: "
                                f"{len(ids)} ids kept (at least 2 a stream needed)")
    progress = cli.Progress(f"evaluating {o['split']}", enabled=o["progress"] is not False)
    result = evaluate_ids(core, ids, o["batch_size"], settings.get("tgt_len"),
                          settings.get("mem_len"), o["max_segments"], progress=progress,
                          by_position=o["by_position"])
    if not math.isfinite(result["loss"]):
        raise TrainingError(_not_finite(core, result["loss"], o["model_dir"]))
    result.update({"dataset": corpus.name, "split": o["split"], "model_dir": o["model_dir"],
                   "drop_remainder": drop,
                   "unknown_tokens": _unknown_scored(ids, tokenizer, result),
                   "clamp_len": getattr(core.config, "clamp_len", None),
                   "same_length": getattr(core.config, "same_length", None),
                   "character_level": inputs.is_character_level(corpus.tokenizer)})
    if o["output"]:  # through a rename: a kill never leaves half of it
        write_atomically(o["output"], json.dumps(result, indent=2, sort_keys=True))
    return result


def _unknown_scored(ids, tokenizer, result):
    """How many of the ids `evaluate_ids` scored (`result`'s segments of each
    stream, never a stream's first id) are the tokenizer's unknown token."""
    from txl_tf.data import stream_length, unknown_count
    length = stream_length(len(ids), result["batch_size"], drop_remainder=False)
    scored = result["segments"] * result["tgt_len"]
    return sum(unknown_count(ids[start + 1:min(start + 1 + scored, start + length)], tokenizer)
               for start in range(0, len(ids), length))


def _not_finite(core, loss, model_dir):
    """The error of a model whose loss is NaN or infinite, naming its
    weights that are (or saying that none is)."""
    import numpy as np
    bad = [w.path for w in core.weights if not np.isfinite(np.asarray(w.numpy())).all()]
    if not bad:
        return (f"the model's outputs are NaN or infinite (loss {loss}) though its weights "
                f"in {model_dir} are finite: an overflow in its computation")
    named = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    return (f"the model's outputs are NaN or infinite (loss {loss}): {len(bad)} of its "
            f"{len(core.weights)} weights in {model_dir} hold NaN or inf ({named}), as a "
            "training run that diverged leaves them; evaluate an earlier checkpoint "
            "(--checkpoint)")


def describe(result):
    """One line: bpc for character-level corpora, perplexity for words."""
    head = (f"bpc {result['bpc']:.4f}" if result["character_level"]
            else f"ppl {result['ppl']:.2f}")
    return (f"{result['dataset']} {result['split']}: {head} (loss {result['loss']:.4f} nats/token "
            f"over {result['tokens']:,} tokens; tgt_len {result['tgt_len']}, mem_len "
            f"{result['mem_len']}, clamp_len {result['clamp_len']}, same_length "
            f"{result['same_length']}, batch {result['batch_size']}, {result['seconds']:.1f}s)"
            + _unknown(result) + _bands(result))


def _unknown(result):
    n = result.get("unknown_tokens", 0)
    if not n:
        return ""
    return (f"; {n:,} tokens ({n / max(result['tokens'], 1):.2%}) are the model's unknown "
            "token (words outside its vocabulary, or the token itself in the text)")


def _bands(result):
    if "loss_by_position" not in result:
        return ""
    from txl_tf.learning.evaluation import position_bands
    return "\nloss by position in the segment: " + ", ".join(
        f"{first}{'' if last == first else f'-{last}'}: {loss:.3f}"
        for first, last, loss in position_bands(result["loss_by_position"]))


def main(argv):
    print(describe(run(**values(SPEC))), flush=True)


def console():
    """The installed command (see setup.py's console scripts)."""
    cli.run(main, SPEC, doc=__doc__)


if __name__ == "__main__":
    console()
