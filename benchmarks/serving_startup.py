r"""What a serving process pays before its first ids: a fresh Python that
opens an ONNX export with `export.open_runtime` and generates, timed whole
(wall seconds) with its peak resident memory, beside the same process with
TensorFlow and Keras imported first, which is what importing `txl_tf` did
while the package imported TensorFlow itself. Both arms run in the same
run, alternating round by round.

    python -m benchmarks.serving_startup --export_dir=out [--tokens=32] \
        [--rounds=5] [--output=benchmarks/results/serving_startup.json]

`--export_dir`: an export job's output folder holding `model.onnx` (any
preset; `python -m export --model_dir=... --output_dir=out --formats=onnx`).
Each arm's process reports what it loaded: the `serving` arm must load
neither TensorFlow nor Keras (else the run is an error), the baseline loads
both. A row: median [min, max] over the rounds of wall seconds and peak MiB,
and the ratio of the medians.
"""
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.common import BenchmarkError, at_least, write_json
from txl_tf.app import cli
from txl_tf.app.flagspec import option, values

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each arm's process: open the export on the CPU, generate, report. `{first}` is what
# it imports before (nothing, or TensorFlow and Keras).
PROCESS = """
import json, sys
{first}
from benchmarks.common import peak_rss_bytes
from export import open_runtime
ids = open_runtime(sys.argv[1], device="cpu").generate([[1, 2, 3]], int(sys.argv[2]), seed=7).ids
print(json.dumps({{"ids": ids.tolist(), "peak_mib": peak_rss_bytes() / 2 ** 20,
                  "loaded": sorted({{m.split(".")[0] for m in sys.modules}}
                                   & {{"tensorflow", "keras"}})}}))
"""
ARMS = {"serving": "", "tensorflow_first": "import tensorflow, keras"}
TIMEOUT_S = 600


def run_arm(arm, export_dir, tokens):
    """One fresh process of `arm` (`ARMS`). Returns `{"wall_s", "peak_mib",
    "loaded", "ids"}`; a process that fails is a `BenchmarkError`."""
    code = PROCESS.format(first=ARMS[arm])
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, export_dir, str(tokens)], cwd=REPO,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise BenchmarkError(f"the {arm} process failed (exit {done.returncode}): "
                             f"{done.stderr.strip().splitlines()[-1:]}")
    return {"wall_s": wall, **json.loads(done.stdout.strip().splitlines()[-1])}


def spread(values):
    """`{"median", "min", "max"}` of `values`."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(export_dir, tokens, rounds):
    """`rounds` rounds, each running every arm once in turn. Returns the
    result: per arm its spread of wall seconds and peak MiB and what it
    loaded, and the ratios of the medians (serving / tensorflow_first)."""
    runs = {arm: [] for arm in ARMS}
    for _ in range(rounds):
        for arm in ARMS:
            runs[arm].append(run_arm(arm, export_dir, tokens))
    ids = {json.dumps(run["ids"]) for arm_runs in runs.values() for run in arm_runs}
    if len(ids) != 1:
        raise BenchmarkError("the arms generated different ids from the same export")
    if any(run["loaded"] for run in runs["serving"]):
        raise BenchmarkError("the serving process loaded "
                             f"{', '.join(runs['serving'][0]['loaded'])}")
    arms = {arm: {"wall_s": spread([r["wall_s"] for r in arm_runs]),
                  "peak_mib": spread([r["peak_mib"] for r in arm_runs]),
                  "loaded": arm_runs[0]["loaded"]} for arm, arm_runs in runs.items()}
    ratios = {figure: arms["serving"][figure]["median"] / arms["tensorflow_first"][figure][
        "median"] for figure in ("wall_s", "peak_mib")}
    return {"question": "a fresh serving process's wall seconds and peak memory, opening an "
                        "ONNX export and generating, with and without TensorFlow loaded",
            "export_dir": os.path.abspath(export_dir), "tokens": tokens, "rounds": rounds,
            "arms": arms, "ratios": ratios}


def table(result):
    """The result as text, a row an arm, then the ratios."""
    lines = [f"{'arm':<17} {'wall s: median [min, max]':<27} {'peak MiB: median [min, max]':<29}"
             " loaded"]
    for arm, row in result["arms"].items():
        wall, peak = row["wall_s"], row["peak_mib"]
        wall_cell = f"{wall['median']:.2f} [{wall['min']:.2f}, {wall['max']:.2f}]"
        peak_cell = f"{peak['median']:.0f} [{peak['min']:.0f}, {peak['max']:.0f}]"
        lines.append(f"{arm:<17} {wall_cell:<27} {peak_cell:<29} {', '.join(row['loaded']) or '-'}")
    ratios = result["ratios"]
    lines.append(f"serving / tensorflow_first: wall {ratios['wall_s']:.3f}, "
                 f"peak {ratios['peak_mib']:.3f}")
    return "\n".join(lines)


SPEC = (
    option("string", "export_dir", None, "An export job's output folder holding model.onnx."),
    option("integer", "tokens", 32, "Ids each process generates after a 3-id prompt."),
    option("integer", "rounds", 5, "Rounds, each running both arms once in turn."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results",
                                            "serving_startup.json"), "Where the JSON goes."),
)


def main(argv):
    del argv
    o = values(SPEC)
    at_least(o, 1, "tokens", "rounds")
    if not o["export_dir"] or not os.path.isfile(os.path.join(o["export_dir"], "model.onnx")):
        raise BenchmarkError(f"--export_dir must be an export folder holding model.onnx, "
                             f"got {o['export_dir']!r}")
    result = measure(o["export_dir"], o["tokens"], o["rounds"])
    print(table(result))
    write_json(o["output"], result)


if __name__ == "__main__":
    cli.run(main, SPEC)
