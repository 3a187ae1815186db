r"""How far back do models use their context? The relative effective context
length (RECL) of Dai et al. (2019, Appendix C) for a group of trained models,
or one model's loss against its context length (absl app).

    python -m training.recl --model_dir=runs/xl --model_dir=runs/short \
        --dataset=pystdlib --max_context=512 --context_step=32 --output_dir=recl

For each model, the loss of every sampled target token (`--positions` of the
`--split`, the same sample for all) given exactly c tokens before it, c from
`--first_context` to `--max_context` by `--context_step`: a Transformer-XL
reads those c tokens from an empty memory of c slots, segment by segment, so
no state carries older text (`txl_tf.learning.context_length`). Then, for each
ratio r of `--ratios` (the fraction of hardest tokens kept), each model's RECL:
c grows while its relative gain over the group's best at c stays at least
`--threshold`. The models must share one vocabulary. Prints the table and
writes `recl.json` and `recl.png` (the gain curves; for one model, its loss
against the context) into `--output_dir`.
"""
import json
import os

from training.errors import TrainingError
from training.files import write_atomically
from txl_tf.app import cli
from txl_tf.app.files import replacing
from txl_tf.app.flagspec import merge, option, values
from txl_tf.app.paths import path_in_the_way
from txl_tf.app.tf_logs import logging_as_found

SPEC = (
    option("multi_string", "model_dir", [], "A model or training run directory; repeat for "
           "each model of the group (name=DIR names it in the table, else the folder's name)."),
    option("string", "dataset", "pystdlib", "Corpus name."),
    option("string", "data_dir", None, "Corpus folder."),
    option("string", "cache_dir", None, "Corpus cache folder."),
    option("multi_string", "corpus_option", [], "key=value options of load_corpus."),
    option("enum", "split", "valid", "Split whose tokens are scored.",
           ["train", "valid", "test"]),
    option("integer", "first_context", 16, "The shortest context length c."),
    option("integer", "context_step", 16, "How much c grows each time (the paper's delta)."),
    option("integer", "max_context", 256, "The longest context length c."),
    option("integer", "positions", 500, "Target tokens sampled (the cost is positions x "
           "context lengths x models reads)."),
    option("string", "ratios", "0.1,0.5,1.0", "Fractions r of the hardest tokens kept, "
           "comma-separated."),
    option("float", "threshold", 0.01, "The relative gain below which c stops growing."),
    option("integer", "batch_size", 32, "Windows scored together."),
    option("integer", "seed", 0, "Seed of the sample of target tokens (>= 0)."),
    option("string", "output_dir", None, "Where recl.json and recl.png go."),
    option("bool", "progress", None, "Show progress on stderr (default: a bar on a terminal, "
           "else a line every 10%)."),
)


def _named(model_dirs):
    """`[(name, directory)]` of the `--model_dir` values."""
    named = []
    for entry in model_dirs:
        name, _, path = entry.rpartition("=") if "=" in entry else ("", "", entry)
        named.append((name or os.path.basename(os.path.normpath(path)), path))
    if len({name for name, _ in named}) != len(named):
        raise TrainingError(f"--model_dir: two models have the same name ({named}); name "
                            "them with name=DIR")
    return named


def _ratios(text):
    try:
        ratios = [float(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise TrainingError(f"--ratios must be comma-separated numbers, got {text!r}") from None
    if not ratios or any(not 0 < r <= 1 for r in ratios):
        raise TrainingError(f"--ratios must be fractions in (0, 1], got {text!r}")
    return ratios


def _check(o):
    if not o["model_dir"]:
        raise TrainingError("--model_dir is required (repeat it for a group of models)")
    for name in ("first_context", "context_step", "positions", "batch_size"):
        if o[name] < 1:
            raise TrainingError(f"--{name} must be positive, got {o[name]}")
    if o["max_context"] < o["first_context"]:
        raise TrainingError(f"--max_context ({o['max_context']}) is below --first_context "
                            f"({o['first_context']})")
    if not 0 < o["threshold"] < 1:
        raise TrainingError(f"--threshold must be in (0, 1), got {o['threshold']}")
    if o["seed"] < 0:  # numpy's seeding takes any integer >= 0
        raise TrainingError(f"--seed must be >= 0, got {o['seed']}")
    in_the_way = o["output_dir"] and path_in_the_way("output_dir", o["output_dir"])
    if in_the_way:  # written once every context is scored
        raise TrainingError(in_the_way)


@logging_as_found()
def run(**options):
    """Measures with `options` (the flags by name); returns the results dict."""
    o = merge(SPEC, options)
    _check(o)
    named, ratios = _named(o["model_dir"]), _ratios(o["ratios"])
    cli.quiet_tensorflow_import()
    import numpy as np

    from training import inputs
    from txl_tf.learning import context_length as cl

    # A range until the text's length has refused a --max_context too long for it.
    contexts = range(o["first_context"], o["max_context"] + 1, o["context_step"])
    scorers, tokenizer = [], None
    for name, path in named:
        scorer, model_tokenizer = _load(path)
        if tokenizer is not None and model_tokenizer.fingerprint() != tokenizer.fingerprint():
            raise TrainingError(f"--model_dir {name}: its vocabulary is not the first model's; "
                                "RECL compares models on the same tokens")
        scorers.append(scorer)
        tokenizer = model_tokenizer
    corpus = inputs.load(o["dataset"], o["data_dir"], o["cache_dir"],
                         inputs.parse_options(o["corpus_option"]), tokenizer=tokenizer,
                         progress=False if o["progress"] is False else None,
                         outside=[("--model_dir", path) for _, path in named]
                         + ([("--output_dir", o["output_dir"])] if o["output_dir"] else []))
    ids = np.asarray(corpus.split(o["split"]))
    if len(ids) <= contexts[-1]:
        raise TrainingError(f"--max_context {o['max_context']}: the {o['split']} split has "
                            f"{len(ids)} ids, too few for the longest context measured "
                            f"({contexts[-1]}) and one target after it")
    positions = cl.sample_positions(len(ids), contexts[-1], o["positions"], o["seed"])
    contexts = list(contexts)
    losses = []
    for (name, _), scorer in zip(named, scorers):
        progress = cli.Progress(f"{name}: loss by context", enabled=o["progress"] is not False)
        losses.append(cl.context_losses(scorer, ids, positions, contexts, o["batch_size"],
                                        progress))
    losses = np.stack(losses)
    result = {"models": [name for name, _ in named], "model_dirs": [p for _, p in named],
              "dataset": corpus.name, "split": o["split"], "contexts": contexts,
              "positions": len(positions), "threshold": o["threshold"], "seed": o["seed"],
              "how": "each target read with exactly c tokens before it: a Transformer-XL "
                     "from an empty memory of c slots, segment by segment (tgt_len); an "
                     "LSTM from the zero state",
              "mean_loss": {name: losses[i].mean(1).tolist()
                            for i, (name, _) in enumerate(named)},
              # Every loss of the table (context x position) and the positions scored:
              # a RECL at another ratio or threshold is recomputed from the file.
              "target_positions": positions.tolist(),
              "losses": {name: losses[i].tolist() for i, (name, _) in enumerate(named)},
              "recl": {}, "gains": {}}
    if len(named) > 1:
        for r in ratios:
            lengths, gains = cl.recl(losses, contexts, r, o["threshold"])
            result["recl"][str(r)] = dict(zip(result["models"], lengths))
            result["gains"][str(r)] = {name: gains[i].tolist()
                                       for i, name in enumerate(result["models"])}
    if o["output_dir"]:
        write_atomically(os.path.join(o["output_dir"], "recl.json"),  # through a rename
                         json.dumps(result, indent=2))
        _plot(result, os.path.join(o["output_dir"], "recl.png"))
    return result


def _load(path):
    """`(scorer, tokenizer)` of a Transformer-XL or LSTM baseline directory."""
    from training import inputs
    from training.evaluate import load_core
    from txl_tf.baselines import load_lstm, lstm_folder, lstm_scorer
    from txl_tf.learning.context_length import transformer_xl_scorer
    folder = lstm_folder(path)
    if folder is not None:
        model = load_lstm(folder)
        return lstm_scorer(model), inputs.model_tokenizer(path, os.path.join(folder, "vocab"),
                                                          model.config)
    core, source = load_core(path)
    return (transformer_xl_scorer(core),
            inputs.model_tokenizer(path, source.vocab_dir, core.config))


def _plot(result, path):
    """The gain curves per ratio (a group), or the mean loss against the
    context (one model), as a PNG; skipped without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("recl.png skipped: matplotlib is not installed (pip install txl_tf[viz])")
        return
    contexts = result["contexts"]
    if result["gains"]:
        panels = list(result["gains"].items())
        fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.5), squeeze=False)
        for ax, (ratio, gains) in zip(axes[0], panels):
            for name, curve in gains.items():
                ax.plot(contexts[1:], curve, marker=".", label=name)
            ax.axhline(result["threshold"], color="grey", linestyle=":")
            ax.set(title=f"r = {ratio}", xlabel="context c + step", ylabel="relative gain")
            ax.legend(fontsize="small")
    else:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for name, curve in result["mean_loss"].items():
            ax.plot(contexts, curve, marker=".", label=name)
        ax.set(xlabel="context length c", ylabel="mean loss (nats)")
        ax.legend(fontsize="small")
    fig.tight_layout()
    with replacing(path) as temporary:  # a kill never leaves half a picture
        fig.savefig(temporary, dpi=100)
    plt.close(fig)


def describe(result):
    """The RECL table per ratio, or one model's loss by context."""
    contexts = result["contexts"]
    step = contexts[1] - contexts[0] if len(contexts) > 1 else 0
    lines = [f"{result['dataset']} {result['split']}, {result['positions']} target tokens, "
             f"contexts {contexts[0]}..{contexts[-1]} (step {step})"]
    if result["recl"]:
        ratios = list(result["recl"])
        lines.append(f"{'model':>16} | " + " | ".join(f"RECL r={r:<5}" for r in ratios))
        for name in result["models"]:
            lines.append(f"{name:>16} | " + " | ".join(
                f"{result['recl'][r][name]:>11}" for r in ratios))
        last = result["contexts"][-1]
        lines.append(f"(a RECL of {last} means the gain never fell below the threshold: "
                     "at least that)")
    for name, curve in result["mean_loss"].items():
        lines.append(f"{name}: mean loss by context " + ", ".join(
            f"{c}: {loss:.3f}" for c, loss in zip(result["contexts"], curve)))
    return "\n".join(lines)


def main(argv):
    del argv
    print(describe(run(**values(SPEC))), flush=True)


def console():
    """The installed command (see setup.py's console scripts)."""
    cli.run(main, SPEC, doc=__doc__)


if __name__ == "__main__":
    console()
