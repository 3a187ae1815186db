r"""How far back does a trained model's context help? Loss by position, by memory length.

    python -m benchmarks.memory_use --model_dirs=RUN[,RUN...] --dataset=wt2 \
        --data_dir=DIR [--split=test] [--mem_lens=0,64,128,256]

Scores each model on a split (`training.evaluate --by_position`) at every
memory length and prints, per memory length, the perplexity (the mean over
the models) and the mean loss at positions 0, 1, 2-3, 4-7, ... of a segment:
a position p sees p earlier ids of its segment plus the memory. Where the
loss without memory equals the loss with it from some position on, the
model uses no context beyond that distance, and the memory's whole gain
comes from the segment's first positions. Writes every model's numbers to
`--output` as JSON. The runs of `bench_quality.py --work_dir=DIR` are model
directories (`DIR/<arm>_seed<N>`, its data in `DIR/data`, dataset `wt2`).
"""
import json
import os
import statistics
import sys


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import integer_list  # noqa: E402
from training import evaluate  # noqa: E402
from training.errors import TrainingError  # noqa: E402
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402

SPEC = (
    option("string", "model_dirs", None, "Comma-separated model (or training run) directories."),
    option("string", "dataset", "wt2", "Corpus name."),
    option("string", "data_dir", None, "Corpus folder."),
    option("string", "cache_dir", None, "Corpus cache folder (training.evaluate's)."),
    option("enum", "split", "test", "Split to score.", ["train", "valid", "test"]),
    option("string", "mem_lens", "0,64,128,256", "Comma-separated memory lengths."),
    option("integer", "batch_size", 10, "Streams scored side by side (training.evaluate's)."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "memory_use.json"),
           "Where to write the JSON results."),
)


def score(o, model_dir, mem_len):
    """`training.evaluate`'s result for one model at one memory length."""
    return evaluate.run(model_dir=model_dir, dataset=o["dataset"], data_dir=o["data_dir"],
                        cache_dir=o["cache_dir"], split=o["split"], mem_len=mem_len,
                        batch_size=o["batch_size"], by_position=True, progress=False)


def table(results, mem_lens):
    """One row per memory length: mean ppl over the models and the mean loss
    in each band of positions."""
    from txl_tf.learning.evaluation import position_bands
    rows, header = [], None
    for mem_len in mem_lens:
        runs = [r[str(mem_len)] for r in results.values()]
        mean_by_position = [statistics.fmean(values) for values in
                            zip(*(r["loss_by_position"] for r in runs))]
        bands = position_bands(mean_by_position)
        if header is None:
            names = [f"{a}" if a == b else f"{a}-{b}" for a, b, _ in bands]
            header = ("| memory | ppl (mean) | " + " | ".join(names) + " |\n"
                      + "|---" * (len(names) + 2) + "|")
        rows.append(f"| {mem_len} | {statistics.fmean(r['ppl'] for r in runs):.1f} | "
                    + " | ".join(f"{loss:.3f}" for _, _, loss in bands) + " |")
    return header + "\n" + "\n".join(rows)


def run(o):
    if not o["model_dirs"]:
        raise TrainingError("--model_dirs is required")
    model_dirs = [d.strip() for d in o["model_dirs"].split(",") if d.strip()]
    mem_lens = integer_list(o["mem_lens"], "mem_lens", 0, "comma-separated integers >= 0")
    results = {}
    for model_dir in model_dirs:
        results[model_dir] = {str(m): score(o, model_dir, m) for m in mem_lens}
        print(f"{model_dir}: " + ", ".join(f"ppl {r['ppl']:.1f} at memory {m}"
                                           for m, r in results[model_dir].items()), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"settings": o, "results": results}, f, indent=2)
    print(f"loss (nats) by position in the segment, {o['split']} split, mean over "
          f"{len(model_dirs)} model(s):")
    print(table(results, mem_lens), flush=True)
    return results


def main(argv):
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
