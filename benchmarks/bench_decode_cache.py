r"""Serving long memory: the exported step against the cached decode interface and the bandwidth bound.

    python -m benchmarks.bench_decode_cache [--preset=enwik8_base] [--mem_len=2100] \
        [--tokens=30] [--backends=onnx,saved_model]

Random weights of `--preset` are exported with `--mem_len` (no parity check:
`tests/test_decode_cache_export.py` holds the numbers equal). The memory is
full (every slot valid, random states). Per backend, batch 1, one token per
call: `step_last` (projects the keys and values of every memory slot at every
call) and `decode_step` (the cache: projects only the new token, reads the cached
keys and values once and returns the token's, which the host writes into
the ring in place, as `generate` runs it), median
milliseconds per token over `--tokens` calls after two warm-up calls, and
`decode_init` (projecting the memory once). The bound, measured in the same
run: reading the weights (float32) and the cached keys and values once per
token at this machine's read bandwidth (a numpy sum over 1 GiB, best of 3).
Prints a table and writes JSON.
"""
import json
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402

SPEC = (
    option("string", "preset", "enwik8_base", "Model preset (random weights)."),
    option("integer", "mem_len", 2100, "Memory length fixed in the export."),
    option("integer", "tokens", 30, "Timed calls per path."),
    option("string", "backends", "onnx,saved_model", "Comma-separated: onnx, saved_model."),
    option("string", "work_dir", None, "Where the export goes (default: a temporary folder)."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "decode_cache.json"),
           "Where to write the JSON results."),
)


def read_bandwidth(gib=1, repeats=3):
    """Bytes per second of a numpy sum over `gib` GiB (best of `repeats`)."""
    import numpy as np
    data = np.ones(gib * 2 ** 30 // 4, np.float32)
    best = min(_seconds(lambda: data.sum()) for _ in range(repeats))
    return data.nbytes / best


def _seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def per_token_ms(fn, tokens):
    """Median milliseconds of `fn()` over `tokens` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    return statistics.median(_seconds(fn) for _ in range(tokens)) * 1e3


def time_backend(runtime, memory, tokens):
    import numpy as np
    ids = np.array([[5]], np.int32)
    state = {"memory": memory}

    def step():
        _, state["memory"] = runtime.step_last(ids, state["memory"])
    step_ms = per_token_ms(step, tokens)
    start = time.perf_counter()
    cache = runtime.decode_init(memory)
    init_ms = (time.perf_counter() - start) * 1e3
    stopped = np.zeros([1], np.bool_)

    def decode():  # as `generate` runs it: the cache advanced in place
        runtime.next_cached(ids[:, 0], stopped, cache)
    decode_ms = per_token_ms(decode, tokens)
    return {"step_last_ms": step_ms, "decode_step_ms": decode_ms, "decode_init_ms": init_ms}


def run(o):
    import numpy as np
    from export import open_runtime, run_export
    from txl_tf import TransformerXL, TransformerXLConfig
    from txl_tf.checks.memory_budget import parameter_count
    from txl_tf.weights import save_pretrained
    config = TransformerXLConfig.preset(o["preset"], mem_len=o["mem_len"])
    work = o["work_dir"] or tempfile.mkdtemp(prefix="txl_decode_cache_")
    save_pretrained(TransformerXL(config), os.path.join(work, "model"))
    backends = [b.strip() for b in o["backends"].split(",") if b.strip()]
    formats = tuple({"onnx": "onnx", "saved_model": "saved_model"}[b] for b in backends)
    run_export(os.path.join(work, "out"), os.path.join(work, "model"), formats=formats,
               verify=False, overwrite=True)
    rng = np.random.default_rng(0)
    mems = rng.normal(size=(config.n_layer, 1, o["mem_len"], config.d_model)).astype(np.float32)
    memory = (mems, np.ones([1, o["mem_len"]], np.bool_))
    bandwidth = read_bandwidth()
    weight_bytes = 4 * parameter_count(config)
    cache_bytes = 2 * 4 * config.n_layer * (o["mem_len"] + 1) * config.n_head * config.d_head
    bound_ms = (weight_bytes + cache_bytes) / bandwidth * 1e3
    rows = []
    for backend in backends:
        runtime = open_runtime(os.path.join(work, "out"), backend=backend, device="cpu")
        timing = time_backend(runtime, memory, o["tokens"])
        rows.append({"backend": runtime.backend, **timing,
                     "step_last_over_bound": timing["step_last_ms"] / bound_ms,
                     "decode_step_over_bound": timing["decode_step_ms"] / bound_ms,
                     "speedup": timing["step_last_ms"] / timing["decode_step_ms"]})
        del runtime
    result = {"settings": o, "read_gb_per_s": bandwidth / 1e9, "weight_mb": weight_bytes / 1e6,
              "cache_mb": cache_bytes / 1e6, "bound_ms": bound_ms, "rows": rows}
    print(f"{o['preset']}, memory {o['mem_len']}, batch 1: bound {bound_ms:.2f} ms per token "
          f"(weights {weight_bytes / 1e6:.0f} MB + cached keys and values "
          f"{cache_bytes / 1e6:.0f} MB at {bandwidth / 1e9:.1f} GB/s)")
    print("| backend | step_last ms | decode_step ms | speed-up | step_last / bound | "
          "decode_step / bound | decode_init ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['step_last_ms']:.1f} | {r['decode_step_ms']:.2f} | "
              f"{r['speedup']:.1f}x | {r['step_last_over_bound']:.1f} | "
              f"{r['decode_step_over_bound']:.1f} | {r['decode_init_ms']:.0f} |")
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)


def main(argv):
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
