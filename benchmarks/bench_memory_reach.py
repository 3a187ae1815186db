r"""How far back can a classifier learn to look? Memory length x gradient through the memory.

    python -m benchmarks.bench_memory_reach [--seeds=0,1] [--steps=1000]

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
import json
import os
import resource
import statistics
import subprocess
import sys
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from training.errors import TrainingError  # noqa: E402

N_CLASSES, MARKER = 3, 253

SPEC = (
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
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


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


def run(o):
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
                [sys.executable, "-m", "benchmarks.bench_memory_reach", *flags,
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
    print(table(results, o))
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"settings": o, "results": results}, f, indent=2)


def table(results, o):
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


def main(argv):
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
