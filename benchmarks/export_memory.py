"""Peak resident memory of the export job at the paper's sizes.

For each preset, random weights are written with `txl_tf.weights.save_pretrained`
(in a child process), then `python -m export` (SavedModel + ONNX + parity) runs in
another child whose peak RSS comes from `os.wait4` (that child's own
`ru_maxrss`, not the loader's). Prints a table and writes JSON.

    python -m benchmarks.export_memory --presets=enwik8_base,wt103_base --mem_len=150
"""
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time


from benchmarks.common import BenchmarkError, at_least, names_from, peak_rss_bytes
from txl_tf.app import cli
from txl_tf.app.flagspec import option, values

PAPER_PRESETS = ["small", "enwik8_base", "enwik8_large", "text8", "wt103_base", "wt103_large"]
SPEC = (
    option("list", "presets", PAPER_PRESETS, "TransformerXLConfig presets."),
    option("integer", "mem_len", 150, "--mem_len of the export."),
    option("string", "work_dir", None, "Where model directories and exports go (default: a "
           "temporary folder, removed at the end)."),
    option("float", "max_ratio", 5.0, "Peak RSS allowed, in multiples of the weights' size."),
    option("string", "output", "benchmarks/results/export_memory.json", "JSON results file."),
)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MAKE_MODEL = """
import sys, numpy as np
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf import weights
core = TransformerXL(TransformerXLConfig.preset(sys.argv[1]))
print(sum(int(np.prod(w.shape)) for w in core.weights))
weights.save_pretrained(core, sys.argv[2])
"""


def child_env():
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2",
               CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_measured(command, log_path):
    """`(exit status, peak RSS bytes, seconds)` of `command` (output to `log_path`)."""
    start = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=child_env(), stdout=log,
                                stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, peak_rss_bytes(usage), time.perf_counter() - start


def measure(preset, work_dir, mem_len):
    model_dir = os.path.join(work_dir, f"{preset}_model")
    out = subprocess.run([sys.executable, "-c", MAKE_MODEL, preset, model_dir], cwd=REPO,
                         env=child_env(), capture_output=True, text=True, check=True)
    params = int(out.stdout.strip().splitlines()[-1])
    export_dir = os.path.join(work_dir, f"{preset}_export")
    log_path = os.path.join(work_dir, f"{preset}_export.log")
    status, peak, seconds = run_measured(
        [sys.executable, "-m", "export", f"--model_dir={model_dir}",
         f"--output_dir={export_dir}", f"--mem_len={mem_len}", "--overwrite"], log_path)
    with open(log_path, encoding="utf-8") as f:
        stages = [line.strip() for line in f if line.startswith("[export")]
    files = {}
    if status == 0:
        for root, _, names in os.walk(export_dir):
            for name in names:
                path = os.path.join(root, name)
                files[os.path.relpath(path, export_dir)] = os.path.getsize(path)
    shutil.rmtree(model_dir, ignore_errors=True)
    shutil.rmtree(export_dir, ignore_errors=True)
    weight_bytes = params * 4
    return {"preset": preset, "params": params, "weight_gb": weight_bytes / 1e9,
            "peak_gb": peak / 1e9, "ratio": peak / weight_bytes, "seconds": seconds,
            "exit_status": status, "stages": stages, "files": files}


def table(rows, max_ratio):
    """Markdown table; "above base" subtracts the peak of the smallest model
    (the libraries' own footprint: TensorFlow, tf2onnx, onnxruntime)."""
    base = min(r["peak_gb"] for r in rows)
    lines = ["| preset | params | weights GB | peak RSS GB | peak / weights | "
             "(peak - base) / weights | seconds | ok |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        above = (r["peak_gb"] - base) / r["weight_gb"] if r["peak_gb"] > base else 0.0
        ok = "yes" if r["exit_status"] == 0 and r["ratio"] <= max_ratio else \
            f"no (exit {r['exit_status']})" if r["exit_status"] else "over"
        lines.append(f"| {r['preset']} | {r['params'] / 1e6:.1f} M | {r['weight_gb']:.2f} | "
                     f"{r['peak_gb']:.2f} | {r['ratio']:.2f} | {above:.2f} | {r['seconds']:.0f} | "
                     f"{ok} |")
    return "\n".join(lines)


def check_options(o):
    """Raises `BenchmarkError` naming the first bad flag of the options `o`."""
    at_least(o, 0, "mem_len")
    if not o["max_ratio"] > 0:
        raise BenchmarkError(f"--max_ratio must be positive, got {o['max_ratio']}")
    from txl_tf.config import PRESETS
    names_from(o["presets"], "presets", sorted(PRESETS))


def main(argv):
    del argv
    o = values(SPEC)
    check_options(o)
    work_dir = o["work_dir"] or tempfile.mkdtemp(prefix="export_memory_")
    os.makedirs(work_dir, exist_ok=True)
    rows = []
    try:
        for preset in o["presets"]:
            rows.append(measure(preset, work_dir, o["mem_len"]))
            r = rows[-1]
            print(f"{preset}: exit {r['exit_status']}, peak {r['peak_gb']:.2f} GB "
                  f"({r['ratio']:.2f}x weights), {r['seconds']:.0f}s", flush=True)
    finally:
        if not o["work_dir"]:
            shutil.rmtree(work_dir, ignore_errors=True)
    print(table(rows, o["max_ratio"]))
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"mem_len": o["mem_len"], "max_ratio": o["max_ratio"],
                   "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                   "results": rows}, f, indent=2)
    if any(r["exit_status"] or r["ratio"] > o["max_ratio"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main, SPEC)
