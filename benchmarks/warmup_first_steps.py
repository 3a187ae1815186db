r"""Why the warm-up: which weights move how far in the first steps, with and without it.

    python -m benchmarks.warmup_first_steps [--steps=100] [--text=../shared/data/wikitext2.valid.txt]

The quality recipe's model (`small`, adaptive softmax cutoffs 2000/6000,
div_val 2, batch 16, Adam at 1e-3, clip 0.25) on WikiText-2 text, the same
seed and batches with the training job's default warm-up (a tenth of 1,500
steps) and without. For each group of weights it records the relative change
`|w_t - w_0| / |w_0|` after `--steps` steps and the training loss; prints a
table and writes JSON.
"""
import json
import os
import sys


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from training.errors import TrainingError  # noqa: E402

SPEC = (
    option("string", "text", os.path.join(REPO, "..", "shared", "data", "wikitext2.valid.txt"),
           "A word-level text file."),
    option("integer", "steps", 100, "Steps observed."),
    option("integer", "total_steps", 1500, "The schedule's length (its warm-up is a tenth)."),
    option("integer", "seed", 0, "Seed."),
    option("string", "output",
           os.path.join(REPO, "benchmarks", "results", "warmup_first_steps.json"),
           "JSON results."),
)

GROUPS = (("tail clusters (cluster_W, cluster_b)", ("cluster",)),
          ("softmax / embedding projections", ("proj",)),
          ("embedding tables", ("lookup_table",)),
          ("LayerNorm", ("LayerNorm",)),
          ("attention q/k/v, r, o", ("rel_attn/qkv", "rel_attn/r/", "rel_attn/o")),
          ("r_w_bias, r_r_bias", ("r_w_bias", "r_r_bias")),
          ("feed-forward", ("/ff/layer",)),
          ("output biases (start at 0)", ("adaptive_softmax/bias", "adaptive_softmax/cutoff")))


def group_of(name):
    for label, keys in GROUPS:
        if any(k in name for k in keys):
            return label
    return "other"


def observe(o, warmup_steps):
    import keras
    import numpy as np
    from txl_tf import ReplicaClippedAdam, TransformerXLConfig, TransformerXLLM
    from txl_tf.weights.checkpoints import get_weights
    from txl_tf.data import segment_dataset
    from txl_tf.learning.schedule import WarmupCosineDecay
    from txl_tf.text import WordTokenizer
    with open(o["text"], encoding="utf-8") as f:
        text = f.read()
    tokenizer = WordTokenizer.build(text)
    ids = tokenizer.encode(text)
    keras.utils.set_random_seed(o["seed"])
    config = TransformerXLConfig.preset("small", n_token=tokenizer.vocab_size,
                                        cutoffs=[2000, 6000], div_val=2)
    model = TransformerXLLM(config, batch_size=16)
    model.compile(optimizer=ReplicaClippedAdam(
        learning_rate=WarmupCosineDecay(1e-3, o["total_steps"], warmup_steps),
        global_clipnorm=0.25))
    start = {k: v.astype(np.float64) for k, v in get_weights(model.core).items()}
    data = segment_dataset(ids, 16, config.tgt_len).take(o["steps"])
    history = model.fit(data, verbose=0, shuffle=False)
    end = get_weights(model.core)
    moved = {}
    for name, w0 in start.items():
        delta, base, count = moved.setdefault(group_of(name), [0.0, 0.0, 0])
        moved[group_of(name)] = [delta + float(np.sum((end[name] - w0) ** 2)),
                                 base + float(np.sum(w0 ** 2)), count + w0.size]
    # Relative to the start's norm; for weights that start at 0 (the tail
    # clusters), the root-mean-square change instead.
    return {"loss": float(history.history["loss"][-1]),
            "change": {k: ((d / b) ** 0.5, "relative") if b else ((d / n) ** 0.5, "rms")
                       for k, (d, b, n) in moved.items()}}


def run(o):
    if not os.path.isfile(o["text"]):
        raise TrainingError(f"--text: {o['text']} not found")
    from txl_tf.learning.schedule import default_warmup_steps
    arms = {"default warm-up": observe(o, default_warmup_steps(o["total_steps"])),
            "no warm-up": observe(o, 0)}
    lines = [f"change after {o['steps']} steps: |w - w0| / |w0| (relative), or the rms "
             "change of weights that start at 0",
             "| weights | measure | default warm-up | no warm-up | ratio |",
             "|---|---|---|---|---|"]
    for label, (b, kind) in arms["no warm-up"]["change"].items():
        a = arms["default warm-up"]["change"][label][0]
        lines.append(f"| {label} | {kind} | {a:.4f} | {b:.4f} | {b / a:.1f} |")
    lines.append(f"| training loss, mean over the steps | nats | "
                 f"{arms['default warm-up']['loss']:.3f} | {arms['no warm-up']['loss']:.3f} | |")
    print("\n".join(lines))
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"settings": o, "arms": arms}, f, indent=2)


def main(argv):
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
