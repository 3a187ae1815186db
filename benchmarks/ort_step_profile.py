r"""Where an ONNX Runtime decode step's time goes: its profile, per op type.

    python -m benchmarks.ort_step_profile --export_dir=EXPORT_DIR [--batch=1] [--device=cuda] \
        [--steps=30]

Opens the export with ONNX Runtime's profiler on, decodes `--steps` tokens
on a full random memory's cache, and prints per session (`decode_step`,
and the ring's write when the cache is on the device) the time of a run,
the kernels per run and on which provider, and the op types that take
most. TensorFlow not needed. The profile JSON files stay in the working
directory (`ort_step_profile_*.json`).
"""
import collections
import json
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from export import open_runtime  # noqa: E402
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from txl_tf.errors import TxlError  # noqa: E402

SPEC = (
    option("string", "export_dir", None, "The export folder (model.onnx and the decode graphs)."),
    option("integer", "batch", 1, "Rows per step."),
    option("string", "device", "cuda", "ONNX Runtime's device: cuda, cpu or auto."),
    option("integer", "steps", 30, "Decode steps profiled."),
)


def summary(profile_file, top=14):
    """Lines describing one session's profile."""
    with open(profile_file, encoding="utf-8") as f:
        events = json.load(f)
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    runs = max(1, sum(1 for e in events if e.get("cat") == "Session" and
                      e["name"] == "model_run"))
    per_op, providers = collections.defaultdict(lambda: [0, 0]), collections.Counter()
    for e in nodes:
        op = per_op[e["args"].get("op_name", "?")]
        op[0], op[1] = op[0] + e["dur"], op[1] + 1
        providers[e["args"].get("provider", "?")] += 1
    run_us = sum(e["dur"] for e in events if e.get("name") == "model_run") / runs
    lines = [f"  run {run_us:.0f} us, {len(nodes) / runs:.0f} kernels per run "
             f"({', '.join(f'{p}: {n // runs}' for p, n in providers.items())})"]
    for op, (dur, count) in sorted(per_op.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"    {op:24s} {dur / runs:8.0f} us  x{count / runs:.0f}")
    return lines


def run(o):
    import onnxruntime as ort
    if not o["export_dir"]:
        raise TxlError("--export_dir is required")
    batch, steps = o["batch"], o["steps"]
    session_options = ort.SessionOptions()
    session_options.enable_profiling = True
    session_options.profile_file_prefix = f"ort_step_profile_b{batch}"
    runtime = open_runtime(o["export_dir"], device=o["device"],
                           session_options=session_options)
    cfg = runtime.config
    rng = np.random.default_rng(0)
    memory = (rng.normal(size=(cfg.n_layer, batch, runtime.mem_len, cfg.d_model))
              .astype(np.float32), np.ones([batch, runtime.mem_len], np.bool_))
    cache = runtime.decode_init(memory)
    ids, stopped = np.full([batch], 5, np.int32), np.zeros([batch], np.bool_)
    start = time.perf_counter()
    for _ in range(steps):
        runtime.next_cached(ids, stopped, cache)
    print(f"{o['export_dir']} batch {batch} on {runtime.device}: "
          f"{(time.perf_counter() - start) / steps * 1e3:.2f} ms per step (profiling on)")
    sessions = {"decode_step": runtime._decode_session("decode_step")}
    if runtime._writer is not None:
        sessions["ring write"] = runtime._writer
    for name, session in sessions.items():
        print(name)
        print("\n".join(summary(session.end_profiling())))


def main(argv):
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
