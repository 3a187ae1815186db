r"""The paper's evaluation-speed comparison (Dai et al., 2019, Table 9).

    python -m benchmarks.eval_speed --preset=small --lengths=128,256,512,1024 \
        --batch_sizes=1,16 --output=benchmarks/results/eval_speed.json

A vanilla Transformer evaluated with attention length L slides a window of L
tokens one token at a time: every step recomputes the whole window and scores
only its last token. Transformer-XL scores a segment of L/2 tokens per call
and carries a memory of L/2 positions (attention length L = segment +
memory). Both run the same weights (the vanilla path is the core with no
memory), each as one compiled `tf.function` with fixed shapes. The per-token
time of each (wall time / tokens scored, all streams counted) and their ratio
are printed as a table and written to JSON and a PNG plot. Warm-up: two calls
for each path, plus `mem_len / tgt_len + 2` segments for Transformer-XL so
its memory is full before timing.
"""
import json
import os
import time

import numpy as np

from benchmarks.common import at_least, integer_list
from txl_tf.app import cli
from txl_tf.app.files import replacing
from txl_tf.app.flagspec import option, values

SPEC = (
    option("string", "preset", "small", "TransformerXLConfig preset (random weights)."),
    option("string", "lengths", "128,256,512,1024", "Comma-separated attention lengths L "
           "(segment and memory L/2 each)."),
    option("string", "batch_sizes", "1,16", "Comma-separated batch sizes."),
    option("integer", "vanilla_calls", 8, "Timed calls of the vanilla window (one token each)."),
    option("integer", "xl_calls", 4, "Timed calls of Transformer-XL (L/2 tokens each)."),
    option("string", "output", "benchmarks/results/eval_speed.json",
           "JSON results file (the PNG goes next to it)."),
)


def build_paths(core, batch, length):
    """`(vanilla_step, xl_step)` compiled for one attention length."""
    import tensorflow as tf

    seg = length // 2
    empty = core.initial_memory(batch, 0)

    @tf.function(input_signature=[tf.TensorSpec([batch, length], tf.int32)])
    def vanilla_step(window):
        hidden, _ = core.hidden_states(window, empty)
        return core.crit(hidden[:, -1:])[:, 0]

    @tf.function(input_signature=[tf.TensorSpec([batch, seg], tf.int32),
                                  tf.TensorSpec([core.config.n_layer, batch, seg,
                                                 core.config.d_model], tf.float32),
                                  tf.TensorSpec([batch, seg], tf.bool)])
    def xl_step(ids, mems, mem_mask):
        log_probs, memory = core(ids, (mems, mem_mask))
        return log_probs, memory.mems, memory.mem_mask

    return vanilla_step, xl_step


def vanilla_log_probs(core, ids, length):
    """Log-probs of every position t of `ids` [B, N] from a window of the
    last `length` tokens ending at t (shorter at the start), eagerly."""
    out = []
    for t in range(ids.shape[1]):
        window = ids[:, max(0, t - length + 1):t + 1]
        hidden, _ = core.hidden_states(window, core.initial_memory(ids.shape[0], 0))
        out.append(np.asarray(core.crit(hidden[:, -1:]))[:, 0])
    return np.stack(out, 1)


def xl_log_probs(core, ids, length):
    """Log-probs of `ids` [B, N] scored a segment of `length // 2` at a time
    with a memory of `length // 2`."""
    seg = length // 2
    memory = core.initial_memory(ids.shape[0], seg)
    out = []
    for start in range(0, ids.shape[1], seg):
        log_probs, memory = core(ids[:, start:start + seg], memory)
        out.append(np.asarray(log_probs))
    return np.concatenate(out, 1)


def _wait(result):
    """Reads `result` (a call's output, or its first item) back to the host:
    on a GPU a call returns once its work is queued, so this waits for it."""
    np.asarray(result[0] if isinstance(result, tuple) else result)


def _timed(fn, calls, warmup=0):
    """Seconds of `calls` calls of `fn` after `warmup` untimed ones, each end
    waited for: the warm-up's queued work is done before the clock starts,
    the last call's before it stops."""
    if warmup:
        for _ in range(warmup):
            result = fn()
        _wait(result)
    start = time.perf_counter()
    for _ in range(calls):
        result = fn()
    _wait(result)
    return time.perf_counter() - start


def measure(core, batch, length, vanilla_calls, xl_calls, seed=0):
    """Per-token seconds of both paths and the speed-up, for one (B, L)."""
    seg = length // 2
    vanilla_step, xl_step = build_paths(core, batch, length)
    rng = np.random.default_rng(seed)
    window = rng.integers(0, core.config.n_token, (batch, length)).astype(np.int32)
    vanilla_s = _timed(lambda: vanilla_step(window), vanilla_calls, warmup=2) / (
        vanilla_calls * batch)

    ids = rng.integers(0, core.config.n_token, (batch, seg)).astype(np.int32)
    memory = core.initial_memory(batch, seg)
    state = [memory.mems, memory.mem_mask]

    def xl_call():
        log_probs, state[0], state[1] = xl_step(ids, state[0], state[1])
        return log_probs
    # mem_len / tgt_len + 2 segments (the first one traces)
    xl_s = _timed(xl_call, xl_calls, warmup=1 + 2) / (xl_calls * batch * seg)
    return {"length": length, "batch": batch, "segment": seg, "memory": seg,
            "vanilla_s_per_token": vanilla_s, "xl_s_per_token": xl_s,
            "speedup": vanilla_s / xl_s, "vanilla_calls": vanilla_calls, "xl_calls": xl_calls}


def table(rows):
    lines = ["| L | batch | vanilla ms/token | Transformer-XL ms/token | speed-up |",
             "|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['length']} | {r['batch']} | {r['vanilla_s_per_token'] * 1e3:.3f} | "
                     f"{r['xl_s_per_token'] * 1e3:.5f} | {r['speedup']:,.0f}x |")
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for batch in sorted({r["batch"] for r in rows}):
        pts = [(r["length"], r["speedup"]) for r in rows if r["batch"] == batch]
        ax.plot(*zip(*pts), marker="o", label=f"batch {batch}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("attention length L")
    ax.set_ylabel("speed-up over the vanilla window")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    with replacing(path) as temporary:  # a kill never leaves half a picture
        fig.savefig(temporary, dpi=120)


def main(argv):
    del argv
    o = values(SPEC)
    at_least(o, 1, "vanilla_calls", "xl_calls")
    lengths = integer_list(o["lengths"], "lengths", 2, "comma-separated integers >= 2")
    batch_sizes = integer_list(o["batch_sizes"], "batch_sizes", 1,
                               "comma-separated positive integers")
    import tensorflow as tf

    from txl_tf import TransformerXL, TransformerXLConfig

    core = TransformerXL(TransformerXLConfig.preset(o["preset"], dropout=0.0, dropatt=0.0))
    rows = []
    for batch in batch_sizes:
        for length in lengths:
            rows.append(measure(core, batch, length, o["vanilla_calls"], o["xl_calls"]))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    result = {"preset": o["preset"], "config": core.config.to_dict(),
              "device": "cpu" if not tf.config.list_physical_devices("GPU") else "gpu",
              "cpu_threads": os.cpu_count(), "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    try:
        plot(rows, os.path.splitext(o["output"])[0] + ".png")
    except ImportError:
        print("matplotlib not installed: no plot")
    print(f"wrote {o['output']}")


if __name__ == "__main__":
    cli.run(main, SPEC)
