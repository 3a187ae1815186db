r"""A soak of the session table: many sessions that open, read a prompt,
generate and close at random times over one runtime.

    python -m benchmarks.session_soak --export_dir=<a `small` export> --sessions=2000

Seeded: up to `--max_open` sessions are open at once; each tick opens new
ones at random, steps the table once, and closes sessions at random (those
done soon, the others now and then, mid-generation). Each session has its
own prompt (1 to 24 ids), budget (1 to 24 new ids), temperature (greedy or
sampled) and seed. Resident memory is printed every `--report_every`
sessions; after the run every session's ids are checked against the same
session run alone (`runtime.generate([prompt], n, ...)` with its settings
and seed, n the ids it got). The JSON holds the memory curve and the
sessions that differ: equal up to float32 round-off, so a sampled draw
within ~1e-6 of the boundary between two ids may take the other one (once in
21,756 ids at `small`; docs/export-and-serving.md).
"""
import json
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import at_least  # noqa: E402
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from txl_tf.errors import TxlError  # noqa: E402

SPEC = (
    option("string", "export_dir", None, "An export folder (`python -m export`)."),
    option("string", "backend", "onnx", "onnx or saved_model."),
    option("integer", "sessions", 2000, "Sessions opened and closed in all."),
    option("integer", "max_open", 16, "Sessions open at once at most (the table's max_batch)."),
    option("integer", "report_every", 250, "Print resident memory every this many sessions."),
    option("integer", "seed", 0, "The soak's random seed."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "session_soak.json"),
           "JSON results file."),
)


def resident_mb():
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def soak(runtime, sessions, max_open, report_every, seed):
    """Runs the soak; `(results {id: (settings, ids)}, memory curve [(closed, MB)])`."""
    from export import SessionTable
    rng = np.random.default_rng(seed)
    table = SessionTable(runtime, max_batch=max_open)
    live, results, curve = {}, {}, []
    opened = 0
    while len(results) < sessions:
        while opened < sessions and len(live) < max_open and rng.random() < 0.6:
            settings = {"prompt": rng.integers(0, runtime.n_token, rng.integers(1, 25)).tolist(),
                        "max_new_tokens": int(rng.integers(1, 25)),
                        "temperature": float(rng.choice([0.0, 0.8])), "seed": opened}
            table.open(opened, **settings)
            live[opened] = settings
            opened += 1
        table.step()
        running = set(table.active())
        for sid in list(live):
            if rng.random() < (0.5 if sid not in running else 0.02):
                results[sid] = (live.pop(sid), table.close(sid).ids[0].tolist())
                if len(results) % report_every == 0:
                    curve.append((len(results), resident_mb()))
                    print(f"{len(results)} sessions closed: resident {curve[-1][1]:.0f} MB",
                          flush=True)
    return results, curve


def differing(runtime, results):
    """Ids of the sessions whose ids differ from the same session run alone."""
    wrong = []
    for sid, (settings, ids) in results.items():
        if not ids:
            continue
        alone = runtime.generate([settings["prompt"]], len(ids),
                                 temperature=settings["temperature"], seed=settings["seed"])
        if alone.ids[0, :len(ids)].tolist() != ids:
            wrong.append(sid)
    return wrong


def main(argv):
    del argv
    o = values(SPEC)
    at_least(o, 1, "sessions", "max_open", "report_every")
    if not o["export_dir"]:
        raise TxlError("--export_dir is required (an export folder: python -m export)")
    from export import open_runtime
    runtime = open_runtime(o["export_dir"], backend=o["backend"], device="cpu")
    start = time.perf_counter()
    results, curve = soak(runtime, o["sessions"], o["max_open"], o["report_every"], o["seed"])
    seconds = time.perf_counter() - start
    wrong = differing(runtime, results)
    generated = sum(len(ids) for _, ids in results.values())
    print(f"{len(results)} sessions, {generated} ids in {seconds:.0f} s; "
          f"{len(wrong)} differ from the same session alone")
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"settings": o, "seconds": seconds, "generated_ids": generated,
                   "resident_mb_by_sessions_closed": curve, "differing_sessions": wrong}, f,
                  indent=2)


if __name__ == "__main__":
    cli.run(main, SPEC)
