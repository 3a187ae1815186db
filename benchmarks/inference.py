r"""Inference speed: per-call latency, generation throughput, and keras-hub's
int8 and LoRA. One suite in parts (`--part`); every part prints a table and
writes JSON:

    python -m benchmarks.inference [--part=latency] --preset=small --batch_sizes=1,16 \
        --iters=100 --output=benchmarks/results/inference.json
    python -m benchmarks.inference --part=generate --preset=small --batch_sizes=1,16 \
        --new_tokens=64 --repeats=5 --output=benchmarks/results/generate.json
    python -m benchmarks.inference --part=keras_hub --model_dir=pystdlib_small

- `latency` (default): the Keras core (tf.function) against the reloaded
  SavedModel and ONNX Runtime, decode and score calls (`run_latency`);
- `generate`: tokens/s of the old per-token loop, the compiled `Decoder`,
  keras-hub's `generate` and the export runtimes (`run_generate`);
- `keras_hub`: int8 and LoRA of the keras-hub causal LM on a trained model
  (`run_keras_hub`);
- `decode_nodes`: the exported cached decode step's ONNX nodes per layer and
  its CPU time, beside another commit's (`run_decode_nodes`);
- `profile`: an export's decode step and segment graph profiled by op
  type, on the CPU or CUDA (`run_profile`).
"""
import collections
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np
from absl import logging

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks import throughput as tp  # noqa: E402
from benchmarks.common import (BenchmarkError, at_least, integer_list, names_from,  # noqa: E402
                               run_part, suite_spec)
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402


# ------------------------------------------------------------------- latency
LATENCY_BACKENDS = ["keras", "saved_model", "onnx"]
WORKLOADS = ["decode", "score"]
DEVICES = ["auto", "cpu", "cuda"]
LATENCY_SPEC = (
    option("string", "preset", "small", "TransformerXLConfig preset (random weights)."),
    option("list", "batch_sizes", ["1", "16"], "Batch sizes."),
    option("integer", "mem_len", None, "Memory length (default: the preset's)."),
    option("integer", "tgt_len", None, "Segment length of the score workload (default: the "
           "preset's)."),
    option("integer", "iters", 100, "Timed calls per measurement."),
    option("integer", "warmup", None, "Untimed calls first (default mem_len // tgt_len + 2, "
           "at least 5)."),
    option("list", "backends", LATENCY_BACKENDS, "Backends to time."),
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


def check_latency_options(o):
    """The batch sizes of the options `o`, once every flag is checked (a
    `BenchmarkError` names the first bad one)."""
    names_from(o["backends"], "backends", LATENCY_BACKENDS)
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


def run_latency(o):
    r"""`--part=latency`: inference latency: Keras core (tf.function) vs reloaded
    SavedModel vs ONNX Runtime.

    Two workloads, each with the memory carried from call to call:
      decode  one token per call (segment length 1), as in generation;
      score   one segment of `tgt_len` tokens per call, as in evaluation.
    Every call returns the log-probs (decode) or NLL (score) to the host; the memory
    stays in the backend's tensors. Reports median / p90 / p99 per-call latency after
    warm-up, and each backend's median relative to the Keras core in the same run.
    """
    batches = check_latency_options(o)
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
                print(f"{workload} batch {batch}: " + ", ".join(
                    f"{r['backend']} {r['median_ms']:.3f} ms" for r in group),
                    file=sys.stderr, flush=True)
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


# ------------------------------------------------------------------ generate
GENERATE_BACKENDS = ["per_token_loop", "decoder", "decoder_nojit", "causal_lm", "onnx",
                     "onnx_1thread", "saved_model"]
GENERATE_SPEC = (
    option("string", "preset", "small", "TransformerXLConfig preset (random weights)."),
    option("list", "batch_sizes", ["1", "16"], "Batch sizes."),
    option("integer", "prompt_len", 16, "Prompt length."),
    option("integer", "new_tokens", 64, "Tokens generated per run."),
    option("integer", "repeats", 5, "Timed runs per backend (after one warm-up run)."),
    option("float", "temperature", 1.0, "Sampling temperature (0: greedy)."),
    option("list", "backends", GENERATE_BACKENDS, "Backends to time (onnx_1thread: a session "
           "with one intra-op thread)."),
    option("string", "output", "benchmarks/results/generate.json", "JSON results file."),
)


class PerTokenLoop:
    """The decoding loop before the compiled decoder (txl_tf/generation/generate.py at
    a3c8cb6): the prompt in segments, then one `tf.function` call per token
    returning `[B, 1, V]` log-probs, sampled in numpy on the host."""

    def __init__(self, core, mem_len):
        import tensorflow as tf
        self.core, self.mem_len, self.segment_len = core, mem_len, core.config.tgt_len

        def last(ids, memory):
            log_probs, memory = core(ids, memory, training=False)
            return log_probs[:, -1], memory
        self._step = tf.function(last, reduce_retracing=True)

    def generate(self, prompt, num_tokens, temperature, seed):
        rng = np.random.default_rng(seed)
        memory = self.core.initial_memory(prompt.shape[0], mem_len=self.mem_len)
        for start in range(0, prompt.shape[1], self.segment_len):
            log_probs, memory = self._step(prompt[:, start:start + self.segment_len], memory)
        out = []
        for _ in range(num_tokens):
            token = _old_sample(log_probs.numpy(), temperature, rng)
            out.append(token)
            log_probs, memory = self._step(token[:, None], memory)
        return np.stack(out, axis=1)


def _old_sample(log_probs, temperature, rng):
    if temperature == 0:
        return np.argmax(log_probs, axis=-1).astype(np.int32)
    probs = np.exp(log_probs / temperature - (log_probs / temperature).max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.array([rng.choice(len(p), p=p) for p in probs], np.int32)


def build(core, names, workdir):
    """`{name: generate(prompt, n, temperature, seed) -> ids}`."""
    from export import export_onnx, export_saved_model, open_runtime
    from txl_tf import Decoder
    mem_len = core.config.mem_len
    runs = {}
    if "per_token_loop" in names:
        runs["per_token_loop"] = PerTokenLoop(core, mem_len).generate
    for name, jit in (("decoder", True), ("decoder_nojit", False)):
        if name in names:
            decoder = Decoder(core, mem_len=mem_len, jit_compile=jit)
            runs[name] = _wrap(decoder)
    if "causal_lm" in names:
        runs["causal_lm"] = _causal_lm(core)
    path = os.path.join(workdir, "model.onnx")
    for name, threads in (("onnx", 0), ("onnx_1thread", 1)):
        if name in names:
            if not os.path.exists(path):
                export_onnx(core, path, mem_len, log_probs="last")
            runs[name] = _wrap(open_runtime(path, device="cpu",
                                            session_options=_quiet_ort_options(threads)))
    if "saved_model" in names:
        path = os.path.join(workdir, "saved_model")
        export_saved_model(core, path, mem_len)
        runs["saved_model"] = _wrap(open_runtime(path, device="cpu"))
    return runs


def _causal_lm(core):
    """keras-hub's greedy `generate` on the same weights: each row gets its
    prompt and `num_tokens` new ids (`max_length` counts the prompt)."""
    from txl_tf import TransformerXLBackbone, TransformerXLCausalLM
    causal_lm = TransformerXLCausalLM(TransformerXLBackbone.from_core(core))
    causal_lm.compile(sampler="greedy")

    def generate(prompt, num_tokens, temperature, seed):
        del temperature, seed
        width = prompt.shape[1] + num_tokens
        ids = np.zeros([prompt.shape[0], width], np.int32)
        ids[:, :prompt.shape[1]] = prompt
        mask = (np.arange(width) < prompt.shape[1]).astype(np.int32)[None].repeat(len(ids), 0)
        out = causal_lm.generate({"token_ids": ids, "padding_mask": mask}, stop_token_ids=None)
        return out["token_ids"][:, prompt.shape[1]:]
    return generate


def _quiet_ort_options(threads=0):
    """No spin-waiting threads (they steal time from everything else on a
    shared CPU; see --part=latency); `threads` intra-op threads (0: one per
    core). One thread avoids the pool's hand-offs, which dominate a batch-1
    step of a small model."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _wrap(backend):
    def generate(prompt, num_tokens, temperature, seed):
        return backend.generate(prompt, num_tokens, temperature=temperature, seed=seed).ids
    return generate


def check_generate_options(o):
    """The batch sizes of the options `o`, once every flag is checked (a
    `BenchmarkError` names the first bad one)."""
    names_from(o["backends"], "backends", GENERATE_BACKENDS)
    at_least(o, 1, "prompt_len", "new_tokens", "repeats")
    if not o["temperature"] >= 0:
        raise BenchmarkError(f"--temperature must be >= 0, got {o['temperature']}")
    return integer_list(o["batch_sizes"], "batch_sizes", 1, "comma-separated positive integers")


def run_generate(o):
    r"""`--part=generate`: generation throughput: the per-token loop this project
    had before the compiled decoder vs `txl_tf.Decoder` (one `tf.while_loop` compiled with XLA, and
    without XLA) vs keras-hub's `generate` of `TransformerXLCausalLM` (XLA, its
    sampler loop on the decode cache; greedy whatever `--temperature`: the keras-hub
    sampler is set at `compile`) vs the export runtimes' host loop (ONNX Runtime,
    SavedModel).

    Every backend continues the same prompts by the same number of tokens with
    the same sampling (temperature 1 by default), random weights of a preset;
    runs are interleaved (one run of each backend in turn) so machine load hits
    all alike; the ratio to the old loop is taken within the run.
    """
    batch_sizes = check_generate_options(o)
    import onnxruntime
    from txl_tf import TransformerXL, TransformerXLConfig
    cfg = TransformerXLConfig.preset(o["preset"])
    core = TransformerXL(cfg)
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        runs = build(core, o["backends"], workdir)
        for batch in batch_sizes:
            prompt = rng.integers(0, cfg.n_token, (batch, o["prompt_len"]), dtype=np.int32)
            times = {name: [] for name in runs}
            for repeat in range(o["repeats"] + 1):  # the first is a warm-up
                for name, generate in runs.items():
                    start = time.perf_counter()
                    ids = generate(prompt, o["new_tokens"], o["temperature"], repeat)
                    if repeat:
                        times[name].append(time.perf_counter() - start)
                    assert ids.shape == (batch, o["new_tokens"])
            base = float(np.median(times.get("per_token_loop", [np.nan])))
            for name, t in times.items():
                median = float(np.median(t))
                rows.append({"backend": name, "batch": batch, "new_tokens": o["new_tokens"],
                             "median_s": median, "min_s": float(np.min(t)),
                             "tokens_per_s": batch * o["new_tokens"] / median,
                             "speedup_vs_per_token_loop": base / median})
    table = tp.format_table(rows, [
        ("backend", "backend", ""), ("batch", "batch", "d"), ("tokens", "new_tokens", "d"),
        ("median s", "median_s", ".3f"), ("tok/s", "tokens_per_s", ".1f"),
        ("x old loop", "speedup_vs_per_token_loop", ".2f")])
    print(table)
    tp.write_json(o["output"], {
        "question": "generation tokens/s: per-token loop vs compiled decoder vs runtimes",
        "settings": {"preset": o["preset"], "prompt_len": o["prompt_len"],
                     "new_tokens": o["new_tokens"], "repeats": o["repeats"],
                     "temperature": o["temperature"], "mem_len": cfg.mem_len},
        "environment": {**tp.environment(), "onnxruntime": onnxruntime.__version__},
        "results": rows, "table": table})


# ----------------------------------------------------------------- keras_hub
KERAS_HUB_SPEC = (
    option("string", "model_dir", "pystdlib_small", "A trained model directory or shipped model "
           "name."),
    option("string", "dataset", "pystdlib", "Corpus whose validation split is held out."),
    option("integer", "eval_tokens", 32768, "Held-out ids evaluated (from the split's start)."),
    option("integer", "eval_batch_size", 8, "Streams of the evaluation."),
    option("integer", "prompt_len", 64, "Prompt ids of the generate timing."),
    option("integer", "new_tokens", 64, "New ids of the generate timing."),
    option("integer", "repeats", 5, "Timed generate runs (the median is reported)."),
    option("string", "finetune_data",
           os.path.join(REPO, "..", "shared", "data", "tinyshakespeare.txt"),
           "Text the LoRA run adapts the model to."),
    option("integer", "lora_rank", 4, "LoRA rank."),
    option("integer", "lora_steps", 200, "Fine-tuning steps."),
    option("integer", "lora_batch_size", 8, "Fine-tuning streams."),
    option("float", "lora_learning_rate", 3e-3, "Fine-tuning learning rate (Adam)."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "keras_hub.json"),
           "Where to write the JSON results."),
)


def streams(causal_lm, ids, batch_size):
    """The paper's evaluation layout: `ids` as `batch_size` contiguous streams."""
    import numpy as np
    return causal_lm.document_dataset(np.array_split(np.asarray(ids), batch_size), batch_size)


def held_out_loss(causal_lm, dataset):
    return float(causal_lm.evaluate(dataset, verbose=0, return_dict=True)["loss"])


def weight_bytes(model):
    import numpy as np
    return int(sum(np.prod(v.shape) * np.dtype(str(v.dtype)).itemsize for v in model.weights))


def generate_seconds(causal_lm, prompt, new_tokens, repeats):
    """Median seconds of greedy `generate` of `new_tokens` after `prompt`."""
    import numpy as np
    width = len(prompt) + new_tokens
    inputs = {"token_ids": np.zeros([1, width], np.int32),
              "padding_mask": np.zeros([1, width], np.int32)}
    inputs["token_ids"][0, :len(prompt)] = prompt
    inputs["padding_mask"][0, :len(prompt)] = 1
    causal_lm.compile(sampler="greedy")
    preprocessor, causal_lm.preprocessor = causal_lm.preprocessor, None  # ids in, ids out
    causal_lm.generate(inputs)  # compiles
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        causal_lm.generate(inputs)
        times.append(time.perf_counter() - start)
    causal_lm.preprocessor = preprocessor
    return float(np.median(times))


def run_keras_hub(o):
    r"""`--part=keras_hub`: LoRA and int8 of the keras-hub causal LM on a trained model.

    int8: `causal_lm.quantize("int8")` (attention projections and feed-forward
    layers; the adaptive embedding / softmax and the position projection stay
    float): held-out perplexity before and after (the paper's stream evaluation:
    `--eval_batch_size` contiguous streams with the memory carried), the bytes
    of the weights, and tokens/s of greedy `generate` (batch 1, a prompt of
    `--prompt_len` ids, `--new_tokens` new ids, median of `--repeats` after a
    compiling run), float and int8 in the same run.

    LoRA: `causal_lm.backbone.enable_lora(rank)` (adapters on `query` and
    `value`): trainable parameters before and after, a fine-tuning run on another
    text (`--finetune_data`, first 90% to train, last 10% held out) whose
    held-out loss is printed before and after, and the adapters saved with
    `save_lora_weights` and loaded into a fresh model (same held-out loss).
    Prints a table and writes JSON.
    """
    import keras
    import numpy as np

    from txl_tf import TransformerXLCausalLM
    from txl_tf.data import load_corpus
    from txl_tf.errors import TxlError

    if not os.path.isdir(o["model_dir"]):
        raise TxlError(f"--model_dir: {o['model_dir']} not found (train the README's "
                             "tour first, or pass a trained model directory)")
    causal_lm = TransformerXLCausalLM.from_preset(o["model_dir"])
    if causal_lm.preprocessor is None:
        raise TxlError(f"--model_dir: {o['model_dir']} has no vocabulary (vocab/)")
    tokenizer = causal_lm.preprocessor.tokenizer.inner
    corpus = load_corpus(o["dataset"], tokenizer=tokenizer)
    held_out = streams(causal_lm, corpus.valid[:o["eval_tokens"]], o["eval_batch_size"])
    prompt = np.asarray(corpus.valid[:o["prompt_len"]], np.int32)
    report = {"model_dir": o["model_dir"], "config": causal_lm.core.config.to_dict(),
              "held_out": f"{o['dataset']} validation, first {o['eval_tokens']} ids, "
                          f"{o['eval_batch_size']} streams, memory {causal_lm.mem_len}"}

    # ------------------------------------------------------------------ int8
    causal_lm.compile()
    int8 = {}
    for mode in ("float32", "int8"):
        if mode == "int8":
            causal_lm.quantize("int8")
            causal_lm.compile()
        loss = held_out_loss(causal_lm, held_out)
        seconds = generate_seconds(causal_lm, prompt, o["new_tokens"], o["repeats"])
        int8[mode] = {"loss": loss, "ppl": float(np.exp(loss)),
                      "weight_bytes": weight_bytes(causal_lm),
                      "generate_seconds": seconds,
                      "generate_tokens_per_s": o["new_tokens"] / seconds}
    report["int8"] = int8

    # ------------------------------------------------------------------ LoRA
    if not os.path.isfile(o["finetune_data"]):
        raise TxlError(f"--finetune_data: {o['finetune_data']} not found")
    text = load_corpus("text", o["finetune_data"], tokenizer=tokenizer)
    lora_held_out = streams(causal_lm, text.valid[:o["eval_tokens"]], o["eval_batch_size"])
    train = streams(causal_lm, text.train, o["lora_batch_size"]).repeat().take(o["lora_steps"])
    causal_lm = TransformerXLCausalLM.from_preset(o["model_dir"])
    before = int(sum(np.prod(v.shape) for v in causal_lm.trainable_weights))
    causal_lm.backbone.enable_lora(o["lora_rank"])
    after = int(sum(np.prod(v.shape) for v in causal_lm.trainable_weights))
    causal_lm.compile(optimizer=keras.optimizers.Adam(o["lora_learning_rate"]))
    loss_before = held_out_loss(causal_lm, lora_held_out)
    start = time.perf_counter()
    causal_lm.fit(train, verbose=0)
    fit_seconds = time.perf_counter() - start
    loss_after = held_out_loss(causal_lm, lora_held_out)
    path = os.path.join(tempfile.mkdtemp(prefix="txl_lora_"), "adapters.lora.h5")
    causal_lm.backbone.save_lora_weights(path)
    reloaded = TransformerXLCausalLM.from_preset(o["model_dir"])
    reloaded.backbone.load_lora_weights(path)
    reloaded.compile()
    loss_reloaded = held_out_loss(reloaded, lora_held_out)
    report["lora"] = {"rank": o["lora_rank"], "trainable_before": before,
                      "trainable_after": after, "finetune_data": o["finetune_data"],
                      "steps": o["lora_steps"], "batch_size": o["lora_batch_size"],
                      "fit_seconds": fit_seconds, "held_out_loss_before": loss_before,
                      "held_out_loss_after": loss_after,
                      "held_out_loss_reloaded": loss_reloaded,
                      "adapter_file_bytes": os.path.getsize(path)}

    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    f32, q8 = int8["float32"], int8["int8"]
    print(f"\nint8 ({report['held_out']})")
    print(f"{'':>8} | {'ppl':>7} | {'weight MB':>9} | {'generate tok/s':>14}")
    for name, row in int8.items():
        print(f"{name:>8} | {row['ppl']:>7.3f} | {row['weight_bytes'] / 1e6:>9.3f} | "
              f"{row['generate_tokens_per_s']:>14.1f}")
    print(f"change   | {100 * (q8['ppl'] / f32['ppl'] - 1):>+6.2f}% | "
          f"{q8['weight_bytes'] / f32['weight_bytes']:>8.2f}x | "
          f"{q8['generate_tokens_per_s'] / f32['generate_tokens_per_s']:>13.2f}x")
    lora = report["lora"]
    print(f"\nLoRA rank {lora['rank']}: trainable parameters {before:,} -> {after:,}; "
          f"{lora['steps']} steps on {os.path.basename(o['finetune_data'])} in "
          f"{fit_seconds:.0f}s: held-out loss {loss_before:.4f} -> {loss_after:.4f} "
          f"(adapters reloaded: {loss_reloaded:.4f}, {lora['adapter_file_bytes']:,} bytes)")
    print(f"results: {o['output']}", flush=True)
    return report


# -------------------------------------------------------------- decode_nodes
DECODE_NODES_SPEC = (
    option("string", "preset", "enwik8_base", "TransformerXLConfig preset (random weights)."),
    option("integer", "mem_len", None, "Memory length (default: the preset's)."),
    option("list", "batch_sizes", ["1", "16"], "Batch sizes of the timed steps."),
    option("integer", "iters", 20, "Timed steps per graph and batch size (0: count only)."),
    option("string", "export_dir", "", "Folder for this tree's decode graphs (default: a "
           "temporary one)."),
    option("string", "compare_dir", "", "An --export_dir this part wrote from another "
           "commit: its graphs counted and timed beside this tree's, in alternating steps."),
    option("integer", "intra_op_threads", 0, "ONNX Runtime's intra-op threads (0: its "
           "default)."),
    option("enum", "decode_dtype", "float32", "The dtype this tree's step computes in, with "
           "its weights, keys and values (python -m export's --decode_dtype).",
           ["float32", "float16"]),
    option("bool", "token", True, "Also count this tree's decode_token (the step that writes "
           "its rings in place; timed by benchmarks.long_memory, where it runs bound)."),
    option("string", "output", "benchmarks/results/decode_nodes.json", "JSON results file."),
)
# The graphs the part writes in an export folder: the preset with 2 and 3
# layers (the nodes a layer adds: the difference) and whole (timed).
NODE_GRAPHS = {"layers_2": 2, "layers_3": 3, "full": None}


# ------------------------------------------------- the decode step's graph
# The exported cached decode step (`decode_step.onnx`): its nodes by op
# type, in total and per layer, as converted and as ONNX Runtime optimizes
# it (`--part=decode_nodes`). At batch 1 on a GPU a step costs about its
# kernel count times a launch, and each node is at least one kernel, except
# the view ops (`VIEW_OPS`), which ONNX Runtime's CUDA provider runs as
# aliases of their input. In a float16 graph the CPU provider casts to
# float32 and back around the nodes it has no float16 kernel for (a GPU's
# has them); those casts (`CPU_CASTS`) are not counted.
OPTIMIZATION_LEVELS = ("basic", "extended", "all")
VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten"})
CPU_CASTS = "InsertedPrecisionFreeCast"


def export_step(config, mem_len, folder, seed=0, decode_dtype="float32",
                interface="decode_step"):
    """Writes the decode step (`interface`: or `decode_token`, the step that
    writes its rings in place) of a core of `config` with random weights
    (`seed`) and memory `mem_len` as the export does (computing in
    `decode_dtype`, with its keys and values in it), to `folder`; returns
    its graph's path."""
    import keras

    from export.onnx_export import export_decode_onnx, write_weights_file
    from txl_tf import TransformerXL
    keras.utils.set_random_seed(seed)
    core = TransformerXL(config)
    os.makedirs(folder, exist_ok=True)
    weights = write_weights_file(core.weights, os.path.join(folder, "model.onnx.data"))
    export_decode_onnx(core, folder, mem_len, weights, interfaces=(interface,),
                       cache_dtype=decode_dtype, decode_dtype=decode_dtype)
    return os.path.join(folder, f"{interface}.onnx")


def node_counts(path, level=None, provider="CPUExecutionProvider"):
    """`collections.Counter` of the op types of the ONNX graph at `path`, as
    written (`level` None) or after the graph optimizations of `level` (one
    of `OPTIMIZATION_LEVELS`) by a session of `provider` (the CPU
    provider's `CPU_CASTS` aside)."""
    import onnx
    model = onnx.load(path, load_external_data=False) if level is None else \
        optimized_graph(path, level, load_weights=False, provider=provider)
    return collections.Counter(node.op_type for node in model.graph.node
                               if not node.name.startswith(CPU_CASTS))


def optimized_graph(path, level, load_weights=True, provider="CPUExecutionProvider"):
    """The ONNX graph at `path` as ONNX Runtime optimizes it at `level` (one
    of `OPTIMIZATION_LEVELS`) for `provider` (e.g. `CUDAExecutionProvider`,
    whose fusions differ from the CPU's; the CPU provider takes the nodes it
    has no kernel for), a `ModelProto` (its initializers' data read only
    with `load_weights`)."""
    import onnx
    import onnxruntime as ort

    from export.onnx_runtime import FLOAT16_DECODE_DISABLED
    levels = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = levels[level]
        options.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
        # Hardware-specific layouts (NCHWc) do not concern these graphs; the
        # warning ONNX Runtime gives for saving them is not wanted here, nor
        # its NCHWc pass, which crashes on float16 graphs.
        options.log_severity_level = 3
        ort.InferenceSession(path, options, providers=list(dict.fromkeys(
                                 [provider, "CPUExecutionProvider"])),
                             disabled_optimizers=list(FLOAT16_DECODE_DISABLED))
        return onnx.load(options.optimized_model_filepath, load_external_data=load_weights)


def kernels(counts):
    """How many of `counts`' nodes are not `VIEW_OPS`."""
    return sum(n for op, n in counts.items() if op not in VIEW_OPS)


def per_layer(one_layer, two_layers):
    """The nodes a layer adds: `two_layers - one_layer` by op type (the
    counts of one config's graphs with n and n + 1 layers, n >= 2: with one
    layer the stacked outputs take no `Concat`)."""
    ops = set(one_layer) | set(two_layers)
    return collections.Counter({op: two_layers[op] - one_layer[op] for op in ops
                                if two_layers[op] != one_layer[op]})


def step_feeds(config, mem_len, batch, seed=0, cache_dtype="float32"):
    """Random inputs of `decode_step` (`export.decode_cache.step_inputs`
    order) at batch `batch`: every slot valid, the free slot mid-ring, keys
    and values in `cache_dtype`."""
    from export.decode_cache import cache_shapes, step_inputs
    rng = np.random.default_rng(seed)
    shapes = cache_shapes(config, mem_len)
    size = mem_len + 1

    def normal(shape):
        return rng.standard_normal([batch if d == "batch" else d for d in shape],
                                   dtype=np.float32)

    feeds = {"token_ids": rng.integers(0, config.n_token, batch, dtype=np.int32),
             "valid": np.ones([batch, size], bool), "slot": np.array(size // 2, np.int32),
             "positions": normal(shapes["positions"])}
    for kind in ("keys", "values"):
        for i in range(config.n_layer):
            feeds[f"{kind}_{i}"] = normal(shapes[kind][1:]).astype(cache_dtype)
    assert list(feeds) == list(step_inputs(config.n_layer))
    return feeds


def token_feeds(config, mem_len, batch, seed=0, cache_dtype="float32"):
    """Random inputs of `decode_token` (`export.decode_cache.token_inputs`
    order): `step_feeds`', no row stopped, each row at the ring's slot."""
    from export.decode_cache import cache_shapes, token_inputs
    step = step_feeds(config, mem_len, batch, seed, cache_dtype)
    mems = cache_shapes(config, mem_len)["cache_mems"]
    feeds = {**step, "stopped": np.zeros([batch], bool),
             "row_slot": np.full([batch], step["slot"], np.int32),
             "cache_mems": np.random.default_rng(seed + 1).standard_normal(
                 [batch if d == "batch" else d for d in mems], dtype=np.float32)}
    return {name: feeds[name] for name in token_inputs(config.n_layer)}


def _decode_graphs(cfg, mem_len, folder, decode_dtype="float32", interface="decode_step"):
    """`{name: <interface>.onnx}` of `NODE_GRAPHS` in `folder`, written there
    (computing in `decode_dtype`) unless it holds them already (a
    `--compare_dir`)."""
    paths = {}
    for name, n_layer in NODE_GRAPHS.items():
        paths[name] = os.path.join(folder, name, f"{interface}.onnx")
        if not os.path.isfile(paths[name]):
            config = cfg if n_layer is None else cfg.replace(n_layer=n_layer)
            export_step(config, mem_len, os.path.join(folder, name), decode_dtype=decode_dtype,
                        interface=interface)
    return paths


def _graph_nodes(paths):
    """Per optimization level (`written` and ONNX Runtime's): the step's
    nodes in total, the kernels among them, and per layer by op type."""
    out = {}
    for level in (None,) + OPTIMIZATION_LEVELS:
        counts = {name: node_counts(path, level) for name, path in paths.items()}
        layer = per_layer(counts["layers_2"], counts["layers_3"])
        out[level or "written"] = {
            "total": sum(counts["full"].values()), "kernels": kernels(counts["full"]),
            "per_layer": sum(layer.values()), "per_layer_kernels": kernels(layer),
            "per_layer_ops": dict(sorted(layer.items()))}
    return out


def _time_steps(paths, cfg, mem_len, batch, iters, threads):
    """ms per `decode_step` of each graph in `paths`, the graphs taking
    turns step by step on the same random cache (in each graph's dtype):
    `{name: [ms, ...]}`."""
    import onnxruntime as ort

    sessions = {name: ort.InferenceSession(path, ort_session_options(threads, False),
                                           providers=["CPUExecutionProvider"])
                for name, path in paths.items()}
    dtypes = {name: "float16" if {i.name: i.type for i in session.get_inputs()}["keys_0"]
              == "tensor(float16)" else "float32" for name, session in sessions.items()}
    feeds = {dtype: step_feeds(cfg, mem_len, batch, cache_dtype=dtype)
             for dtype in set(dtypes.values())}
    times = {name: [] for name in sessions}
    for i in range(iters + 2):  # two untimed rounds first
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(["log_probs"], feeds[dtypes[name]])
            if i >= 2:
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def run_decode_nodes(o):
    r"""`--part=decode_nodes`: the cached decode step's ONNX graph: nodes per
    layer by op type, in total, and after ONNX Runtime's optimizations
    (each node is a kernel launch on a GPU), and its CPU time.

        python -m benchmarks.inference --part=decode_nodes --preset=enwik8_base \
            --mem_len=2100 --export_dir=/tmp/nodes_new [--compare_dir=/tmp/nodes_old]

    With `--compare_dir` (this part's `--export_dir` run from another
    commit, e.g. `--iters=0` there) both graphs are counted, and timed in
    alternating steps (median and min-max of `--iters` steps)."""
    from txl_tf import TransformerXLConfig
    batches = integer_list(o["batch_sizes"], "batch_sizes", 1,
                           "comma-separated positive integers")
    at_least(o, 0, "iters", "intra_op_threads")
    cfg = TransformerXLConfig.preset(o["preset"])
    mem_len = cfg.mem_len if o["mem_len"] is None else o["mem_len"]
    if mem_len < 1:
        raise BenchmarkError(f"--mem_len must be >= 1, got {mem_len}")
    folders = {"this": o["export_dir"] or tempfile.mkdtemp(prefix="decode_nodes_")}
    if o["compare_dir"]:
        if not all(os.path.isfile(os.path.join(o["compare_dir"], name, "decode_step.onnx"))
                   for name in NODE_GRAPHS):
            raise BenchmarkError(f"--compare_dir {o['compare_dir']!r} does not hold this "
                                 f"part's graphs ({', '.join(NODE_GRAPHS)}): write them with "
                                 "--export_dir from the other commit")
        folders["compare"] = o["compare_dir"]
    paths = {tree: _decode_graphs(cfg, mem_len, folder, o["decode_dtype"])
             for tree, folder in folders.items()}
    nodes = {tree: _graph_nodes(p) for tree, p in paths.items()}
    if o["token"]:  # counted, not timed: only a bound run writes its rings in place
        nodes["this_token"] = _graph_nodes(_decode_graphs(
            cfg, mem_len, folders["this"], o["decode_dtype"], "decode_token"))
    report = {"preset": o["preset"], "mem_len": mem_len, "n_layer": cfg.n_layer,
              "folders": folders, "nodes": nodes, "steps": {}}
    for level in report["nodes"]["this"]:
        line = " ".join(f"{tree}: {nodes[level]['total']} nodes ({nodes[level]['kernels']} "
                        f"kernels), {nodes[level]['per_layer']} a layer "
                        f"({nodes[level]['per_layer_kernels']} kernels)"
                        for tree, nodes in report["nodes"].items())
        print(f"{level:9} {line}")
    for tree, nodes in report["nodes"].items():
        for level in ("written", "all"):
            print(f"{tree} {level} per layer: {nodes[level]['per_layer_ops']}")
    for batch in batches if o["iters"] else []:
        times = _time_steps({tree: p["full"] for tree, p in paths.items()}, cfg, mem_len,
                            batch, o["iters"], o["intra_op_threads"])
        report["steps"][batch] = {tree: {"median_ms": float(np.median(t)),
                                         "min_ms": float(np.min(t)),
                                         "max_ms": float(np.max(t)), "ms": t}
                                  for tree, t in times.items()}
        print(f"batch {batch}: " + "; ".join(
            f"{tree} {r['median_ms']:.2f} ms ({r['min_ms']:.2f}-{r['max_ms']:.2f})"
            for tree, r in report["steps"][batch].items()), flush=True)
    report["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count()}
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"results: {o['output']}", flush=True)
    return report


# ------------------------------------------------------------------- profile
PROFILE_SPEC = (
    option("string", "export_dir", "", "An export folder (its model.onnx and decode graphs)."),
    option("list", "graphs", ["decode_token", "model"], "The export's graphs profiled: "
           "decode_token (one token a row on a full ring, written in place: the step a GPU "
           "replays), decode_step (the same, read-only: the host's), model (a segment of "
           "--segment_len ids a row on a full memory)."),
    option("string", "device", "cpu", "cpu or cuda."),
    option("list", "batch_sizes", ["1", "16"], "Batch sizes."),
    option("integer", "segment_len", 512, "Ids a row of model's segment."),
    option("bool", "fixed_shapes", True, "The segment graph with its batch and seq_len axes "
           "fixed (free-dimension overrides), as the runtime runs a repeated shape on CUDA "
           "(OnnxRuntime's fixed_shapes); --nofixed_shapes: dynamic, as its main session."),
    option("integer", "iters", 20, "Profiled runs per graph and batch size (after 5 untimed)."),
    option("string", "output", "benchmarks/results/profile.json", "JSON results file."),
)
PROFILE_WARMUP = 5
PROFILE_SHAPES = 12  # the groups of nodes of one op type and input shapes a profile lists
PROFILED_GRAPHS = ("decode_token", "decode_step", "model")


def export_info(folder):
    """The `ExportInfo` of the export in `folder` (its model.onnx's metadata,
    the weights not read)."""
    import onnx

    from export.metadata import ExportInfo
    model = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False)
    return ExportInfo({p.key: p.value for p in model.metadata_props})


def segment_feeds(path, info, batch, segment_len, seed=0):
    """Random inputs of the segment graph at `path` (`model.onnx`): `batch`
    rows of `segment_len` ids, on a full memory (every slot valid, random
    states), shaped by the graph's own inputs."""
    import onnx
    rng = np.random.default_rng(seed)
    sizes = {"batch": batch, "seq_len": segment_len}
    feeds = {}
    for tensor in onnx.load(path, load_external_data=False).graph.input:
        shape = [d.dim_value or sizes[d.dim_param] for d in tensor.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.type.tensor_type.elem_type)
        if dtype == np.bool_:
            feeds[tensor.name] = np.ones(shape, np.bool_)
        elif np.issubdtype(dtype, np.integer):
            feeds[tensor.name] = rng.integers(0, info.config.n_token, shape, dtype=dtype)
        else:
            feeds[tensor.name] = rng.standard_normal(shape, np.float32).astype(dtype)
    return feeds


def profile_graph(path, feeds, device, iters, fixed=None, in_place=()):
    """ONNX Runtime's profile of `iters` runs of the graph at `path` on
    `feeds` (after `PROFILE_WARMUP`), its inputs and outputs bound on
    `device` (nothing crosses the bus), its dynamic axes named in `fixed`
    (`{name: size}`) fixed: `summarize_profile`'s per run. The inputs
    named in `in_place` are written in place, as the runtime runs the
    graph: each one's output `new_<name>` is bound to its buffer (else
    the write would copy the whole input into a fresh output first)."""
    import onnxruntime as ort

    from export.onnx_runtime import FLOAT16_DECODE_DISABLED, provider_entries
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(folder, "profile")
        options.log_severity_level = 3
        for axis, size in (fixed or {}).items():
            options.add_free_dimension_override_by_name(axis, size)
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" \
            else ["CPUExecutionProvider"]
        # TF32 off on CUDA, as the runtime opens the graphs it times (`OnnxRuntime`'s default)
        session = ort.InferenceSession(path, options, providers=provider_entries(providers),
                                       disabled_optimizers=list(FLOAT16_DECODE_DISABLED))
        if session.get_providers()[0] != providers[0]:
            raise BenchmarkError(f"--device={device}: ONNX Runtime did not open "
                                 f"{providers[0]} (it has {ort.get_available_providers()})")
        binding, bound = bind_profiled(session, feeds, device, in_place)  # bound: kept alive
        for _ in range(PROFILE_WARMUP + iters):
            session.run_with_iobinding(binding)
        with open(session.end_profiling(), encoding="utf-8") as f:
            events = json.load(f)
    return summarize_profile(events, iters, device)


def bind_profiled(session, feeds, device, in_place=()):
    """`(binding, {input: OrtValue})`: `session`'s inputs bound to `feeds`
    copied onto `device` (the values must outlive the runs), the output
    `new_<name>` of each input named in `in_place` to that input's buffer,
    the other outputs to fresh buffers on `device` (`export.device_cache.bind_on_device`)."""
    from export.device_cache import bind_on_device
    return bind_on_device(session, device, feeds, in_place=in_place)


def summarize_profile(events, iters, device="cpu"):
    """`{"wall_ms", "nodes_ms", "kernels", "on_cpu", "ops": {op: {"ms",
    "count"}}, "shapes": [{"op", "inputs", "ms", "count"}, ...]}` a run,
    `ops` by time, from ONNX Runtime profile `events` (a list of dicts):
    the last `iters` runs (`model_run`) of a session on `device` (`on_cpu`:
    the op types its nodes left to the CPU provider). `shapes`: the
    `PROFILE_SHAPES` costliest groups of nodes of one op type and the same
    input shapes (`inputs`, as the profile lists them: a weight the kernel
    prepacked, as the CPU's MatMul does, is left out; other weights, a layer
    norm's, are listed), which tells apart nodes of one type (a layer's
    matmuls against the memory from those against its weights)."""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    if len(runs) < iters:
        raise BenchmarkError(f"the profile holds {len(runs)} runs, not {iters}")
    start = runs[-iters]["ts"]
    nodes = [e for e in events if e.get("cat") == "Node" and e["ts"] >= start
             and e["name"].endswith("_kernel_time")]
    ops = collections.defaultdict(lambda: {"ms": 0.0, "count": 0})
    shapes = collections.defaultdict(lambda: {"ms": 0.0, "count": 0})
    on_cpu = set()
    for e in nodes:
        op = e["args"]["op_name"]
        inputs = json.dumps([dims for shape in e["args"].get("input_type_shape", [])
                             for dims in shape.values()])
        for group in (ops[op], shapes[op, inputs]):
            group["ms"] += e["dur"] / 1e3 / iters
            group["count"] += 1
        if device != "cpu" and e["args"].get("provider") == "CPUExecutionProvider":
            on_cpu.add(op)
    for group in (*ops.values(), *shapes.values()):
        group["count"] //= iters
    costliest = sorted(shapes.items(), key=lambda item: -item[1]["ms"])[:PROFILE_SHAPES]
    return {"wall_ms": sum(r["dur"] for r in runs[-iters:]) / 1e3 / iters,
            "nodes_ms": sum(op["ms"] for op in ops.values()),
            "kernels": sum(op["count"] for name, op in ops.items() if name not in VIEW_OPS),
            "on_cpu": sorted(on_cpu),
            "ops": dict(sorted(ops.items(), key=lambda item: -item[1]["ms"])),
            "shapes": [{"op": op, "inputs": json.loads(inputs), **group}
                       for (op, inputs), group in costliest]}


def run_profile(o):
    r"""`--part=profile`: where an export's graphs spend their time, by op
    type (ONNX Runtime's profiler).

        python -m benchmarks.inference --part=profile --export_dir=EXPORT \
            --device=cuda [--graphs=decode_token,model] [--batch_sizes=1,16]

    Per graph and batch size, on random inputs: the decode step on a full
    ring (`token_feeds`, `step_feeds`), the segment graph on `--segment_len` ids a row and
    a full memory (`segment_feeds`); every input and output bound on the
    device, no CUDA graphs; the segment graph with its axes fixed
    (`--fixed_shapes`, as the runtime runs a repeated shape on CUDA). A
    run's wall milliseconds, the sum of its nodes' and each op type's
    milliseconds and node count, and on CUDA the op types left to the CPU
    provider (a graph with any cannot be captured as a CUDA graph). On CUDA,
    `CUDA_LAUNCH_BLOCKING=1` is set (unless already set) before CUDA starts,
    so that a node's time is its kernels' (ONNX Runtime times a node on the
    host): each carries a launch and a wait, so the
    totals are above an asynchronous run's (and a replayed step's), and the
    split between ops is the point."""
    batches = integer_list(o["batch_sizes"], "batch_sizes", 1,
                           "comma-separated positive integers")
    at_least(o, 1, "iters", "segment_len")
    graphs = names_from(o["graphs"], "graphs", PROFILED_GRAPHS)
    if o["device"] not in ("cpu", "cuda"):
        raise BenchmarkError(f"--device must be cpu or cuda, got {o['device']!r}")
    paths = {graph: os.path.join(o["export_dir"], f"{graph}.onnx") for graph in graphs}
    missing = [os.path.basename(p) for p in paths.values() if not os.path.isfile(p)]
    if not o["export_dir"] or missing:
        raise BenchmarkError(f"--export_dir {o['export_dir']!r} holds no {', '.join(missing)} "
                             "(an ONNX export with its decode graphs: python -m export)")
    if o["device"] == "cuda":
        os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    from export.decode_cache import token_in_place
    info = export_info(o["export_dir"])
    report = {"export_dir": o["export_dir"], "device": o["device"], "mem_len": info.mem_len,
              "segment_len": o["segment_len"], "fixed_shapes": o["fixed_shapes"],
              "decode_dtype": info.decode_dtype,
              "iters": o["iters"], "launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING"),
              "graphs": {}}
    lines = []
    for graph, path in paths.items():
        for batch in batches:
            fixed = None
            if graph in ("decode_step", "decode_token"):
                feeds = (step_feeds if graph == "decode_step" else token_feeds)(
                    info.config, info.mem_len, batch, cache_dtype=info.cache_dtype)
            else:
                feeds = segment_feeds(path, info, batch, o["segment_len"])
                if o["fixed_shapes"]:
                    fixed = {"batch": batch, "seq_len": o["segment_len"]}
            in_place = token_in_place(info.config.n_layer) if graph == "decode_token" else ()
            r = profile_graph(path, feeds, o["device"], o["iters"], fixed, in_place)
            report["graphs"].setdefault(graph, {})[batch] = r
            top = ", ".join(f"{op} {v['ms']:.2f} ms ({v['count']})"
                            for op, v in list(r["ops"].items())[:4])
            costliest = r["shapes"][0] if r["shapes"] else None
            lines.append(f"{graph} b{batch} {r['wall_ms']:.2f} ms, {r['kernels']} kernels" +
                         (f", on the CPU: {' '.join(r['on_cpu'])}" if r["on_cpu"] else "") +
                         f": {top}" + (f"; costliest shapes: {costliest['op']} " +
                                       "x".join(map(str, costliest["inputs"])) +
                                       f" {costliest['ms']:.2f} ms ({costliest['count']})"
                                       if costliest else ""))
            print(json.dumps({"graph": graph, "batch": batch, **r}), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"results: {o['output']}", flush=True)
    print(f"profile on {o['device']} by op type (ms a run, nodes): " + "; ".join(lines),
          flush=True)
    return report


PARTS = {"latency": (LATENCY_SPEC, run_latency),
         "generate": (GENERATE_SPEC, run_generate),
         "keras_hub": (KERAS_HUB_SPEC, run_keras_hub),
         "decode_nodes": (DECODE_NODES_SPEC, run_decode_nodes),
         "profile": (PROFILE_SPEC, run_profile)}
SPEC = suite_spec({name: spec for name, (spec, _) in PARTS.items()})


def main(argv):
    run_part(PARTS, values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
