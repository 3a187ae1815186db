r"""The paper's ablation (its Table 6) and relative effective context length
(its Table 8) at this machine's scale: one group of models of about equal
size, trained on the same text for the same steps, then scored together.

    python -m benchmarks.ablation [--runs_dir=runs/ablation] [--seeds=0,1,2]

The group, each trained by the library's own job on this Python's standard
library (`pystdlib`, bytes; the `small` preset's size, batch 16, segments of
64), once per seed:

    xl         Transformer-XL: relative encoding (attn_type 0), memory 64
    xl_norec   the same without recurrence (trained with mem_len 0)
    shaw       Shaw et al.'s learnable relative encoding (attn_type 1), memory 64
    vanilla    absolute sinusoids (attn_type 2), no memory: a vanilla Transformer
    lstm       a 2-layer LSTM carrying its state (training.train_lstm)

A seed's models live in `runs_dir/seed<S>/<model>`; one whose `export/`
exists is not trained again. Then each model's bits per byte on the valid
split at attention lengths 64 + memory (the segment, and the memory it
reads), and the seed's group RECL (`training.recl`, the same sampled target
tokens for every seed) for the ratios 0.1, 0.5 and 1.0. A seed's results are
kept in `runs_dir/seed<S>/scores.json` and read back on the next run, so
seeds can be trained in separate processes (`--seeds=1` and `--seeds=2`
side by side) and summed up by one more run over all of them. Writes
`--output` (JSON: every seed, and the median, min and max over seeds per
model and attention length) and the first seed's gain curves beside it
(`ablation_recl.png`).
"""
import json
import os
import statistics
import shutil
import subprocess
import sys
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import integer_list  # noqa: E402
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from txl_tf.errors import TxlError  # noqa: E402

# name -> (training job, its flags beyond the shared ones)
GROUP = {
    "xl": ("training.train", []),
    "xl_norec": ("training.train", ["--mem_len=0"]),
    "shaw": ("training.train", ["--config_override=attn_type=1"]),
    "vanilla": ("training.train", ["--config_override=attn_type=2", "--mem_len=0"]),
    "lstm": ("training.train_lstm", []),
}

SPEC = (
    option("string", "runs_dir", os.path.join(REPO, "runs", "ablation"),
           "Where the group's model directories are (and are trained if missing)."),
    option("string", "models", ",".join(GROUP), "Comma-separated models of the group."),
    option("string", "seeds", "0,1,2", "Comma-separated training seeds; each trains the group."),
    option("integer", "train_steps", 1500, "Training steps of every model."),
    option("integer", "batch_size", 16, "Training streams of every model."),
    option("string", "mem_lens", "0,64,192", "Evaluation memory lengths (attention "
           "length = 64 + memory); the LSTM is scored with its state reset each "
           "segment (0) and carried."),
    option("integer", "eval_segments", 100, "Valid segments scored per setting (x batch 8 x 64)."),
    option("integer", "max_context", 320, "RECL: the longest context c."),
    option("integer", "first_context", 32, "RECL: the first context c."),
    option("integer", "context_step", 32, "RECL: how much c grows (the paper's delta)."),
    option("integer", "positions", 200, "RECL: target tokens sampled."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "ablation.json"),
           "Where to write the JSON results."),
)


def train(name, run_dir, seed, o):
    """Trains one model of the group with its job (in a child process)."""
    job, extra = GROUP[name]
    command = [sys.executable, "-m", job, f"--model_dir={run_dir}", "--dataset=pystdlib",
               f"--batch_size={o['batch_size']}", f"--train_steps={o['train_steps']}",
               "--nofinal_eval", f"--seed={seed}", "--log_every=100"] + extra
    if job == "training.train":
        command += ["--preset=small", "--strategy=one_device", "--verbose=0",
                    "--checkpoint_every=500"]
    print(f"training {name}: {' '.join(command[1:])}", flush=True)
    start = time.time()
    subprocess.run(command, check=True, cwd=REPO)
    return time.time() - start


def scores(name, run_dir, o, mem_lens):
    """bpc on the valid split at each memory length (the LSTM: reset, carried)."""
    from training import evaluate
    settings = [0, 1] if GROUP[name][0] == "training.train_lstm" else mem_lens
    result = {}
    for mem_len in settings:
        r = evaluate.run(model_dir=run_dir, dataset="pystdlib", split="valid", tgt_len=64,
                         mem_len=mem_len, batch_size=8, max_segments=o["eval_segments"],
                         progress=False)
        label = ("carried" if mem_len else "reset") if name == "lstm" else str(64 + mem_len)
        result[label] = {"bpc": r["bpc"], "tokens": r["tokens"]}
        print(f"  {name} attention {label}: {r['bpc']:.4f} bpc", flush=True)
    return result


def parameters(run_dir):
    """Trainable parameters of a trained model of the group."""
    from txl_tf.baselines import load_lstm, lstm_folder
    from training.evaluate import load_core
    folder = lstm_folder(run_dir)
    model = load_lstm(folder) if folder else load_core(run_dir)[0]
    return int(sum(v.numpy().size for v in model.trainable_weights))


def one_seed(seed, names, mem_lens, o):
    """The group of one seed: trained where missing, scored, its RECL; cached
    in `runs_dir/seed<S>/scores.json`. Returns the seed's results dict."""
    from training import recl
    seed_dir = os.path.join(o["runs_dir"], f"seed{seed}")
    cached = os.path.join(seed_dir, "scores.json")
    if os.path.exists(cached):
        with open(cached, encoding="utf-8") as f:
            kept = json.load(f)
        if set(names) <= set(kept["models"]) and kept["train_steps"] == o["train_steps"]:
            print(f"seed {seed}: scores read from {cached}", flush=True)
            return kept
    runs = {name: os.path.join(seed_dir, name) for name in names}
    trained = {}
    for name, run_dir in runs.items():
        if not os.path.isdir(os.path.join(run_dir, "export")):
            trained[name] = train(name, run_dir, seed, o)
    results = {"seed": seed, "models": {}, "train_steps": o["train_steps"],
               "train_seconds_this_run": trained}
    for name, run_dir in runs.items():
        print(f"seed {seed}: scoring {name}", flush=True)
        results["models"][name] = {"parameters": parameters(run_dir),
                                   "valid_bpc": scores(name, run_dir, o, mem_lens)}
    recl_dir = os.path.join(seed_dir, "recl")
    results["recl"] = recl.run(model_dir=[f"{n}={d}" for n, d in runs.items()],
                               dataset="pystdlib", max_context=o["max_context"],
                               first_context=o["first_context"],
                               context_step=o["context_step"], positions=o["positions"],
                               output_dir=recl_dir, progress=False)
    print(recl.describe(results["recl"]), flush=True)
    with open(cached, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    return results


def spread(per_seed, names):
    """Median, min and max over seeds of every model's bpc at every attention
    length, and of its RECL at every ratio."""
    summary = {}
    for name in names:
        labels = per_seed[0]["models"][name]["valid_bpc"]
        bpc = {label: [r["models"][name]["valid_bpc"][label]["bpc"] for r in per_seed]
               for label in labels}
        ratios = per_seed[0]["recl"]["recl"]
        recl_lengths = {ratio: [r["recl"]["recl"][ratio][name] for r in per_seed]
                        for ratio in ratios}
        summary[name] = {
            "bpc": {label: {"median": statistics.median(v), "min": min(v), "max": max(v),
                            "per_seed": v} for label, v in bpc.items()},
            "recl": {ratio: {"median": statistics.median(v), "min": min(v), "max": max(v),
                             "per_seed": v} for ratio, v in recl_lengths.items()}}
    return summary


def describe(summary, seeds):
    """The table: bpc median [min, max] per model and attention length."""
    lines = [f"seeds {', '.join(map(str, seeds))}: bpc median [min, max]; RECL per seed"]
    for name, entry in summary.items():
        cells = [f"{label}: {v['median']:.3f} [{v['min']:.3f}, {v['max']:.3f}]"
                 for label, v in entry["bpc"].items()]
        recls = [f"r={ratio}: {'/'.join(map(str, v['per_seed']))}"
                 for ratio, v in entry["recl"].items()]
        lines.append(f"{name:>9} | " + " | ".join(cells) + " | RECL " + ", ".join(recls))
    return "\n".join(lines)


def main(argv):
    del argv
    o = values(SPEC)
    names = [n.strip() for n in o["models"].split(",") if n.strip()]
    unknown = [n for n in names if n not in GROUP]
    if unknown:
        raise TxlError(f"--models: unknown {unknown}; the group is {', '.join(GROUP)}")
    mem_lens = integer_list(o["mem_lens"], "mem_lens", 0, "memory lengths >= 0")
    seeds = integer_list(o["seeds"], "seeds", 0, "seeds >= 0")
    cli.quiet_tensorflow_import()

    per_seed = [one_seed(seed, names, mem_lens, o) for seed in seeds]
    summary = spread(per_seed, names)
    results = {"models": names, "seeds": seeds, "train_steps": o["train_steps"],
               "batch_size": o["batch_size"], "tgt_len": 64, "dataset": "pystdlib",
               "eval_segments": o["eval_segments"], "summary": summary,
               "per_seed": per_seed}
    print(describe(summary, seeds))
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    picture = os.path.splitext(o["output"])[0] + "_recl.png"
    first_png = os.path.join(o["runs_dir"], f"seed{seeds[0]}", "recl", "recl.png")
    if os.path.exists(first_png):
        shutil.copyfile(first_png, picture)
    print(f"wrote {o['output']}")


if __name__ == "__main__":
    cli.run(main, SPEC)
