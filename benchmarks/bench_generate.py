"""Generation throughput: the per-token loop this project had before the
compiled decoder vs `txl_tf.Decoder` (one `tf.while_loop` compiled with XLA, and
without XLA) vs keras-hub's `generate` of `TransformerXLCausalLM` (XLA, its
sampler loop on the decode cache; greedy whatever `--temperature`: the keras-hub
sampler is set at `compile`) vs the export runtimes' host loop (ONNX Runtime,
SavedModel).

Every backend continues the same prompts by the same number of tokens with
the same sampling (temperature 1 by default), random weights of a preset;
runs are interleaved (one run of each backend in turn) so machine load hits
all alike; the ratio to the old loop is taken within the run.

    python -m benchmarks.bench_generate --preset=small --batch_sizes=1,16 \
        --new_tokens=64 --repeats=5 --output=benchmarks/results/generate.json
"""
import os
import tempfile
import time

import numpy as np

from benchmarks import throughput as tp
from benchmarks.common import BenchmarkError, at_least, integer_list, names_from
from txl_tf.app import cli
from txl_tf.app.flagspec import option, values

BACKENDS = ["per_token_loop", "decoder", "decoder_nojit", "causal_lm", "onnx", "onnx_1thread",
            "saved_model"]
SPEC = (
    option("string", "preset", "small", "TransformerXLConfig preset (random weights)."),
    option("list", "batch_sizes", ["1", "16"], "Batch sizes."),
    option("integer", "prompt_len", 16, "Prompt length."),
    option("integer", "new_tokens", 64, "Tokens generated per run."),
    option("integer", "repeats", 5, "Timed runs per backend (after one warm-up run)."),
    option("float", "temperature", 1.0, "Sampling temperature (0: greedy)."),
    option("list", "backends", BACKENDS, "Backends to time (onnx_1thread: a session with one "
           "intra-op thread)."),
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
    shared CPU; see bench_inference); `threads` intra-op threads (0: one per
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


def check_options(o):
    """The batch sizes of the options `o`, once every flag is checked (a
    `BenchmarkError` names the first bad one)."""
    names_from(o["backends"], "backends", BACKENDS)
    at_least(o, 1, "prompt_len", "new_tokens", "repeats")
    if not o["temperature"] >= 0:
        raise BenchmarkError(f"--temperature must be >= 0, got {o['temperature']}")
    return integer_list(o["batch_sizes"], "batch_sizes", 1, "comma-separated positive integers")


def main(argv):
    del argv
    o = values(SPEC)
    batch_sizes = check_options(o)
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


if __name__ == "__main__":
    cli.run(main, SPEC)
