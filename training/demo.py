r"""`make demo`: trains a small Transformer-XL on this Python's standard library
for a few minutes on CPU, then shows what it learned.

    python -m training.demo [--train_seconds=180] [--model_dir=/tmp/txl_demo]

Prints validation bits per character with the memory (at the training
length and longer) and without it (mem_len 0), and a greedy and a sampled
continuation of a prompt.
"""
import os
import tempfile

from txl_tf.app import cli
from txl_tf.app.flagspec import merge, option, values

SPEC = (
    option("string", "model_dir", None, "Where to train (default: a new temporary folder)."),
    option("float", "train_seconds", 180, "Training time budget in seconds."),
    option("string", "preset", "small", "Model preset."),
    option("integer", "batch_size", 16, "Global batch size."),
    option("float", "learning_rate", 1e-3, "Peak learning rate (short runs like it higher "
           "than the paper's 2.5e-4)."),
    option("integer", "max_bytes", 3_000_000, "Bytes of the standard library to read (3 MB: "
           "the validation 5% is ordinary code)."),
    option("integer", "eval_segments", 100, "Validation segments per evaluation (x batch 8 "
           "x tgt_len bytes)."),
    option("string", "prompt", "import os\n\n\ndef ", "Prompt to continue."),
    option("integer", "num_tokens", 240, "Bytes to generate."),
)


def run(**options):
    """Trains, evaluates and samples; returns a summary dict. Without
    `--model_dir` it trains in a temporary folder, removed at the end."""
    o = merge(SPEC, options)
    if o["model_dir"]:
        return _demo(o, o["model_dir"])
    with tempfile.TemporaryDirectory(prefix="txl_demo_") as model_dir:
        result = _demo(o, model_dir)
    print(f"(trained in {model_dir}, now removed; --model_dir keeps a run)", flush=True)
    return result


def _demo(o, model_dir):
    cli.quiet_tensorflow_import()
    from txl_tf.weights import load_pretrained
    from txl_tf.data import load_corpus
    from txl_tf.text import load_tokenizer
    from training.budget import train_within
    from txl_tf.learning.evaluation import evaluate_ids
    from training.generate import continue_text

    base = dict(preset=o["preset"], dataset="pystdlib", batch_size=o["batch_size"],
                corpus_option=[f"max_bytes={o['max_bytes']}"], learning_rate=o["learning_rate"],
                strategy="one_device")
    print(f"timing a few steps of the {o['preset']} preset ...", flush=True)
    result, steps, per_step, trained = train_within(o["train_seconds"], base, model_dir)

    core = load_pretrained(result["export_dir"])
    tokenizer = load_tokenizer(os.path.join(result["export_dir"], "vocab"))
    valid = load_corpus("pystdlib", max_bytes=o["max_bytes"]).valid
    tgt = core.config.tgt_len
    rows = []
    for mem_len in (3 * tgt, tgt, 0):
        r = evaluate_ids(core, valid, batch_size=8, tgt_len=tgt, mem_len=mem_len,
                         max_segments=o["eval_segments"])
        rows.append((mem_len, r))
    greedy = continue_text(core, tokenizer, o["prompt"], o["num_tokens"], mem_len=3 * tgt,
                           greedy=True)
    sampled = continue_text(core, tokenizer, o["prompt"], o["num_tokens"], mem_len=3 * tgt,
                            temperature=0.7, seed=1)

    print(f"\ntrained {result['step']} steps ({result['parameters']:,} parameters) in "
          f"{trained:.0f}s on {len(load_corpus('pystdlib', max_bytes=o['max_bytes']).train):,} "
          "bytes of Python source")
    print(f"validation ({rows[0][1]['tokens']:,} bytes, segments of {tgt}):")
    for mem_len, r in rows:
        label = f"memory {mem_len}" if mem_len else "no memory (mem_len 0)"
        print(f"  {label:<24} {r['bpc']:.3f} bpc")
    gain = rows[-1][1]["bpc"] - rows[0][1]["bpc"]
    print(f"  memory saves {gain:.3f} bits per byte")
    print(f"\ngreedy continuation of {o['prompt']!r}:\n{o['prompt']}{greedy}")
    print(f"\nsampled (temperature 0.7):\n{o['prompt']}{sampled}\n", flush=True)
    return {"model_dir": model_dir, "steps": result["step"],
            "bpc": {mem: r["bpc"] for mem, r in rows}, "greedy": greedy, "sampled": sampled}


def main(argv):
    run(**values(SPEC))


def console():
    """The installed command (see setup.py's console scripts)."""
    cli.run(main, SPEC)


if __name__ == "__main__":
    console()
