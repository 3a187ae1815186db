r"""The host's (Python's) overhead of the serving and generation calls a GPU
user makes per token (issue 53), measured on the CPU, where the graphs cost
almost nothing: µs per call of each verb against the bare
`run_with_iobinding` of the same graphs over the same bound buffers (the
floor), measured in the same run.

    python -m benchmarks.host_overhead [--mem_lens=4,64] [--verbs=decode_step,generate] \
        [--calls=2000] [--rounds=5] [--compare_ref=main] [--profile] \
        [--output=benchmarks/results/host_overhead.json]

A tiny model (1 layer, d_model 8, vocabulary 16; random weights) is exported
once per memory length (`--export_dir`: reuse those exports, `<dir>/m<mem_len>/out`),
and opened on the CPU provider with the cache on the device and
`cuda_graph=True`: the fixed-buffer path a GPU replays, without a capture.
The verbs (`VERBS`): `decode_step` (the public call, its checks),
`next_cached` (what the decode loops call per token), `generate` (per token:
a call of 1 + `GENERATE_TOKENS` new ids less a call of 1, over
`GENERATE_TOKENS`), `table_1` and `table_16` (`SessionTable.step` with 1 and 16
sessions on the device slab), `step` (one id on a memory the runtime keeps,
the fixed-shape segment). Each floor is the runs of that verb's graphs alone
(`decode_token` and the move of the ring position, per token; the segment).

Each round times every verb and its floor in turn (`--calls` calls each);
a row is the median over `--rounds` of µs per call, of the floor, and of
their difference ("over"), with the spread of the difference. With
`--compare_ref=REF` the code of that git ref (its `export/` and `txl_tf/`)
runs the same verbs on the same exports in a second process, the two
processes alternating round by round: "before" and "after" side by side.
`--profile` adds each verb's busiest functions (cProfile: own µs per
call and calls per call) to the table and the JSON.
"""
import cProfile
import json
import os
import pstats
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from txl_tf.app.flagspec import option

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(1, REPO)

VERBS = ("decode_step", "next_cached", "generate", "table_1", "table_16", "step")
GENERATE_TOKENS = 32
# The tiny model's config (TransformerXLConfig.preset("tiny", ...) overrides).
TINY = dict(n_layer=1, d_model=8, n_head=2, d_head=4, d_inner=16, n_token=16, tgt_len=4)
PROFILED = 12  # functions listed per verb
CHUNKS = 10  # pieces a round's calls of a verb and of its floor alternate in
WORKER_TIMEOUT_S = 600  # one answer of a worker


# ------------------------------------------------------------ the verbs
def open_tiny(export_dir):
    """The device-path runtime of the export in `export_dir` (CPU provider)."""
    from export import open_runtime
    return open_runtime(export_dir, device="cpu", device_cache=True, cuda_graph=True)


def token_floor(steps):
    """The runs of one device step's graphs over `steps` (a `FixedStep`)
    alone: `decode_token` (or the step and the ring's write of an export
    made before it) and the move."""
    sessions, options = steps.sessions, steps.run_options
    if steps.token_binding is not None:
        runs = [(sessions["token"], steps.token_binding)]
    else:
        runs = [(sessions["step"], steps.step_binding), (sessions["write"], steps.write_binding)]
    runs.append((sessions["move"], steps.move_binding))

    def floor():
        for session, binding in runs:
            session.run_with_iobinding(binding, options)
    return floor


def make_verb(runtime, name):
    """`(verb, floor, base)`: callables of one call of `name` on `runtime`, of
    its graphs alone, and (generate) of the part not counted per token, or
    None. The verb is called once here (what a first call opens)."""
    import numpy as np
    from export import SessionTable
    if name in ("decode_step", "next_cached"):
        cache = runtime.decode_init(runtime.initial_memory(1))
        ids, stopped = np.array([3]), np.zeros(1, np.bool_)
        backend = runtime._generation
        verb = (lambda: runtime.decode_step(ids, cache)) if name == "decode_step" else \
            (lambda: backend.next_cached(ids, stopped, cache))
        verb()
        return verb, token_floor(runtime._residents[1].steps), None
    if name.startswith("table_"):
        sessions = int(name[len("table_"):])
        table = SessionTable(runtime, max_batch=max(16, sessions))
        for i in range(sessions):
            table.open(i, [1, 2, 3], max_new_tokens=2 ** 30, temperature=1.0, seed=i)
        table.step()
        return table.step, token_floor(table.slab._steps[sessions]), None
    if name == "generate":
        def run(count):
            return lambda: runtime.generate([[1, 2, 3]], count, temperature=1.0, seed=1)
        verb = run(1 + GENERATE_TOKENS)
        verb()
        floor = token_floor(runtime._residents[1].steps)
        return verb, floor, run(1)
    if name == "step":
        ids, state = np.array([[3]]), {"memory": runtime.initial_memory(1)}

        def verb():
            state["memory"] = runtime.step(ids, state["memory"])[1]
        for _ in range(3):  # the second call of a shape opens its fixed-shape session
            verb()
        segment = runtime._fixed[(1, 1)]
        return verb, lambda: segment.session.run_with_iobinding(segment.binding,
                                                                segment.run_options), None
    raise ValueError(f"unknown verb {name!r}")


def per_call_us(fn, calls):
    """µs per call of `calls` calls of `fn`."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def time_verb(made, calls):
    """`{"us", "floor_us"}` of one round: the verb and its floor in
    `CHUNKS` alternating pieces (per token for generate: the long call less
    the short one)."""
    verb, floor, base = made
    pieces = {"us": [], "floor_us": []}
    if base is None:
        size = max(1, calls // CHUNKS)
        for _ in range(CHUNKS):
            pieces["us"].append(per_call_us(verb, size))
            pieces["floor_us"].append(per_call_us(floor, size))
    else:
        size = max(1, calls // GENERATE_TOKENS // CHUNKS)
        for _ in range(CHUNKS):
            long, short = per_call_us(verb, size), per_call_us(base, size)
            pieces["us"].append((long - short) / GENERATE_TOKENS)
            pieces["floor_us"].append(per_call_us(floor, size * GENERATE_TOKENS))
    return {name: statistics.fmean(values) for name, values in pieces.items()}


def profile_verb(made, calls):
    """The verb's `PROFILED` busiest functions: `[{"function", "own_us",
    "calls"}]`, per call of the verb (cProfile's own time, which it inflates)."""
    verb = made[0]
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        verb()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:PROFILED]
    return [{"function": short_name(key), "own_us": round(tottime / calls * 1e6, 2),
             "calls": round(ncalls / calls, 2)}
            for key, (_, ncalls, tottime, _, _) in rows]


def short_name(key):
    """`file:line(function)` of a cProfile key, the path from the package on."""
    path, line, function = key
    if path == "~":
        return function
    parts = path.replace("\\", "/").split("/")
    for top in ("export", "txl_tf", "benchmarks", "onnxruntime", "numpy"):
        if top in parts:
            path = "/".join(parts[len(parts) - 1 - parts[::-1].index(top):])
            break
    else:  # the standard library's, or elsewhere: its folder and file
        path = "/".join(parts[-2:])
    return f"{path}:{line}({function})"


def serve(stream_in=sys.stdin, stream_out=sys.stdout):
    """A worker: each line in is `{"export_dir", "verb", "calls"}` (or
    `{"profile": true, ...}`), each line out its `time_verb` (or
    `profile_verb`) result, or `{"error": ...}`."""
    made = {}
    for line in stream_in:
        ask = json.loads(line)
        key = (ask["export_dir"], ask["verb"])
        try:
            if key not in made:
                runtime = made.get(ask["export_dir"]) or open_tiny(ask["export_dir"])
                made[ask["export_dir"]] = runtime
                made[key] = make_verb(runtime, ask["verb"])
            answer = profile_verb(made[key], ask["calls"]) if ask.get("profile") else \
                time_verb(made[key], ask["calls"])
        except Exception as error:  # reported to the main process, which stops
            answer = {"error": f"{type(error).__name__}: {error}"}
        stream_out.write(json.dumps(answer) + "\n")
        stream_out.flush()


# ----------------------------------------------------------- the summary
def summarize(samples):
    """One row's figures from its rounds' `time_verb` results: medians of
    µs, floor and over (their difference, round by round), over's spread,
    and the best round's (the least disturbed on a shared machine):
    `over_best_us`, the fastest verb round less the fastest floor round."""
    over = [s["us"] - s["floor_us"] for s in samples]
    return {"us": statistics.median(s["us"] for s in samples),
            "floor_us": statistics.median(s["floor_us"] for s in samples),
            "over_us": statistics.median(over), "over_min_us": min(over),
            "over_max_us": max(over),
            "over_best_us": min(s["us"] for s in samples) - min(s["floor_us"] for s in samples),
            "rounds": len(samples)}


def compare(rows):
    """Each "after" row with the "before" row's overs (`over_before_us`,
    `over_best_before_us`) of its verb and memory, where one ran, and
    after ÷ before of each (`over_ratio`, `over_best_ratio`; None where
    before's is not above 0)."""
    before = {(r["verb"], r["mem_len"]): r for r in rows if r["code"] == "before"}
    for row in rows:
        old = before.get((row["verb"], row["mem_len"]))
        if row["code"] == "after" and old:
            row["over_before_us"] = old["over_us"]
            row["over_best_before_us"] = old["over_best_us"]
            for ratio, name in (("over_ratio", "over_us"), ("over_best_ratio", "over_best_us")):
                row[ratio] = (round(row[name] / old[name], 3) if old[name] > 0 else None)
    return rows


def table(rows):
    """The Markdown table of `rows` (`summarize`d, `compare`d)."""
    lines = ["| verb | memory | code | µs per call | floor µs | over the floor µs (spread) "
             "| best round's over µs | after ÷ before (median / best) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratios = " / ".join("–" if r.get(name) is None else f"{r[name]:.2f}"
                            for name in ("over_ratio", "over_best_ratio"))
        lines.append(f"| {r['verb']} | {r['mem_len']} | {r['code']} | {r['us']:.1f} | "
                     f"{r['floor_us']:.1f} | {r['over_us']:.1f} ({r['over_min_us']:.1f}–"
                     f"{r['over_max_us']:.1f}) | {r['over_best_us']:.1f} | "
                     f"{ratios if 'over_before_us' in r else ''} |")
    return "\n".join(lines)


def profile_table(profiles):
    """Each verb's busiest functions, one Markdown table per verb."""
    out = []
    for (verb, mem_len, code), functions in profiles.items():
        out.append(f"\n{verb}, memory {mem_len}, {code} (cProfile, per call):\n")
        out.append("| function | own µs | calls |\n|---|---|---|")
        out += [f"| {f['function']} | {f['own_us']:.2f} | {f['calls']:g} |" for f in functions]
    return "\n".join(out)


# ---------------------------------------------------------------- the run
class Worker:
    """A `serve` process over the code in `code_dir` (its `export` and
    `txl_tf` first on the path; this benchmark's own module from here)."""

    def __init__(self, code_dir):
        program = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
                   "from benchmarks.host_overhead import serve; serve()")
        env = dict(os.environ, PYTHONPATH="", TF_CPP_MIN_LOG_LEVEL="2")
        self.process = subprocess.Popen([sys.executable, "-c", program, code_dir, REPO],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env, cwd=tempfile.gettempdir())

    def ask(self, **question):
        self.process.stdin.write(json.dumps(question) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], WORKER_TIMEOUT_S)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            raise BenchmarkFailure(f"a worker gave no answer to {question} (exit status "
                                   f"{self.process.poll()})")
        answer = json.loads(line)
        if isinstance(answer, dict) and "error" in answer:
            raise BenchmarkFailure(f"{question['verb']}: {answer['error']}")
        return answer

    def close(self):
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class BenchmarkFailure(Exception):
    """A worker failed (its error, or no answer)."""


def export_tiny(folder, mem_len):
    """Exports a random tiny model (`TINY`) of memory `mem_len` into `folder/out`."""
    from benchmarks.long_memory import export_random
    from txl_tf import TransformerXL, TransformerXLConfig
    config = TransformerXLConfig.preset("tiny", mem_len=mem_len, **TINY)
    export_random(TransformerXL(config), folder, formats=["onnx"])


def code_of_ref(ref, into):
    """The `export/` and `txl_tf/` of the git ref `ref`, unpacked into `into`."""
    try:
        archive = subprocess.run(["git", "-C", REPO, "archive", ref, "export", "txl_tf"],
                                 capture_output=True, check=True).stdout
    except subprocess.CalledProcessError as error:
        from benchmarks.common import BenchmarkError
        raise BenchmarkError(f"--compare_ref={ref}: git archive failed: "
                             f"{error.stderr.decode(errors='replace').strip()}") from None
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def measure(exports, verbs, calls, rounds, codes, profile=False):
    """`(rows, profiles)`: every verb on every export (`{mem_len: dir}`) in
    each of `codes` (`{name: code dir}`), in `rounds` rounds, the codes'
    workers taking turns (their order swapped each round)."""
    workers = {name: Worker(code) for name, code in codes.items()}
    try:
        samples = {}
        order = list(workers)
        for turn in range(rounds):
            for name in (order if turn % 2 == 0 else order[::-1]):
                for mem_len, folder in exports.items():
                    for verb in verbs:
                        samples.setdefault((verb, mem_len, name), []).append(
                            workers[name].ask(export_dir=folder, verb=verb, calls=calls))
        profiles = {}
        if profile:
            for name, worker in workers.items():
                for mem_len, folder in exports.items():
                    for verb in verbs:
                        profiles[(verb, mem_len, name)] = worker.ask(
                            export_dir=folder, verb=verb, profile=True,
                            calls=max(1, calls // (GENERATE_TOKENS if verb == "generate"
                                                   else 1)))
    finally:
        for worker in workers.values():
            worker.close()
    rows = [{"verb": verb, "mem_len": mem_len, "code": name, **summarize(found)}
            for (verb, mem_len, name), found in samples.items()]
    return compare(rows), profiles


SPEC = (
    option("string", "mem_lens", "4,64", "Comma-separated memory lengths (one tiny export "
           "each)."),
    option("string", "verbs", ",".join(VERBS), "Comma-separated verbs: "
           + ", ".join(VERBS) + "."),
    option("integer", "calls", 2000, "Calls timed per verb, floor and round (generate: "
           f"tokens, in calls of {GENERATE_TOKENS})."),
    option("integer", "rounds", 5, "Rounds (medians over them; with --compare_ref the "
           "two codes alternate round by round)."),
    option("string", "compare_ref", None, "A git ref whose export/ and txl_tf/ run the "
           "same verbs beside this tree's (before and after)."),
    option("bool", "profile", False, "Also list each verb's busiest functions (cProfile)."),
    option("string", "export_dir", None, "Reuse the exports in this folder "
           "(m<mem_len>/out), made here when absent; default: a temporary folder."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results",
                                            "host_overhead.json"),
           "Where to write the JSON results."),
)


def main(argv):
    del argv
    from benchmarks.common import at_least, integer_list, names_from, write_json
    from txl_tf.app.flagspec import values
    o = values(SPEC)
    at_least(o, 1, "calls", "rounds")
    mem_lens = integer_list(o["mem_lens"], "mem_lens", 1, "comma-separated integers >= 1")
    verbs = names_from([v.strip() for v in o["verbs"].split(",") if v.strip()], "verbs", VERBS)
    work = o["export_dir"] or tempfile.mkdtemp(prefix="host_overhead_")
    ref_dir = tempfile.mkdtemp(prefix="host_overhead_ref_") if o["compare_ref"] else None
    try:
        codes = {"after" if ref_dir else "this": REPO}
        if ref_dir:
            codes = {"before": code_of_ref(o["compare_ref"], ref_dir), **codes}
        exports = {}
        for mem_len in mem_lens:
            folder = os.path.join(work, f"m{mem_len}")
            if not os.path.isfile(os.path.join(folder, "out", "model.onnx")):
                export_tiny(folder, mem_len)
            exports[mem_len] = os.path.join(folder, "out")
        rows, profiles = measure(exports, verbs, o["calls"], o["rounds"], codes, o["profile"])
    finally:
        if not o["export_dir"]:
            shutil.rmtree(work, ignore_errors=True)
        if ref_dir:
            shutil.rmtree(ref_dir, ignore_errors=True)
    rows.sort(key=lambda r: (VERBS.index(r["verb"]), r["mem_len"], r["code"] != "before"))
    print(table(rows))
    if profiles:
        print(profile_table(profiles))
    result = {"model": TINY, "mem_lens": mem_lens, "calls": o["calls"], "rounds": o["rounds"],
              "compare_ref": o["compare_ref"], "generate_tokens": GENERATE_TOKENS,
              "cpu_threads": os.cpu_count(), "rows": rows,
              "profiles": [{"verb": v, "mem_len": m, "code": c, "functions": f}
                           for (v, m, c), f in profiles.items()]}
    write_json(o["output"], result)


if __name__ == "__main__":
    from txl_tf.app import cli
    cli.run(main, SPEC)
