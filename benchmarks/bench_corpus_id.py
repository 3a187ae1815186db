r"""Which corpus does a passage of N words come from, and what are
pretraining and memory worth for telling?

    python -m benchmarks.bench_corpus_id [--pretrain_s=720] [--finetune_s=240] \
        [--n_words=48] [--output=benchmarks/results/corpus_id.json]

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
   `bench_shakespeare`) for `--pretrain_s` seconds on the training 90 % of
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
import json
import os
import re
import sys
import tempfile
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from training.errors import TrainingError  # noqa: E402

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

SPEC = (
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

def run(o):
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


def main(argv):
    del argv
    run(values(SPEC))  # absl would pass a returned value to sys.exit


if __name__ == "__main__":
    cli.run(main, SPEC)  # the jobs' exit path: bad input is one `error:` line
