r"""Why TensorFlow's decode step stays above its bound: its kernels, timed alone.

    python -m benchmarks.tf_decode_kernels [--preset=wt103_base] [--batch_sizes=1,16]

At a preset's sizes (memory full at the paper's evaluation length), the
SavedModel's heaviest kernels in a one-token decode step, each as the
exported graph runs it and in the layout that would read its operand
without a transpose, in TensorFlow graph mode (alternating, median of
`--calls`):

- **output layer**: the logits of one position per row against the
  adaptive softmax's table `[V, d]` (`h @ tableᵀ`, today) and against a
  second copy kept as columns `[d, V]` (`h @ table_t`);
- **scores** and **values**: one layer's query rows against the cached keys
  as columns `[B, H, d_head, S]`, and its probabilities against the cached
  values `[B, H, S, d_head]` (batch matmuls, as the attention's
  `call_with_cache` runs them).

Each row prints milliseconds, the bytes read over that time (GB/s) and
that rate as a fraction of this machine's read bandwidth measured in the
same run (`bench_long_memory.read_bandwidth`). Prints a table and writes
JSON.
"""
import json
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.bench_long_memory import (PAPER_MEMORY, parse_batch_sizes,  # noqa: E402
                                          read_bandwidth, seconds)
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402

SPEC = (
    option("string", "preset", "wt103_base", "Model preset whose sizes are timed."),
    option("string", "batch_sizes", "1,16", "Comma-separated batch sizes."),
    option("integer", "calls", 20, "Timed calls of each kernel (alternating)."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results",
                                            "tf_decode_kernels.json"),
           "Where to write the JSON results."),
)


def kernels(config, mem_len, batch):
    """`{name: (graph function, bytes it reads)}` at these sizes, random data."""
    import numpy as np
    import tensorflow as tf
    rng = np.random.default_rng(0)
    d, heads, d_head, slots = config.d_model, config.n_head, config.d_head, mem_len + 1

    def const(*shape):
        return tf.constant(rng.normal(size=shape).astype(np.float32))

    hidden, query = const(batch, d), const(batch, heads, 1, d_head)
    table = const(config.n_token, d)
    table_t = tf.constant(tf.transpose(table))
    keys, vals = const(batch, heads, d_head, slots), const(batch, heads, slots, d_head)
    probs = const(batch, heads, 1, slots)
    table_bytes, cache_bytes = 4 * config.n_token * d, 4 * batch * heads * d_head * slots
    return {
        "output layer, table as rows (today)":
            (tf.function(lambda: tf.matmul(hidden, table, transpose_b=True)), table_bytes),
        "output layer, table as columns": (tf.function(lambda: tf.matmul(hidden, table_t)),
                                           table_bytes),
        "scores over one layer's keys": (tf.function(lambda: tf.matmul(query, keys)), cache_bytes),
        "values of one layer": (tf.function(lambda: tf.matmul(probs, vals)), cache_bytes),
    }


def time_alternating(fns, calls):
    """Median seconds of each function, the functions called in turn."""
    for fn in fns.values():
        fn()
        fn()
    times = {name: [] for name in fns}
    for _ in range(calls):
        for name, fn in fns.items():
            times[name].append(seconds(lambda: fn().numpy()))
    return {name: statistics.median(t) for name, t in times.items()}


def run(o):
    from txl_tf import TransformerXLConfig
    config = TransformerXLConfig.preset(o["preset"])
    mem_len = PAPER_MEMORY.get(o["preset"], config.mem_len)
    batch_sizes = parse_batch_sizes(o["batch_sizes"])
    bandwidth = read_bandwidth()
    rows = []
    for batch in batch_sizes:
        found = kernels(config, mem_len, batch)
        medians = time_alternating({name: fn for name, (fn, _) in found.items()}, o["calls"])
        for name, (_, nbytes) in found.items():
            rate = nbytes / medians[name]
            rows.append({"preset": o["preset"], "mem_len": mem_len, "batch": batch,
                         "kernel": name, "ms": medians[name] * 1e3, "mb_read": nbytes / 1e6,
                         "gb_per_s": rate / 1e9, "of_bandwidth": rate / bandwidth})
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s")
    print("| batch | kernel | ms | MB read | GB/s | of bandwidth |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['kernel']} | {r['ms']:.2f} | {r['mb_read']:.1f} | "
              f"{r['gb_per_s']:.1f} | {r['of_bandwidth']:.2f} |")
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"settings": o, "read_gb_per_s": bandwidth / 1e9, "rows": rows}, f, indent=2)


def main(argv):
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
