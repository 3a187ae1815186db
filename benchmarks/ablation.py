r"""The paper's ablation (its Table 6) and relative effective context length
(its Table 8) at this machine's scale: one group of models of about equal
size, trained on the same text for the same steps, then scored together.

    python -m benchmarks.ablation [--runs_dir=runs/ablation] [--train_steps=1500]

The group, each trained by the library's own job on this Python's standard
library (`pystdlib`, bytes; the `small` preset's size, batch 16, segments of
64, seed 0):

    xl         Transformer-XL: relative encoding (attn_type 0), memory 64
    xl_norec   the same without recurrence (trained with mem_len 0)
    shaw       Shaw et al.'s learnable relative encoding (attn_type 1), memory 64
    vanilla    absolute sinusoids (attn_type 2), no memory: a vanilla Transformer
    lstm       a 2-layer LSTM carrying its state (training.train_lstm)

A model whose `export/` exists is not trained again. Then each model's bits
per byte on the valid split at attention lengths 64 + memory (the segment,
and the memory it reads), and the group's RECL (`training.recl`) for the
ratios 0.1, 0.5 and 1.0. Writes `--output` (JSON) and the gain curves beside
it (`ablation_recl.png`).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
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


def train(name, run_dir, o):
    """Trains one model of the group with its job (in a child process)."""
    job, extra = GROUP[name]
    command = [sys.executable, "-m", job, f"--model_dir={run_dir}", "--dataset=pystdlib",
               f"--batch_size={o['batch_size']}", f"--train_steps={o['train_steps']}",
               "--nofinal_eval", "--seed=0", "--log_every=100"] + extra
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


def main(argv):
    del argv
    o = values(SPEC)
    names = [n.strip() for n in o["models"].split(",") if n.strip()]
    unknown = [n for n in names if n not in GROUP]
    if unknown:
        raise TxlError(f"--models: unknown {unknown}; the group is {', '.join(GROUP)}")
    mem_lens = integer_list(o["mem_lens"], "mem_lens", 0, "memory lengths >= 0")
    cli.quiet_tensorflow_import()
    from training import recl

    runs = {name: os.path.join(o["runs_dir"], name) for name in names}
    trained = {}
    for name, run_dir in runs.items():
        if not os.path.isdir(os.path.join(run_dir, "export")):
            trained[name] = train(name, run_dir, o)
    results = {"models": {}, "train_steps": o["train_steps"], "batch_size": o["batch_size"],
               "tgt_len": 64, "dataset": "pystdlib", "eval_segments": o["eval_segments"],
               "train_seconds_this_run": trained}
    for name, run_dir in runs.items():
        print(f"scoring {name}", flush=True)
        results["models"][name] = {"parameters": parameters(run_dir),
                                   "valid_bpc": scores(name, run_dir, o, mem_lens)}
    with tempfile.TemporaryDirectory() as recl_dir:
        results["recl"] = recl.run(model_dir=[f"{n}={d}" for n, d in runs.items()],
                                   dataset="pystdlib", max_context=o["max_context"],
                                   first_context=o["first_context"],
                                   context_step=o["context_step"], positions=o["positions"],
                                   output_dir=recl_dir, progress=False)
        picture = os.path.splitext(o["output"])[0] + "_recl.png"
        if os.path.exists(os.path.join(recl_dir, "recl.png")):
            shutil.copyfile(os.path.join(recl_dir, "recl.png"), picture)
    print(recl.describe(results["recl"]))
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {o['output']} and {picture}")

if __name__ == "__main__":
    cli.run(main, SPEC)
