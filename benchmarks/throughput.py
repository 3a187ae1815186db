r"""Training and evaluation tokens/s of the real `TransformerXLLM`, memory
carried, beside the paper's PyTorch code in the same run.

    python -m benchmarks.throughput --part=train --shapes=small,medium \
        --variants=f32,f32+jit,bf16,bf16+jit --iters=30 \
        [--reference_dir=.../transformer-xl/pytorch --reference_python=.../bin/python]
    python -m benchmarks.throughput --part=eval --shapes=small --mem_lens=128,512 ...
    # the GPU pair (one variant at a time, each with its own peak memory):
    python -m benchmarks.throughput --part=train --shapes=enwik8_base,wt103_base \
        --variants=f32+jit,bf16+jit,f16+jit --nointerleave --warmup=2 --iters=10 \
        --reference_dir=.../transformer-xl/pytorch --reference_python=python

`--part=train`: for each shape (`SHAPES`) one model per variant (`VARIANTS`:
a Keras dtype policy, jit_compile off / on), compiled as the training job
compiles it (ReplicaClippedAdam, clip 0.25, cosine schedule), is trained on
random ids through `txl_tf.data.segment_dataset`, a callback timing each
batch of `fit`. With `--reference_dir` each variant is paired with the
paper's code (`paper_reference.py`, its own process) at the same shape,
optimizer, clip and steps in the matching precision (`f32`: float32 on the
CPU, TF32 on a GPU as TensorFlow's default; `bf16` / `f16`: bf16 / fp16
autocast; the paper row's `policy` names it: `PyTorch float32`, `PyTorch
tf32`, `PyTorch bf16`, `PyTorch fp16`), and the ratio column is each row's
tok/s over its pair's.

`--part=tails`: the adaptive softmax's NLL (mean) and its gradients in one
XLA function on `--rows` random hidden states (default the shape's batch x
tgt_len) and Zipf-drawn targets, traced with the row count known (each tail
bin scores its own rows in chunks, `txl_tf.layers.tail_nll`, as the training
step runs it) and unknown (each tail scores every row, what the XLA step did
before): the time of each and the ratio to every row's.

`--part=eval`: one model per variant and memory length (`--mem_lens`), its
`evaluate` over `txl_tf.data.eval_segment_dataset` from an empty memory; with
`--reference_dir` the paper's code (float32; TF32 matmuls on a GPU: `PyTorch
tf32`) is the first row of each memory length.

Variants run interleaved in rounds of `--block` batches (load from elsewhere
on a shared CPU hits every variant alike); `--nointerleave` runs one at a
time and reports each one's peak GPU memory (TensorFlow's
`get_memory_info('GPU:0')['peak']`, torch's `max_memory_allocated`;
TensorFlow takes GPU memory as it needs it, `common.share_the_gpu`, so the
paper's worker finds room on the same GPU). Every
row reports the first step's seconds (tracing and compiling), the median and
p90 step, tok/s, model GFLOP/s and MFU against the large-matmul peak of the
row's compute dtype measured in the same run. Prints a table, writes JSON and
its PNG chart (with matplotlib, the `bench` extra). `--profile_steps=N` runs N
more steps of each Keras variant under TensorFlow's profiler: where its time
goes, by XLA op category on a GPU (`tf_profile.py`), in its row.

Model FLOPs per token (matmul/einsum multiply-adds x 2; softmax, LayerNorm,
dropout, the optimizer and the relative shift are not counted). With
d = d_model, h = n_head * d_head, T = tgt_len, M = mem_len, K = M + T,
B = batch, L = n_layer, V = n_token:

    per layer  2*d*h             q (the T queries)
             + 2*2*d*h*K/T       k, v over the K keys (memory recomputed)
             + 2*d*h*K/(B*T)     r = pos_emb @ W_r (shared by the batch)
             + 3*2*h*K           q.k, q.r, prob @ v (all K keys, no causal skip)
             + 2*h*d             o
             + 2*2*d*d_inner     feed-forward
    output   2*d*V; with an adaptive softmax (cutoffs) the head, 2*d*(c_1 +
             clusters), plus each tail cluster's 2*d*size weighted by the share
             of targets in it (size/V for the uniform random ids used here)
    forward  = L * per layer + output
    training = 3 * forward (backward = 2 x forward)

This counts what the model needs, not what the code computes: work the code
wastes (such as queries computed for memory positions) lowers the MFU.
"""
import gc
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

from benchmarks.common import BenchmarkError, at_least, integer_list, names_from, share_the_gpu
from txl_tf.app import cli
from txl_tf.app.files import replacing
from txl_tf.app.flagspec import option, values

# A tiny one, the SMALL shape (5.19 M parameters), a larger one, and the paper's
# base shapes with its training batch (wt103: adaptive softmax, div_val 1).
SHAPES = {
    "tiny": dict(n_token=300, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64,
                 dropout=0.1, div_val=1, cutoffs=[100, 200], tgt_len=16, mem_len=16,
                 batch_size=4),  # the tests' and `gpu_check --tiny`'s (adaptive softmax)
    "small": dict(n_token=256, n_layer=6, d_model=256, n_head=8, d_head=32, d_inner=1024,
                  dropout=0.1, tgt_len=128, mem_len=128, batch_size=16),
    "medium": dict(n_token=256, n_layer=8, d_model=512, n_head=8, d_head=64, d_inner=2048,
                   dropout=0.1, tgt_len=128, mem_len=128, batch_size=8),
    "enwik8_base": dict(n_token=256, n_layer=12, d_model=512, n_head=8, d_head=64,
                        d_inner=2048, dropout=0.1, tgt_len=512, mem_len=512, batch_size=22),
    "wt103_base": dict(n_token=267735, n_layer=16, d_model=410, n_head=10, d_head=41,
                       d_inner=2100, dropout=0.1, div_val=1, cutoffs=[20000, 40000, 200000],
                       tgt_len=150, mem_len=150, batch_size=60),
}
# name: (Keras dtype policy, jit_compile). The paper's code pairs with a
# variant's precision, `PAPER_PRECISION[policy]` (on a GPU float32 means
# TF32 on both sides, TensorFlow's default).
VARIANTS = {
    "f32": ("float32", False),
    "f32+jit": ("float32", True),
    "bf16": ("mixed_bfloat16", False),
    "bf16+jit": ("mixed_bfloat16", True),
    "f16": ("mixed_float16", False),
    "f16+jit": ("mixed_float16", True),
}
PAPER_PRECISION = {"float32": "float32", "mixed_bfloat16": "bf16", "mixed_float16": "fp16"}
COMPUTE_DTYPE = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}

SPEC = (
    option("enum", "part", "train", "train: fit tokens/s; eval: evaluate tokens/s; tails: the "
           "adaptive softmax's NLL and gradients under XLA, each tail scoring its own rows "
           "against every row.", ["train", "eval", "tails"]),
    option("list", "shapes", None, f"Shapes: {sorted(SHAPES)} (default: small,medium for "
           "train, small for eval)."),
    option("list", "mem_lens", ["128", "512"], "Evaluation memory lengths (--part=eval)."),
    option("integer", "rows", 0, "Rows of the NLL (--part=tails; 0: the shape's batch x "
           "tgt_len)."),
    option("list", "variants", ["f32", "f32+jit", "bf16", "bf16+jit"],
           f"Variants: {list(VARIANTS)}."),
    option("integer", "iters", 30, "Timed batches per variant."),
    option("integer", "warmup", 4, "Untimed batches per variant first (the first one's seconds "
           "are reported: tracing, compiling)."),
    option("integer", "block", 5, "Batches per variant per round (interleaved)."),
    option("bool", "interleave", True, "Interleave the variants in rounds of --block (a shared "
           "CPU); --nointerleave: one at a time, each with its own peak GPU memory."),
    option("integer", "steps_per_execution", 1, "Keras steps_per_execution (--part=train)."),
    option("integer", "profile_steps", 0, "After each Keras variant's timed batches, this many "
           "more under TensorFlow's profiler (--part=train): its row's `profile` gives the "
           "time a step by XLA op category (on a GPU) and its largest ops "
           "(benchmarks/tf_profile.py)."),
    option("string", "output", None, "JSON results file (default: "
           "benchmarks/results/<part>_throughput.json)."),
    option("string", "reference_dir", None, "The pytorch/ folder of kimiyoung/transformer-xl: "
           "adds the paper's rows."),
    option("string", "reference_python", sys.executable, "A Python interpreter with torch, for "
           "--reference_dir."),
)


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
    forward = cfg.n_layer * layer + output_flops_per_token(cfg)
    return 3 * forward if training else forward


def output_flops_per_token(cfg):
    """The output layer's forward FLOPs per token: `2*d*V`, or with an
    adaptive softmax the head's and each tail's weighted by its share of the
    vocabulary (see the module docstring)."""
    d, cutoffs = cfg.d_model, list(cfg.cutoffs or [])
    if not cutoffs:
        return 2 * d * cfg.n_token
    ends = cutoffs + [cfg.n_token]
    tails = [b - a for a, b in zip(ends, ends[1:])]
    return 2 * d * (cutoffs[0] + len(tails)) + sum(2 * d * s * s / cfg.n_token for s in tails)


def matmul_size(on_gpu):
    """The side of `matmul_peak`'s matrices: 2048 on a CPU; 8192 on a GPU,
    where a 2048 matmul takes about as long as the call's own launch and
    read-back, which would lower the peak and raise the MFU."""
    return 8192 if on_gpu else 2048


def matmul_peak(dtype_name, n=None, repeats=5):
    """GFLOP/s of the best of `repeats` `[n, n] @ [n, n]` TensorFlow matmuls
    (`n`: `matmul_size` of the device TensorFlow computes on)."""
    import tensorflow as tf
    n = n or matmul_size(bool(tf.config.list_logical_devices("GPU")))
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
    `steps_per_execution` batches; the time is shared among them). Each
    batch's clock stops after its logs are read back to the host, which
    waits for the step on a GPU (Keras reads them before a callback with
    its own `on_*_batch_end`; read here again, so the timer never depends
    on that)."""
    import keras

    class BatchTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times, self._first, self._start = [], 0, 0.0

        def _begin(self, batch, logs=None):
            self._first, self._start = batch, time.perf_counter()

        def _end(self, batch, logs=None):
            keras.tree.map_structure(keras.ops.convert_to_numpy, logs or {})  # the step done
            n = batch - self._first + 1
            self.times.extend([(time.perf_counter() - self._start) / n] * n)

        on_train_batch_begin = on_test_batch_begin = _begin
        on_train_batch_end = on_test_batch_end = _end

    return BatchTimer()


def keras_runner(model, dataset, training):
    """`n -> seconds of each of n more fit (or evaluate) batches` (memory
    carried by `fit`; every `evaluate` call starts from an empty memory, and
    the work per batch does not depend on how full it is); its `profile(n)`
    is `n` more under TensorFlow's profiler (`tf_profile.summarize`)."""
    def run(n):
        timer = batch_timer()
        if training:
            model.fit(dataset, epochs=1, steps_per_epoch=n, verbose=0, callbacks=[timer],
                      shuffle=False)
        else:
            model.evaluate(dataset, steps=n, verbose=0, callbacks=[timer])
        return timer.times
    def profile(n):
        import tempfile

        from benchmarks.tf_profile import profiled
        with tempfile.TemporaryDirectory(prefix="txl_profile_") as folder:
            return profiled(run, n, folder)

    # Trainable weights only: `count_params` also counts the memory the
    # model carries between batches (non-trainable state, not parameters).
    run.parameters = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    run.profile = profile
    return run


def gpu_peak_bytes(reset=False):
    """TensorFlow's peak memory on GPU:0 (bytes; reset when `reset`), or None
    without a GPU."""
    import tensorflow as tf
    if not tf.config.list_logical_devices("GPU"):
        return None
    if reset:
        tf.config.experimental.reset_memory_stats("GPU:0")
    return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])


def profile_of(runner, steps):
    """`runner.profile(steps)`, or `{"source": None, "why": ...}` where the
    profiler or its tables fail (a profile must not cost the rows after it)."""
    try:
        return runner.profile(steps)
    except Exception as error:  # TensorFlow's profiler, its tool tables, their columns
        return {"source": None,
                "why": f"the profile failed: {type(error).__name__}: "
                       + " ".join(str(error).split())[:300]}


def measure(makers, iters, warmup, block, interleave=True, progress=None, profile_steps=0):
    """`{name: {"seconds", "first_step_s", "peak_bytes", "parameters"}}` of
    each runner. `progress(name, result)`, if given, is called as each
    runner is made (`result` None), when its first step's seconds are known
    (`result` holds only `first_step_s`) and when it is done (its result).

    `makers`: `{name: () -> runner}`; a runner is a callable `n -> list of n
    per-batch seconds`, maybe with `close()`, a `peak_bytes` attribute (its
    own process's peak) and `parameters`. Each runner's first `warmup`
    batches are untimed (the first one's seconds reported); then `iters`
    timed ones. With `interleave` all runners live at once and run in rounds
    of `block` batches; without it one runner is made, measured and dropped
    at a time, a runner without its own `peak_bytes` reports TensorFlow's
    GPU peak over its life, and a runner that raises `PaperCodeFailed`
    gets `{"error": message}` (passed to `progress` too) while the others
    go on. With `profile_steps`, a runner with a `profile(n)` method runs
    that many more batches under it once its result is reported, which
    gains its `profile` (reported again; a profile that fails says why there,
    `profile_of`, and the runners after it still run)."""
    def finish(runner, seconds, first):
        close = getattr(runner, "close", None)
        peak = getattr(runner, "peak_bytes", None)
        if close:
            close()
        if peak is None and not interleave:
            peak = gpu_peak_bytes()
        return {"seconds": np.array(seconds), "first_step_s": first, "peak_bytes": peak,
                "parameters": getattr(runner, "parameters", None)}

    progress = progress or (lambda name, result: None)

    def start(name, make):
        progress(name, None)
        return make()

    def warm(name, runner):
        first = runner(warmup)[0]
        progress(name, {"first_step_s": first})
        return first

    results = {}
    if not interleave:
        for name, make in makers.items():
            gpu_peak_bytes(reset=True)
            runner = None  # where the paper's worker fails to start, none
            try:
                runner = start(name, make)
                first = warm(name, runner)
                results[name] = finish(runner, runner(iters), first)
            except PaperCodeFailed as error:  # our rows are still worth having
                results[name] = {"error": str(error)}
            progress(name, results[name])
            if profile_steps and hasattr(runner, "profile") and "error" not in results[name]:
                results[name]["profile"] = profile_of(runner, profile_steps)
                progress(name, results[name])
            runner = None
            gc.collect()
        return results
    runners = {name: start(name, make) for name, make in makers.items()}
    firsts = {name: warm(name, run) for name, run in runners.items()}
    times = {name: [] for name in runners}
    while min(len(t) for t in times.values()) < iters:
        for name, run in runners.items():
            times[name].extend(run(min(block, iters - len(times[name]))))
    for name, run in runners.items():
        results[name] = finish(run, times[name], firsts[name])
        if profile_steps and hasattr(run, "profile"):
            results[name]["profile"] = profile_of(run, profile_steps)
        progress(name, results[name])
    return results


def summarize(result, tokens_per_batch, flops_per_token, peak_gflops):
    seconds = result["seconds"]
    median = float(np.median(seconds))
    tok_s = tokens_per_batch / median
    peak = result["peak_bytes"]
    return {"median_step_ms": 1e3 * median, "p90_step_ms": 1e3 * float(np.percentile(seconds, 90)),
            "tokens_per_s": tok_s, "model_gflops_per_s": tok_s * flops_per_token / 1e9,
            "mfu": tok_s * flops_per_token / 1e9 / peak_gflops, "steps_timed": len(seconds),
            "first_step_s": result["first_step_s"], "peak_bytes": peak,
            "parameters": result.get("parameters"),
            "peak_gib": None if peak is None else peak / 2 ** 30}


def format_table(rows, columns):
    """`columns`: (title, key, format); a None value shows as `-`."""
    cells = [[title for title, _, _ in columns]]
    cells += [["-" if r.get(key) is None else format(r[key], fmt) for _, key, fmt in columns]
              for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def environment():
    import keras
    import tensorflow as tf
    return {"tensorflow": tf.__version__, "keras": keras.__version__,
            "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "gpus": [d.name for d in tf.config.list_logical_devices("GPU")],
            "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def peaks(dtypes, earlier=None):
    """Large-matmul GFLOP/s of each compute dtype, measured now (the best of
    now and `earlier`, if given: the run measures before and after)."""
    return {k: max(matmul_peak(k), (earlier or {}).get(k, 0.0)) for k in dtypes}


def write_json(path, result, quiet=False):
    """Writes `result` to `path` whole (a reader, or a kill, never meets half
    a file)."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        os.replace(path + ".tmp", path)
        if not quiet:
            print(f"wrote {path}")


def report(rows, peak, env_before, columns, output, question, settings):
    """Fills MFU against the best matmul peak of the run, prints the table and
    writes the JSON (`question`, `settings`, peaks, environment, rows). A row
    that computes faster than the matmul keeps its MFU above 1 and is flagged
    (`above_peak`): its step skipped work, or the matmul was timed too low;
    taking the row as the peak would hide the first and lower every other
    row's MFU."""
    peak = peaks(peak, peak)  # the best of before and after
    for r in rows:
        if "error" not in r:
            r["peak_gflops"] = peak[r["peak_dtype"]]
            r["mfu"] = r["model_gflops_per_s"] / r["peak_gflops"]
            if r["mfu"] > 1:
                r["above_peak"] = True
    above = [f"{r.get('shape', '')} {r.get('variant', '')}".strip() for r in rows
             if r.get("above_peak")]
    if above:
        print(f"MFU above 1 ({', '.join(above)}): faster than the same-run matmul; check "
              "that the step did its work, or the matmul was timed too low")
    table = format_table(rows, columns)
    env = environment()
    env["loadavg_before"] = env_before["loadavg"]
    shown = ", ".join(f"{k} {v:.1f}" for k, v in peak.items())
    print(f"matmul peak GFLOP/s: {shown}; loadavg before {env['loadavg_before']}, "
          f"after {env['loadavg']}")
    print(table)
    for r in rows:
        if "profile" in r:
            from benchmarks.tf_profile import one_line
            print(f"profile {r['shape']} {r['variant']}: {one_line(r['profile'])}")
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
    bar labelled with its ratio column."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    rows = [r for r in result["results"] if "error" not in r]
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
                ratios.append(row["ratio"])
        bars = ax.bar(xs, ys, width, label=variant)
        for bar, ratio in zip(bars, ratios):
            ax.annotate("-" if ratio is None else f"{ratio:.2f}x",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                        va="bottom", fontsize=7)
    label = "memory" if group_key == "mem_len" else "shape"
    ax.set_xticks(range(len(groups)), [f"{label} {g}" for g in groups])
    ax.set_ylabel("tokens / s")
    ax.set_title(result["question"], fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    output = os.path.splitext(path)[0] + ".png"
    with replacing(output) as temporary:  # a kill never leaves half a picture
        fig.savefig(temporary, dpi=110)
    plt.close(fig)
    return output


def build_model(cfg, batch_size, mem_len, policy, jit_compile, steps_per_execution=1,
                optimizer_class=None):
    """`TransformerXLLM` compiled the way the training job compiles it (with
    `optimizer_class` in place of `ReplicaClippedAdam` where given)."""
    import keras
    from txl_tf import ReplicaClippedAdam, TransformerXLLM, WarmupCosineDecay
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = TransformerXLLM(cfg, batch_size=batch_size, mem_len=mem_len)
        optimizer = (optimizer_class or ReplicaClippedAdam)(
            learning_rate=WarmupCosineDecay(2.5e-4, 10 ** 6), epsilon=1e-8,
            global_clipnorm=0.25)
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


def check_options(o):
    """The options `o`, checked (a `BenchmarkError` names the first bad flag)
    and completed with the part's defaults."""
    default_shapes = {"train": ["small", "medium"], "eval": ["small"],
                      "tails": ["wt103_base"]}[o["part"]]
    o = dict(o, shapes=o["shapes"] or default_shapes,
             output=o["output"] or f"benchmarks/results/{o['part']}_throughput.json")
    names_from(o["shapes"], "shapes", sorted(SHAPES))
    names_from(o["variants"], "variants", list(VARIANTS))
    at_least(o, 1, "iters", "block", "warmup", "steps_per_execution")
    at_least(o, 0, "rows")
    if o["part"] == "tails":
        plain = [s for s in o["shapes"] if not SHAPES[s].get("cutoffs")]
        if plain:
            raise BenchmarkError(f"--part=tails needs shapes with an adaptive softmax "
                                 f"(cutoffs); {', '.join(plain)} has none")
    o["mem_lens"] = integer_list(o["mem_lens"], "mem_lens", 0, "comma-separated integers >= 0")
    return o


def paper_name(variant):
    """The paper's row paired with `variant`: `paper f32`, `paper bf16`, ..."""
    return "paper " + variant.split("+")[0]


class PaperCodeFailed(RuntimeError):
    """The paper's code stopped (its worker process exited)."""


class ReferenceWorker:
    """The paper's code in a worker process (`paper_reference.py`), set up
    with `setup` (the fields of its protocol's `setup` request) and driven
    like the other runners: `runner(n)` → seconds of each of n more steps.
    The worker waits idle on its stdin while the other variants run."""

    def __init__(self, python, reference_dir, setup):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper_reference.py")
        self.process = subprocess.Popen([python, script, os.path.abspath(reference_dir)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.peak_bytes = None
        self.setup(setup)

    def setup(self, fields):
        """(Re)builds the worker's model from the protocol's `setup` fields."""
        self.info = self._ask({"setup": fields})
        self.parameters = self.info.get("parameters")

    def _ask(self, request):
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except BrokenPipeError:  # it exited before reading the request
            line = ""
        if not line:
            code = self.process.wait()
            try:
                self.process.stdin.close()
            except BrokenPipeError:  # what it did not read is dropped
                pass
            raise PaperCodeFailed(f"the reference worker exited ({code}); see its error above")
        return json.loads(line)

    def __call__(self, n):
        reply = self._ask({"run": n})
        self.peak_bytes = reply.get("peak_bytes")
        return reply["seconds"]

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def paper_device():
    """Where the paper's code runs: "cuda" where TensorFlow sees a GPU, else "cpu"."""
    import tensorflow as tf
    return "cuda" if tf.config.list_logical_devices("GPU") else "cpu"


def paper_precision(policy, device):
    """The `paper_reference.py` precision the paper's code runs in beside a
    Keras `policy` on `device`: float32 is "tf32" on a GPU (TF32 matmuls
    allowed, as TensorFlow's float32 there), else `PAPER_PRECISION`'s.

    Args:
        policy: a Keras dtype policy of `VARIANTS`.
        device: "cuda" or "cpu" (`paper_device`).
    Returns:
        "float32", "tf32", "bf16" or "fp16".
    """
    precision = PAPER_PRECISION[policy]
    return "tf32" if device == "cuda" and precision == "float32" else precision


def paper_label(precision):
    """The `policy` column of a paper row run in `precision`: what it ran."""
    return f"PyTorch {precision}"


class ReferenceRunner(ReferenceWorker):
    """The paper's code at a shape of `SHAPES` on `device` (`paper_device`)
    in `precision` (`paper_precision`, which the row's label names too)."""

    def __init__(self, python, reference_dir, mode, shape, mem_len, precision, device):
        sizes = dict(SHAPES[shape], mem_len=mem_len, dropatt=0.0, threads=os.cpu_count(),
                     mode=mode, device=device, precision=precision)
        sizes.pop("div_val", None)
        super().__init__(python, reference_dir, sizes)


COLUMNS = [("median ms", "median_step_ms", ".1f"), ("p90 ms", "p90_step_ms", ".1f"),
           ("tok/s", "tokens_per_s", ",.0f"), ("ratio", "ratio", ".2f"),
           ("1st step s", "first_step_s", ".1f"), ("peak GiB", "peak_gib", ".2f"),
           ("MFLOP/tok", "model_mflop_per_token", ".1f"), ("GFLOP/s", "model_gflops_per_s", ".1f"),
           ("MFU", "mfu", ".1%")]


TRAIN_QUESTION = "training tokens/s of TransformerXLLM.fit, memory carried"


def set_ratios(group, paired):
    """Each row's `ratio`: over its paper row (`paired`; a paper row's own is
    1.00, a row whose paper row is not done yet or failed None), else over the
    first row."""
    first = next(iter(group.values()))
    for name, r in group.items():
        base = (group.get(paper_name(name)) if name in VARIANTS else r) if paired else first
        speeds = (None, None) if base is None else (r.get("tokens_per_s"),
                                                    base.get("tokens_per_s"))
        r["ratio"] = None if None in speeds else speeds[0] / speeds[1]


def train_part(o, peak, partial=None):
    """`(rows, columns, question)` of `--part=train`. `partial(rows,
    started)`, if given, is called as the rows come: the rows done so far
    and the variants started and not done (`shape`, `variant`,
    `first_step_s`: None until the first step is done)."""
    from txl_tf.data import segment_dataset
    rows = []
    device = paper_device() if o["reference_dir"] else None
    for shape in o["shapes"]:
        cfg, batch, dataset = shape_data(shape, segment_dataset)
        flops = model_flops_per_token(cfg, cfg.tgt_len, cfg.mem_len, batch, training=True)
        makers, kinds = {}, {}
        for v in o["variants"]:
            policy, jit = VARIANTS[v]
            if o["reference_dir"] and paper_name(v) not in makers:
                precision = paper_precision(policy, device)
                makers[paper_name(v)] = (
                    lambda p=precision: ReferenceRunner(o["reference_python"], o["reference_dir"],
                                                        "train", shape, cfg.mem_len, p, device))
                kinds[paper_name(v)] = (paper_label(precision), False, policy)
            makers[v] = (lambda p=policy, j=jit: keras_runner(
                build_model(cfg, batch, cfg.mem_len, p, j,
                            steps_per_execution=o["steps_per_execution"]), dataset, True))
            kinds[v] = (policy, jit, policy)
        group, started = {}, {}

        def progress(name, result):
            if result is not None and "error" in result:  # the paper's code failed
                group[name] = {"shape": shape, "variant": name, "policy": kinds[name][0],
                               "error": result["error"]}
                set_ratios(group, bool(o["reference_dir"]))
                started.pop(name, None)
            elif result is None or "seconds" not in result:  # made, or its first step done
                started[name] = None if result is None else result["first_step_s"]
            else:
                label, jit, policy = kinds[name]
                dtype = COMPUTE_DTYPE[policy]
                group[name] = {"shape": shape, "variant": name, "policy": label,
                               "jit_compile": jit,
                               "steps_per_execution": o["steps_per_execution"],
                               "batch_size": batch, "tgt_len": cfg.tgt_len,
                               "mem_len": cfg.mem_len, "model_mflop_per_token": flops / 1e6,
                               "peak_dtype": dtype,
                               **summarize(result, batch * cfg.tgt_len, flops, peak[dtype]),
                               **({"profile": result["profile"]} if "profile" in result
                                  else {})}
                set_ratios(group, bool(o["reference_dir"]))
                started.pop(name, None)
            if partial:
                partial(rows + list(group.values()),
                        [{"shape": shape, "variant": n, "first_step_s": f}
                         for n, f in started.items()])

        measure(makers, o["iters"], o["warmup"], o["block"], o["interleave"], progress,
                o["profile_steps"] if o["part"] == "train" else 0)
        rows.extend(group.values())
    ratio = "x its paper row" if o["reference_dir"] else f"x {rows[0]['variant']}"
    columns = [("shape", "shape", ""), ("variant", "variant", ""), ("params", "parameters", ","),
               *[(ratio if key == "ratio" else t, key, f) for t, key, f in COLUMNS]]
    return rows, columns, TRAIN_QUESTION


def eval_part(o, peak):
    from txl_tf.data import eval_segment_dataset
    rows = []
    if o["reference_dir"]:  # the paper's row: float32 (TF32 matmuls on a GPU)
        device = paper_device()
        precision = paper_precision("float32", device)
    for shape in o["shapes"]:
        cfg, batch, dataset = shape_data(shape, eval_segment_dataset)
        variants = (["paper"] if o["reference_dir"] else []) + o["variants"]
        makers, keys = {}, {}
        for m in o["mem_lens"]:
            for v in variants:
                if v == "paper":
                    make = (lambda m=m: ReferenceRunner(o["reference_python"],
                                                        o["reference_dir"], "eval", shape, m,
                                                        precision, device))
                else:
                    make = (lambda m=m, v=v: keras_runner(
                        build_model(cfg, batch, m, *VARIANTS[v]), dataset, False))
                makers[f"{v} mem{m}"], keys[f"{v} mem{m}"] = make, (v, m)
        results = measure(makers, o["iters"], o["warmup"], o["block"], o["interleave"])
        group = []
        for name, result in results.items():
            v, mem = keys[name]
            if "error" in result:
                group.append({"shape": shape, "variant": v, "mem_len": mem,
                              "error": result["error"]})
                continue
            policy, jit = (paper_label(precision), False) if v == "paper" else VARIANTS[v]
            dtype = COMPUTE_DTYPE.get(policy, "float32")
            flops = model_flops_per_token(cfg, cfg.tgt_len, mem, batch, training=False)
            group.append({"shape": shape, "variant": v, "policy": policy, "jit_compile": jit,
                          "mem_len": mem, "batch_size": batch, "tgt_len": cfg.tgt_len,
                          "model_mflop_per_token": flops / 1e6, "peak_dtype": dtype,
                          **summarize(result, batch * cfg.tgt_len, flops, peak[dtype])})
        for r in group:
            base = next(g for g in group if g["mem_len"] == r["mem_len"])
            speeds = (r.get("tokens_per_s"), base.get("tokens_per_s"))
            r["ratio"] = None if None in speeds else speeds[0] / speeds[1]
        rows.extend(group)
    columns = [("shape", "shape", ""), ("mem", "mem_len", "d"), ("variant", "variant", ""),
               *[(f"x {rows[0]['variant']}" if key == "ratio" else t, key, f)
                 for t, key, f in COLUMNS]]
    return rows, columns, "evaluation tokens/s of TransformerXLLM.evaluate, memory carried"


# --part=tails: the NLL traced with the row count known (each tail bin scores its own
# rows, `layers.tail_nll`) and unknown (each scores every row, as under XLA before).
TAIL_PATHS = {"every row": None, "chunks": "known"}


def tails_runner(cfg, rows, path):
    """`n -> seconds of each of n more calls` of the adaptive softmax's NLL
    (mean) and its gradients (hidden states, the softmax's and the tied
    embedding's weights) in one XLA function, on `rows` random hidden states
    and Zipf-drawn targets (seed 0); `path` a `TAIL_PATHS` name."""
    import tensorflow as tf
    from txl_tf import TransformerXL
    core = TransformerXL(cfg)
    weights = core.word_emb.trainable_weights + core.crit.trainable_weights
    hidden = tf.constant(np.random.default_rng(0).normal(size=(rows, cfg.d_model)), tf.float32)
    target = tf.constant(zipf_targets(rows, cfg.n_token), tf.int32)
    known = rows if TAIL_PATHS[path] else None
    signature = [tf.TensorSpec([known, cfg.d_model], tf.float32),
                 tf.TensorSpec([known], tf.int32)]

    @tf.function(jit_compile=True, input_signature=signature)
    def call(hidden, target):
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            loss = tf.reduce_mean(core.crit(hidden, target))
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, [hidden] + weights)
                 if g is not None]
        return loss + tf.add_n([tf.reduce_sum(g) for g in grads])

    def run(n):
        times = []
        for _ in range(n):
            start = time.perf_counter()
            call(hidden, target).numpy()
            times.append(time.perf_counter() - start)
        return times
    run.parameters = sum(int(np.prod(w.shape)) for w in weights)
    return run


def zipf_targets(rows, n_token):
    """`rows` ids drawn from a Zipf law (exponent 1.2, seed 1), as a corpus's
    words fall: most in the head, a few in each tail bin."""
    return np.minimum(np.random.default_rng(1).zipf(1.2, rows) - 1, n_token - 1)


def tails_part(o, peak):
    rows = []
    for shape in o["shapes"]:
        cfg = config_for(shape)
        n = o["rows"] or SHAPES[shape]["batch_size"] * cfg.tgt_len
        makers = {path: (lambda path=path: tails_runner(cfg, n, path)) for path in TAIL_PATHS}
        results = measure(makers, o["iters"], o["warmup"], o["block"], o["interleave"])
        flops = 3 * output_flops_per_token(cfg)  # forward and backward
        share = float(np.mean(zipf_targets(n, cfg.n_token) >= cfg.cutoffs[0]))
        group = [{"shape": shape, "variant": path, "rows": n, "tail_share": share,
                  "policy": "float32",
                  "jit_compile": True, "peak_dtype": "float32",
                  "model_mflop_per_token": flops / 1e6,
                  **summarize(result, n, flops, peak["float32"])}
                 for path, result in results.items()]
        for r in group:
            r["ratio"] = r["median_step_ms"] / group[0]["median_step_ms"]
        rows.extend(group)
    columns = [("shape", "shape", ""), ("rows", "rows", "d"), ("path", "variant", ""),
               ("median ms", "median_step_ms", ".1f"), ("p90 ms", "p90_step_ms", ".1f"),
               ("time x every row", "ratio", ".2f"), ("1st call s", "first_step_s", ".1f"),
               ("GFLOP/s", "model_gflops_per_s", ".1f"), ("MFU", "mfu", ".1%")]
    return rows, columns, ("the adaptive softmax's NLL and gradients under XLA: each tail bin "
                           "scoring its own rows in chunks, and every row")


def main(argv):
    del argv
    share_the_gpu()  # the paper's worker runs beside this process on the same GPU
    o = check_options(values(SPEC))
    dtypes = sorted({COMPUTE_DTYPE[VARIANTS[v][0]] for v in o["variants"]
                     if o["part"] != "tails"} | {"float32"})  # tails: float32 only
    env_before, peak = environment(), peaks(dtypes)
    settings = {key: o[key] for key in ("part", "iters", "warmup", "block", "interleave",
                                         "steps_per_execution", "mem_lens")}
    settings["shapes"] = {s: SHAPES[s] for s in o["shapes"]}
    if o["part"] == "train":  # the rows so far, in case the run is stopped (gpu_check)
        def partial(rows, started):
            write_json(o["output"], {"question": TRAIN_QUESTION, "partial": True,
                                     "settings": settings, "results": rows,
                                     "started": started}, quiet=True)
        rows, columns, question = train_part(o, peak, partial)
    elif o["part"] == "tails":
        rows, columns, question = tails_part(o, peak)
    else:
        rows, columns, question = eval_part(o, peak)
    report(rows, peak, env_before, columns, o["output"], question, settings)
    failed = [f"{r['variant']} at {r['shape']}: {r['error']}" for r in rows if "error" in r]
    if failed:
        raise BenchmarkError("the paper's code failed (the other rows are in the table): "
                             + "; ".join(failed))


if __name__ == "__main__":
    cli.run(main, SPEC)
