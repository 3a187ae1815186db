r"""What an ONNX Runtime runtime holds in memory with its decode cache open,
and what its weight sharing costs a decode step.

    python -m export --model_dir=<random enwik8_base> --output_dir=/tmp/e8 \
        --formats=onnx --mem_len=2100 --noverify
    python -m benchmarks.runtime_memory --export_dir=/tmp/e8

Three ways of opening the same export (CPU):
- **every session packed**: `session_options` given, so each graph's session
  loads and packs its own copy of the weights (what runtimes did before the
  weights were shared);
- **default**: the two hot paths (the step, the decode step) pack their own
  copies; the other sessions share the export's `model.onnx.data`, mapped once;
- **low_memory**: every session shares it.

For each, in a child process of its own: resident memory added by opening the
runtime, reading a 64-id prompt (`step`), `decode_init` and 8 decode steps,
over the weights' bytes plus the cache's. Then, in one process, the three
runtimes timed in interleaved rounds (min / median / max): `decode_step`, and
`step` of a 64-id segment on the full memory (a prompt read, or evaluation).
Prints a table and writes JSON.
"""
import json
import os
import subprocess
import sys
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import at_least, integer_list  # noqa: E402
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from txl_tf.errors import TxlError  # noqa: E402

SPEC = (
    option("string", "export_dir", None, "An export folder with model.onnx, the decode graphs "
           "and model.onnx.data (`python -m export`)."),
    option("string", "batch_sizes", "1", "Comma-separated batch sizes (three runtimes at once: "
           "at batch 16 and memory 2,100 they need more than 24 GB)."),
    option("integer", "rounds", 15, "Interleaved rounds of 6 decode steps per way."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "runtime_memory.json"),
           "JSON results file."),
)
WAYS = ("every session packed", "default", "low_memory")


def open_way(folder, way):
    """The runtime of `folder` opened the `way` named."""
    import onnxruntime as ort
    from export import open_runtime
    if way == WAYS[0]:
        return open_runtime(folder, device="cpu", session_options=ort.SessionOptions())
    return open_runtime(folder, device="cpu", low_memory=way == "low_memory")


def resident_bytes():
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def measure_memory(folder, way, batch):
    """(Run in a child.) `{"added_mb", "weights_mb", "cache_mb", "ratio"}`."""
    import numpy as np
    import export.onnx_runtime  # noqa: F401  (imports counted in the baseline)
    base = resident_bytes()
    runtime = open_way(folder, way)
    ids = np.random.default_rng(0).integers(0, runtime.n_token, [batch, 64], dtype=np.int32)
    _, memory = runtime.step(ids, runtime.initial_memory(batch))
    cache = runtime.decode_init(memory)
    del memory
    for i in range(8):
        runtime.decode_step(ids[:, i], cache)
    added = resident_bytes() - base
    weights = os.path.getsize(os.path.join(folder, "model.onnx.data"))
    cache_bytes = sum(v.nbytes for v in cache.values())
    return {"added_mb": added / 1e6, "weights_mb": weights / 1e6, "cache_mb": cache_bytes / 1e6,
            "ratio": added / (weights + cache_bytes)}


def measure_steps(folder, batch, rounds):
    """`{way: {min_ms, median_ms, max_ms}}` of `decode_step`, interleaved."""
    import numpy as np
    from export import RuntimeMemory
    runtimes = {way: open_way(folder, way) for way in WAYS}
    config, mem_len = runtimes["default"].config, runtimes["default"].mem_len
    rng = np.random.default_rng(0)
    mems = rng.normal(size=[config.n_layer, batch, mem_len, config.d_model]).astype(np.float32)
    memory = RuntimeMemory(mems, np.ones([batch, mem_len], np.bool_))
    caches = {way: runtime.decode_init(memory) for way, runtime in runtimes.items()}
    ids, segment = np.zeros([batch], np.int32), np.zeros([batch, 64], np.int32)
    steps, segments = ({way: [] for way in WAYS} for _ in range(2))
    for _ in range(rounds + 1):  # the first round warms up
        for way, runtime in runtimes.items():
            for _ in range(6):
                start = time.perf_counter()
                runtime.decode_step(ids, caches[way])
                steps[way].append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            runtime.step(segment, memory)
            segments[way].append((time.perf_counter() - start) * 1e3)
    return {way: {"min_ms": float(np.min(steps[way][6:])),
                  "median_ms": float(np.median(steps[way][6:])),
                  "max_ms": float(np.max(steps[way][6:])),
                  "segment_min_ms": float(np.min(segments[way][1:])),
                  "segment_median_ms": float(np.median(segments[way][1:]))} for way in WAYS}


def main(argv):
    del argv
    o = values(SPEC)
    at_least(o, 1, "rounds")
    if not o["export_dir"] or not os.path.isfile(os.path.join(o["export_dir"],
                                                              "model.onnx.data")):
        raise TxlError("--export_dir must be an export folder holding model.onnx.data "
                       "(python -m export, with its decode graphs)")
    folder = os.path.abspath(o["export_dir"])
    rows = []
    for batch in integer_list(o["batch_sizes"], "batch_sizes", 1, "positive integers"):
        steps = measure_steps(folder, batch, o["rounds"])
        for way in WAYS:
            child = subprocess.run(
                [sys.executable, "-c", "import json, sys; from benchmarks.runtime_memory "
                 "import measure_memory; print(json.dumps(measure_memory(*sys.argv[1:3], "
                 "int(sys.argv[3]))))", folder, way, str(batch)],
                cwd=REPO, capture_output=True, text=True, check=True)
            memory = json.loads(child.stdout.strip().splitlines()[-1])
            rows.append({"batch": batch, "way": way, **memory, **steps[way]})
            print(json.dumps(rows[-1]), flush=True)
    print("| batch | way | added MB | weights + cache MB | ÷ (weights + cache) | "
          "decode_step ms min / median / max | 64-id step ms min / median |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['way']} | {r['added_mb']:.0f} | "
              f"{r['weights_mb']:.0f} + {r['cache_mb']:.0f} | {r['ratio']:.2f} | "
              f"{r['min_ms']:.1f} / {r['median_ms']:.1f} / {r['max_ms']:.1f} | "
              f"{r['segment_min_ms']:.0f} / {r['segment_median_ms']:.0f} |")
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"settings": o, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    cli.run(main, SPEC)
