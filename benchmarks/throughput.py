"""Shared parts of `train_throughput.py` and `eval_throughput.py`.

Shapes, the model-FLOPs formula, a same-run matmul peak, interleaved timing
of Keras `fit` / `evaluate` batches, the table, the JSON file and its PNG
chart (with matplotlib, the `bench` extra).

Model FLOPs per token (matmul/einsum multiply-adds x 2; softmax, LayerNorm,
dropout, the optimizer and the relative shift are not counted). With
d = d_model, h = n_head * d_head, T = tgt_len, M = mem_len, K = M + T,
B = batch, L = n_layer, V = n_token (no adaptive softmax):

    per layer  2*d*h             q (the T queries)
             + 2*2*d*h*K/T       k, v over the K keys (memory recomputed)
             + 2*d*h*K/(B*T)     r = pos_emb @ W_r (shared by the batch)
             + 3*2*h*K           q.k, q.r, prob @ v (all K keys, no causal skip)
             + 2*h*d             o
             + 2*2*d*d_inner     feed-forward
    forward  = L * per layer + 2*d*V (output softmax)
    training = 3 * forward (backward = 2 x forward)

This counts what the model needs, not what the code computes: work the code
wastes (such as queries computed for memory positions) lowers the MFU.
"""
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

from benchmarks.common import at_least, names_from
from txl_tf.app.flagspec import option

# The SMALL shape (5.19 M parameters) and a larger one.
SHAPES = {
    "small": dict(n_token=256, n_layer=6, d_model=256, n_head=8, d_head=32, d_inner=1024,
                  dropout=0.1, tgt_len=128, mem_len=128, batch_size=16),
    "medium": dict(n_token=256, n_layer=8, d_model=512, n_head=8, d_head=64, d_inner=2048,
                   dropout=0.1, tgt_len=128, mem_len=128, batch_size=8),
}
VARIANTS = {  # name: (Keras dtype policy, jit_compile)
    "f32": ("float32", False),
    "f32+jit": ("float32", True),
    "bf16": ("mixed_bfloat16", False),
    "bf16+jit": ("mixed_bfloat16", True),
}


def config_for(shape, **overrides):
    from txl_tf import TransformerXLConfig
    sizes = {k: v for k, v in SHAPES[shape].items() if k != "batch_size"}
    sizes.update(overrides)
    return TransformerXLConfig(**sizes)


def model_flops_per_token(cfg, tgt_len, mem_len, batch_size, training):
    """See the module docstring."""
    d, h, k, t = cfg.d_model, cfg.n_head * cfg.d_head, mem_len + tgt_len, tgt_len
    layer = (2 * d * h + 4 * d * h * k / t + 2 * d * h * k / (batch_size * t)
             + 6 * h * k + 2 * h * d + 4 * d * cfg.d_inner)
    forward = cfg.n_layer * layer + 2 * cfg.d_model * cfg.n_token
    return 3 * forward if training else forward


def matmul_peak(dtype_name, n=2048, repeats=5):
    """GFLOP/s of the best of `repeats` `[n, n] @ [n, n]` TensorFlow matmuls."""
    import tensorflow as tf
    dtype = tf.as_dtype(dtype_name)
    a = tf.random.normal([n, n], dtype=tf.float32)
    a, b = tf.cast(a, dtype), tf.cast(tf.transpose(a), dtype)
    matmul = tf.function(lambda x, y: tf.reduce_sum(tf.cast(tf.matmul(x, y)[:1, :1],
                                                            tf.float32)))
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


def batch_timer():
    """A Keras callback whose `times` are the seconds per batch of `fit` or
    `evaluate` (Keras calls `on_*_batch_begin/end` once per execution of
    `steps_per_execution` batches; the time is shared among them)."""
    import keras

    class BatchTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times, self._first, self._start = [], 0, 0.0

        def _begin(self, batch, logs=None):
            self._first, self._start = batch, time.perf_counter()

        def _end(self, batch, logs=None):
            n = batch - self._first + 1
            self.times.extend([(time.perf_counter() - self._start) / n] * n)

        on_train_batch_begin = on_test_batch_begin = _begin
        on_train_batch_end = on_test_batch_end = _end

    return BatchTimer()


def fit_runner(model, dataset):
    """`n -> seconds of each of n more fit batches` (memory carried)."""
    def run(n):
        timer = batch_timer()
        model.fit(dataset, epochs=1, steps_per_epoch=n, verbose=0, callbacks=[timer],
                  shuffle=False)
        return timer.times
    return run


def interleave(runners, iters, warmup, block):
    """`{name: seconds per batch}`: `warmup` untimed batches for each runner,
    then `iters` timed ones each in rounds of `block`, so that load from
    elsewhere on the machine hits every variant alike. A runner is a
    callable `n -> list of n per-batch seconds`."""
    for run in runners.values():
        run(warmup)
    times = {name: [] for name in runners}
    while min(len(t) for t in times.values()) < iters:
        for name, run in runners.items():
            times[name].extend(run(min(block, iters - len(times[name]))))
    return {name: np.array(t) for name, t in times.items()}


def summarize(seconds, tokens_per_batch, flops_per_token, peak_gflops):
    median = float(np.median(seconds))
    tok_s = tokens_per_batch / median
    return {"median_step_ms": 1e3 * median, "p90_step_ms": 1e3 * float(np.percentile(seconds, 90)),
            "tokens_per_s": tok_s, "model_gflops_per_s": tok_s * flops_per_token / 1e9,
            "mfu": tok_s * flops_per_token / 1e9 / peak_gflops, "steps_timed": len(seconds)}


def format_table(rows, columns):
    """`columns`: (title, key, format)."""
    cells = [[title for title, _, _ in columns]]
    cells += [[format(r[key], fmt) for _, key, fmt in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def environment():
    import keras
    import tensorflow as tf
    return {"tensorflow": tf.__version__, "keras": keras.__version__,
            "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "loadavg": list(os.getloadavg())}


def peaks(earlier=None):
    """Large-matmul GFLOP/s for float32 and bfloat16, measured now (the best
    of now and `earlier`, if given: the run measures before and after)."""
    now = {"float32": matmul_peak("float32"), "bfloat16": matmul_peak("bfloat16")}
    return {k: max(v, (earlier or {}).get(k, 0.0)) for k, v in now.items()}


def write_json(path, result):
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {path}")


def report(rows, peak, env_before, columns, output, question, settings):
    """Fills MFU against the best matmul peak of the run, prints the table and
    writes the JSON (`question`, `settings`, peaks, environment, rows)."""
    peak = peaks(peak)  # the best of before and after
    for r in rows:
        r["peak_gflops"] = peak[r["peak_dtype"]]
        r["mfu"] = r["model_gflops_per_s"] / r["peak_gflops"]
    table = format_table(rows, columns)
    env = environment()
    env["loadavg_before"] = env_before["loadavg"]
    print(f"matmul peak GFLOP/s: float32 {peak['float32']:.1f}, bfloat16 {peak['bfloat16']:.1f}; "
          f"loadavg before {env['loadavg_before']}, after {env['loadavg']}")
    print(table)
    write_json(output, {"question": question, "settings": settings,
                        "matmul_peak_gflops": peak, "environment": env, "results": rows,
                        "table": table})
    if output:
        try:
            print(f"wrote {chart(output)}")
        except ImportError:
            print("matplotlib not installed (the bench extra): no chart")


def chart(path):
    """A PNG bar chart of a throughput JSON file, next to it: tokens/s per
    variant, grouped by shape (training) or memory length (evaluation), each
    bar labelled with its ratio to the group's first bar."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    rows = result["results"]
    group_key = "mem_len" if "evaluation" in result["question"] else "shape"
    groups = list(dict.fromkeys(r[group_key] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    width = 0.8 / len(variants)
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(groups) * len(variants) * width * 2.5, 4))
    for v, variant in enumerate(variants):
        xs, ys, ratios = [], [], []
        for g, group in enumerate(groups):
            row = next((r for r in rows if r[group_key] == group and r["variant"] == variant),
                       None)
            if row is not None:
                xs.append(g + (v - (len(variants) - 1) / 2) * width)
                ys.append(row["tokens_per_s"])
                ratios.append(row["vs_first"])
        bars = ax.bar(xs, ys, width, label=variant)
        for bar, ratio in zip(bars, ratios):
            ax.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
    label = "memory" if group_key == "mem_len" else "shape"
    ax.set_xticks(range(len(groups)), [f"{label} {g}" for g in groups])
    ax.set_ylabel("tokens / s")
    ax.set_title(result["question"], fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    output = os.path.splitext(path)[0] + ".png"
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def build_model(cfg, batch_size, mem_len, policy, jit_compile, steps_per_execution=1):
    """`TransformerXLLM` compiled the way the training job compiles it."""
    import keras
    from txl_tf import ReplicaClippedAdam, TransformerXLLM, WarmupCosineDecay
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = TransformerXLLM(cfg, batch_size=batch_size, mem_len=mem_len)
        optimizer = ReplicaClippedAdam(learning_rate=WarmupCosineDecay(2.5e-4, 10 ** 6),
                                       epsilon=1e-8, global_clipnorm=0.25)
        model.compile(optimizer=optimizer, jit_compile=jit_compile,
                      steps_per_execution=steps_per_execution)
        model.optimizer.build(model.trainable_variables)
    finally:
        keras.config.set_dtype_policy(previous)
    return model


def shape_data(shape, make_dataset):
    """`(config, batch, dataset)` of a shape: 64 segments of random ids per
    stream through `make_dataset(ids, batch, tgt_len)`."""
    cfg, batch = config_for(shape), SHAPES[shape]["batch_size"]
    ids = random_ids(batch * (cfg.tgt_len * 64 + 1), cfg.n_token)
    return cfg, batch, make_dataset(ids, batch, cfg.tgt_len)


def random_ids(n, n_token=256, seed=0):
    return np.random.default_rng(seed).integers(0, n_token, n).astype(np.int32)


# The options `train_throughput` and `eval_throughput` add to their SPEC:
# the paper's code as a same-run baseline row (see `paper_reference.py`).
REFERENCE_OPTIONS = (
    option("string", "reference_dir", None, "The pytorch/ folder of kimiyoung/transformer-xl: "
           "adds its row."),
    option("string", "reference_python", sys.executable, "A Python interpreter with torch, for "
           "--reference_dir."),
)


def check_options(o):
    """The options `o` of `train_throughput` or `eval_throughput`, checked
    (a `BenchmarkError` names the first bad flag)."""
    names_from(o["shapes"], "shapes", sorted(SHAPES))
    names_from(o["variants"], "variants", list(VARIANTS))
    at_least(o, 1, "iters", "block")
    at_least(o, 0, "warmup")
    return o


class ReferenceRunner:
    """The paper's code in a worker process (`paper_reference.py`), driven
    like the other runners: `runner(n)` → seconds of each of n more steps.
    The worker waits idle on its stdin while the other variants run."""

    def __init__(self, python, reference_dir, mode, shape, mem_len):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper_reference.py")
        self.process = subprocess.Popen([python, script, os.path.abspath(reference_dir)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        sizes = {k: v for k, v in SHAPES[shape].items()}
        sizes.update(mem_len=mem_len, dropatt=0.0, threads=os.cpu_count(), mode=mode)
        self.info = self._ask({"setup": sizes})

    def _ask(self, request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the reference worker exited ({self.process.wait()}); "
                               "see its error above")
        return json.loads(line)

    def __call__(self, n):
        return self._ask({"run": n})["seconds"]

    def close(self):
        self.process.stdin.close()
        self.process.wait()
