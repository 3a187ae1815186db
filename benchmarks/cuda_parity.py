r"""The ONNX Runtime decode on CUDA against the CPU, where a GPU is lent.

    python -m benchmarks.cuda_parity --exports=EXPORT_DIR[,EXPORT_DIR...] [--steps=40] \
        [--output=benchmarks/results/cuda_parity.json]

Per export (TensorFlow not needed): the runtime on CUDA with its decode
cache on the GPU (`device_cache`, steps replayed as CUDA graphs), the same
without graphs, the same with TF32 matmuls, on CUDA with
the cache in host memory, and on the CPU provider (the host cache, what CI
tests) decode the same rows from the same full random memory (batch 2, one
row stopping halfway, the ring wrapping when `--steps` exceeds the
memory): the largest log-prob difference to the CPU over the steps,
whether the GPU ring's buffers stayed in place, and greedy `generate` (a
prompt, then a next turn on the held cache): the share of ids equal to
the CPU's (near-ties of a random model may go either way) and whether the
device cache's ids equal the host cache's on the same GPU. Prints a table
and writes JSON; ends with an error when a difference (TF32 aside) exceeds
`--tolerance`, a buffer moved, or the two GPU caches' ids differ.
"""
import json
import os
import sys

import numpy as np


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from export import open_runtime  # noqa: E402
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from txl_tf.errors import TxlError  # noqa: E402

SPEC = (
    option("string", "exports", None, "Comma-separated export folders (model.onnx and the decode "
           "graphs)."),
    option("integer", "steps", 40, "Decode steps compared (batch 2)."),
    option("float", "tolerance", 1e-3, "Largest log-prob difference to the CPU allowed (TF32 "
           "aside)."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "cuda_parity.json"),
           "Where to write the JSON results."),
)


def compare(path, steps, seed=0):
    """`{...}` of one export (see the module's docstring)."""
    runtimes = {"cpu": open_runtime(path, device="cpu"),
                "gpu": open_runtime(path, device="cuda", device_cache=True),
                "gpu_no_graph": open_runtime(path, device="cuda", device_cache=True,
                                             cuda_graph=False),
                "gpu_host": open_runtime(path, device="cuda", device_cache=False),
                "gpu_tf32": open_runtime(path, device="cuda", device_cache=True, tf32=True)}
    if runtimes["gpu"].device != "cuda":
        raise TxlError("the CUDA provider did not load (see the warning above)")
    cpu = runtimes["cpu"]
    cfg, rng = cpu.config, np.random.default_rng(seed)
    memory = (rng.normal(size=(cfg.n_layer, 2, cpu.mem_len, cfg.d_model)).astype(np.float32),
              np.ones([2, cpu.mem_len], np.bool_))
    caches = {name: rt.decode_init(memory) for name, rt in runtimes.items()}
    buffers = {name: caches["gpu_no_graph"][name].data_ptr()
               for name in ("cache_mems", "keys", "values")}
    worst = {name: 0.0 for name in runtimes if name != "cpu"}
    for t in range(steps):
        ids = rng.integers(0, cfg.n_token, [2])
        stopped = np.array([False, t >= steps // 2])
        out = {name: rt.decode_step(ids, caches[name], stopped)[0]
               for name, rt in runtimes.items()}
        for name in worst:
            worst[name] = max(worst[name], float(np.abs(out[name][0] - out["cpu"][0]).max()))
    in_place = all(caches["gpu_no_graph"][name].data_ptr() == ptr
                   for name, ptr in buffers.items())
    prompts = [list(rng.integers(0, cfg.n_token, 12)), list(rng.integers(0, cfg.n_token, 5))]
    ids = {}
    for name in ("cpu", "gpu", "gpu_host"):  # gpu: replaying CUDA graphs
        first = runtimes[name].generate(prompts, 16, temperature=0.0)
        turn = runtimes[name].generate([[1, 2, 3], [4]], 16, resume=first.state,
                                       temperature=0.0)
        ids[name] = np.concatenate([first.ids, turn.ids], 1)
    return {"export": path, "steps": steps, "max_diff_device_cache": worst["gpu"],
            "max_diff_no_graph": worst["gpu_no_graph"], "replays_graphs": runtimes["gpu"].cuda_graph,
            "max_diff_host_cache": worst["gpu_host"], "max_diff_tf32": worst["gpu_tf32"],
            "ring_in_place": in_place,
            "greedy_ids_gpu_equal_cpu": float((ids["cpu"] == ids["gpu"]).mean()),
            "greedy_ids_device_equal_host_cache": bool(np.array_equal(ids["gpu"],
                                                                      ids["gpu_host"]))}


def run(o):
    paths = [p.strip() for p in (o["exports"] or "").split(",") if p.strip()]
    if not paths:
        raise TxlError("--exports is required (comma-separated export folders)")
    rows = [compare(path, o["steps"]) for path in paths]
    print("| export | steps | max diff, cache on GPU, CUDA graphs | no graphs | cache on host | "
          "with TF32 | ring in place | greedy ids = CPU's | = host cache's on GPU |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['export']} | {r['steps']} | {r['max_diff_device_cache']:.1e} | "
              f"{r['max_diff_no_graph']:.1e} | "
              f"{r['max_diff_host_cache']:.1e} | {r['max_diff_tf32']:.1e} | "
              f"{r['ring_in_place']} | {r['greedy_ids_gpu_equal_cpu']:.0%} | "
              f"{r['greedy_ids_device_equal_host_cache']} |")
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"settings": o, "rows": rows}, f, indent=2)
    bad = [r["export"] for r in rows if max(r["max_diff_device_cache"], r["max_diff_no_graph"],
                                            r["max_diff_host_cache"]) > o["tolerance"]
           or not r["ring_in_place"] or not r["greedy_ids_device_equal_host_cache"]]
    if bad:
        raise TxlError(f"the GPU disagrees with the CPU on {', '.join(bad)} (see the table)")


def main(argv):
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
