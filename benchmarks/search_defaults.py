r"""A small search for the small-model training defaults, chosen on a
validation split and reported on a held-out one.

    python -m benchmarks.search_defaults [--settings=a,b] [--seeds=0] [--parallel=2]

The recipe is `bench_quality.py`'s (small preset, adaptive softmax, 1,500
steps of batch 16 at 1e-3 with the default warm-up) on WikiText-2 text,
split in three: the last 10% of the lines held out (reported, never used to
choose), the 10% before it the validation split (chooses; not trained on),
the rest trained on. Each setting changes a few training flags (`SETTINGS`).
`--parallel` runs that many jobs at once, each on `--threads` TensorFlow
threads (2 x 1 thread uses a 2-core machine better than 1 x 2 at this size).
Prints a table (median validation and held-out ppl at memory 64, memory
gain, ratio to the baseline's median) and writes every run to JSON.
"""
import functools
import json
import os
import statistics
import sys
import tempfile


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.quality_recipe import (one_run, parse_seeds, run_all, split_text,  # noqa: E402
                                       thread_env)
from training.errors import TrainingError  # noqa: E402
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402

# name -> training flags after the recipe's (1e-3, warm-up 10%, dropout 0.1,
# dropatt 0, cosine floor 0.004, clip 0.25).
SETTINGS = {
    "baseline": [],
    "lr2e-3": ["--learning_rate=2e-3"],
    "lr3e-3": ["--learning_rate=3e-3"],
    "lr5e-4": ["--learning_rate=5e-4"],
    "warmup5%": ["--warmup_steps=75"],
    "warmup25%": ["--warmup_steps=375"],
    "dropout0.2": ["--dropout=0.2"],
    "dropout0.05": ["--dropout=0.05"],
    "dropatt0.1": ["--dropatt=0.1"],
    "floor0.1": ["--min_lr_ratio=0.1"],
    "lr2e-3+warmup25%": ["--learning_rate=2e-3", "--warmup_steps=375"],
    "lr2e-3+dropout0.2": ["--learning_rate=2e-3", "--dropout=0.2"],
    # A probe beyond the dozen, aimed at the memory gain: train with twice
    # the memory that the recipe evaluates with.
    "mem128": ["--mem_len=128"],
    # Round two: the optimizer's own defaults (the paper's Adam and clip),
    # the rates Adam's beta_2 at 0.98 allows, two dropout combinations.
    "beta2_0.98": ["--adam_beta2=0.98"],
    "beta2_0.98+lr2e-3": ["--adam_beta2=0.98", "--learning_rate=2e-3"],
    "clip1.0": ["--clip=1.0"],
    "clip0.1": ["--clip=0.1"],
    "epsilon1e-6": ["--adam_epsilon=1e-6"],
    "dropatt0.1+dropout0.2": ["--dropatt=0.1", "--dropout=0.2"],
    "lr2e-3+dropout0.2+dropatt0.1": ["--learning_rate=2e-3", "--dropout=0.2", "--dropatt=0.1"],
    "clip0": ["--clip=0"],
    "beta2_0.98+lr1.5e-3": ["--adam_beta2=0.98", "--learning_rate=1.5e-3"],
    "beta2_0.98+lr2e-3+warmup20%": ["--adam_beta2=0.98", "--learning_rate=2e-3",
                                    "--warmup_steps=300"],
    "beta2_0.98+lr1.5e-3+warmup20%": ["--adam_beta2=0.98", "--learning_rate=1.5e-3",
                                      "--warmup_steps=300"],
    "beta2_0.98+lr1.25e-3": ["--adam_beta2=0.98", "--learning_rate=1.25e-3"],
    "beta2_0.98+clip1.0": ["--adam_beta2=0.98", "--clip=1.0"],
    # Round three: the small preset's own architecture defaults.
    "pre_lnorm": ["--config_override=pre_lnorm=true"],
    "untie_r": ["--config_override=untie_r=true"],
}

SPEC = (
    option("string", "text", os.path.join(REPO, "..", "shared", "data", "wikitext2.valid.txt"),
           "A word-level text file (one sentence or paragraph a line)."),
    option("string", "settings", ",".join(SETTINGS), "Comma-separated names from SETTINGS."),
    option("string", "seeds", "0", "Comma-separated seeds."),
    option("string", "precision", "none", "The training job's --mixed_precision."),
    option("integer", "train_steps", 1500, "Training steps per run."),
    option("float", "heldout_fraction", 0.1, "Last fraction of the lines held out (reported)."),
    option("float", "selection_fraction", 0.1, "Fraction before it used to choose."),
    option("integer", "parallel", 2, "Jobs at once."),
    option("integer", "threads", 1, "TensorFlow intra-op threads per job."),
    option("string", "work_dir", None, "Where runs are kept (default: a temporary folder)."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "search.json"),
           "Where to write the JSON results (runs already there are kept and reused)."),
)


def summarize(runs):
    """One row per setting, in SETTINGS order, with ratios to the baseline."""
    groups = {}
    for r in runs:
        groups.setdefault(r["setting"], []).append(r)
    base = groups.get("baseline")
    base_valid = statistics.median(r["valid_ppl_mem64"] for r in base) if base else None
    rows = []
    for name in [n for n in SETTINGS if n in groups]:
        group = sorted(groups[name], key=lambda r: r["seed"])
        valid = statistics.median(r["valid_ppl_mem64"] for r in group)
        rows.append({"setting": name, "seeds": [r["seed"] for r in group],
                     "valid_median": valid,
                     "valid_ppl_mem64": [r["valid_ppl_mem64"] for r in group],
                     "heldout_median": statistics.median(r["ppl_mem64"] for r in group),
                     "heldout_max_over_min": max(r["ppl_mem64"] for r in group)
                     / min(r["ppl_mem64"] for r in group),
                     "min_memory_gain": min(r["memory_gain"] for r in group),
                     "valid_vs_baseline": valid / base_valid if base_valid else None})
    return rows


def table(rows):
    lines = ["| setting | seeds | validation ppl (mem 64) by seed | median | ÷ baseline "
             "| held-out median | held-out max/min | smallest memory gain |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['valid_vs_baseline']:.3f}" if r["valid_vs_baseline"] else "–"
        lines.append(f"| {r['setting']} | {len(r['seeds'])} | "
                     f"{' / '.join(f'{p:.1f}' for p in r['valid_ppl_mem64'])} | "
                     f"{r['valid_median']:.1f} | {ratio} | {r['heldout_median']:.1f} | "
                     f"{r['heldout_max_over_min']:.3f} | {r['min_memory_gain']:.3f} |")
    return "\n".join(lines)


def run(o):
    names = [n.strip() for n in o["settings"].split(",") if n.strip()]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        raise TrainingError(f"--settings: unknown {unknown}; known: {list(SETTINGS)}")
    seeds = parse_seeds(o["seeds"])
    if not os.path.isfile(o["text"]):
        raise TrainingError(f"--text: {o['text']} not found")
    runs = []
    if os.path.isfile(o["output"]):
        with open(o["output"], encoding="utf-8") as f:
            runs = json.load(f)["runs"]
    done = {(r["setting"], r["seed"]) for r in runs}
    work = o["work_dir"] or tempfile.mkdtemp(prefix="txl_search_")
    data_dir = os.path.join(work, "data")
    split_text(o["text"], data_dir, o["heldout_fraction"], 0, o["selection_fraction"])
    recipe = {"train_steps": o["train_steps"], "learning_rate": 1e-3}
    env = thread_env(o["threads"])
    todo = [(n, s) for n in names for s in seeds if (n, s) not in done]
    print(f"{len(todo)} runs in {work}, {o['parallel']} at once", flush=True)

    def one(name, seed):
        result = one_run(recipe, data_dir, os.path.join(work, f"{name}_seed{seed}"), seed,
                         o["precision"], "default", SETTINGS[name], ("valid", "test"), env)
        return {"setting": name, "flags": SETTINGS[name], **result}

    def record(r):
        runs.append(r)
        print(f"{r['setting']} seed {r['seed']}: validation {r['valid_ppl_mem64']:.1f}, "
              f"held-out {r['ppl_mem64']:.1f} at memory 64 ({r['train_seconds']:.0f}s)",
              flush=True)
        os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
        with open(o["output"], "w", encoding="utf-8") as f:
            json.dump({"settings": o, "runs": runs, "rows": summarize(runs)}, f, indent=2)

    run_all([functools.partial(one, n, s) for n, s in todo], o["parallel"], record)
    print(table(summarize(runs)), flush=True)


def main(argv):
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
