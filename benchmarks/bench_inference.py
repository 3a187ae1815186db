"""Inference latency: Keras core (tf.function) vs reloaded SavedModel vs ONNX Runtime.

Two workloads, each with the memory carried from call to call:
  decode  one token per call (segment length 1), as in generation;
  score   one segment of `tgt_len` tokens per call, as in evaluation.
Every call returns the log-probs (decode) or NLL (score) to the host; the memory
stays in the backend's tensors. Reports median / p90 / p99 per-call latency after
warm-up, and each backend's median relative to the Keras core in the same run.

    python -m benchmarks.bench_inference --preset=small --batch_sizes=1,16 \
        --iters=100 --output=benchmarks/results/inference.json
"""
import json
import os
import platform
import tempfile
import time

import numpy as np
from absl import logging

from benchmarks.common import BenchmarkError, at_least, integer_list, names_from
from txl_tf.app import cli
from txl_tf.app.flagspec import option, values

BACKENDS = ["keras", "saved_model", "onnx"]
WORKLOADS = ["decode", "score"]
DEVICES = ["auto", "cpu", "cuda"]
SPEC = (
    option("string", "preset", "small", "TransformerXLConfig preset (random weights)."),
    option("list", "batch_sizes", ["1", "16"], "Batch sizes."),
    option("integer", "mem_len", None, "Memory length (default: the preset's)."),
    option("integer", "tgt_len", None, "Segment length of the score workload (default: the "
           "preset's)."),
    option("integer", "iters", 100, "Timed calls per measurement."),
    option("integer", "warmup", None, "Untimed calls first (default mem_len // tgt_len + 2, "
           "at least 5)."),
    option("list", "backends", BACKENDS, "Backends to time."),
    option("list", "workloads", WORKLOADS, "Workloads to time."),
    option("string", "device", "auto", "auto, cpu or cuda."),
    option("integer", "intra_op_threads", 0, "Intra-op threads for TensorFlow and ONNX "
           "Runtime (0: each library's default)."),
    option("bool", "ort_spinning", False, "Let ONNX Runtime's idle threads spin-wait (its "
           "default; on a shared or oversubscribed CPU it steals time from every "
           "other thread, so it is off unless asked for)."),
    option("string", "output", "benchmarks/results/inference.json", "JSON results file."),
)


class KerasBaseline:
    """The core itself under `tf.function`, shaped like a runtime."""

    backend = "keras"

    def __init__(self, core, mem_len):
        import tensorflow as tf
        from txl_tf import Memory
        self.core, self.mem_len = core, mem_len
        cfg = core.config
        ids = tf.TensorSpec([None, None], tf.int32)
        mems = tf.TensorSpec([cfg.n_layer, None, mem_len, cfg.d_model], tf.float32)
        mask = tf.TensorSpec([None, mem_len], tf.bool)

        @tf.function(input_signature=[ids, mems, mask])
        def step(token_ids, states, valid):
            log_probs, new = core(token_ids, Memory(states, valid), training=False)
            return log_probs, new.mems, new.mem_mask

        @tf.function(input_signature=[ids, ids, mems, mask])
        def score(token_ids, targets, states, valid):
            nll, new = core(token_ids, Memory(states, valid), targets=targets, training=False)
            return nll, new.mems, new.mem_mask

        self._step, self._score, self._tf = step, score, tf

    def initial_memory(self, batch_size):
        return tuple(self.core.initial_memory(batch_size, self.mem_len))

    def step(self, ids, memory):
        log_probs, states, valid = self._step(self._tf.constant(ids), *memory)
        return log_probs.numpy(), (states, valid)

    def score(self, ids, targets, memory):
        nll, states, valid = self._score(self._tf.constant(ids), self._tf.constant(targets),
                                         *memory)
        return nll.numpy(), (states, valid)


def time_interleaved(backends, workload, batch, seg_len, n_token, iters, warmup, block=10,
                     seed=0):
    """`{backend: per-call latencies in ms}`: `warmup` untimed calls each, then
    `iters` timed calls each, taken in alternating blocks of `block` calls so
    that load from elsewhere on the machine hits every backend alike. Each
    backend carries its own memory from call to call."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, n_token, (warmup + iters, batch, seg_len), dtype=np.int32)
    targets = rng.integers(0, n_token, (batch, seg_len), dtype=np.int32)
    memory = {name: rt.initial_memory(batch) for name, rt in backends.items()}
    times = {name: [] for name in backends}
    done = {name: 0 for name in backends}

    def call(name, rt, i):
        start = time.perf_counter()
        if workload == "decode":
            _, memory[name] = rt.step(ids[i], memory[name])
        else:
            _, memory[name] = rt.score(ids[i], targets, memory[name])
        return (time.perf_counter() - start) * 1e3

    for name, rt in backends.items():
        for i in range(warmup):
            call(name, rt, i)
    while min(done.values()) < iters:
        for name, rt in backends.items():
            for _ in range(min(block, iters - done[name])):
                times[name].append(call(name, rt, warmup + done[name]))
                done[name] += 1
    return {name: np.array(t) for name, t in times.items()}


def summarize(times, batch, seg_len):
    median = float(np.median(times))
    return {"median_ms": median, "p90_ms": float(np.percentile(times, 90)),
            "p99_ms": float(np.percentile(times, 99)), "mean_ms": float(times.mean()),
            "tokens_per_s": batch * seg_len / median * 1e3}


def ort_session_options(threads, spinning):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return options


def build_backends(core, mem_len, names, device, workdir, session_options=None):
    from export import export_onnx, export_saved_model, open_runtime
    backends = {}
    if "keras" in names:
        backends["keras"] = KerasBaseline(core, mem_len)
    if "saved_model" in names:
        export_saved_model(core, os.path.join(workdir, "saved_model"), mem_len)
        backends["saved_model"] = open_runtime(os.path.join(workdir, "saved_model"),
                                               device=device)
    if "onnx" in names:
        export_onnx(core, os.path.join(workdir, "model.onnx"), mem_len)
        backends["onnx"] = open_runtime(os.path.join(workdir, "model.onnx"), device=device,
                                        session_options=session_options)
    return backends


def format_table(rows):
    header = (f"{'workload':8} {'batch':>5} {'T':>4} {'backend':12} {'median ms':>10} "
              f"{'p90 ms':>9} {'p99 ms':>9} {'tok/s':>10} {'x keras':>8}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['workload']:8} {r['batch']:>5} {r['seg_len']:>4} {r['backend']:12} "
                     f"{r['median_ms']:>10.3f} {r['p90_ms']:>9.3f} {r['p99_ms']:>9.3f} "
                     f"{r['tokens_per_s']:>10.0f} {r.get('latency_vs_keras', float('nan')):>8.2f}")
    return "\n".join(lines)


def check_options(o):
    """The batch sizes of the options `o`, once every flag is checked (a
    `BenchmarkError` names the first bad one)."""
    names_from(o["backends"], "backends", BACKENDS)
    names_from(o["workloads"], "workloads", WORKLOADS)
    if o["device"] not in DEVICES:
        raise BenchmarkError(f"--device must be auto, cpu or cuda, got {o['device']!r}")
    at_least(o, 1, "iters")
    at_least(o, 0, "intra_op_threads")
    for name in ("mem_len", "warmup"):
        if o[name] is not None:
            at_least(o, 0, name)
    if o["tgt_len"] is not None:
        at_least(o, 1, "tgt_len")
    return integer_list(o["batch_sizes"], "batch_sizes", 1, "comma-separated positive integers")


def main(argv):
    del argv
    o = values(SPEC)
    batches = check_options(o)
    import onnxruntime
    import tensorflow as tf
    from txl_tf import TransformerXL, TransformerXLConfig

    if o["intra_op_threads"]:
        tf.config.threading.set_intra_op_parallelism_threads(o["intra_op_threads"])
    cfg = TransformerXLConfig.preset(o["preset"])
    mem_len = cfg.mem_len if o["mem_len"] is None else o["mem_len"]
    tgt_len = cfg.tgt_len if o["tgt_len"] is None else o["tgt_len"]
    warmup = o["warmup"] if o["warmup"] is not None else max(mem_len // tgt_len + 2, 5)
    core = TransformerXL(cfg)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        backends = build_backends(
            core, mem_len, o["backends"], o["device"], workdir,
            ort_session_options(o["intra_op_threads"], o["ort_spinning"]))
        for name, rt in backends.items():
            logging.info("%s: %s", name, getattr(rt, "describe", lambda: "tf.function")())
        for workload in o["workloads"]:
            seg_len = 1 if workload == "decode" else tgt_len
            for batch in batches:
                times = time_interleaved(backends, workload, batch, seg_len, cfg.n_token,
                                         o["iters"], warmup)
                group = [{"workload": workload, "batch": batch, "seg_len": seg_len,
                          "backend": name, **summarize(t, batch, seg_len)}
                         for name, t in times.items()]
                base = next((r for r in group if r["backend"] == "keras"), None)
                for r in group:
                    if base:
                        r["latency_vs_keras"] = r["median_ms"] / base["median_ms"]
                rows.extend(group)
        providers = {n: getattr(rt, "provider", getattr(rt, "device", "tf.function"))
                     for n, rt in backends.items()}
    table = format_table(rows)
    print(table)
    result = {
        "question": "per-call inference latency of the exported models vs the Keras core",
        "settings": {"preset": o["preset"], "mem_len": mem_len, "tgt_len": tgt_len,
                     "iters": o["iters"], "warmup": warmup, "batch_sizes": batches,
                     "device": o["device"], "intra_op_threads": o["intra_op_threads"],
                     "ort_spinning": o["ort_spinning"]},
        "environment": {"tensorflow": tf.__version__, "onnxruntime": onnxruntime.__version__,
                        "cpu_count": os.cpu_count(), "platform": platform.platform(),
                        "providers": providers},
        "config": cfg.to_dict(), "results": rows, "table": table,
    }
    if o["output"]:
        os.makedirs(os.path.dirname(o["output"]) or ".", exist_ok=True)
        with open(o["output"], "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {o['output']}")


if __name__ == "__main__":
    cli.run(main, SPEC)
