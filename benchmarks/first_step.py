r"""A training job's first step (tracing and compiling) with the library as
it is against the library with one of its first-step savings undone,
measured in the same run (`--compare`):

- `optimizer`: Adam's update of a variable as one op (`fused`) against
  Keras 3's own Adam update (`keras`);
- `dropout`: dropout's random words under XLA from a keyed counter hash
  (`hash`) against TensorFlow's Philox generator (`philox`), which XLA
  expands at every dropout (only the `+jit` variants differ).

    python -m benchmarks.first_step [--compare=optimizer] [--shapes=tiny,enwik8_base] \
        [--variants=f32,f32+jit] [--tgt_len=64] [--batch_size=1] [--rounds=3] [--steps=5] \
        [--output=benchmarks/results/first_step.json]

Each measurement is a process of its own (a first step traces and compiles
once per process): `TransformerXLLM` compiled as the training job compiles
it (`benchmarks.throughput.build_model`: `ReplicaClippedAdam` with the clip
and the schedule), one `train_on_batch` timed (the first step), then the
median of `--steps` more (a step). The two arms alternate within each
round. A row is the median, min and max over `--rounds` of each, and the
ratio of the medians (baseline / library). Sizes: the shape's own
(`benchmarks.throughput.SHAPES`) with `--tgt_len` (memory as long) and
`--batch_size` where given, so that the paper's base shapes fit a CPU.
"""
import json
import os
import statistics
import subprocess
import sys

from txl_tf.app.flagspec import option

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(1, REPO)

# Each comparison's arms: (the baseline, the library as it is).
COMPARISONS = {"optimizer": ("keras", "fused"), "dropout": ("philox", "hash")}
WORKER_TIMEOUT_S = 1200  # one process: the paper's base shapes compile for minutes on 2 cores


def keras_update_adam():
    """`ReplicaClippedAdam` with Keras 3's own `Adam.update_step`."""
    import keras
    from txl_tf import ReplicaClippedAdam

    class KerasUpdateAdam(ReplicaClippedAdam):
        update_step = keras.optimizers.Adam.update_step

    return KerasUpdateAdam


def philox_dropout():
    """Makes this process's dropout draw Philox words under XLA too (the
    library's dropout before the counter hash)."""
    from txl_tf.layers import dropout
    dropout.compiling_with_xla = lambda: False


def measure_once(shape, variant, arm, tgt_len, batch_size, steps):
    """In this process: `{first_step_s, step_s}` of one model's training
    with `arm` (a name of `COMPARISONS`)."""
    import time

    import numpy as np
    from benchmarks.throughput import SHAPES, VARIANTS, build_model, config_for
    if arm == "philox":
        philox_dropout()
    sizes = {"tgt_len": tgt_len, "mem_len": tgt_len} if tgt_len else {}
    cfg = config_for(shape, **sizes)
    batch = batch_size or SHAPES[shape]["batch_size"]
    policy, jit = VARIANTS[variant]
    model = build_model(cfg, batch, cfg.mem_len, policy, jit,
                        optimizer_class=keras_update_adam() if arm == "keras" else None)
    ids = np.random.default_rng(0).integers(0, cfg.n_token, (batch, cfg.tgt_len + 1))
    x, y = ids[:, :-1].astype(np.int32), ids[:, 1:].astype(np.int32)
    start = time.perf_counter()
    model.train_on_batch(x, y)
    first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    return {"first_step_s": first, "step_s": statistics.median(times)}


def run_worker(shape, variant, arm, tgt_len, batch_size, steps):
    """`measure_once` in a fresh process; its result."""
    program = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
               "from benchmarks.first_step import measure_once; "
               "print(json.dumps(measure_once(sys.argv[2], sys.argv[3], sys.argv[4], "
               "int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))))")
    from benchmarks.common import BenchmarkError
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    try:
        done = subprocess.run(
            [sys.executable, "-c", program, REPO, shape, variant, arm, str(tgt_len),
             str(batch_size), str(steps)], capture_output=True, text=True, env=env,
            timeout=WORKER_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise BenchmarkError(f"{shape} {variant} {arm}: the worker did not finish in "
                             f"{WORKER_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BenchmarkError(f"{shape} {variant} {arm}: the worker failed: {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(samples):
    """A row's figures from `[{first_step_s, step_s}, ...]` of one arm."""
    firsts = [s["first_step_s"] for s in samples]
    return {"first_step_s": statistics.median(firsts), "first_step_min_s": min(firsts),
            "first_step_max_s": max(firsts),
            "step_s": statistics.median(s["step_s"] for s in samples)}


def rows_of(samples, arms):
    """One row per (shape, variant): each of `arms`' figures (baseline,
    library) and the ratios of their medians (baseline / library)."""
    baseline, library = arms
    rows = []
    for (shape, variant), by_arm in samples.items():
        row = {"shape": shape, "variant": variant}
        for name in arms:
            row[name] = summarize(by_arm[name])
        row["first_step_ratio"] = row[baseline]["first_step_s"] / row[library]["first_step_s"]
        row["step_ratio"] = row[baseline]["step_s"] / row[library]["step_s"]
        rows.append(row)
    return rows


def table(rows, arms):
    """The rows as a text table, `arms` (baseline, library) side by side."""
    baseline, library = arms
    lines = [f"{'shape':<12} {'variant':<8} {baseline + ' first s':>22} "
             f"{library + ' first s':>22} {'ratio':>6} {baseline + ' step s':>13} "
             f"{library + ' step s':>13} {'ratio':>6}"]
    for r in rows:
        spans = {name: f"{r[name]['first_step_s']:.2f} [{r[name]['first_step_min_s']:.2f}, "
                       f"{r[name]['first_step_max_s']:.2f}]" for name in arms}
        lines.append(f"{r['shape']:<12} {r['variant']:<8} {spans[baseline]:>22} "
                     f"{spans[library]:>22} {r['first_step_ratio']:>6.2f} "
                     f"{r[baseline]['step_s']:>13.3f} {r[library]['step_s']:>13.3f} "
                     f"{r['step_ratio']:>6.2f}")
    return "\n".join(lines)


SPEC = (
    option("enum", "compare", "optimizer", "Which saving to undo in the baseline arm: "
           "Adam's one-op update (optimizer) or dropout's counter hash under XLA (dropout).",
           sorted(COMPARISONS)),
    option("list", "shapes", ["tiny", "enwik8_base"], "Shapes of benchmarks.throughput."),
    option("list", "variants", ["f32", "f32+jit"], "Variants of benchmarks.throughput."),
    option("integer", "tgt_len", 64, "Segment length, and memory as long (0: the shape's)."),
    option("integer", "batch_size", 1, "Rows (0: the shape's)."),
    option("integer", "rounds", 3, "Processes per arm and row (the two alternate)."),
    option("integer", "steps", 5, "Steps timed after the first (their median is `step_s`)."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "first_step.json"),
           "Where to write the JSON results."),
)


def main(argv):
    del argv
    from benchmarks.common import at_least, names_from, write_json
    from benchmarks.throughput import SHAPES, VARIANTS
    from txl_tf.app.flagspec import values
    o = values(SPEC)
    at_least(o, 1, "rounds", "steps")
    at_least(o, 0, "tgt_len", "batch_size")
    names_from(o["shapes"], "shapes", sorted(SHAPES))
    names_from(o["variants"], "variants", list(VARIANTS))
    arms = COMPARISONS[o["compare"]]
    samples = {}
    for shape in o["shapes"]:
        for variant in o["variants"]:
            found = samples.setdefault((shape, variant), {name: [] for name in arms})
            for round_ in range(o["rounds"]):
                order = arms if round_ % 2 == 0 else arms[::-1]
                for name in order:
                    found[name].append(run_worker(shape, variant, name, o["tgt_len"],
                                                  o["batch_size"], o["steps"]))
                    print(f"{shape} {variant} round {round_ + 1} {name}: "
                          f"first step {found[name][-1]['first_step_s']:.2f} s", flush=True)
    rows = rows_of(samples, arms)
    print(table(rows, arms))
    result = {"compare": o["compare"], "arms": list(arms), "tgt_len": o["tgt_len"],
              "batch_size": o["batch_size"], "rounds": o["rounds"], "steps": o["steps"],
              "cpu_threads": os.cpu_count(), "rows": rows}
    write_json(o["output"], result)


if __name__ == "__main__":
    from txl_tf.app import cli
    cli.run(main, SPEC)
