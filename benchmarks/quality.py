r"""Training quality: does training land in the same place every run, and why.
One suite in parts (`--part`); every part prints a table and writes JSON:

    python -m benchmarks.quality [--part=seeds] [--seeds=0,1,2,3,4] [--precisions=none,auto] \
        [--warmups=default,0] [--text=../shared/data/wikitext2.valid.txt] \
        [--job_flags=--jit_compile]
    python -m benchmarks.quality --part=search [--settings=a,b] [--seeds=0] [--parallel=2]
    python -m benchmarks.quality --part=memory_use --model_dirs=RUN[,RUN...] --dataset=wt2 \
        --data_dir=DIR [--split=test] [--mem_lens=0,64,128,256]
    python -m benchmarks.quality --part=warmup [--steps=100]

- `seeds` (default): held-out perplexity of the quality recipe over seeds,
  precisions and warm-ups, optionally beside the paper's code (`run_seeds`);
- `search`: the recipe with one change per setting, chosen on a validation
  split and reported on a held-out one (`run_search`);
- `memory_use`: a trained model's loss by position in a segment, by memory
  length: how far back its context helps (`run_memory_use`);
- `warmup`: which weights move how far in the first steps, with and without
  the warm-up (`run_warmup`).

The recipe (`RECIPE`, `split_text`, `one_run`): the `small` preset with an
adaptive softmax (cutoffs 2000/6000, div_val 2), word level, batch 16, one
training job per run in its own process, scored at memory 64 and 0.
"""
import concurrent.futures
import functools
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import integer_list, run_part, suite_spec  # noqa: E402
from training.errors import TrainingError  # noqa: E402
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402


# ---------------------------------------------------------------- the recipe
RECIPE = ("--preset=small", "--config_override=cutoffs=[2000,6000]",
          "--config_override=div_val=2", "--batch_size=16", "--checkpoint_every=500",
          "--final_eval=false", "--verbose=0")


def split_text(path, folder, heldout_fraction, valid_lines, selection_fraction=0.0):
    """Writes `train.txt`, `valid.txt`, `test.txt` (the held-out lines) into
    `folder`; returns the line counts.

    With `selection_fraction` > 0 the validation split is the lines just before
    the held-out part, taken out of training (for choosing settings);
    otherwise it is the first `valid_lines` lines of the training text."""
    if not 0 < heldout_fraction < 1:  # NaN too
        raise TrainingError(f"--heldout_fraction must be in (0, 1), got {heldout_fraction}")
    if not 0 <= selection_fraction < 1:
        raise TrainingError(f"--selection_fraction must be in [0, 1), got {selection_fraction}")
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


def parse_job_flags(text):
    """The flags of a `--job_flags` value, split as a shell would."""
    try:
        return shlex.split(text)
    except ValueError as e:
        raise TrainingError(f"--job_flags {text!r}: {e}") from None


def parse_warmups(text):
    """The arms of a `--warmups` value ("default,0"): 'default' or a step
    count in ASCII digits (`str.isdigit` also takes "²", which `int()` refuses)."""
    warmups = [w.strip() for w in text.split(",") if w.strip()]
    for w in warmups:
        if w != "default" and not (w.isascii() and w.isdigit()):
            raise TrainingError(f"--warmups takes 'default' or step counts, got {w!r}")
    return warmups


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


# --------------------------------------------------------------------- seeds
SEEDS_SPEC = (
    option("string", "text", os.path.join(REPO, "..", "shared", "data", "wikitext2.valid.txt"),
           "A word-level text file (one sentence or paragraph a line)."),
    option("string", "seeds", "0,1,2,3,4", "Comma-separated seeds."),
    option("string", "precisions", "none,auto", "Values of the training job's --mixed_precision "
           "(none: float32)."),
    option("string", "warmups", "default,0", "Warm-up arms: 'default' (no --warmup_steps flag) or "
           "a number of steps."),
    option("integer", "train_steps", 1500, "Training steps per run."),
    option("float", "learning_rate", 1e-3, "Peak learning rate (0: the job's default)."),
    option("string", "job_flags", "", "Flags added to each of this library's training jobs, "
           "as a shell would split them (e.g. '--jit_compile')."),
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
    worker = os.path.join(REPO, "benchmarks", "pytorch_parity.py")  # its torch stages
    start = time.time()
    with open(os.path.join(run_dir, "job.log"), "w", encoding="utf-8") as log:
        done = subprocess.run([o["reference_python"], worker, "quality_stage",
                               os.path.abspath(o["reference_dir"]), job_path],
                              stdout=subprocess.PIPE, stderr=log, text=True)
    if done.returncode:
        raise TrainingError(f"the paper's code failed (exit {done.returncode}); see "
                            f"{os.path.join(run_dir, 'job.log')}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ppl = result["ppl"]
    return {"seed": seed, "precision": "paper (PyTorch)", "warmup": warmup,
            "onednn_isa": "", "ppl_mem64": ppl["64"], "ppl_mem0": ppl["0"],
            "memory_gain": ppl["0"] / ppl["64"], "train_seconds": time.time() - start,
            "torch": result["torch"]}


def summarize_arms(runs):
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


def arms_table(rows):
    lines = ["| precision | warm-up | held-out ppl at memory 64, by seed | median | max/min "
             "| smallest memory 0 / memory 64 |", "|---|---|---|---|---|---|"]
    for r in rows:
        by_seed = " / ".join(f"{p:.1f}" for p in r["ppl_mem64"])
        lines.append(f"| {r['precision']} | {r['warmup']} | {by_seed} | {r['median']:.1f} "
                     f"| {r['max_over_min']:.3f} | {r['min_memory_gain']:.3f} |")
    return "\n".join(lines)


def run_seeds(o):
    r"""`--part=seeds`: does training land in the same place every run? Held-out
    perplexity over seeds.

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
    reproduces an AVX2 machine's round-off; `--job_flags` adds flags to every
    training job of this library (`--jit_compile`: the step under XLA). Prints
    a table per arm (median, max/min, memory gain) and writes every run to
    `--output` as JSON.

    `--reference_dir` (the `pytorch/` folder of kimiyoung/transformer-xl) with
    `--reference_python` (an interpreter with torch and numpy) adds the paper's
    code as an arm on the same recipe, text, token ids, seeds and warm-ups
    (`quality_stage` of `pytorch_parity.py`; `--precisions=` with nothing runs that arm
    alone).
    """
    if not os.path.isfile(o["text"]):
        raise TrainingError(f"--text: {o['text']} not found")
    seeds = parse_seeds(o["seeds"])
    precisions = [p.strip() for p in o["precisions"].split(",") if p.strip()]
    warmups = parse_warmups(o["warmups"])
    job_flags = parse_job_flags(o["job_flags"])
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
        return one_run(o, data_dir, run_dir, seed, precision, warmup,
                       extra_flags=job_flags, env=env)

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
    print(arms_table(summarize_arms(runs)), flush=True)


def _write(path, o, runs):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"settings": o, "recipe": RECIPE, "runs": runs, "arms": summarize_arms(runs)},
                  f, indent=2)


# -------------------------------------------------------------------- search
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

SEARCH_SPEC = (
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


def summarize_settings(runs):
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


def settings_table(rows):
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


def run_search(o):
    r"""`--part=search`: a small search for the small-model training defaults, chosen on a
    validation split and reported on a held-out one.

    The recipe is `--part=seeds`'s (small preset, adaptive softmax, 1,500
    steps of batch 16 at 1e-3 with the default warm-up) on WikiText-2 text,
    split in three: the last 10% of the lines held out (reported, never used to
    choose), the 10% before it the validation split (chooses; not trained on),
    the rest trained on. Each setting changes a few training flags (`SETTINGS`).
    `--parallel` runs that many jobs at once, each on `--threads` TensorFlow
    threads (2 x 1 thread uses a 2-core machine better than 1 x 2 at this size).
    Prints a table (median validation and held-out ppl at memory 64, memory
    gain, ratio to the baseline's median) and writes every run to JSON.
    """
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
            json.dump({"settings": o, "runs": runs, "rows": summarize_settings(runs)}, f,
                      indent=2)

    run_all([functools.partial(one, n, s) for n, s in todo], o["parallel"], record)
    print(settings_table(summarize_settings(runs)), flush=True)


# ---------------------------------------------------------------- memory_use
MEMORY_USE_SPEC = (
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


def score_by_position(o, model_dir, mem_len):
    """`training.evaluate`'s result for one model at one memory length."""
    from training import evaluate
    return evaluate.run(model_dir=model_dir, dataset=o["dataset"], data_dir=o["data_dir"],
                        cache_dir=o["cache_dir"], split=o["split"], mem_len=mem_len,
                        batch_size=o["batch_size"], by_position=True, progress=False)


def position_table(results, mem_lens):
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


def run_memory_use(o):
    r"""`--part=memory_use`: how far back does a trained model's context help? Loss by
    position, by memory length.

    Scores each model on a split (`training.evaluate --by_position`) at every
    memory length and prints, per memory length, the perplexity (the mean over
    the models) and the mean loss at positions 0, 1, 2-3, 4-7, ... of a segment:
    a position p sees p earlier ids of its segment plus the memory. Where the
    loss without memory equals the loss with it from some position on, the
    model uses no context beyond that distance, and the memory's whole gain
    comes from the segment's first positions. Writes every model's numbers to
    `--output` as JSON. The runs of `--part=seeds --work_dir=DIR` are model
    directories (`DIR/<arm>_seed<N>`, its data in `DIR/data`, dataset `wt2`).
    """
    if not o["model_dirs"]:
        raise TrainingError("--model_dirs is required")
    model_dirs = [d.strip() for d in o["model_dirs"].split(",") if d.strip()]
    mem_lens = integer_list(o["mem_lens"], "mem_lens", 0, "comma-separated integers >= 0")
    results = {}
    for model_dir in model_dirs:
        results[model_dir] = {str(m): score_by_position(o, model_dir, m) for m in mem_lens}
        print(f"{model_dir}: " + ", ".join(f"ppl {r['ppl']:.1f} at memory {m}"
                                           for m, r in results[model_dir].items()), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"settings": o, "results": results}, f, indent=2)
    print(f"loss (nats) by position in the segment, {o['split']} split, mean over "
          f"{len(model_dirs)} model(s):")
    print(position_table(results, mem_lens), flush=True)
    return results


# -------------------------------------------------------------------- warmup
WARMUP_SPEC = (
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


def run_warmup(o):
    r"""`--part=warmup`: why the warm-up: which weights move how far in the first
    steps, with and without it.

    The quality recipe's model (`small`, adaptive softmax cutoffs 2000/6000,
    div_val 2, batch 16, Adam at 1e-3, clip 0.25) on WikiText-2 text, the same
    seed and batches with the training job's default warm-up (a tenth of 1,500
    steps) and without. For each group of weights it records the relative change
    `|w_t - w_0| / |w_0|` after `--steps` steps and the training loss; prints a
    table and writes JSON.
    """
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


PARTS = {"seeds": (SEEDS_SPEC, run_seeds),
         "search": (SEARCH_SPEC, run_search),
         "memory_use": (MEMORY_USE_SPEC, run_memory_use),
         "warmup": (WARMUP_SPEC, run_warmup)}
SPEC = suite_spec({name: spec for name, (spec, _) in PARTS.items()})


def main(argv):
    run_part(PARTS, values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
