r"""Does training land in the same place every run? Held-out perplexity over seeds.

    python -m benchmarks.bench_quality [--seeds=0,1,2,3,4] [--precisions=none,auto] \
        [--warmups=default,0] [--text=../shared/data/wikitext2.valid.txt]

The recipe (one training job per seed x precision x warm-up, each in its own
process): the `small` preset with an adaptive softmax (cutoffs 2000/6000,
div_val 2), word level, 1,500 steps of batch 16 at learning rate 1e-3. The
text's lines are split in three: the last `--heldout_fraction` is held out
(never trained on, never used to choose anything) and scored at the end;
training reads the rest; the validation split is the first 400 lines (as in
the recipe that measured the problem; it is inside the training text and only
logged). Each run is scored on the held-out lines at memory 64 and memory 0.

`--warmups`: `default` runs the training job without `--warmup_steps` (its
default), a number passes it. `ONEDNN_MAX_CPU_ISA=AVX2` in the environment
reproduces an AVX2 machine's round-off. Prints a table per arm (median,
max/min, memory gain) and writes every run to `--output` as JSON.

`--reference_dir` (the `pytorch/` folder of kimiyoung/transformer-xl) with
`--reference_python` (an interpreter with torch and numpy) adds the paper's
code as an arm on the same recipe, text, token ids, seeds and warm-ups
(`paper_quality_worker.py`; `--precisions=` with nothing runs that arm alone).
"""
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.quality_recipe import (RECIPE, one_run, parse_seeds, run_all,  # noqa: E402
                                       split_text, thread_env)
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from training.errors import TrainingError  # noqa: E402

SPEC = (
    option("string", "text", os.path.join(REPO, "..", "shared", "data", "wikitext2.valid.txt"),
           "A word-level text file (one sentence or paragraph a line)."),
    option("string", "seeds", "0,1,2,3,4", "Comma-separated seeds."),
    option("string", "precisions", "none,auto", "Values of the training job's --mixed_precision "
           "(none: float32)."),
    option("string", "warmups", "default,0", "Warm-up arms: 'default' (no --warmup_steps flag) or "
           "a number of steps."),
    option("integer", "train_steps", 1500, "Training steps per run."),
    option("float", "learning_rate", 1e-3, "Peak learning rate (0: the job's default)."),
    option("float", "heldout_fraction", 0.1, "Last fraction of the lines held out."),
    option("integer", "valid_lines", 400, "First lines used as the (logged) validation split."),
    option("string", "reference_dir", None, "The pytorch/ folder of kimiyoung/transformer-xl: "
           "adds the paper's code as an arm."),
    option("string", "reference_python", None, "An interpreter with torch and numpy, for "
           "--reference_dir."),
    option("integer", "reference_threads", 2, "torch threads of the paper's code."),
    option("integer", "parallel", 1, "Training jobs at once."),
    option("integer", "threads", 0, "TensorFlow intra-op threads per job (0: its default, all "
           "cores); with --parallel=2 on 2 cores, 1."),
    option("string", "work_dir", None, "Where runs are kept (default: a temporary folder)."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "quality.json"),
           "Where to write the JSON results."),
)


def reference_ids(data_dir, cache_dir, path):
    """The training and held-out token ids as txl_tf's training job reads them
    (vocabulary built from the training split), for the paper's code."""
    import numpy as np
    from txl_tf.data.corpora import load_corpus
    corpus = load_corpus("wt2", data_dir, cache_dir=cache_dir)
    np.savez(path, train=np.asarray(corpus.train, np.int32),
             test=np.asarray(corpus.test, np.int32))
    return corpus.tokenizer.vocab_size


def reference_run(o, ids_path, n_token, run_dir, seed, warmup):
    """Trains and scores the paper's PyTorch code on the recipe in a worker."""
    from txl_tf.config import TransformerXLConfig
    from txl_tf.learning.schedule import default_warmup_steps
    config = TransformerXLConfig.preset("small", cutoffs=[2000, 6000], div_val=2,
                                        n_token=n_token)
    steps = o["train_steps"]
    job = {"ids": ids_path, "seed": seed, "batch_size": 16, "train_steps": steps,
           "learning_rate": o["learning_rate"] or 2.5e-4, "clip": 0.25,
           "warmup_steps": default_warmup_steps(steps) if warmup == "default" else int(warmup),
           "threads": o["reference_threads"], "eval_batch_size": 10, "eval_mem_lens": [64, 0],
           **{k: getattr(config, k) for k in ("n_token", "n_layer", "n_head", "d_model",
                                               "d_head", "d_inner", "dropout", "dropatt",
                                               "div_val", "cutoffs", "tie_projs", "tgt_len",
                                               "mem_len")}}
    os.makedirs(run_dir, exist_ok=True)
    job_path = os.path.join(run_dir, "job.json")
    with open(job_path, "w", encoding="utf-8") as f:
        json.dump(job, f, indent=2)
    worker = os.path.join(REPO, "benchmarks", "paper_quality_worker.py")
    start = time.time()
    with open(os.path.join(run_dir, "job.log"), "w", encoding="utf-8") as log:
        done = subprocess.run([o["reference_python"], worker, os.path.abspath(o["reference_dir"]),
                               job_path], stdout=subprocess.PIPE, stderr=log, text=True)
    if done.returncode:
        raise TrainingError(f"the paper's code failed (exit {done.returncode}); see "
                            f"{os.path.join(run_dir, 'job.log')}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ppl = result["ppl"]
    return {"seed": seed, "precision": "paper (PyTorch)", "warmup": warmup,
            "onednn_isa": "", "ppl_mem64": ppl["64"], "ppl_mem0": ppl["0"],
            "memory_gain": ppl["0"] / ppl["64"], "train_seconds": time.time() - start,
            "torch": result["torch"]}


def summarize(runs):
    """One row per (precision, warm-up) arm."""
    arms = {}
    for r in runs:
        arms.setdefault((r["precision"], r["warmup"]), []).append(r)
    rows = []
    for (precision, warmup), group in arms.items():
        ppl = [r["ppl_mem64"] for r in group]
        rows.append({"precision": precision, "warmup": warmup,
                     "seeds": [r["seed"] for r in group], "ppl_mem64": ppl,
                     "median": statistics.median(ppl), "max_over_min": max(ppl) / min(ppl),
                     "min_memory_gain": min(r["memory_gain"] for r in group)})
    return rows


def table(rows):
    lines = ["| precision | warm-up | held-out ppl at memory 64, by seed | median | max/min "
             "| smallest memory 0 / memory 64 |", "|---|---|---|---|---|---|"]
    for r in rows:
        by_seed = " / ".join(f"{p:.1f}" for p in r["ppl_mem64"])
        lines.append(f"| {r['precision']} | {r['warmup']} | {by_seed} | {r['median']:.1f} "
                     f"| {r['max_over_min']:.3f} | {r['min_memory_gain']:.3f} |")
    return "\n".join(lines)


def run(o):
    if not os.path.isfile(o["text"]):
        raise TrainingError(f"--text: {o['text']} not found")
    seeds = parse_seeds(o["seeds"])
    precisions = [p.strip() for p in o["precisions"].split(",") if p.strip()]
    warmups = [w.strip() for w in o["warmups"].split(",") if w.strip()]
    for w in warmups:
        if w != "default" and not w.isdigit():
            raise TrainingError(f"--warmups takes 'default' or step counts, got {w!r}")
    work = o["work_dir"] or tempfile.mkdtemp(prefix="txl_quality_")
    data_dir = os.path.join(work, "data")
    lines = split_text(o["text"], data_dir, o["heldout_fraction"], o["valid_lines"])
    print(f"text {o['text']}: {lines['train']} training lines, {lines['test']} held out; "
          f"runs in {work}", flush=True)
    arms = list(precisions)
    if o["reference_dir"]:
        if not o["reference_python"]:
            raise TrainingError("--reference_dir needs --reference_python (an interpreter "
                                "with torch and numpy)")
        ids_path = os.path.join(work, "reference_ids.npz")
        n_token = reference_ids(data_dir, os.path.join(work, "reference_cache"), ids_path)
        arms.append("paper")
    env = thread_env(o["threads"])

    def task(precision, warmup, seed):
        run_dir = os.path.join(work, f"{precision}_warmup-{warmup}_seed{seed}")
        if precision == "paper":
            return reference_run(o, ids_path, n_token, run_dir, seed, warmup)
        return one_run(o, data_dir, run_dir, seed, precision, warmup, env=env)

    runs = []

    def record(result):
        runs.append(result)
        print(f"{result['precision']} warm-up {result['warmup']} seed {result['seed']}: "
              f"held-out ppl {result['ppl_mem64']:.1f} at memory 64, {result['ppl_mem0']:.1f} "
              f"at memory 0 ({result['train_seconds']:.0f}s)", flush=True)
        _write(o["output"], o, runs)

    run_all([functools.partial(task, p, w, s) for w in warmups for p in arms for s in seeds],
            o["parallel"], record)
    runs.sort(key=lambda r: (str(r["warmup"]), r["precision"], r["seed"]))
    _write(o["output"], o, runs)
    print(table(summarize(runs)), flush=True)


def _write(path, o, runs):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"settings": o, "recipe": RECIPE, "runs": runs, "arms": summarize(runs)},
                  f, indent=2)


def main(argv):
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
