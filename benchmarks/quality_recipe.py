"""The quality recipe shared by `bench_quality.py` and `search_defaults.py`
(no flags of its own): the text's split, one training job scored at memory
64 and 0, and jobs run side by side."""
import concurrent.futures
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from training.errors import TrainingError  # noqa: E402

RECIPE = ("--preset=small", "--config_override=cutoffs=[2000,6000]",
          "--config_override=div_val=2", "--batch_size=16", "--checkpoint_every=500",
          "--final_eval=false", "--verbose=0")


def split_text(path, folder, heldout_fraction, valid_lines, selection_fraction=0.0):
    """Writes `train.txt`, `valid.txt`, `test.txt` (the held-out lines) into
    `folder`; returns the line counts.

    With `selection_fraction` > 0 the validation split is the lines just before
    the held-out part, taken out of training (for choosing settings);
    otherwise it is the first `valid_lines` lines of the training text."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    cut = len(lines) - int(len(lines) * heldout_fraction)
    train_end = cut - int(len(lines) * selection_fraction)
    if cut == len(lines) or train_end <= valid_lines or (selection_fraction and train_end == cut):
        raise TrainingError(f"--text {path}: {len(lines)} lines are too few for "
                            f"a validation split and a held-out part")
    valid = lines[train_end:cut] if selection_fraction else lines[:valid_lines]
    parts = {"train": lines[:train_end], "valid": valid, "test": lines[cut:]}
    os.makedirs(folder, exist_ok=True)
    for name, part in parts.items():
        with open(os.path.join(folder, f"{name}.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(part) + "\n")
    return {name: len(part) for name, part in parts.items()}


def _job(module, flags, log_path, env=None):
    command = [sys.executable, "-m", module, *flags]
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        done = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              env=None if env is None else {**os.environ, **env})
    if done.returncode:
        raise TrainingError(f"{module} failed (exit {done.returncode}); see {log_path}")


def one_run(o, data_dir, run_dir, seed, precision, warmup, extra_flags=(), splits=("test",),
            env=None):
    """Trains one model and scores `splits` (the held-out one: `test`) at
    memory 64 and 0; `extra_flags` go to the training job after the recipe's."""
    flags = [*RECIPE, "--dataset=wt2", f"--data_dir={data_dir}", f"--model_dir={run_dir}",
             f"--cache_dir={os.path.join(run_dir, 'cache')}", f"--seed={seed}",
             f"--train_steps={o['train_steps']}", f"--mixed_precision={precision}"]
    if o["learning_rate"]:
        flags.append(f"--learning_rate={o['learning_rate']}")
    if warmup != "default":
        flags.append(f"--warmup_steps={int(warmup)}")
    flags.extend(extra_flags)
    log_path = os.path.join(run_dir, "job.log")
    os.makedirs(run_dir, exist_ok=True)
    start = time.time()
    _job("training.train", flags, log_path, env)
    seconds = time.time() - start
    ppl = {}
    for split in splits:
        for mem_len in (64, 0):
            out = os.path.join(run_dir, f"{split}_mem{mem_len}.json")
            _job("training.evaluate", [f"--model_dir={run_dir}", "--dataset=wt2",
                                       f"--data_dir={data_dir}", f"--split={split}",
                                       f"--cache_dir={os.path.join(run_dir, 'cache')}",
                                       f"--mem_len={mem_len}", f"--output={out}",
                                       "--progress=false"], log_path, env)
            with open(out, encoding="utf-8") as f:
                ppl[split, mem_len] = json.load(f)["ppl"]
    result = {"seed": seed, "precision": precision, "warmup": warmup,
              "onednn_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
              "ppl_mem64": ppl["test", 64], "ppl_mem0": ppl["test", 0],
              "memory_gain": ppl["test", 0] / ppl["test", 64], "train_seconds": seconds}
    if "valid" in splits:
        result.update(valid_ppl_mem64=ppl["valid", 64], valid_ppl_mem0=ppl["valid", 0])
    return result


def parse_seeds(text):
    """The seeds of a `--seeds` value ("0,1,2")."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise TrainingError(f"--seeds must be comma-separated integers, got {text!r}") from None


def thread_env(threads):
    """Environment of a job limited to `threads` TensorFlow/oneDNN threads
    (None for 0: the defaults)."""
    if not threads:
        return None
    return {"TF_NUM_INTRAOP_THREADS": str(threads), "TF_NUM_INTEROP_THREADS": "1",
            "OMP_NUM_THREADS": str(threads)}


def run_all(tasks, parallel, on_result):
    """Calls each of `tasks` (no-argument functions), `parallel` at once, and
    `on_result` with each result as it comes (in the calling thread)."""
    with concurrent.futures.ThreadPoolExecutor(max(1, parallel)) as pool:
        for future in concurrent.futures.as_completed([pool.submit(t) for t in tasks]):
            on_result(future.result())
