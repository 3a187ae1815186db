r"""How far does a small Transformer-XL get on real text in a fixed CPU budget,
and what is its memory worth?

    python -m benchmarks.bench_shakespeare [--budget_s=480] [--output=shakespeare.json]

Trains a preset (default `small`) on Tiny Shakespeare, byte-level, first 90%
of the bytes for training and the last 10% for validation (the char-rnn
convention), for `--budget_s` seconds of training (the number of steps is
set from a short timing probe so that the cosine schedule ends with the
budget). Then evaluates the whole validation split with the memory at the
training length, at 3x that, and with mem_len 0; prints a table and writes
JSON.
"""
import json
import os
import sys
import tempfile


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from training.errors import TrainingError  # noqa: E402

SPEC = (
    option("string", "data", os.path.join(REPO, "..", "shared", "data", "tinyshakespeare.txt"),
           "Tiny Shakespeare text file."),
    option("float", "budget_s", 480, "Training time budget in seconds."),
    option("string", "preset", "small", "Model preset."),
    option("integer", "batch_size", 16, "Global batch size."),
    option("integer", "tgt_len", None, "Segment length (default: the preset's)."),
    option("integer", "mem_len", None, "Training memory length (default: the preset's)."),
    option("float", "learning_rate", 1e-3, "Peak learning rate."),
    option("float", "dropout", None, "Dropout (default: the preset's)."),
    option("multi_string", "config_override", [], "field=value changes to the preset, e.g. "
           "d_model=192 (as the training job's flag)."),
    option("enum", "mixed_precision", "auto", "As the training job's flag.",
           ["auto", "none", "mixed_float16", "mixed_bfloat16"]),
    option("integer", "eval_batch_size", 8, "Streams during evaluation."),
    option("string", "model_dir", None, "Training folder (default: a temporary one)."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "shakespeare.json"),
           "Where to write the JSON results."),
)


def run(o):
    if not os.path.isfile(o["data"]):
        raise TrainingError(f"--data: {o['data']} not found (Tiny Shakespeare; the repo "
                            "expects it at ../shared/data/tinyshakespeare.txt)")
    from txl_tf.weights import load_pretrained
    from txl_tf.data import load_corpus
    from training.budget import train_within
    from txl_tf.learning.evaluation import evaluate_ids

    model_dir = o["model_dir"] or tempfile.mkdtemp(prefix="txl_shakespeare_")
    cache = os.path.join(model_dir, "corpus_cache")
    base = dict(preset=o["preset"], dataset="text", data_dir=o["data"], cache_dir=cache,
                batch_size=o["batch_size"], tgt_len=o["tgt_len"], mem_len=o["mem_len"],
                dropout=o["dropout"], learning_rate=o["learning_rate"], strategy="one_device",
                config_override=o["config_override"], mixed_precision=o["mixed_precision"])
    result, steps, per_step, train_seconds = train_within(
        o["budget_s"], base, model_dir, warmup_steps=200, checkpoints=5, log_every=20)

    core = load_pretrained(result["export_dir"])
    corpus = load_corpus("text", o["data"], cache_dir=cache)
    tgt, mem = core.config.tgt_len, core.config.mem_len
    rows = []
    for mem_len in (mem, 3 * mem, 0):
        r = evaluate_ids(core, corpus.valid, batch_size=o["eval_batch_size"], tgt_len=tgt,
                         mem_len=mem_len)
        rows.append({"mem_len": mem_len, "bpc": r["bpc"], "loss": r["loss"],
                     "tokens": r["tokens"], "seconds": r["seconds"]})
    with open(os.path.join(model_dir, "train_log.jsonl"), encoding="utf-8") as f:
        last = [json.loads(line) for line in f][-1]
    report = {"benchmark": "tinyshakespeare byte-level, 90/10 split", "preset": o["preset"],
              "config": core.config.to_dict(), "mixed_precision": o["mixed_precision"],
              "parameters": result["parameters"], "batch_size": o["batch_size"],
              "tgt_len": tgt, "train_mem_len": mem, "learning_rate": o["learning_rate"],
              "budget_s": o["budget_s"], "train_seconds": train_seconds,
              "steps": result["step"], "seconds_per_step": per_step,
              "train_tokens": result["step"] * o["batch_size"] * tgt,
              "train_bytes": int(len(corpus.train)), "valid_bytes": int(len(corpus.valid)),
              "train_bpc_last_epoch": last.get("bpc"), "validation": rows,
              "model_dir": model_dir}
    output = o["output"] or os.path.join(model_dir, "shakespeare.json")
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)

    print(f"\nTiny Shakespeare, byte-level: preset {o['preset']} "
          f"({result['parameters']:,} parameters), {result['step']} steps x batch "
          f"{o['batch_size']} x {tgt} bytes in {train_seconds:.0f}s")
    print(f"{'eval mem_len':>12} | {'valid bpc':>9} | {'bytes':>8} | {'eval s':>6}")
    for row in rows:
        print(f"{row['mem_len']:>12} | {row['bpc']:>9.4f} | {row['tokens']:>8,} | "
              f"{row['seconds']:>6.1f}")
    print(f"results: {output}", flush=True)
    return report


def main(argv):
    del argv
    run(values(SPEC))  # absl would pass a returned value to sys.exit


if __name__ == "__main__":
    cli.run(main, SPEC)  # the jobs' exit path: bad input is one `error:` line
