r"""What the memory is worth: in bits per character on real text, in how far
back a classifier can read, and in telling corpora apart. One suite in parts
(`--part`); every part prints a table and writes JSON:

    python -m benchmarks.memory_worth [--part=shakespeare] [--budget_s=480] [--seeds=0,1,2]
    python -m benchmarks.memory_worth --part=reach [--seeds=0,1] [--steps=1000]
    python -m benchmarks.memory_worth --part=corpus_id [--pretrain_s=720] [--finetune_s=240] \
        [--n_words=48]

- `shakespeare` (default): a small Transformer-XL trained on Tiny
  Shakespeare in a fixed CPU budget, once per seed, scored at three
  memories: median and range over the seeds (`run_shakespeare`);
- `reach`: a label only the first of several segments decides, learned with
  the paper's gradient cut, with the gradient through the whole document,
  or with a longer memory (`run_reach`);
- `corpus_id`: which corpus a passage is from, a pretrained byte-level
  backbone fine-tuned with and without memory (`run_corpus_id`).
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import peak_rss_bytes, run_part, suite_spec  # noqa: E402
from training.errors import TrainingError  # noqa: E402
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402


# --------------------------------------------------------------- shakespeare
SHAKESPEARE_SPEC = (
    option("string", "data", os.path.join(REPO, "..", "shared", "data", "tinyshakespeare.txt"),
           "Tiny Shakespeare text file."),
    option("float", "budget_s", 480, "Training time budget in seconds, per seed."),
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
    option("string", "seeds", "0,1,2", "Comma-separated training seeds: one model each; the "
           "table is each memory's median bpc and its range over them."),
    option("string", "model_dir", None, "Training folder (default: a temporary one); a seed's "
           "model trains in its seed<S> folder."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "shakespeare.json"),
           "Where to write the JSON results."),
)


def shakespeare_seeds(text):
    """The `--seeds` flag's seeds (at least one, no repeats), or `TrainingError`."""
    from training.train import check_seed
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or len(set(seeds)) != len(seeds):
        raise TrainingError(f"--seeds takes distinct integers, got {text!r}")
    for seed in seeds:
        check_seed(seed)
    return seeds


def over_seeds(runs):
    """Each memory's bpc over the seeds' runs: `[{"mem_len", "bpc" (the median),
    "bpc_min", "bpc_max", "bpc_by_seed"}]`, in the runs' order of memories."""
    rows = []
    for k, first in enumerate(runs[0]["validation"]):
        values = [run["validation"][k]["bpc"] for run in runs]
        rows.append({"mem_len": first["mem_len"], "bpc": statistics.median(values),
                     "bpc_min": min(values), "bpc_max": max(values), "bpc_by_seed": values})
    return rows


def run_shakespeare(o):
    r"""`--part=shakespeare`: how far does a small Transformer-XL get on real text
    in a fixed CPU budget, and what is its memory worth?

    For each seed of `--seeds`, trains a preset (default `small`) on Tiny
    Shakespeare, byte-level, first 90% of the bytes for training and the last
    10% for validation (the char-rnn convention), for `--budget_s` seconds of
    training (the number of steps is set from a short timing probe so that the
    cosine schedule ends with the budget). Then evaluates the whole validation
    split with the memory at the training length, at 3x that, and with mem_len
    0; prints each memory's median bpc over the seeds and its range, and
    writes JSON (every seed's run in `runs`).
    """
    if not 0 < o["budget_s"] < float("inf"):  # NaN too
        raise TrainingError(f"--budget_s must be a finite number of seconds > 0, got "
                            f"{o['budget_s']}")
    if not os.path.isfile(o["data"]):
        raise TrainingError(f"--data: {o['data']} not found (Tiny Shakespeare; the repo "
                            "expects it at ../shared/data/tinyshakespeare.txt)")
    seeds = shakespeare_seeds(o["seeds"])
    model_dir = o["model_dir"] or tempfile.mkdtemp(prefix="txl_shakespeare_")
    runs = [shakespeare_run(o, seed, os.path.join(model_dir, f"seed{seed}")) for seed in seeds]
    first = runs[0]
    report = {"benchmark": "tinyshakespeare byte-level, 90/10 split", "preset": o["preset"],
              "config": first["config"], "mixed_precision": o["mixed_precision"],
              "parameters": first["parameters"], "batch_size": o["batch_size"],
              "tgt_len": first["tgt_len"], "train_mem_len": first["train_mem_len"],
              "learning_rate": o["learning_rate"], "budget_s": o["budget_s"], "seeds": seeds,
              "steps": statistics.median(run["steps"] for run in runs),
              "train_bytes": first["train_bytes"], "valid_bytes": first["valid_bytes"],
              "validation": over_seeds(runs), "runs": runs, "model_dir": model_dir}
    output = o["output"] or os.path.join(model_dir, "shakespeare.json")
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)

    print(f"\nTiny Shakespeare, byte-level: preset {o['preset']} "
          f"({first['parameters']:,} parameters), seeds {o['seeds']}, steps "
          f"{', '.join(str(run['steps']) for run in runs)} x batch {o['batch_size']} x "
          f"{first['tgt_len']} bytes")
    print(f"{'eval mem_len':>12} | {'valid bpc: median':>17} | {'min':>6} | {'max':>6}")
    for row in report["validation"]:
        print(f"{row['mem_len']:>12} | {row['bpc']:>17.4f} | {row['bpc_min']:>6.4f} | "
              f"{row['bpc_max']:>6.4f}")
    print(f"results: {output}", flush=True)
    return report


def shakespeare_run(o, seed, model_dir):
    """One seed's model of `run_shakespeare`, trained in `model_dir`: its
    settings, steps and validation rows (bpc at each memory)."""
    from txl_tf.weights import load_pretrained
    from txl_tf.data import load_corpus
    from training.budget import train_within
    from txl_tf.learning.evaluation import evaluate_ids

    cache = os.path.join(model_dir, "corpus_cache")
    base = dict(preset=o["preset"], dataset="text", data_dir=o["data"], cache_dir=cache,
                batch_size=o["batch_size"], tgt_len=o["tgt_len"], mem_len=o["mem_len"],
                dropout=o["dropout"], learning_rate=o["learning_rate"], strategy="one_device",
                config_override=o["config_override"], mixed_precision=o["mixed_precision"],
                seed=seed)
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
    return {"seed": seed, "config": core.config.to_dict(), "parameters": result["parameters"],
            "tgt_len": tgt, "train_mem_len": mem, "train_seconds": train_seconds,
            "steps": result["step"], "seconds_per_step": per_step,
            "train_tokens": result["step"] * o["batch_size"] * tgt,
            "train_bytes": int(len(corpus.train)), "valid_bytes": int(len(corpus.valid)),
            "train_bpc_last_epoch": last.get("bpc"), "validation": rows}


# --------------------------------------------------------------------- reach
N_CLASSES, MARKER = 3, 253

REACH_SPEC = (
    option("string", "arms", "32:1,32:4,96:1", "Comma-separated mem_len:grad_segments."),
    option("string", "seeds", "0,1", "Comma-separated seeds."),
    option("string", "preset", "small", "Backbone preset (fresh weights)."),
    option("integer", "segment_len", 32, "Bytes per segment."),
    option("integer", "segments", 4, "Segments per document."),
    option("integer", "steps", 1000, "Training steps per arm."),
    option("integer", "batch_size", 32, "Documents per step."),
    option("float", "learning_rate", 1e-3, "Peak learning rate (10% warm-up, cosine decay)."),
    option("integer", "test_documents", 600, "Held-out documents."),
    option("string", "arm", None, "Internal: run one arm (mem_len:grad_segments:seed) and print "
           "its JSON."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "memory_reach.json"),
           "Where to write the JSON results."),
)


def documents(n, segment_len, segments, seed):
    """`({"token_ids", "lengths"}, labels)`: the task of the module doc."""
    import numpy as np
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, MARKER, (n, segment_len * segments)).astype(np.int32)
    labels = rng.integers(0, N_CLASSES, n).astype(np.int32)
    ids[np.arange(n), rng.integers(0, segment_len, n)] = MARKER + labels
    return {"token_ids": ids, "lengths": np.full(n, ids.shape[1], np.int32)}, labels


def run_arm(o, mem_len, grad_segments, seed):
    """Trains and scores one arm in this process; its result dict."""
    import keras
    import numpy as np
    from txl_tf import TransformerXLClassifier, TransformerXLConfig, WarmupCosineDecay
    keras.utils.set_random_seed(seed)
    config = TransformerXLConfig.preset(o["preset"], n_token=256, tgt_len=o["segment_len"],
                                        mem_len=mem_len)
    model = TransformerXLClassifier(config, N_CLASSES, mem_len=mem_len,
                                    grad_segments=grad_segments, dtype="float32")
    model.compile(keras.optimizers.Adam(WarmupCosineDecay(o["learning_rate"], o["steps"])),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    x, y = documents(o["steps"] * o["batch_size"], o["segment_len"], o["segments"], seed)
    start = time.time()
    model.fit(x, y, batch_size=o["batch_size"], epochs=1, verbose=0, shuffle=False)
    seconds = time.time() - start
    tx, ty = documents(o["test_documents"], o["segment_len"], o["segments"], 10_000 + seed)
    predicted = np.argmax(model.predict(tx, batch_size=o["batch_size"], verbose=0), -1)
    return {"mem_len": mem_len, "grad_segments": grad_segments, "seed": seed,
            "accuracy": float(np.mean(predicted == ty)),
            "seconds_per_step": seconds / o["steps"],
            "peak_rss_mib": (peak_rss_bytes() or float("nan")) / 2 ** 20}  # nan: Windows


def _parse(o):
    try:
        arms = [tuple(int(v) for v in a.split(":")) for a in o["arms"].split(",") if a.strip()]
        seeds = [int(s) for s in o["seeds"].split(",") if s.strip()]
    except ValueError:
        raise TrainingError("--arms takes mem_len:grad_segments pairs and --seeds integers, "
                            f"got {o['arms']!r} and {o['seeds']!r}") from None
    if any(len(a) != 2 or a[0] < 0 or a[1] < 1 for a in arms):
        raise TrainingError(f"--arms: each is mem_len >= 0 : grad_segments >= 1, got {o['arms']}")
    return arms, seeds


def run_reach(o):
    r"""`--part=reach`: how far back can a classifier learn to look? Memory length x
    gradient through the memory.

    A 3-class task whose label is decided only by the first segment of a
    document of `--segments` segments of `--segment_len` bytes: one marker id
    (253, 254 or 255: the class) at a random place in the first segment, every
    other id uniform noise over 0..252, so nothing after the first segment tells
    the classes apart. Each arm trains a fresh `--preset` classifier (its own
    process: the peak RSS is the arm's) and reports the held-out accuracy, the
    seconds per training step and the peak memory. Arms (`--arms`):
    `mem_len:grad_segments`, e.g. `32:1` (memory of one segment, the paper's
    gradient cut), `32:4` (gradient through the memory over the whole
    document), `96:1` (the first segment in direct reach of the last).
    Prints a table and writes JSON.
    """
    if o["arm"]:
        mem_len, grad_segments, seed = (int(v) for v in o["arm"].split(":"))
        print(json.dumps(run_arm(o, mem_len, grad_segments, seed)), flush=True)
        return
    arms, seeds = _parse(o)
    flags = [f"--{k}={v}" for k, v in o.items() if k not in ("arm", "arms", "seeds", "output")]
    results = []
    for mem_len, grad_segments in arms:
        for seed in seeds:
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.memory_worth", "--part=reach", *flags,
                 f"--arm={mem_len}:{grad_segments}:{seed}"],
                cwd=REPO, capture_output=True, text=True)
            if done.returncode:
                raise TrainingError(f"arm {mem_len}:{grad_segments} seed {seed} failed: "
                                    f"{done.stderr.strip().splitlines()[-1:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            r = results[-1]
            print(f"mem_len {mem_len}, grad_segments {grad_segments}, seed {seed}: accuracy "
                  f"{r['accuracy']:.3f}, {r['seconds_per_step'] * 1000:.0f} ms/step, peak "
                  f"{r['peak_rss_mib']:,.0f} MiB", flush=True)
    print(reach_table(results, o))
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"settings": o, "results": results}, f, indent=2)


def reach_table(results, o):
    span = o["segment_len"] * o["segments"]
    lines = [f"documents of {o['segments']} segments of {o['segment_len']} bytes ({span}); "
             f"chance {1 / N_CLASSES:.3f}",
             "| mem_len | grad_segments | accuracy by seed | median | ms/step | peak MiB |",
             "|---|---|---|---|---|---|"]
    arms = {}
    for r in results:
        arms.setdefault((r["mem_len"], r["grad_segments"]), []).append(r)
    for (mem_len, k), group in arms.items():
        acc = [r["accuracy"] for r in group]
        lines.append(f"| {mem_len} | {k} | {' / '.join(f'{a:.3f}' for a in acc)} | "
                     f"{statistics.median(acc):.3f} | "
                     f"{statistics.median(r['seconds_per_step'] for r in group) * 1000:.0f} | "
                     f"{max(r['peak_rss_mib'] for r in group):,.0f} |")
    return "\n".join(lines)


# ----------------------------------------------------------------- corpus_id
CORPORA = {  # class name: files in --data_dir, read in this order
    "ptb": ("ptb.valid.txt", "ptb.test.txt"),
    "shakespeare": ("tinyshakespeare.txt",),
    "wikitext2": ("wikitext2.valid.txt",),
}
VARIANTS = (  # name, pretrained backbone, memory
    ("a: pretrained, memory", True, None),
    ("b: from scratch, memory", False, None),
    ("c: pretrained, mem_len 0", True, 0),
)

CORPUS_ID_SPEC = (
    option("string", "data_dir", os.path.join(REPO, "..", "shared", "data"), "Folder with "
           "tinyshakespeare.txt, ptb.valid.txt, ptb.test.txt, wikitext2.valid.txt."),
    option("integer", "n_words", 48, "Words per passage."),
    option("float", "pretrain_s", 720, "Pretraining time budget in seconds."),
    option("string", "preset", "small", "Backbone preset (byte-level)."),
    option("multi_string", "config_override", [], "field=value changes to the preset."),
    option("integer", "pretrain_batch_size", 16, "Pretraining batch (streams)."),
    option("float", "pretrain_learning_rate", 1e-3, "Pretraining peak learning rate."),
    option("integer", "segment_len", 64, "Segment length (pretraining tgt_len and the "
           "classifier's)."),
    option("integer", "mem_len", 64, "Memory length (pretraining and variants a, b)."),
    option("float", "finetune_s", 240, "Fine-tuning budget of variant (a) in seconds; sets the "
           "steps of all three."),
    option("integer", "finetune_steps", 0, "Fine-tuning steps (0: from --finetune_s)."),
    option("integer", "batch_size", 32, "Fine-tuning batch (passages)."),
    option("float", "learning_rate", 5e-4, "Fine-tuning peak learning rate."),
    option("integer", "max_length", 512, "Bytes kept per passage (the start)."),
    option("enum", "mixed_precision", "auto", "As the training job's flag.",
           ["auto", "none", "mixed_float16", "mixed_bfloat16"]),
    option("integer", "seed", 0, "Seed of the passage choice, shuffling and the classifier head / "
           "scratch weights."),
    option("string", "model_dir", None, "Working folder (default: a temporary one)."),
    option("string", "pretrained", None, "Skip pretraining: use this model directory (e.g. "
           "<model_dir>/pretrain/export of an earlier run)."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "corpus_id.json"),
           "Where to write the JSON results."),
)


# -- text ----------------------------------------------------------------------

_CONTRACTION = re.compile(r"\s+(n't|'s|'re|'ve|'ll|'d|'m)\b", re.IGNORECASE)


def normalise(name, text):
    """Words of `text` (one corpus) with format markers removed; see the
    module docstring."""
    lines = text.splitlines()
    if name == "wikitext2":
        lines = [ln for ln in lines if not re.fullmatch(r"\s*=.*=\s*", ln)]
    if name == "shakespeare":
        lines = [ln for ln in lines if not re.fullmatch(r"[A-Za-z][A-Za-z .']*:\s*", ln)]
    text = "\n".join(lines).replace("<unk>", " ")
    text = re.sub(r"@[-,.]@", " ", text)
    if name == "ptb":
        text = re.sub(r"\bN\b", " ", text)  # PTB is lower-case: N is its number token
    text = _CONTRACTION.sub(r"\1", text).lower().replace("'", "").replace("\u2019", "")
    return re.sub(r"[^a-z]+", " ", text).split()


def read_corpora(data_dir):
    """`{name: words}` of the normalised corpora."""
    words = {}
    for name, files in CORPORA.items():
        parts = []
        for file in files:
            path = os.path.join(data_dir, file)
            if not os.path.isfile(path):
                raise TrainingError(f"--data_dir: {path} not found (expected "
                                    f"{', '.join(f for fs in CORPORA.values() for f in fs)})")
            with open(path, encoding="utf-8") as f:
                parts += normalise(name, f.read())
        words[name] = parts
    return words


def split_words(words, train_fraction=0.9):
    cut = int(len(words) * train_fraction)
    return words[:cut], words[cut:]


def interleave(texts, chunk_words=1000):
    """One text from several word lists, taking `chunk_words` from each in turn."""
    out, offsets = [], [0] * len(texts)
    while any(o < len(t) for o, t in zip(offsets, texts)):
        for i, words in enumerate(texts):
            out += words[offsets[i]:offsets[i] + chunk_words]
            offsets[i] += chunk_words
    return " ".join(out)


def balanced_examples(parts, n_words, labels, rng):
    """Examples with as many passages per class as the smallest corpus gives."""
    import numpy as np
    from txl_tf.classification import Examples, corpus_passages
    passages = {name: corpus_passages(" ".join(words), n_words)
                for name, words in parts.items()}
    per_class = min(len(p) for p in passages.values())
    texts, ids, sources = [], [], []
    for name, found in passages.items():
        pick = np.sort(rng.choice(len(found), per_class, replace=False))
        texts += [found[i] for i in pick]
        ids += [labels.id(name)] * per_class
        sources += [f"{name}:passage {i}" for i in pick]
    return Examples(texts, np.array(ids), labels, sources), {
        name: len(p) for name, p in passages.items()}


# -- fine-tuning -----------------------------------------------------------------

class StepTimer:
    """Keras callback keeping each train batch's wall time."""

    def __new__(cls):
        import keras

        class _Timer(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.seconds, self.logs = [], {}

            def on_train_batch_begin(self, batch, logs=None):
                self._start = time.perf_counter()

            def on_train_batch_end(self, batch, logs=None):
                self.seconds.append(time.perf_counter() - self._start)
                self.logs = dict(logs or {})
        return _Timer()


def build_classifier(o, pretrained_dir, use_pretrained, mem_len, labels, steps):
    import keras
    from txl_tf import TransformerXLClassifier
    from txl_tf import weights
    from txl_tf.learning.optimizer import ReplicaClippedAdam
    from txl_tf.learning.schedule import WarmupCosineDecay
    keras.utils.set_random_seed(o["seed"])
    policy = "auto" if o["mixed_precision"] == "auto" else (
        "float32" if o["mixed_precision"] == "none" else o["mixed_precision"])
    kwargs = dict(num_classes=len(labels), segment_len=o["segment_len"], mem_len=mem_len,
                  label_names=labels.names, dtype=policy)
    if use_pretrained:
        model = TransformerXLClassifier.from_model_dir(pretrained_dir, **kwargs)
    else:
        config = weights.load_pretrained(pretrained_dir).config
        model = TransformerXLClassifier(config, **kwargs)
    schedule = WarmupCosineDecay(o["learning_rate"], steps, warmup_steps=max(steps // 10, 1),
                                 min_lr_ratio=0.0)
    model.compile(ReplicaClippedAdam(schedule, global_clipnorm=1.0),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def train_dataset(o, train, tokenizer):
    from txl_tf.classification import classification_dataset
    return classification_dataset(train, tokenizer, o["batch_size"],
                                  max_length=o["max_length"], segment_len=o["segment_len"],
                                  shuffle=True, seed=o["seed"], repeat=True,
                                  drop_remainder=True, bucket=True)


def accuracy(model, examples, tokenizer, o):
    """Accuracy, per-class accuracy and the confusion matrix (rows: truth)."""
    import numpy as np
    from txl_tf.classification import classification_dataset
    ds = classification_dataset(examples.texts, tokenizer, 64, max_length=o["max_length"],
                                segment_len=o["segment_len"])
    logits = np.concatenate([model(batch, training=False).numpy() for batch in ds])
    pred = logits.argmax(-1)
    truth = examples.label_ids
    n = len(examples.labels)
    confusion = np.zeros([n, n], np.int64)
    np.add.at(confusion, (truth, pred), 1)
    per_class = {name: float(confusion[i, i] / confusion[i].sum())
                 for i, name in enumerate(examples.labels.names)}
    return float((pred == truth).mean()), per_class, confusion.tolist()


def probe_steps(o, pretrained_dir, labels, train, tokenizer):
    """Steps of variant (a) that fit in --finetune_s (median of a few timed
    steps after tracing) and the measured seconds per step."""
    import statistics
    model = build_classifier(o, pretrained_dir, True, o["mem_len"], labels, 100)
    timer = StepTimer()
    model.fit(train_dataset(o, train, tokenizer), steps_per_epoch=12, epochs=1,
              verbose=0, shuffle=False, callbacks=[timer])
    per_step = statistics.median(timer.seconds[4:])
    return max(int(o["finetune_s"] * 0.95 / per_step), 10), per_step


def fine_tune(o, name, use_pretrained, mem_len, pretrained_dir, labels, train, test,
              tokenizer, steps):
    model = build_classifier(o, pretrained_dir, use_pretrained, mem_len, labels, steps)
    before, _, _ = accuracy(model, test, tokenizer, o) if use_pretrained else (None, 0, 0)
    timer = StepTimer()
    start = time.time()
    history = model.fit(train_dataset(o, train, tokenizer), steps_per_epoch=steps, epochs=1,
                        verbose=0, shuffle=False, callbacks=[timer])
    seconds = time.time() - start
    acc, per_class, confusion = accuracy(model, test, tokenizer, o)
    row = {"variant": name, "pretrained": use_pretrained, "mem_len": model.mem_len,
           "steps": steps, "seconds": seconds, "ms_per_step": 1e3 * seconds / steps,
           "train_loss": float(history.history["loss"][-1]),
           "train_accuracy": float(history.history["accuracy"][-1]),
           "test_accuracy": acc, "test_accuracy_per_class": per_class,
           "confusion": confusion, "test_accuracy_untrained_head": before}
    print(f"{name}: {steps} steps in {seconds:.0f}s, test accuracy {acc:.4f} "
          f"({', '.join(f'{k} {v:.3f}' for k, v in per_class.items())})", flush=True)
    return row


# -- the run ---------------------------------------------------------------------

def run_corpus_id(o):
    r"""`--part=corpus_id`: which corpus does a passage of N words come from, and
    what are pretraining and memory worth for telling?

    Three classes: Tiny Shakespeare (`tinyshakespeare.txt`), PTB
    (`ptb.valid.txt` + `ptb.test.txt`) and WikiText-2 (`wikitext2.valid.txt`),
    from `--data_dir` (default `../shared/data`).

    1. **Normalise** each corpus (`normalise`), so that markers of the source's
       format rather than of its language do not give the answer away: drop
       `<unk>`, PTB's number token `N`, WikiText's `= heading =` lines and its
       `@-@` / `@,@` / `@.@` joiners, and Tiny Shakespeare's speaker lines
       (`First Citizen:`); join the split contractions of PTB and WikiText
       (`do n't`, `it 's` -> `don't`, `it's`) as Shakespeare writes them; then
       lower-case, delete apostrophes, turn every other character that is not an
       ASCII letter into a space (digits, punctuation, hyphens, accented
       letters) and keep single spaces between words.
    2. **Split** each corpus's words 90 / 10, the first 90 % for training, before
       anything is cut, so no test passage overlaps the training text.
    3. **Pretrain** a byte-level backbone (`--preset`, default `small`) with the
       project's training job (`training.budget.train_within`, as
       `--part=shakespeare`) for `--pretrain_s` seconds on the training 90 % of
       all three corpora, interleaved in chunks of 1,000 words (the job's own
       90 / 10 split of that file only feeds its log).
    4. **Cut** passages of `--n_words` words (`txl_tf.classification.corpus_passages`),
       balanced: every class gets as many passages as the smallest corpus gives
       (a seeded random choice from the larger ones), separately for training
       and test.
    5. **Fine-tune** three `TransformerXLClassifier`s for the same number of
       steps (sized so that variant (a) takes about `--finetune_s` seconds):
       (a) the pretrained backbone with memory `--mem_len`, (b) the same config
       from random weights with the same memory, (c) the pretrained backbone
       with `mem_len=0` (the head then sees only the passage's last segment).
       Held-out accuracy on the balanced test passages, per class as well.

    It measures accuracy, not speed: a shared machine only changes how many
    steps fit in the budget (recorded).
    """
    if o["n_words"] < 1 or o["segment_len"] < 1 or o["mem_len"] < 0:
        raise TrainingError("--n_words and --segment_len must be positive, --mem_len >= 0")
    import numpy as np
    from benchmarks.throughput import environment, format_table, write_json
    from txl_tf.classification import LabelSet
    from txl_tf.text import ByteTokenizer
    from training.budget import train_within

    env_before = environment()
    words = read_corpora(o["data_dir"])
    parts = {name: split_words(w) for name, w in words.items()}
    labels = LabelSet.from_labels(CORPORA)
    rng = np.random.default_rng(o["seed"])
    train, train_found = balanced_examples({k: v[0] for k, v in parts.items()},
                                           o["n_words"], labels, rng)
    test, test_found = balanced_examples({k: v[1] for k, v in parts.items()},
                                         o["n_words"], labels, rng)
    tokenizer = ByteTokenizer()
    lengths = np.array([len(t.encode("utf-8")) for t in train.texts + test.texts])
    print(f"passages of {o['n_words']} words: {len(train)} train, {len(test)} test "
          f"(balanced; found train {train_found}, test {test_found}); bytes "
          f"mean {lengths.mean():.0f}, max {lengths.max()}, "
          f"{(lengths > o['max_length']).sum()} cut to {o['max_length']}", flush=True)

    model_dir = o["model_dir"] or tempfile.mkdtemp(prefix="txl_corpus_id_")
    pretrain = None
    if o["pretrained"]:
        pretrained_dir = o["pretrained"]
    else:
        pre_dir = os.path.join(model_dir, "pretrain")
        os.makedirs(pre_dir, exist_ok=True)
        corpus_file = os.path.join(model_dir, "pretrain_text.txt")
        with open(corpus_file, "w", encoding="utf-8") as f:
            f.write(interleave([v[0] for v in parts.values()]))
        base = dict(preset=o["preset"], dataset="text", data_dir=corpus_file,
                    cache_dir=os.path.join(model_dir, "corpus_cache"),
                    batch_size=o["pretrain_batch_size"], tgt_len=o["segment_len"],
                    mem_len=o["mem_len"], learning_rate=o["pretrain_learning_rate"],
                    strategy="one_device", config_override=o["config_override"],
                    mixed_precision=o["mixed_precision"], seed=o["seed"])
        result, steps, per_step, seconds = train_within(
            o["pretrain_s"], base, pre_dir, warmup_steps=200, checkpoints=3, log_every=50)
        with open(os.path.join(pre_dir, "train_log.jsonl"), encoding="utf-8") as f:
            last = [json.loads(line) for line in f][-1]
        pretrained_dir = result["export_dir"]
        pretrain = {"steps": result["step"], "seconds": seconds, "seconds_per_step": per_step,
                    "parameters": result["parameters"], "train_bpc_last": last.get("bpc"),
                    "train_bytes": os.path.getsize(corpus_file),
                    "tokens_seen": result["step"] * o["pretrain_batch_size"] * o["segment_len"]}
        print(f"pretrained {result['step']} steps in {seconds:.0f}s, last train bpc "
              f"{last.get('bpc')}", flush=True)

    if o["finetune_steps"]:
        steps, per_step = o["finetune_steps"], None
    else:
        steps, per_step = probe_steps(o, pretrained_dir, labels, train, tokenizer)
        print(f"fine-tuning: {per_step * 1e3:.0f} ms/step -> {steps} steps per variant",
              flush=True)
    rows = [fine_tune(o, name, pre, o["mem_len"] if mem is None else mem, pretrained_dir,
                      labels, train, test, tokenizer, steps)
            for name, pre, mem in VARIANTS]

    print(f"\nWhich corpus (ptb / shakespeare / wikitext2), {o['n_words']}-word passages, "
          f"byte-level, {len(test)} balanced test passages (chance 0.333):")
    columns = [("variant", "variant", ""), ("mem_len", "mem_len", "d"),
               ("steps", "steps", "d"), ("s", "seconds", ".0f"),
               ("train acc", "train_accuracy", ".3f"), ("test acc", "test_accuracy", ".4f")]
    print(format_table(rows, columns))
    report = {"benchmark": "corpus identification (ptb / shakespeare / wikitext2), "
                           "byte-level, 90/10 split of each corpus's normalised words",
              "settings": {k: v for k, v in o.items()}, "labels": labels.names,
              "train_passages": len(train), "test_passages": len(test),
              "passages_found": {"train": train_found, "test": test_found},
              "passage_bytes_mean": float(lengths.mean()),
              "passage_bytes_max": int(lengths.max()),
              "pretrain": pretrain, "pretrained_dir": pretrained_dir,
              "finetune_probe_seconds_per_step": per_step, "variants": rows,
              "environment_before": env_before, "environment_after": environment()}
    write_json(o["output"], report)
    return report


PARTS = {"shakespeare": (SHAKESPEARE_SPEC, run_shakespeare),
         "reach": (REACH_SPEC, run_reach),
         "corpus_id": (CORPUS_ID_SPEC, run_corpus_id)}
SPEC = suite_spec({name: spec for name, (spec, _) in PARTS.items()})


def main(argv):
    run_part(PARTS, values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
