r"""Serving long memory: the decode cache's speed on CPU and GPU, the runtime's
memory, many sessions, and the tools the GPU flow needs. One suite in parts
(`--part`); every part prints a table and writes JSON:

    python -m benchmarks.long_memory [--part=speed] [--presets=enwik8_base,wt103_base] \
        [--batch_sizes=1,16] [--backends=xla,onnx,saved_model] [--tokens=16] [--device=cpu]
    python -m benchmarks.long_memory --part=evaluation [--presets=enwik8_base] \
        [--segment_len=512] [--batch_sizes=1,16] [--device=cuda] [--reference_dir=DIR]
    python -m benchmarks.long_memory --part=runtime_memory --export_dir=EXPORT
    python -m benchmarks.long_memory --part=soak --export_dir=EXPORT --soak_sessions=2000 \
        [--device=cpu]
    python -m benchmarks.long_memory --part=onnx_weights --export_dir=EXPORT --skeleton_dir=SKEL
    python -m benchmarks.long_memory --part=onnx_weights --fill --skeleton_dir=SKEL
    python -m benchmarks.long_memory --part=cuda_parity --exports=EXPORT[,EXPORT...] [--steps=40]
    python -m benchmarks.long_memory --part=cache_precision --model_dir=RUN --dataset=wt2 \
        --data_dir=DIR [--mem_len=640] [--tokens=1000]

- `speed` (default): ms per new token against the bandwidth bound, turns,
  prompts, session tables (`run_speed`);
- `evaluation`: tok/s of evaluation through the runtime API (`score`,
  `step`, the memory fed back) against the graph with every buffer bound,
  their NLLs checked equal, and the paper's code on CUDA (`run_evaluation`);
- `runtime_memory`: what an ONNX Runtime runtime holds in memory with its
  decode cache open, and what its weight sharing costs a step;
- `soak`: many sessions opening, reading, generating and closing at random;
- `onnx_weights`: carries an ONNX export to a machine without TensorFlow
  (its weights stripped, then refilled at random there);
- `cuda_parity`: the ONNX Runtime decode on CUDA against the CPU;
- `cache_precision`: what a 16-bit decode cache would cost in exactness.

Only `cache_precision`, `speed`'s XLA and SavedModel rows and the exports
(`speed` and `evaluation` without `--reuse_exports`) need TensorFlow; the
rest runs where only onnxruntime is installed (the GPU machine).
"""
import contextlib
import dataclasses
import glob
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import (at_least, integer_list, run_part, share_the_gpu,  # noqa: E402
                               suite_spec)
from benchmarks.issue_targets import limit_of  # noqa: E402
from export.metadata import WEIGHT_PREFIX  # noqa: E402
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from txl_tf.errors import TxlError  # noqa: E402


# --------------------------------------------------------------------- speed
PAPER_MEMORY = {"enwik8_base": 2100, "wt103_base": 1600}
CACHE_PLACES = {"auto": "auto", "true": True, "false": False}
# --xla_device: (TensorFlow's device, the rows' device and its bandwidth's name)
XLA_DEVICES = {"cpu": ("/CPU:0", "cpu"), "gpu": ("/GPU:0", "cuda")}
TURN = 32

SPEED_SPEC = (
    option("string", "presets", "enwik8_base", "Comma-separated model presets (random weights)."),
    option("integer", "mem_len", None, "Memory length (default: the paper's evaluation memory for "
           "enwik8_base / wt103_base, else the preset's)."),
    option("integer", "clamp_len", None, "The model's clamp_len (default: the preset's: none). "
           "The paper evaluates enwik8_base with 820, its large models at memory "
           "1,600-3,800 with 1,000; the XLA decoder keeps keys for the distinct "
           "distances only."),
    option("string", "batch_sizes", "1,16", "Comma-separated batch sizes."),
    option("string", "backends", "xla,onnx,saved_model", "Comma-separated: xla, onnx, "
           "saved_model, triton, onnx_step_write (the ONNX export stepped as before "
           "decode_token: the step, then the ring's write)."),
    option("integer", "tokens", 16, "Timed steps per measurement."),
    option("bool", "turns", True, "Also time a conversation turn and a prompt read (batch 1)."),
    option("bool", "sessions", True, "Also time a session table (runtimes, batch > 1)."),
    option("string", "work_dir", None, "Where the exports go, kept (default: a temporary folder, "
           "removed at the end)."),
    option("bool", "reuse_exports", False, "Time the exports already in --work_dir (<preset>/out, "
           "e.g. made on another machine: --part=onnx_weights) instead of "
           "exporting; ONNX needs no TensorFlow then."),
    option("string", "device", "cpu", "The ONNX Runtime backend's device: cpu, cuda or auto (the "
           "XLA decoder (see --xla_device) and the SavedModel run on the CPU). On cuda the "
           "bound is read at the GPU's bandwidth."),
    option("enum", "xla_device", "cpu", "The XLA decoder's device (the xla backend: the Keras "
           "side's compiled generate): cpu, or gpu (TensorFlow's first GPU, its bound at the "
           "GPU's bandwidth).", ["cpu", "gpu"]),
    option("string", "device_cache", "auto", "ONNX Runtime's decode cache: auto (on the device on "
           "CUDA), true or false (numpy in host memory)."),
    option("string", "cuda_graph", "auto", "ONNX Runtime's device steps replayed as CUDA graphs: "
           "auto (with the cache on CUDA), true or false."),
    option("enum", "decode_dtype", "float32", "The ONNX export's decode graphs' dtype (python -m "
           "export's --decode_dtype; with --reuse_exports the dtype the exports must have; the "
           "bound stays the float32 step's bytes, and a 16-bit step's row adds its own: "
           "own_bound_ms, over_own_bound).",
           ["float32", "float16"]),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "long_memory.json"),
           "Where to write the JSON results."),
)


def parse_batch_sizes(text):
    """The batch sizes of a `--batch_sizes` value ("1,16")."""
    return integer_list(text, "batch_sizes", 1, "comma-separated positive integers")


def read_bandwidths(gib=1, repeats=3):
    """`{kernel: bytes per second}` of a sum over `gib` GiB of float32 read by
    each kind of kernel the backends read with: numpy (one thread), ONNX
    Runtime's reduction, and where TensorFlow is installed its multi-threaded
    reduction and an XLA-compiled one, pinned to the CPU (best of `repeats`
    each). The bound uses the fastest: a step cannot read faster than the
    best read this machine shows in the same run."""
    import numpy as np
    data = np.ones(gib * 2 ** 30 // 4, np.float32)
    kernels = {"numpy": lambda: data.sum(), "onnxruntime": ort_reader(data, "cpu")}
    try:
        import tensorflow as tf
    except ImportError:  # a serving box: only numpy and ONNX Runtime read there
        tf = None
    if tf is not None:  # on the CPU where TensorFlow also sees a GPU (the GPU check's machine)
        with tf.device("/CPU:0"):
            held = tf.constant(data)
        compiled = tf.function(tf.reduce_sum, jit_compile=True)

        def on_cpu(reduce):
            with tf.device("/CPU:0"):
                return reduce(held).numpy()
        kernels.update(tensorflow=lambda: on_cpu(tf.reduce_sum), xla=lambda: on_cpu(compiled))
    result = {}
    for name, read in kernels.items():
        read()  # warm-up (XLA compiles)
        result[name] = data.nbytes / min(seconds(read) for _ in range(repeats))
    return result


def ort_reader(data, device):
    """A call that sums the float32 vector `data` with an ONNX Runtime
    ReduceSum on `device` ("cpu" or "cuda", where the vector is copied
    once beforehand)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)], "read",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    provider = "CUDAExecutionProvider" if device == "cuda" else "CPUExecutionProvider"
    session = ort.InferenceSession(model.SerializeToString(), providers=[provider])
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(data, device, 0))
    binding.bind_output("y", device, 0)
    return lambda: session.run_with_iobinding(binding)


def cuda_read_bandwidth(gib=0.75, repeats=5, device="cuda"):
    """Bytes per second of an ONNX Runtime ReduceSum over data held on the
    GPU (`device`): the bound's bandwidth when the runtime's state lives
    there. A read of `gib` GiB and one of twice that, in `repeats` rounds
    (`bandwidth_between`): a call's fixed cost (its launch, ONNX Runtime's
    own work, the wait for the stream), not small beside a GiB's read on an
    HBM GPU, cancels in the difference. (The larger read stays under 2 GiB,
    2**31 bytes: no byte count of its kernels needs more than 31 bits.)"""
    import numpy as np
    count = int(gib * 2 ** 30) // 4
    small = ort_reader(np.ones(count, np.float32), device)
    large = ort_reader(np.ones(2 * count, np.float32), device)
    return bandwidth_between(small, large, 4 * count, repeats)


def bandwidth_between(small, large, extra_bytes, repeats):
    """Bytes per second of the `extra_bytes` that the read `large` reads
    beyond the read `small`: over the difference of their best times, each
    warmed up once and timed in `repeats` alternating rounds; where that
    difference is not positive (noise), the large read's own rate.

    Args:
        small, large: calls that each read their data once and return when
            it is read.
        extra_bytes: what `large` reads beyond `small` (`small` reads as
            much: `large` reads 2 * `extra_bytes`).
        repeats: rounds.
    Returns:
        bytes per second."""
    small(), large()
    times = {small: [], large: []}
    for _ in range(repeats):
        for read in (small, large):
            times[read].append(seconds(read))
    fast_small, fast_large = min(times[small]), min(times[large])
    if fast_large > fast_small:
        return extra_bytes / (fast_large - fast_small)
    return 2 * extra_bytes / fast_large


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_seconds(fn, calls):
    """Median seconds of `fn()` over `calls` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    return statistics.median(seconds(fn) for _ in range(calls))


def step_bytes(config, mem_len, batch, itemsize=4):
    """What one decode step reads: the weights + each row's keys and values,
    `itemsize` bytes each (4: float32; 2: a float16 decode step)."""
    from txl_tf.checks.memory_budget import parameter_count
    cache = 2 * itemsize * config.n_layer * (mem_len + 1) * config.n_head * config.d_head
    return itemsize * parameter_count(config) + batch * cache


def full_memory(config, mem_len, batch, seed=0):
    """A memory of `batch` rows, every slot valid, random states (drawn in
    float32: 825 MB at `enwik8_base`, memory 2,100, batch 16)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    mems = rng.standard_normal((config.n_layer, batch, mem_len, config.d_model), np.float32)
    return mems, np.ones([batch, mem_len], np.bool_)


def time_runtime(runtime, memory, batch, tokens):
    """`{"per_token_ms"}` of a decode step (the decode loop's, unchecked) on
    a full memory's cache."""
    import numpy as np
    from export.runtime import generation_backend
    cache = runtime.decode_init(memory)
    ids, stopped = np.full([batch], 5, np.int32), np.zeros([batch], np.bool_)
    loop = generation_backend(runtime)
    step = median_seconds(lambda: loop.next_cached(ids, stopped, cache), tokens)
    return {"per_token_ms": step * 1e3}


TOKEN_PARTS = ("step_graph", "read", "write", "token", "host")


def time_token_parts(runtime, memory, batch, tokens):
    """`{"token_parts": {...}}`: ms a token of each part of a decode step
    over fixed buffers (`device_cache.FixedStep`, replayed as CUDA graphs
    where `runtime.cuda_graph` is on a GPU), on a full memory's cache:

    - `step_graph`: one run of the step graph alone (its kernels, its graph
      launch and ONNX Runtime's end-of-run synchronization); where the
      export has `decode_token`, that graph, which writes the ring too;
    - `read`: the step as the loop runs it: the ids and stopped flags copied
      in, the step graph, the log-probs copied out;
    - `write`: the ring's write and the move of its slots (two runs; the
      move alone after `decode_token`);
    - `token`: the loop's whole step (`read`, `write` and the bookkeeping
      around them);
    - `host`: `token - step_graph - write`, what the token costs beyond its
      graphs' runs alone: the copies, Python, and what the runs cost each
      other when they alternate (on the CPU a read after the ring's write
      graph ran slower than reads alone).

    Empty where the runtime's steps do not run over fixed buffers."""
    import numpy as np
    from export.runtime import generation_backend
    if not getattr(runtime, "cuda_graph", False):
        return {}
    cache = runtime.decode_init(memory)
    ids, stopped = np.full([batch], 5, np.int32), np.zeros([batch], np.bool_)
    loop = generation_backend(runtime)
    loop.next_cached(ids, stopped, cache)  # the fixed buffers made, the graphs captured
    steps = runtime._resident(cache).steps
    step_session, binding = (steps.sessions["token"], steps.token_binding) \
        if steps.token_binding is not None else (steps.sessions["step"], steps.step_binding)
    # Each part alone, repeated: reads of the same ring, or writes of the
    # same token moving the ring on (the cache is dropped afterwards).
    parts = {"step_graph": lambda: step_session.run_with_iobinding(binding, steps.run_options),
             "read": lambda: steps.read(ids, stopped),
             "write": steps.write,
             "token": lambda: loop.next_cached(ids, stopped, cache)}
    ms = {name: median_seconds(run, tokens) * 1e3 for name, run in parts.items()}
    ms["host"] = ms["token"] - ms["step_graph"] - ms["write"]
    return {"token_parts": {name: ms[name] for name in TOKEN_PARTS}}


def time_xla(decoder, memory, batch, tokens):
    """`{"per_token_ms", "first_call_s"}` of the compiled decoder."""
    from txl_tf import Memory
    import tensorflow as tf
    memory = Memory(tf.constant(memory[0]), tf.constant(memory[1]))

    def run(n):
        return seconds(lambda: decoder.generate([[5]] * batch, n, memory=memory,
                                                temperature=0.0))
    more = 32
    first = run(tokens) + run(tokens + more)
    short, long, per_token = seconds_per_extra_token(run, tokens, tokens + more)
    return {"per_token_ms": per_token * 1e3, "first_call_s": first - short - long}


def seconds_per_extra_token(run, short, long, pairs=5):
    """`(short_s, long_s, per_token_s)` of a loop that `run(n)` times for
    `n` tokens: the median seconds of `short` and of `long` tokens, and the
    median over `pairs` of the two run back to back of their difference
    per extra token (pairs: the machine's drift between them cancels). That
    median is NaN where it is not above 0 (the machine's noise larger than
    the extra tokens' time): a speed of it (`tokens_per_s`, `over_bound`)
    would be negative, and a negative time would meet any target.

    Args:
        run: `run(n)`, the seconds of a loop of `n` tokens.
        short, long: the two loop lengths, `short < long`.
        pairs: how many times the two run back to back.

    Returns:
        The three figures, seconds.
    """
    timed = [(run(short), run(long)) for _ in range(pairs)]
    per_token = statistics.median(l - s for s, l in timed) / (long - short)
    return (statistics.median(s for s, _ in timed), statistics.median(l for _, l in timed),
            per_token if per_token > 0 else math.nan)


def time_turn(backend, memory, read_cached_and_steps, rounds=5):
    """A next turn (32 ids in, 32 out) after a full memory, on the state's
    cache and on the memory, beside its parts alone. Turn and parts are
    timed in alternating rounds and compared round by round (median of the
    ratios): this machine's speed drifts over minutes."""
    import numpy as np
    turn = [list(range(3, 3 + TURN))]
    first = backend.generate([[5]], 1, memory=memory, temperature=0.0)
    options = dict(temperature=0.0, segment_len=TURN)

    def on_cache():
        return seconds(lambda: backend.generate(turn, TURN, resume=first.state, **options))

    def parts():
        return read_cached_and_steps(first.state, np.array(turn, np.int32))
    on_cache(), parts()  # warm-up
    turns, part = [], []
    for _ in range(rounds):
        turns.append(on_cache())
        part.append(parts())
    on_memory = median_seconds(lambda: backend.generate(turn, TURN, memory=first.memory,
                                                        **options), 3)
    return {"turn_ms": statistics.median(turns) * 1e3,
            "turn_parts_ms": statistics.median(part) * 1e3,
            "turn_over_parts": statistics.median(t / p for t, p in zip(turns, part)),
            "turn_on_memory_ms": on_memory * 1e3}


def time_prompt(backend, config, mem_len, step):
    """Tokens/s of reading a memory-long prompt into an empty memory (and
    the first read's seconds, compiling included), and of evaluation
    (`step` over `tgt_len` segments) on a full memory."""
    import numpy as np
    prompt = [list(np.random.default_rng(1).integers(0, config.n_token, mem_len))]
    first = seconds(lambda: backend.generate(prompt, 1, temperature=0.0))
    read = median_seconds(lambda: backend.generate(prompt, 1, temperature=0.0), 1)
    segment = np.ones([1, config.tgt_len], np.int32)
    memory = full_memory(config, mem_len, 1)
    evaluate = median_seconds(lambda: step(segment, memory), 3)
    return {"prompt_tokens_per_s": mem_len / read, "prompt_first_call_s": first,
            "eval_tokens_per_s": config.tgt_len / evaluate,
            "prompt_over_eval": (mem_len / read) / (config.tgt_len / evaluate)}


def time_sessions(runtime, config, mem_len, batch, tokens, rounds=3):
    """`SessionTable` steps over `batch` sessions on full memories (see the
    docstring of `run_speed`)."""
    import numpy as np
    from export import SessionTable
    from export.runtime import generation_backend

    def table(cached):
        runtime.use_decode_cache = cached
        sessions = SessionTable(runtime, max_batch=batch)
        for i in range(batch):
            sessions.open(i, [5], 10 ** 6, temperature=0.0,
                          memory=full_memory(config, mem_len, 1, seed=i))
        sessions.step()  # the sessions join the slab
        return sessions
    cached = table(True)
    rows = cached.slab.batch()  # the same rows, stepped without the table
    ids, stopped = np.full([batch], 5, np.int32), np.zeros([batch], np.bool_)
    own, steps, loop = [], [], generation_backend(runtime)
    for _ in range(rounds):
        own.append(median_seconds(lambda rows=rows: loop.next_cached(ids, stopped, rows),
                                  tokens))
        steps.append(median_seconds(cached.step, tokens))
    del cached, rows  # before the second table's memories
    step_last = median_seconds(table(False).step, 1)
    runtime.use_decode_cache = True
    return {"table_ms": statistics.median(steps) * 1e3,
            "table_over_own": statistics.median(t / o for t, o in zip(steps, own)),
            "table_step_last_ms": step_last * 1e3}


def time_triton(repo, config, mem_len, batch, tokens):
    """`{"triton_step_ms", "triton_cached_ms"}`: ms per one-id request of the
    repository's step and cached models on a full memory (onnxruntime, CPU)."""
    import numpy as np
    import onnxruntime as ort
    from export.triton import model_file
    from export.triton import state_names, state_shapes
    rng = np.random.default_rng(0)
    ids = np.full([batch, 1], 5, np.int32)
    mems, mem_mask = full_memory(config, mem_len, batch)
    shapes = state_shapes(config, mem_len)
    states = {"step": {"mems": np.ascontiguousarray(np.transpose(mems, [1, 0, 2, 3])),
                       "mem_mask": mem_mask},
              "cached": {name: (np.ones([batch, mem_len], np.bool_) if name == "mem_mask" else
                                rng.normal(size=[batch] + shapes[name]).astype(np.float32))
                         for name, _ in state_names(config.n_layer)}}
    pairs = {"step": [("mems", "new_mems"), ("mem_mask", "new_mem_mask")],
             "cached": state_names(config.n_layer)}
    result = {}
    for kind, name in (("step", "txl"), ("cached", "txl_cached")):
        session = ort.InferenceSession(model_file(repo, name), providers=["CPUExecutionProvider"])
        outputs = [o.name for o in session.get_outputs()]
        state = states[kind]

        def request(session=session, outputs=outputs, state=state, pairs=pairs[kind]):
            out = dict(zip(outputs, session.run(None, {"token_ids": ids, **state})))
            state.update({name: out[new] for name, new in pairs})
        result[f"triton_{kind}_ms"] = median_seconds(request, tokens) * 1e3
        del session
    return result


def runtime_parts(runtime):
    """Seconds of a 32-id `decode_read` on a state's cache plus 32 steps (the
    generation flow's unchecked calls)."""
    import numpy as np
    from export.runtime import generation_backend
    loop = generation_backend(runtime)

    def parts(state, turn):
        start = time.perf_counter()
        new = loop.read_cached(turn, state.cache.tensors)[1]
        read = time.perf_counter() - start
        ids, stopped = np.full([1], 5, np.int32), np.zeros([1], np.bool_)
        return read + TURN * statistics.median(
            seconds(lambda: loop.next_cached(ids, stopped, new)) for _ in range(8))
    return parts


def decoder_parts(decoder):
    """Seconds of a 32-id read on a state's cache plus 32 compiled steps."""
    def parts(state, turn):
        read = seconds(lambda: decoder.read_cached(turn, state.cache.tensors))
        return read + TURN * time_xla_from_state(decoder, state)
    return parts


def time_xla_from_state(decoder, state):
    """Seconds per token of the compiled loop from a state (no projection)."""
    def run(n):
        return seconds(lambda: decoder.generate(None, n, resume=state))
    run(TURN), run(3 * TURN)
    return seconds_per_extra_token(run, TURN, 3 * TURN)[2]


def preset_config(preset, mem_len=None, clamp_len=None):
    """The config of `preset` with `mem_len` (default: the paper's evaluation
    memory, `PAPER_MEMORY`, else the preset's) and `clamp_len` (default the
    preset's)."""
    from txl_tf.config import TransformerXLConfig
    mem_len = mem_len or PAPER_MEMORY.get(preset)
    return TransformerXLConfig.preset(preset, **({"mem_len": mem_len} if mem_len else {}),
                                      **({"clamp_len": clamp_len} if clamp_len is not None
                                         else {}))


def xla_scope(xla_device="cpu"):
    """TensorFlow's device scope where the XLA decoder runs, `--xla_device`:
    the CPU, or the first GPU (imported here: a run of the ONNX exports alone
    needs no TensorFlow)."""
    import tensorflow as tf
    return tf.device(XLA_DEVICES[xla_device][0])


def tf_read_bandwidth(device, gib=0.75, repeats=5):
    """Bytes per second of an XLA-compiled TensorFlow sum over float32 held
    on `device` ("/GPU:0"): the GPU's bandwidth as the XLA decoder reads
    (`bandwidth_between` of a read of `gib` GiB and one of twice that)."""
    import tensorflow as tf
    count = int(gib * 2 ** 30) // 4
    compiled = tf.function(tf.reduce_sum, jit_compile=True)

    def reader(size):
        with tf.device(device):
            data = tf.ones([size], tf.float32)

        def read():
            with tf.device(device):
                return compiled(data).numpy()
        return read
    return bandwidth_between(reader(count), reader(2 * count), 4 * count, repeats)


def export_random(core, folder, **options):
    """Exports the model `core` (random weights) into `folder/out` (its
    weights in `folder/model`), unverified, with the export job's `options`."""
    from export import run_export
    from txl_tf.weights import save_pretrained
    save_pretrained(core, os.path.join(folder, "model"))
    start = time.perf_counter()
    run_export(os.path.join(folder, "out"), os.path.join(folder, "model"), verify=False,
               overwrite=True, **options)
    print(f"{os.path.basename(folder)}: exported in {time.perf_counter() - start:.0f} s",
          flush=True)


def check_export_flags(o):
    """Raises `TxlError` for a bad `--device` or `--reuse_exports` without
    `--work_dir` (the parts that export or reuse exports)."""
    check_device_flag(o["device"])
    if o["reuse_exports"] and not o["work_dir"]:
        raise TxlError("--reuse_exports needs --work_dir (the folder holding the exports)")


def open_export(folder, backend, mem_len, asked_device, decode_dtype=None, **options):
    """The runtime of the export in `folder/out` (`open_runtime`'s
    `options`); `TxlError` where ONNX Runtime was asked for CUDA
    (`asked_device`) and could not open it, where the export's memory is
    not `mem_len` slots, or where its ONNX decode graphs do not compute in
    `decode_dtype` (where given: `--decode_dtype`, which the results'
    settings record, must say what ran)."""
    from export import open_runtime
    runner = open_runtime(os.path.join(folder, "out"), backend=backend, **options)
    if backend == "onnx":
        check_opened_on(runner, asked_device)
    if runner.mem_len != mem_len:
        raise TxlError(f"the export in {folder} holds {runner.mem_len} memory slots, not "
                       f"{mem_len} (--mem_len)")
    if backend == "onnx" and decode_dtype and runner.info.decode_dtype != decode_dtype:
        raise TxlError(f"the export in {folder} has {runner.info.decode_dtype} decode graphs, "
                       f"not {decode_dtype} (--decode_dtype: pass "
                       f"--decode_dtype={runner.info.decode_dtype} to time them)")
    return runner


# The ONNX export stepped as before `decode_token` (the step, then the ring's
# write graph), timed beside it: `--backends=onnx,onnx_step_write`.
STEP_AND_WRITE = "onnx_step_write"
SPEED_BACKENDS = ("xla", "onnx", "saved_model", "triton", STEP_AND_WRITE)


def without_token_step(folder):
    """`folder` + "_step_write": its `out` seen without `decode_token.onnx`
    (links to every other file), as an export made before it."""
    from export.metadata import DECODE_TOKEN_FILE
    view = folder.rstrip(os.sep) + "_step_write"
    out = os.path.join(view, "out")
    shutil.rmtree(view, ignore_errors=True)
    os.makedirs(out)
    for name in os.listdir(os.path.join(folder, "out")):
        if name != DECODE_TOKEN_FILE:
            os.symlink(os.path.abspath(os.path.join(folder, "out", name)), os.path.join(out, name))
    return view


def run_preset(preset, o, bandwidth, work):
    from export.runtime import generation_backend
    config = preset_config(preset, o["mem_len"], o["clamp_len"])
    mem_len = config.mem_len
    backends = [b.strip() for b in o["backends"].split(",") if b.strip()]
    formats = tuple(dict.fromkeys("onnx" if b == STEP_AND_WRITE else b for b in backends
                                  if b in ("onnx", STEP_AND_WRITE, "saved_model", "triton")))
    folder = os.path.join(work, preset)
    core = None
    if "xla" in backends or (formats and not o["reuse_exports"]):
        from txl_tf import TransformerXL
        with xla_scope(o["xla_device"]):  # the XLA decoder's weights, where it runs
            core = TransformerXL(config)
    if formats and not o["reuse_exports"]:
        export_random(core, folder, formats=formats,
                      log_probs="last" if "triton" in formats else "all",
                      decode_dtype=o["decode_dtype"])
    rows = []
    for backend in backends:
        if backend == "triton":
            for batch in parse_batch_sizes(o["batch_sizes"]):
                bound_ms = step_bytes(config, mem_len, batch) / bandwidth["cpu"] * 1e3
                row = {"preset": preset, "mem_len": mem_len, "backend": backend,
                       "batch": batch, "bound_ms": bound_ms,
                       **time_triton(os.path.join(folder, "out", "triton"), config, mem_len,
                                     batch, o["tokens"])}
                print(json.dumps(row), flush=True)
                rows.append(row)
            continue
        # On a machine where TensorFlow sees a GPU it would place the XLA decoder
        # there: it runs where --xla_device says, timed against that device's bound.
        with xla_scope(o["xla_device"]) if backend == "xla" else contextlib.nullcontext():
            if backend == "xla":
                import tensorflow as tf
                from txl_tf import Decoder, Memory
                runner = Decoder(core, mem_len=mem_len)

                def step(ids, memory, runner=runner):
                    return runner.step_last(ids, Memory(tf.constant(memory[0]),
                                                        tf.constant(memory[1])))
                parts, model_config = decoder_parts(runner), config
            else:
                kind = "onnx" if backend == STEP_AND_WRITE else backend
                options = {"device": o["device"], "device_cache": CACHE_PLACES[o["device_cache"]],
                           "cuda_graph": CACHE_PLACES[o["cuda_graph"]]
                           } if kind == "onnx" else {"device": "cpu"}
                source = without_token_step(folder) if backend == STEP_AND_WRITE else folder
                runner = open_export(source, kind, mem_len, o["device"],
                                     decode_dtype=o["decode_dtype"], **options)
                step, parts = generation_backend(runner).step_last, runtime_parts(runner)
                model_config = runner.config  # a reused export's own sizes
            for batch in parse_batch_sizes(o["batch_sizes"]):
                memory = full_memory(model_config, mem_len, batch)
                timing = (time_xla if backend == "xla" else time_runtime)(runner, memory, batch,
                                                                         o["tokens"])
                device = XLA_DEVICES[o["xla_device"]][1] if backend == "xla" else \
                    getattr(runner, "device", "cpu")
                bound_ms = step_bytes(model_config, mem_len, batch) / bandwidth[device] * 1e3
                row = {"preset": preset, "mem_len": mem_len, "clamp_len": model_config.clamp_len,
                       "backend": backend, "batch": batch,
                       "device": device, "device_cache": getattr(runner, "device_cache", False),
                       "cuda_graph": getattr(runner, "cuda_graph", False),
                       **timing, "bound_ms": bound_ms,
                       "over_bound": timing["per_token_ms"] / bound_ms,
                       "tokens_per_s": batch * 1e3 / timing["per_token_ms"]}
                if backend in ("onnx", STEP_AND_WRITE):
                    row.update(time_token_parts(runner, memory, batch, o["tokens"]))
                if backend == "onnx" and runner.info.decode_dtype != "float32":
                    # beside the float32 bound: what this step reads in its own dtype
                    own_ms = step_bytes(model_config, mem_len, batch, 2) / bandwidth[device] * 1e3
                    row.update(decode_dtype=runner.info.decode_dtype, own_bound_ms=own_ms,
                               over_own_bound=timing["per_token_ms"] / own_ms)
                if batch == 1 and o["turns"]:
                    row.update(time_turn(runner, memory, parts))
                    row.update(time_prompt(runner, model_config, mem_len, step))
                if batch > 1 and o["sessions"] and backend not in ("xla", STEP_AND_WRITE):
                    row.update(time_sessions(runner, model_config, mem_len, batch, o["tokens"]))
                print(json.dumps(row), flush=True)
                rows.append(row)
            del runner
    return rows


def run_speed(o):
    r"""`--part=speed`: ms per new token against the bandwidth bound, turns, prompts.

    Random weights of each preset, exported with the paper's evaluation memory
    (`enwik8_base` 2,100; `wt103_base` 1,600; else the preset's `mem_len`, or
    `--mem_len`), unclamped unless `--clamp_len` (the paper's evaluation clamp,
    820 for `enwik8_base`). Memory full (every slot valid, random states). Per backend
    (the XLA `Decoder`, ONNX Runtime, SavedModel) and batch size:

    - **per token**: milliseconds per new token on the decode cache. Runtimes:
      the median of `--tokens` `decode_step` calls (as `generate` runs them).
      XLA: one compiled decode of `--tokens` + 32 ids minus one of `--tokens`,
      over 32 (the projection at the call's start cancels out);
      its first call (compile) is printed.
    - **bound**: bytes one step must read (the float32 weights once, and each
      row's cached keys and values) over this machine's read bandwidth measured
      in the same run: the fastest of a numpy, a TensorFlow and an XLA sum over
      1 GiB (best of 3 each); on CUDA an ONNX Runtime sum over 1.5 GiB less
      one over 0.75 GiB, held on the GPU (`cuda_read_bandwidth`: a call's fixed cost
      cancels). The ratio is printed; a ratio below 1 (for a 16-bit step: to
      the bytes it reads, `over_own_bound`) means the bandwidth was measured
      too low, and is flagged as a measurement error on its row and in the
      last line.

    At batch 1 also (`--turns`):
    - **turn**: a conversation's next turn after a full memory, 32 ids in and
      32 generated (`generate(turn, 32, resume=state)`), beside what its parts
      cost alone (one 32-id `decode_read` on the cache + 32 decode steps; the
      two alternate over 5 rounds and `÷ parts` is the median of the rounds'
      ratios), and beside the turn read on the memory (`memory=`: the memory
      projected again).
    - **prompt**: a prompt of the memory's length read into an empty memory
      (`generate(prompt, 1)`, a later call: compile excluded) in tokens/s,
      the first call's seconds (compiling included), beside the evaluation
      throughput at that memory (`step` over segments of `tgt_len` on a full
      memory).

    At batch > 1 on the runtimes also (`--sessions`):
    - **sessions**: a `SessionTable` of that many sessions, each on its own full
      memory: ms per step on the decode cache's slab, beside the runtime's own
      step on the slab's rows without the table (its `GenerationBackend`'s
      unchecked `next_cached`; the two alternate over 3 rounds; `÷ own` is
      the median of the rounds' ratios), and ms per step of the same table
      through `step_last` (the table without the cache: every step projects every
      memory again).

    On ONNX Runtime where the steps run over fixed buffers (`--cuda_graph`:
    on CUDA by default) also:
    - **token parts**: ms a token of the step graph's run alone, the step
      with its copies in and out, the ring's write, the whole loop step, and
      the rest (`time_token_parts`): how much of a token is the graphs'
      kernels and how much the host's copies, launches and Python.

    With `triton` in `--backends`: the Triton repository's two models run in
    onnxruntime as Triton's sequence batcher runs them (the state fed back as
    the next input), one id per request on a full memory: the step model (the
    memory as layer inputs, projected again every request) and the cached
    model (the memory as keys and values, written whole every request).

    Prints a table and writes JSON.
    """
    parse_batch_sizes(o["batch_sizes"])  # a bad value fails before any export
    backends = [b.strip() for b in o["backends"].split(",") if b.strip()]
    unknown = [b for b in backends if b not in SPEED_BACKENDS]
    if unknown:
        raise TxlError(f"--backends: unknown {unknown}; each one of {', '.join(SPEED_BACKENDS)}")
    check_export_flags(o)
    xla_on_gpu = "xla" in backends and o["xla_device"] == "gpu"
    if "xla" in backends:
        try:
            import tensorflow as tf
        except ImportError:
            raise TxlError("--backends=xla needs TensorFlow (the XLA decoder is the Keras "
                           "side's); without it, time the ONNX exports: --backends=onnx "
                           "--reuse_exports") from None
    if xla_on_gpu:
        if not tf.config.list_physical_devices("GPU"):
            raise TxlError("--xla_device=gpu: TensorFlow sees no GPU here")
    for name in ("device_cache", "cuda_graph"):
        if o[name] not in CACHE_PLACES:
            raise TxlError(f"--{name} must be auto, true or false, got {o[name]!r}")
    if o["reuse_exports"] and o["clamp_len"] is not None:
        raise TxlError("--clamp_len makes this run's model; with --reuse_exports the exports "
                       "keep the clamp they were made with")
    work = o["work_dir"] or tempfile.mkdtemp(prefix="txl_long_memory_")
    share_the_gpu()  # TensorFlow's reads below, onnxruntime-gpu beside them
    reads = read_bandwidths()
    bandwidth = {"cpu": max(reads.values())}  # bytes/s of each device a backend runs on
    if _on_cuda(o["device"]):
        bandwidth["cuda"] = cuda_read_bandwidth()
    if xla_on_gpu:
        bandwidth["cuda"] = max(bandwidth.get("cuda", 0.0), tf_read_bandwidth("/GPU:0"))
    rows = []
    try:
        for preset in [p.strip() for p in o["presets"].split(",") if p.strip()]:
            rows += run_preset(preset, o, bandwidth, work)
    finally:  # a temporary folder's exports are gigabytes at the real presets
        if not o["work_dir"]:
            shutil.rmtree(work, ignore_errors=True)
    result = {"settings": o, "read_gb_per_s": bandwidth["cpu"] / 1e9,
              "reads_gb_per_s": {k: v / 1e9 for k, v in reads.items()}, "rows": rows}
    if "cuda" in bandwidth:
        result["cuda_read_gb_per_s"] = bandwidth["cuda"] / 1e9
    print("read bandwidth " + ", ".join(f"{device} {value / 1e9:.1f} GB/s"
                                        for device, value in bandwidth.items()) +
          " (cpu: the best of " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in reads.items()) +
          ")")
    below = below_bound(rows)
    for r in below:
        print(f"MEASUREMENT ERROR: {r['preset']} {r['backend']} batch {r['batch']} ran at "
              f"{lowest_ratio(r):.2f}x the bound: the read bandwidth was measured too low")
    print("| preset | memory | backend | device | batch | ms / step | tokens/s | bound ms "
          "| ÷ bound | turn ms | ÷ parts | turn on memory ms | prompt tok/s | ÷ eval "
          "| prompt first s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    triton = [r for r in rows if "triton_step_ms" in r]
    rows = [r for r in rows if "triton_step_ms" not in r]
    for r in rows:
        turn = (f"{r['turn_ms']:.0f} | {r['turn_over_parts']:.2f} | "
                f"{r['turn_on_memory_ms']:.0f} | {r['prompt_tokens_per_s']:.0f} | "
                f"{r['prompt_over_eval']:.2f} | {r['prompt_first_call_s']:.1f}"
                ) if "turn_ms" in r else " | | | | |"
        device = r["device"] + (" (cache there)" if r["device_cache"] else "") + (
            ", graphs" if r.get("cuda_graph") else "")
        memory = str(r["mem_len"]) + (f" (clamp {r['clamp_len']})" if r.get("clamp_len", -1) > 0
                                      else "")
        print(f"| {r['preset']} | {memory} | {r['backend']} | {device} | {r['batch']} | "
              f"{r['per_token_ms']:.1f} | {r['tokens_per_s']:.0f} | {r['bound_ms']:.1f} | "
              f"{r['over_bound']:.2f}" + (f" ({r['over_own_bound']:.2f} of the "
                                          f"{r['decode_dtype']} bytes)"
                                          if "over_own_bound" in r else "") + f" | {turn} |")
    print_table(["preset", "backend", "sessions", "table ms / step", "÷ own batch step",
                 "through step_last ms"],
                [[r["preset"], r["backend"], r["batch"], f"{r['table_ms']:.1f}",
                  f"{r['table_over_own']:.2f}", f"{r['table_step_last_ms']:.0f}"]
                 for r in rows if "table_ms" in r])
    print_table(["preset", "backend", "batch", "step graph ms", "read ms", "write ms", "token ms",
                 "host ms"],
                [[r["preset"], r["backend"], r["batch"]] +
                 [f"{r['token_parts'][name]:.3f}" for name in TOKEN_PARTS]
                 for r in rows if "token_parts" in r])
    print_table(["preset", "batch", "bound ms", "Triton step model ms (÷ bound)",
                 "cached model ms (÷ bound)"],
                [[r["preset"], r["batch"], f"{r['bound_ms']:.1f}",
                  f"{r['triton_step_ms']:.1f} ({r['triton_step_ms'] / r['bound_ms']:.2f})",
                  f"{r['triton_cached_ms']:.1f} ({r['triton_cached_ms'] / r['bound_ms']:.2f})"]
                 for r in triton])
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(speed_summary(rows))


def print_table(header, rows):
    """Prints a markdown table of `rows` (lists of cells) after a blank
    line, nothing where there are no rows."""
    if rows:
        print("\n| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
    for cells in rows:
        print("| " + " | ".join(str(cell) for cell in cells) + " |")


def lowest_ratio(row):
    """A speed row's step time over the least its step can take: over the
    bound of the bytes it reads (`over_own_bound` for a 16-bit step, which
    reads about half the float32 step's `over_bound` bytes)."""
    return row.get("over_own_bound", row.get("over_bound", 1.0))


def below_bound(rows):
    """The speed rows that ran faster than their bound (`lowest_ratio` < 1):
    no correct step does, so the bandwidth was measured too low.

    Args:
        rows: `run_preset`'s rows.
    Returns:
        those rows, in order."""
    return [r for r in rows if r.get("bound_ms", 0) > 0 and lowest_ratio(r) < 1]


def speed_summary(rows):
    """The speed part's last line (the GPU check's result): each row's ms a
    step (a token for each of its rows) and ÷ bound, its session table's,
    and where a row ran below its bound (`below_bound`) a measurement error.

    Args:
        rows: `run_preset`'s rows (Triton's left out).
    Returns:
        str."""
    below = below_bound(rows)
    return "ms a step, one token a row (÷ bound): " + "; ".join(
        f"{r['preset']} {r['backend']} {r['device']} b{r['batch']} {r['per_token_ms']:.2f} "
        f"({r['over_bound']:.1f}x" + (f", {r['over_own_bound']:.1f}x of its {r['decode_dtype']} "
                                      "bytes" if "over_own_bound" in r else "")
        + (", below the bound: MEASUREMENT ERROR" if any(r is b for b in below) else "") + ")"
        + (f", table {r['table_ms']:.1f} ({r['table_over_own']:.2f}x the batch step)"
           if "table_ms" in r else "")
        for r in rows)


def check_device_flag(device):
    """Raises `TxlError` unless `--device` is cpu, cuda or auto."""
    if device not in ("cpu", "cuda", "auto"):
        raise TxlError(f"--device must be cpu, cuda or auto, got {device!r}")


def check_opened_on(runtime, device):
    """Raises `TxlError` where `--device=cuda` was asked for and `runtime`
    (an ONNX Runtime one) did not open on CUDA."""
    if device == "cuda" and runtime.device != "cuda":
        raise TxlError("--device=cuda: ONNX Runtime could not open its CUDA provider "
                       "(is onnxruntime-gpu installed, and does it see the GPU?)")


def _on_cuda(device):
    """Whether ONNX Runtime runs on CUDA here for `--device` (its CUDA
    provider listed and loading: `export.onnx_runtime.choose_providers`)."""
    if device == "cpu":
        return False
    from export.onnx_runtime import CUDA, choose_providers
    return CUDA in choose_providers(device)[0]


# ---------------------------------------------------------------- evaluation
EVALUATION_SPEC = (
    option("string", "presets", "enwik8_base", "Comma-separated model presets (random weights)."),
    option("integer", "mem_len", None, "Memory length (default: the paper's evaluation memory for "
           "enwik8_base / wt103_base, else the preset's)."),
    option("integer", "segment_len", 512, "Ids per row in each evaluated segment."),
    option("string", "batch_sizes", "1,16", "Comma-separated batch sizes."),
    option("integer", "segments", 3, "Segments read per timed run, the memory carried (>= 2: the "
           "NLL check needs a carried memory)."),
    option("integer", "repeats", 5, "Timed runs of each path, interleaved in rounds after a "
           "warm-up round (which checks the NLLs); the medians are reported."),
    option("float", "tolerance", 1e-5, "Largest NLL difference allowed between a path through "
           "the API and the bound."),
    option("string", "device", "cpu", "ONNX Runtime's device: cpu, cuda or auto (cuda: an error "
           "where its provider does not load)."),
    option("string", "fixed_shapes", "auto", "The runtime's fixed_shapes: auto, true, one_token "
           "or false (segments on sessions of fixed shapes; auto: on CUDA)."),
    option("string", "tf32_rows", "auto", "Also time the bound graph and score on a runtime with "
           "TF32 matmuls (open_runtime(tf32=True)): bound_tf32 and score_tf32, their NLLs' "
           "difference to the float32 bound's stated, not held to --tolerance: auto (on CUDA; "
           "on the CPU TF32 changes nothing), true or false."),
    option("string", "work_dir", None, "Where the exports go, kept (default: a temporary folder, "
           "removed at the end)."),
    option("bool", "reuse_exports", False, "Time the exports already in --work_dir (<preset>/out, "
           "e.g. made on another machine: --part=onnx_weights) instead of "
           "exporting; ONNX needs no TensorFlow then."),
    option("string", "reference_dir", None, "The pytorch/ folder of kimiyoung/transformer-xl: "
           "the paper's code on the same shape (on CUDA)."),
    option("string", "reference_python", sys.executable, "A Python interpreter with torch, for "
           "--reference_dir."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results",
                                            "long_memory_evaluation.json"),
           "Where to write the JSON results."),
)
# The paths timed, in the table's order: the graph with bound buffers (the
# runtime's fastest way, then its dynamic-shape session), then the public API
# with the memory it returns fed back, then with a numpy memory.
EVALUATION_PATHS = ("bound", "bound_dynamic", "score", "step", "score_numpy", "step_numpy")
# With --tf32_rows: the bound graph and score on a runtime whose float32 matmuls use TF32
# (issue 53 allows lower precision against the paper's code, its parity stated).
TF32_PATHS = ("bound_tf32", "score_tf32")
# issue 53: the API with the memory on the device >= 0.9x the bound (benchmarks/issue_targets.py)
API_TARGET = limit_of("api_over_bound")


def gather_nll(log_probs, targets):
    """Each target's negative log-probability, numpy `[B, T]`."""
    return -np.take_along_axis(log_probs, targets[..., None].astype(np.int64), -1)[..., 0]


def bound_path(runtime, memory, segments, dynamic=False):
    """The graph's own speed: `model.onnx` the fastest way the runtime runs
    it, every input and output bound on its device. Where the runtime fixes
    the segments' shape (`fixed_shapes`) that is its fixed-shape session:
    on the device path over its fixed buffers (`fixed_bound_path`, a CUDA
    graph replayed on CUDA), else bound as below; otherwise, or with
    `dynamic`, its main (dynamic-shape) session: the ids placed on the
    device beforehand, the memory fed back as OrtValues, two sets of memory
    buffers and one of log-probs allocated once. Returns `run(keep=None)`,
    which reads `segments` (`[(ids, targets)]`, numpy `[B, T]`) from the
    numpy `memory`; `keep(nll)` (the check, not timed) gets each segment's
    NLL, its log-probs copied to the host."""
    import onnxruntime as ort
    from export.device_cache import ortvalue
    from export.device_memory import FixedSegment
    fixed = None if dynamic else runtime._fixed_for(segments[0][0].shape, open_now=True)
    if isinstance(fixed, FixedSegment):
        return fixed_bound_path(fixed, memory, segments)
    session, device = fixed or runtime.session, runtime.device

    def empty(shape, dtype):
        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, device, 0)
    start = [ortvalue(value, device) for value in memory]
    buffers = [[empty(value.shape, value.dtype) for value in memory] for _ in range(2)]
    batch, length = segments[0][0].shape
    log_probs = empty([batch, length, runtime.n_token], np.float32)
    ids = [ortvalue(np.asarray(i, np.int32), device) for i, _ in segments]
    binding = session.io_binding()
    binding.bind_ortvalue_output("log_probs", log_probs)

    def run(keep=None):
        mems, mem_mask = start
        for i, segment in enumerate(ids):
            new_mems, new_mem_mask = buffers[i % 2]
            binding.bind_ortvalue_input("token_ids", segment)
            binding.bind_ortvalue_input("mems", mems)
            binding.bind_ortvalue_input("mem_mask", mem_mask)
            binding.bind_ortvalue_output("new_mems", new_mems)
            binding.bind_ortvalue_output("new_mem_mask", new_mem_mask)
            session.run_with_iobinding(binding)
            if keep:
                keep(gather_nll(log_probs.numpy(), segments[i][1]))
            mems, mem_mask = new_mems, new_mem_mask
    return run


def fixed_bound_path(fixed, memory, segments):
    """`bound_path` over a `FixedSegment`'s buffers: the start memory copied
    in, each segment's ids written in place, the new memory copied back
    into the inputs on the device (`feed_back`: one copy a segment, what a
    graph tied to its buffers needs)."""
    from export.device_cache import ortvalue
    start = [ortvalue(value, fixed.device) for value in memory]
    ids = [np.asarray(i, np.int32) for i, _ in segments]

    def run(keep=None):
        fixed.load(*start)
        for segment, (_, targets) in zip(ids, segments):
            fixed.replay(segment)
            if keep:
                keep(gather_nll(fixed.outputs["log_probs"].numpy(), targets))
            fixed.feed_back()
    return run


def api_path(runtime, memory, segments, score, on_device):
    """A path through the public API, as docs/export-and-serving.md shows it:
    `rt.score(ids, targets, memory)` (`score`) or `rt.step(ids, memory)`,
    the memory it returns fed back as it is (`on_device`: OrtValues on the
    runtime's device, placed there once by `rt.take`) or as numpy
    (`memory.numpy()` after every call, what users did before). `run(keep)`
    as `bound_path`'s (a step's NLL gathered from its log-probs)."""
    start = runtime.take(memory, range(len(memory[1]))) if on_device else memory

    def run(keep=None):
        state = start
        for ids, targets in segments:
            if score:
                nll, state = runtime.score(ids, targets, state)
            else:
                log_probs, state = runtime.step(ids, state)
            if not on_device:
                state = state.numpy()
            if keep:
                keep(nll if score else gather_nll(log_probs, targets))
    return run


def evaluation_paths(runtime, memory, segments, tf32_runtime=None):
    """`{path: run}` of `EVALUATION_PATHS` (see `bound_path`, `api_path`),
    and of `TF32_PATHS` on `tf32_runtime` where given."""
    paths = {"bound": bound_path(runtime, memory, segments),
             "bound_dynamic": bound_path(runtime, memory, segments, dynamic=True)}
    for name in EVALUATION_PATHS[2:]:
        paths[name] = api_path(runtime, memory, segments, score=name.startswith("score"),
                               on_device=not name.endswith("numpy"))
    if tf32_runtime is not None:
        paths["bound_tf32"] = bound_path(tf32_runtime, memory, segments)
        paths["score_tf32"] = api_path(tf32_runtime, memory, segments, score=True,
                                       on_device=True)
    return paths


def check_nll(runtime, memory, segments, paths, tolerance):
    """Runs each path once (the warm-up round) keeping its NLLs; returns
    `{"nll_max_abs_diff": {path: max |NLL - the bound's|}, "memory_effect":
    max |d NLL| of the second segment read on the start memory instead of
    the carried one}`. Raises `TxlError` where the memory does not move the
    NLLs beyond `tolerance`: the check could not see a path that drops it."""
    nll = {}
    for name, run in paths.items():
        nll[name] = []
        run(nll[name].append)
    bound = np.stack(nll["bound"])
    diffs = {name: float(np.abs(np.stack(values) - bound).max())
             for name, values in nll.items() if name != "bound"}
    ids, targets = segments[1]
    uncarried = runtime.score(ids, targets, memory)[0]
    effect = float(np.abs(uncarried - bound[1]).max())
    if not effect > tolerance:
        raise TxlError(f"the memory carried moves the NLLs by {effect:.1e} only (<= --tolerance "
                       f"{tolerance:g}): the check cannot tell a path that drops it")
    return {"nll_max_abs_diff": diffs, "memory_effect": effect}


def paper_tokens_per_s(o, config, mem_len, batch_sizes, device):
    """`{batch: (tok/s, None)}` of the paper's PyTorch code evaluating
    segments of `--segment_len` on a memory of `mem_len` at each batch size
    (`paper_reference.py`, one process set up per batch size, float32 with
    TF32 off; the median step after its memory has filled), or `{batch:
    (None, why it is absent)}`."""
    def absent(why):
        return {batch: (None, why) for batch in batch_sizes}
    if device != "cuda":
        return absent("timed on CUDA only")
    if not o["reference_dir"]:
        return absent("no --reference_dir")
    if config.div_val != 1:
        return absent("its worker builds div_val 1 only")
    from benchmarks.throughput import ReferenceWorker
    shape = dict(mode="eval", n_token=config.n_token, n_layer=config.n_layer,
                 d_model=config.d_model, n_head=config.n_head, d_head=config.d_head,
                 d_inner=config.d_inner, dropout=0.0, dropatt=0.0, tgt_len=o["segment_len"],
                 mem_len=mem_len, threads=os.cpu_count(), cutoffs=list(config.cutoffs),
                 device="cuda", precision="float32")
    result, worker = {}, None
    try:
        for batch in batch_sizes:
            if worker is None:
                worker = ReferenceWorker(o["reference_python"], o["reference_dir"],
                                         dict(shape, batch_size=batch))
            else:
                worker.setup(dict(shape, batch_size=batch))
            worker(-(-mem_len // o["segment_len"]) + 1)  # its memory grows to mem_len
            seconds = worker(o["segments"] * o["repeats"])
            result[batch] = (batch * o["segment_len"] / statistics.median(seconds), None)
    except (OSError, RuntimeError, ValueError) as error:
        return absent(f"the paper's code did not run: {error}")
    finally:
        if worker is not None:
            worker.close()
    return result


def evaluate_batch(runtime, o, batch, paper, tf32_runtime=None):
    """The rows of one batch size (see `run_evaluation`); `paper` is
    `(tok/s, None)` or `(None, reason)`; `tf32_runtime`: the same export
    with TF32 matmuls (the `TF32_PATHS`), or None."""
    rng = np.random.default_rng(batch)
    shape = (batch, o["segment_len"])
    segments = [(rng.integers(0, runtime.n_token, shape, dtype=np.int32),
                 rng.integers(0, runtime.n_token, shape, dtype=np.int32))
                for _ in range(o["segments"])]
    memory = full_memory(runtime.config, runtime.mem_len, batch)
    paths = evaluation_paths(runtime, memory, segments, tf32_runtime)
    check = check_nll(runtime, memory, segments, paths, o["tolerance"])
    times = {name: [] for name in paths}
    for _ in range(o["repeats"]):  # rounds: this machine's speed drifts over minutes
        for name, run in paths.items():
            times[name].append(seconds(run))
    tokens = batch * o["segment_len"] * o["segments"]
    rows = []
    for name in paths:
        row = {"path": name, "batch": batch, "tokens_per_s": tokens / statistics.median(
                   times[name]), "seconds": times[name],
               # the median of the rounds' ratios (the rounds' speeds differ)
               "over_bound": statistics.median(b / s for b, s in zip(times["bound"],
                                                                   times[name])),
               "nll_max_abs_diff": check["nll_max_abs_diff"].get(name, 0.0),
               "memory_effect": check["memory_effect"]}
        if name in ("score", "step"):
            row["meets_target"] = row["over_bound"] >= API_TARGET
        rows.append(row)
    rows.append({"path": "paper", "batch": batch, "tokens_per_s": paper[0],
                 **({"absent": paper[1]} if paper[1] else {})})
    for row in rows:
        if paper[0] and row["tokens_per_s"]:
            row["over_paper"] = row["tokens_per_s"] / paper[0]
    return rows


def run_evaluation(o):
    r"""`--part=evaluation`: evaluation through the runtime API against the
    graph's own speed (issue 53).

    Random weights of each preset exported with `log_probs='all'` (or the
    exports in `--work_dir` with `--reuse_exports`), opened with
    `open_runtime(device=--device)`. Per batch size, on a full memory of
    `--mem_len` (every slot valid, random states), `--segments` segments of
    `--segment_len` random ids read one after the other, the memory carried,
    along each path:

    - **bound**: `model.onnx` the fastest way the runtime runs it, every
      input and output bound on its device (`bound_path`): the graph's
      speed; on its fixed-shape session where it fixes the segments' shape
      (`--fixed_shapes`; "auto": on CUDA, where the fixed buffers replay as
      a CUDA graph);
    - **bound_dynamic**: the same through its dynamic-shape session (what
      fixing the shapes, and replaying, gained);
    - **score**, **step**: `rt.score(ids, targets, memory)` and
      `rt.step(ids, memory)`, the memory they return fed back as it is (on
      the device);
    - **score_numpy**, **step_numpy**: the same with a numpy memory
      (`memory.numpy()` after each call: the bus both ways on a GPU);
    - **bound_tf32**, **score_tf32** (`--tf32_rows`, on CUDA by default):
      the bound graph and score on a second runtime of the same export
      whose float32 matmuls use TF32, their NLLs' largest difference to
      the float32 bound's stated (not held to `--tolerance`; a tenth of
      what the memory moves the NLLs, or more, fails the part);
    - **paper**: on CUDA with `--reference_dir`, the paper's PyTorch code on
      the same shape in its own process (float32, TF32 off); else absent,
      with the reason.

    A warm-up round runs every path once and checks that each gives the
    bound's NLLs within `--tolerance`, and that the memory carried moves
    them beyond it (so a path that dropped it would differ). Then
    `--repeats` rounds time each path in turn: tok/s from the median run,
    ÷ bound the median of the rounds' ratios, against the issue's target
    (>= 0.9 for the API with the memory on the device). Prints a table and
    writes JSON (also when the check fails); ends with an error when a path's
    NLLs differ from the bound's.
    """
    batch_sizes = parse_batch_sizes(o["batch_sizes"])
    at_least(o, 1, "segment_len", "repeats")
    at_least(o, 2, "segments")
    check_export_flags(o)
    fixed_shapes = {**CACHE_PLACES, "one_token": "one_token"}.get(o["fixed_shapes"])
    if fixed_shapes is None:
        raise TxlError("--fixed_shapes must be auto, true, one_token or false, got "
                       f"{o['fixed_shapes']!r}")
    if o["tf32_rows"] not in ("auto", "true", "false"):
        raise TxlError(f"--tf32_rows must be auto, true or false, got {o['tf32_rows']!r}")
    if o["device"] == "cuda" and not _on_cuda("cuda"):
        from export.onnx_runtime import cuda_built
        raise TxlError("--device=cuda: " + (
            "this onnxruntime's CUDA provider does not load here (no GPU, or its CUDA "
            "libraries not on the loader's path)" if cuda_built() else
            "this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu on a "
            "machine with an NVIDIA GPU)"))
    configs = {p.strip(): preset_config(p.strip(), o["mem_len"])
               for p in o["presets"].split(",") if p.strip()}
    if not configs:
        raise TxlError(f"--presets names no preset: {o['presets']!r}")
    work = o["work_dir"] or tempfile.mkdtemp(prefix="txl_long_memory_")
    rows, result = [], {"settings": o, "api_target": API_TARGET}
    try:
        for preset, config in configs.items():
            folder = os.path.join(work, preset)
            if not o["reuse_exports"]:
                from txl_tf import TransformerXL
                export_random(TransformerXL(config), folder, formats=("onnx",),
                              decode_cache=False, log_probs="all")
            elif not os.path.isfile(os.path.join(folder, "out", "model.onnx")):
                raise TxlError(f"--reuse_exports: no {preset} export in {folder}/out (made by "
                               "--part=speed with the same --work_dir, or --part=onnx_weights)")
            runtime = open_export(folder, "onnx", config.mem_len, o["device"],
                                  device=o["device"], fixed_shapes=fixed_shapes)
            if runtime.log_probs_mode != "all":
                raise TxlError(f"the export in {folder} has log_probs='{runtime.log_probs_mode}'"
                               "; scoring needs 'all'")
            result["device"] = runtime.device
            tf32_runtime = None
            if o["tf32_rows"] == "true" or (o["tf32_rows"] == "auto" and
                                            runtime.device == "cuda"):
                tf32_runtime = open_export(folder, "onnx", config.mem_len, o["device"],
                                           device=o["device"], fixed_shapes=fixed_shapes,
                                           tf32=True)
            papers = paper_tokens_per_s(o, runtime.config, runtime.mem_len, batch_sizes,
                                        runtime.device)
            for batch in batch_sizes:
                for row in evaluate_batch(runtime, o, batch, papers[batch], tf32_runtime):
                    rows.append({"preset": preset, "mem_len": runtime.mem_len,
                                 "segment_len": o["segment_len"], **row})
                    print(json.dumps({k: v for k, v in rows[-1].items() if k != "seconds"}),
                          flush=True)
            del runtime, tf32_runtime
    finally:
        if not o["work_dir"]:
            shutil.rmtree(work, ignore_errors=True)
    result["rows"] = rows
    print_evaluation(rows)
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    check_nll_rows(rows, o["tolerance"])
    print(evaluation_summary(rows, result["device"]), flush=True)


def check_nll_rows(rows, tolerance):
    """`TxlError` naming the first row whose NLLs are off the bound's: a
    float32 path's beyond `tolerance`, or any path's not finite (NaN never
    compares above a tolerance; the TF32 paths are exempt from the
    tolerance, not from giving numbers), or a TF32 path's by a tenth of what
    the memory carried moves them (`memory_effect`) or more: its round-off
    is far below that, a path that dropped the memory is not."""
    for r in rows:
        diff = r.get("nll_max_abs_diff")
        if diff is None:
            continue
        if not math.isfinite(diff):
            raise TxlError(f"the NLLs of {r['path']} (batch {r['batch']}) differ from the "
                           f"bound's by {diff} (not finite)")
    fp32 = [r for r in rows if r.get("nll_max_abs_diff") is not None
            and r["path"] not in TF32_PATHS]
    worst = max(fp32, key=lambda r: r["nll_max_abs_diff"])
    if worst["nll_max_abs_diff"] > tolerance:
        raise TxlError(f"the NLLs of {worst['path']} (batch {worst['batch']}) differ from the "
                       f"bound's by {worst['nll_max_abs_diff']:.1e} (> --tolerance "
                       f"{tolerance:g})")
    for r in rows:
        if r["path"] in TF32_PATHS and r["nll_max_abs_diff"] >= r["memory_effect"] / 10:
            raise TxlError(f"the NLLs of {r['path']} (batch {r['batch']}) differ from the "
                           f"bound's by {r['nll_max_abs_diff']:.1e}, a tenth or more of what "
                           f"the memory moves them ({r['memory_effect']:.1e}): more than "
                           "TF32's round-off")


def print_evaluation(rows):
    print(f"| preset | memory | segment | batch | path | tok/s | ÷ bound "
          f"| API target >= {API_TARGET:g} | × paper | NLL max diff to the bound |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["tokens_per_s"] is None:
            cells = f"absent ({r['absent']}) | | | |"
        else:
            target = {True: "yes", False: "NO"}.get(r.get("meets_target"), "")
            paper = f"{r['over_paper']:.2f}" if "over_paper" in r else ""
            over = f"{r['over_bound']:.2f}" if "over_bound" in r else ""
            nll = f"{r['nll_max_abs_diff']:.1e}" if "nll_max_abs_diff" in r else ""
            cells = f"{r['tokens_per_s']:,.0f} | {over} | {target} | {paper} | {nll}"
        print(f"| {r['preset']} | {r['mem_len']:,} | {r['segment_len']} | {r['batch']} | "
              f"{r['path']} | {cells} |")


def evaluation_summary(rows, device):
    """One line: each preset and batch's API ÷ bound and the paper's tok/s
    (the GPU check's result)."""
    parts = []
    for preset, batch in dict.fromkeys((r["preset"], r["batch"]) for r in rows):
        by = {r["path"]: r for r in rows if (r["preset"], r["batch"]) == (preset, batch)}
        paper = by["paper"]
        parts.append(f"{preset} b{batch} bound {by['bound']['tokens_per_s']:,.0f} tok/s (dynamic "
                     f"shapes {by['bound_dynamic']['tokens_per_s']:,.0f}), score "
                     f"{by['score']['over_bound']:.2f}x, step {by['step']['over_bound']:.2f}x, "
                     f"score on a numpy memory {by['score_numpy']['over_bound']:.2f}x, "
                     + (f"score with TF32 {by['score_tf32']['tokens_per_s']:,.0f} tok/s (NLLs "
                        f"{by['score_tf32']['nll_max_abs_diff']:.0e} off), "
                        if "score_tf32" in by else "") + "paper "
                     + (f"{paper['tokens_per_s']:,.0f}" if paper["tokens_per_s"]
                        else f"absent ({paper['absent']})"))
    return f"evaluation on {device}, API ÷ bound (NLLs equal): " + "; ".join(parts)


# ------------------------------------------------------------ runtime_memory
RUNTIME_MEMORY_SPEC = (
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


def run_runtime_memory(o):
    r"""`--part=runtime_memory`: what an ONNX Runtime runtime holds in memory with
    its decode cache open, and what its weight sharing costs a decode step.
    The export (`--export_dir`), e.g. of a random `enwik8_base`:

        python -m export --model_dir=<random enwik8_base> --output_dir=/tmp/e8 \
            --formats=onnx --mem_len=2100 --noverify

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
                [sys.executable, "-c", "import json, sys; from benchmarks.long_memory "
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


# ---------------------------------------------------------------------- soak
SOAK_SPEC = (
    option("string", "export_dir", None, "An export folder (`python -m export`)."),
    option("string", "backend", "onnx", "onnx or saved_model."),
    option("string", "device", "cpu", "The ONNX Runtime backend's device: cpu, cuda or auto "
           "(on CUDA the sessions' decode caches and the table's slab stay on the GPU; "
           "--backend=saved_model runs on the CPU and takes no cuda)."),
    option("integer", "soak_sessions", 2000, "Sessions opened and closed in all."),
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


def open_soak_runtime(export_dir, backend, device):
    """The soak's runtime: ONNX Runtime on `device` (`--device=cuda`: on
    CUDA, or a `TxlError`), the SavedModel on the CPU."""
    from export import open_runtime
    if backend != "onnx":
        if device == "cuda":
            raise TxlError(f"--device=cuda runs --backend=onnx only, not {backend!r}")
        return open_runtime(export_dir, backend=backend, device="cpu")
    runtime = open_runtime(export_dir, backend=backend, device=device)
    check_opened_on(runtime, device)
    return runtime


def run_soak(o):
    r"""`--part=soak`: a soak of the session table: many sessions that open, read
    a prompt, generate and close at random times over one runtime (`--export_dir`:
    a `small` export; ONNX Runtime on `--device`: on CUDA the sessions' decode
    caches and the table's slab live in GPU memory).

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
    at_least(o, 1, "soak_sessions", "max_open", "report_every")
    check_device_flag(o["device"])
    if not o["export_dir"]:
        raise TxlError("--export_dir is required (an export folder: python -m export)")
    runtime = open_soak_runtime(o["export_dir"], o["backend"], o["device"])
    start = time.perf_counter()
    results, curve = soak(runtime, o["soak_sessions"], o["max_open"], o["report_every"], o["seed"])
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


# -------------------------------------------------------------- onnx_weights
MARK = "txl_tf:random"
MIN_ELEMENTS = 4096  # smaller weights (and every integer constant) are kept

ONNX_WEIGHTS_SPEC = (
    option("string", "export_dir", None, "The export to strip (its .onnx and .json files)."),
    option("string", "skeleton_dir", None, "Where the skeleton goes (strip) or is (fill)."),
    option("bool", "fill", False, "Fill the skeleton's weights instead of stripping."),
    option("integer", "seed", 0, "Seed of the random weights (fill)."),
)


def strip(export_dir, skeleton_dir):
    """Writes the skeleton of `export_dir` into `skeleton_dir`; returns its files."""
    import onnx
    files = sorted(glob.glob(os.path.join(export_dir, "*.onnx")))
    if not files:
        raise TxlError(f"no .onnx files in {export_dir}")
    os.makedirs(skeleton_dir, exist_ok=True)
    written = []
    for path in files:
        model = onnx.load(path)
        for tensor in model.graph.initializer:
            if is_large_weight(tensor):
                tensor.ClearField("raw_data")
                tensor.ClearField("float_data")
                tensor.doc_string = MARK
        target = os.path.join(skeleton_dir, os.path.basename(path))
        onnx.save(model, target)
        written.append(target)
    for path in glob.glob(os.path.join(export_dir, "*.json")):
        shutil.copy(path, skeleton_dir)
    return written


def is_large_weight(tensor):
    """Whether the initializer `tensor` is one of the model's float weights
    (`WEIGHT_PREFIX`) of at least `MIN_ELEMENTS`: what `strip` empties.
    Other constants stay (the relative encodings `decode_init` holds)."""
    import onnx
    return tensor.name.startswith(WEIGHT_PREFIX) and \
        tensor.data_type == onnx.TensorProto.FLOAT and \
        int(np.prod(tensor.dims, dtype=np.int64)) >= MIN_ELEMENTS


def fill(skeleton_dir, seed=0):
    """Gives the marked weights of every `.onnx` file in `skeleton_dir`
    random values, in place; returns the number of weights filled. Each
    weight's values are drawn from `seed` and its name, which every graph
    of an export gives the same weight: filled, the graphs are one model.
    `TxlError`, and no file changed, where a marked tensor is not a weight
    (a skeleton stripped before weights alone were: strip the export again)."""
    import onnx
    paths = sorted(glob.glob(os.path.join(skeleton_dir, "*.onnx")))
    if not paths:
        raise TxlError(f"no .onnx files in {skeleton_dir}")
    for path in paths:
        for tensor in onnx.load(path).graph.initializer:
            if tensor.doc_string == MARK and not tensor.name.startswith(WEIGHT_PREFIX):
                raise TxlError(f"{path}: the emptied tensor {tensor.name!r} is not one of the "
                               f"model's weights ({WEIGHT_PREFIX}NNNN), so random values "
                               "would make its graphs different models: this skeleton is "
                               "older than its weights' names; strip the export again")
    filled = 0
    for path in paths:
        model = onnx.load(path)
        for tensor in model.graph.initializer:
            if tensor.doc_string == MARK:
                name = int.from_bytes(hashlib.sha256(tensor.name.encode()).digest()[:8], "little")
                values = np.random.default_rng([seed, name]).normal(0, 0.02, tuple(tensor.dims))
                values = values.astype(np.float32)
                tensor.raw_data = values.tobytes()
                tensor.doc_string = ""
                filled += 1
        onnx.save(model, path)
    return filled


def run_onnx_weights(o):
    r"""`--part=onnx_weights`: carries an ONNX export to a machine without
    TensorFlow, for timing.

    `strip` writes every `.onnx` file of an export with the model's large float
    weights emptied (shapes and names kept, marked `txl_tf:random`) beside the
    export's JSON files: megabytes instead of gigabytes. `fill` gives those
    weights random values (normal, std 0.02, seeded by `--seed` and each
    weight's name, so a weight gets the same values in every graph) in
    place. The graphs are the
    export's, so a runtime times the same work; the numbers they compute are
    a random model's. `--part=speed --reuse_exports` then times them where
    only onnxruntime is installed (the GPU machine, where TensorFlow cannot be).
    """
    if not o["skeleton_dir"]:
        raise TxlError("--skeleton_dir is required")
    at_least(o, 0, "seed")  # numpy's seeds are non-negative
    if o["fill"]:
        print(f"filled {fill(o['skeleton_dir'], o['seed'])} weights in {o['skeleton_dir']}")
    elif not o["export_dir"]:
        raise TxlError("--export_dir is required (or --fill)")
    else:
        written = strip(o["export_dir"], o["skeleton_dir"])
        print(f"wrote {len(written)} skeleton files to {o['skeleton_dir']}")


# --------------------------------------------------------------- cuda_parity
CUDA_PARITY_SPEC = (
    option("string", "exports", None, "Comma-separated export folders (model.onnx and the decode "
           "graphs)."),
    option("integer", "steps", 40, "Decode steps compared (batch 2)."),
    option("string", "device", "cuda", "cuda (the GPU against the CPU), or cpu: the same "
           "runtimes' paths (the cache on the device, replayed over fixed buffers or not) on "
           "the CPU provider against its host cache, a rehearsal of the check's exports and "
           "code where no GPU is lent."),
    option("float", "tolerance", 1e-3, "Largest log-prob difference to the CPU allowed (TF32 "
           "aside)."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "cuda_parity.json"),
           "Where to write the JSON results."),
)


def compare_devices(path, steps, device="cuda", seed=0):
    """`{...}` of one export (see the docstring of `run_cuda_parity`);
    `device` "cpu" opens the `gpu` runtimes on the CPU provider."""
    from export import open_runtime
    runtimes = {"cpu": open_runtime(path, device="cpu"),
                "gpu": open_runtime(path, device=device, device_cache=True, cuda_graph=True),
                "gpu_no_graph": open_runtime(path, device=device, device_cache=True,
                                             cuda_graph=False),
                "gpu_host": open_runtime(path, device=device, device_cache=False),
                "gpu_tf32": open_runtime(path, device=device, device_cache=True, tf32=True)}
    if runtimes["gpu"].device != device:
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
            worst[name] = max(worst[name], live_difference(out[name], out["cpu"], stopped))
    in_place = all(caches["gpu_no_graph"][name].data_ptr() == ptr
                   for name, ptr in buffers.items())
    prompts = [list(rng.integers(0, cfg.n_token, 12)), list(rng.integers(0, cfg.n_token, 5))]
    ids = {}
    for name in ("cpu", "gpu", "gpu_host"):  # gpu: replaying CUDA graphs
        first = runtimes[name].generate(prompts, 16, temperature=0.0)
        turn = runtimes[name].generate([[1, 2, 3], [4]], 16, resume=first.state,
                                       temperature=0.0)
        ids[name] = np.concatenate([first.ids, turn.ids], 1)
    return {"export": path, "steps": steps, **cuda_step_nodes(path),
            "max_diff_device_cache": worst["gpu"],
            "max_diff_no_graph": worst["gpu_no_graph"],
            "replays_graphs": runtimes["gpu"].cuda_graph,
            "max_diff_host_cache": worst["gpu_host"], "max_diff_tf32": worst["gpu_tf32"],
            "ring_in_place": in_place,
            "greedy_ids_gpu_equal_cpu": float((ids["cpu"] == ids["gpu"]).mean()),
            "greedy_ids_device_equal_host_cache": bool(np.array_equal(ids["gpu"],
                                                                      ids["gpu_host"]))}


def live_difference(log_probs, reference, stopped):
    """The largest |difference| between two steps' log-probs (`[B, n_token]`)
    over the rows not `stopped` (bool `[B]`: a stopped row's log-probs mean
    nothing); 0.0 where every row stopped.

    Args:
        log_probs, reference: numpy `[B, n_token]`.
        stopped: bool `[B]`.
    Returns:
        float."""
    live = ~np.asarray(stopped, np.bool_)
    if not live.any():
        return 0.0
    return float(np.abs(np.asarray(log_probs)[live] - np.asarray(reference)[live]).max())


def cuda_step_nodes(path):
    """`{"cuda_step_graph", "cuda_step_kernels", "cuda_step_ops"}` of the
    decode step a replayed runtime runs (`decode_token` where the export has
    it, else `decode_step`) as a CUDA session optimizes it (ONNX Runtime's
    default level, as the runtime opens it): its kernels (nodes other than
    the view ops) and its nodes by op type, the count a step launches; on
    failure, None and `cuda_step_nodes_error`."""
    from benchmarks.inference import VIEW_OPS, kernels, node_counts
    from export.onnx_runtime import decode_files, token_file
    model = os.path.join(path, "model.onnx")
    graph = token_file(model) or (decode_files(model) or {}).get("decode_step")
    if graph is None:  # an export without the cached decode interface
        return {"cuda_step_graph": None, "cuda_step_kernels": None, "cuda_step_ops": None,
                "cuda_step_nodes_error": f"{path} holds no decode step graph"}
    name = os.path.basename(graph)[:-len(".onnx")]
    try:
        counts = node_counts(graph, "all", provider="CUDAExecutionProvider")
    except Exception as error:  # onnxruntime's own types; the parity rows still count
        return {"cuda_step_graph": name, "cuda_step_kernels": None, "cuda_step_ops": None,
                "cuda_step_nodes_error": " ".join(str(error).split())[:300]}
    return {"cuda_step_graph": name, "cuda_step_kernels": kernels(counts),
            "cuda_step_ops": {op: n for op, n in sorted(counts.items()) if op not in VIEW_OPS}}


def run_cuda_parity(o):
    r"""`--part=cuda_parity`: the ONNX Runtime decode on CUDA against the CPU,
    where a GPU is lent.

    Per export (TensorFlow not needed): the runtime on CUDA with its decode
    cache on the GPU (`device_cache`, steps replayed as CUDA graphs), the same
    without graphs, the same with TF32 matmuls, on CUDA with
    the cache in host memory, and on the CPU provider (the host cache, what CI
    tests) decode the same rows from the same full random memory (batch 2, one
    row stopping halfway, the ring wrapping when `--steps` exceeds the
    memory): the largest log-prob difference to the CPU over the steps
    (every row until it stops: a stopped row's log-probs mean nothing),
    whether the GPU ring's buffers stayed in place, the step's kernels as
    the CUDA provider optimizes it (`cuda_step_nodes`), and greedy `generate` (a
    prompt, then a next turn on the held cache): the share of ids equal to
    the CPU's (near-ties of a random model may go either way) and whether the
    device cache's ids equal the host cache's on the same GPU. Prints a table
    and writes JSON; ends with an error when a difference (TF32 aside) exceeds
    `--tolerance`, a buffer moved, or the two GPU caches' ids differ.
    `--device=cpu` runs the same paths on the CPU provider (its cache
    "on the device" in OrtValues, replayed over fixed buffers without a
    capture): no GPU's figures, but the code and the exports the GPU check
    compares, checked where none is lent.
    """
    paths = [p.strip() for p in (o["exports"] or "").split(",") if p.strip()]
    if not paths:
        raise TxlError("--exports is required (comma-separated export folders)")
    if o["device"] not in ("cuda", "cpu"):
        raise TxlError(f"--device must be cuda or cpu, got {o['device']!r}")
    rows = [compare_devices(path, o["steps"], o["device"]) for path in paths]
    print("| export | steps | max diff, cache on GPU, CUDA graphs | no graphs | cache on host | "
          "with TF32 | ring in place | greedy ids = CPU's | = host cache's on GPU | "
          "step kernels on CUDA |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['export']} | {r['steps']} | {r['max_diff_device_cache']:.1e} | "
              f"{r['max_diff_no_graph']:.1e} | "
              f"{r['max_diff_host_cache']:.1e} | {r['max_diff_tf32']:.1e} | "
              f"{r['ring_in_place']} | {r['greedy_ids_gpu_equal_cpu']:.0%} | "
              f"{r['greedy_ids_device_equal_host_cache']} | "
              f"{r['cuda_step_kernels'] if r['cuda_step_kernels'] is not None else '-'} |")
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"settings": o, "rows": rows}, f, indent=2)
    bad = [r["export"] for r in rows if max(r["max_diff_device_cache"], r["max_diff_no_graph"],
                                            r["max_diff_host_cache"]) > o["tolerance"]
           or not r["ring_in_place"] or not r["greedy_ids_device_equal_host_cache"]]
    if bad:
        where = "the GPU" if o["device"] == "cuda" else "the device cache on the CPU"
        raise TxlError(f"{where} disagrees with the CPU's host cache on {', '.join(bad)} "
                       f"(see the table)")


# ----------------------------------------------------------- cache_precision
PRECISIONS = ("float32", "bfloat16", "float16")
PAPER_CACHE_MEMORY = {"enwik8_base": 2100, "enwik8_large": 3800, "wt103_base": 1600,
                "wt103_large": 1600}

CACHE_PRECISION_SPEC = (
    option("string", "model_dir", None, "A training job's model directory."),
    option("string", "dataset", "wt2", "Corpus name (as training.evaluate)."),
    option("string", "data_dir", None, "The corpus folder."),
    option("string", "cache_dir", None, "Where encoded corpora are cached."),
    option("string", "split", "test", "Which split to read."),
    option("integer", "mem_len", 640, "Memory length of the decode cache."),
    option("integer", "tokens", 1000, "Tokens read per stream."),
    option("integer", "streams", 4, "Streams (rows) read at once, each from its own part of the "
           "split."),
    option("bool", "through_exports", True, "Also read the text through the ONNX export's "
           "decode graphs on --device, exported with a float32 and with a float16 cache "
           "(--cache_dtype), and computing in float16 (--decode_dtype)."),
    option("string", "device", "cpu", "ONNX Runtime's device for the exports' rows: cpu, cuda "
           "(an error where its provider does not load; the decode cache on the GPU) or auto."),
    option("string", "work_dir", None, "Where the exports go, kept, one folder each "
           "(float32, float16_cache, float16_decode; default: a temporary folder)."),
    option("bool", "reuse_exports", False, "Read the exports already in --work_dir (e.g. made "
           "on another machine by an earlier run) instead of exporting."),
    option("bool", "keras_rows", True, "Also read the text through the Keras model's decode "
           "cache rounded to each precision (--nokeras_rows with --reuse_exports: no model is "
           "built and no TensorFlow op runs: TensorFlow's runtime never starts on a GPU that "
           "ONNX Runtime uses; its import lists the GPUs)."),
    option("string", "output",
           os.path.join(REPO, "benchmarks", "results", "cache_precision.json"),
           "Where to write the JSON results."),
)


def read_through_cache(core, ids, mem_len, precision):
    """Log-probabilities `[T, B, V]` of reading `ids` (`[B, T]`) one token at
    a time on a decode cache whose keys and values are rounded to
    `precision` after every step."""
    import numpy as np
    import tensorflow as tf
    rounded = tf.as_dtype(precision)

    def stored(cache):
        if rounded == tf.float32:
            return cache
        return cache._replace(**{name: tuple(tf.cast(tf.cast(t, rounded), t.dtype)
                                             for t in getattr(cache, name))
                                 for name in ("keys", "values")})

    @tf.function
    def step(token, cache):
        hidden, cache = core.call_with_cache(token, cache)
        return core.crit(hidden), stored(cache)

    cache = stored(core.decode_cache(core.initial_memory(ids.shape[0], mem_len=mem_len)))
    out = []
    for t in range(ids.shape[1]):
        log_probs, cache = step(tf.constant(ids[:, t]), cache)
        out.append(log_probs.numpy())
    return np.stack(out)


# The exports `--through_exports` reads through: their row names, their folders in
# --work_dir, and their export options.
EXPORT_PRECISIONS = {"export, float32 cache": ("float32", {"cache_dtype": "float32"}),
                     "export, float16 cache": ("float16_cache", {"cache_dtype": "float16"}),
                     "export, float16 decode": ("float16_decode", {"decode_dtype": "float16"})}


def read_through_export(folder, ids, config, mem_len, dtypes, device):
    """Log-probabilities `[T, B, V]` of reading `ids` (`[B, T]`) one token at
    a time through the ONNX export in `folder/out` (`runtime.decode_step`,
    ONNX Runtime on `device`); `TxlError` where that export is not of the
    model `config` describes (`check_same_model`), does not hold `mem_len`
    slots or was not exported with the options `dtypes` (`cache_dtype`,
    `decode_dtype`)."""
    runtime = open_export(folder, "onnx", mem_len, device,
                          decode_dtype=dtypes.get("decode_dtype", "float32"), device=device)
    check_same_model(runtime.config, config, folder)
    cache_dtype = dtypes.get("cache_dtype")
    if cache_dtype and runtime.info.cache_dtype != cache_dtype:
        raise TxlError(f"the export in {folder} keeps its decode cache in "
                       f"{runtime.info.cache_dtype}, not {cache_dtype}")
    cache = runtime.decode_init(runtime.initial_memory(ids.shape[0]))
    return np.stack([np.array(runtime.decode_step(ids[:, t], cache)[0])
                     for t in range(ids.shape[1])])


def check_same_model(exported, config, folder):
    """Raises `TxlError` where the export in `folder`, whose config is
    `exported`, is not of the model `config` describes (another model's
    export, kept from an earlier run, read as this one's): a field of the
    config differs, its vocabulary's fingerprint among them; not `mem_len`,
    the model's own where the export holds another memory (`open_export`
    checks that one)."""
    differ = [f.name for f in dataclasses.fields(config) if f.name != "mem_len"
              and getattr(exported, f.name) != getattr(config, f.name)]
    if differ:
        raise TxlError(f"the export in {folder} is not of the model asked for: its "
                       f"{', '.join(differ)} differ (made from another model; export it again)")


def export_precisions(model_dir, work_dir, mem_len):
    """Exports the model in `model_dir` (ONNX, memory `mem_len`) once for
    each of `EXPORT_PRECISIONS`, into `work_dir/<its folder>/out`; returns
    those folders."""
    from export import run_export
    written = []
    for folder, dtypes in EXPORT_PRECISIONS.values():
        written.append(os.path.join(work_dir, folder, "out"))
        run_export(written[-1], model_dir, formats=("onnx",), mem_len=mem_len, verify=False,
                   overwrite=True, **dtypes)
    return written


def read_through_exports(o, ids, config):
    """`{row name: log-probabilities [T, B, V]}` of `ids` read through each
    export of `EXPORT_PRECISIONS` (`read_through_export`), made from
    `--model_dir` into `--work_dir` (a temporary folder without it) unless
    `--reuse_exports`; each must be an export of the model `config`
    (`--model_dir`'s) describes."""
    with tempfile.TemporaryDirectory() as scratch:
        work_dir = o["work_dir"] or scratch
        if not o["reuse_exports"]:
            export_precisions(o["model_dir"], work_dir, o["mem_len"])
        return {name: read_through_export(os.path.join(work_dir, folder), ids, config,
                                          o["mem_len"], dtypes, o["device"])
                for name, (folder, dtypes) in EXPORT_PRECISIONS.items()}


def compare_precisions(reference, other, targets):
    """Perplexity of `other` and its changes against `reference` (`[T, B, V]`)."""
    import numpy as np
    picked = np.take_along_axis(other, targets.T[:, :, None], -1)[..., 0]
    base = np.take_along_axis(reference, targets.T[:, :, None], -1)[..., 0]
    change = np.abs(picked - base)
    return {"ppl": float(np.exp(-picked.mean())), "max_abs_log_prob_change": float(change.max()),
            "max_abs_change_any_log_prob": float(np.abs(other - reference).max()),
            "mean_abs_log_prob_change": float(change.mean()),
            "argmax_changed": float((other.argmax(-1) != reference.argmax(-1)).mean())}


def cache_sizes():
    """Bytes per stream at each preset's paper memory: float32 and 16-bit keys and values."""
    import numpy as np
    from export.decode_cache import cache_shapes
    from txl_tf import TransformerXLConfig
    rows = []
    for preset, mem_len in PAPER_CACHE_MEMORY.items():
        shapes = cache_shapes(TransformerXLConfig.preset(preset, mem_len=mem_len), mem_len, 1)
        count = {name: int(np.prod(shape)) for name, shape in shapes.items()}
        keys_values = count["keys"] + count["values"]
        rest = 4 * count["cache_mems"] + count["valid"]
        rows.append({"preset": preset, "mem_len": mem_len,
                     "float32_mb": (4 * keys_values + rest) / 1e6,
                     "keys_values_16bit_mb": (2 * keys_values + rest) / 1e6})
    return rows


def run_cache_precision(o):
    r"""`--part=cache_precision`: what a 16-bit decode cache would cost in
    exactness, and what it would save.

    A trained model (a training job's `--model_dir`) reads held-out text one
    token at a time through the decode cache (`TransformerXL.call_with_cache`, the
    step every backend runs), once with the cache's keys and values in float32
    and once with them rounded to bfloat16 and to float16 after every step (the
    values a 16-bit cache would hold; the arithmetic stays float32, so only the
    storage's precision is measured). Per precision: perplexity of the text, the
    largest and the mean change of a target's log-probability against float32,
    and how often the most likely next token changes. Also the cache's size per
    stream at each preset's paper memory, float32 against 16-bit keys and values.
    With `--through_exports`, the same text through the ONNX export's decode graphs
    (`export.decode_interface`) on `--device` (`cuda`: the float16 decode's
    own GPU kernels, which the CPU provider does not have), exported with a
    float32 cache, with `--cache_dtype=float16` (keys and values stored and
    passed in float16) and with `--decode_dtype=float16` (weights, compute,
    keys and values in float16), each against the float32 export (made in,
    or with `--reuse_exports` read from, `--work_dir`). TensorFlow's TF32
    matmuls are off (the Keras rows on a GPU); with `--nokeras_rows` only the
    exports' rows are read and no model is built. Prints a table, writes
    JSON, then one line: the exports' perplexities and changes.
    """
    import numpy as np
    from benchmarks.throughput import write_json
    from training import inputs
    from training.errors import TrainingError
    from txl_tf.weights.model_dir import load_config, load_core, resolve
    if not o["model_dir"]:
        raise TrainingError("--model_dir is required")
    check_export_flags(o)
    if not (o["keras_rows"] or o["through_exports"]):
        raise TrainingError("--nokeras_rows --nothrough_exports leaves nothing to read")
    source = resolve(o["model_dir"])
    config = load_config(source)
    tokenizer = inputs.model_tokenizer(o["model_dir"], source.vocab_dir, config)
    corpus = inputs.load(o["dataset"], o["data_dir"], o["cache_dir"], {}, tokenizer=tokenizer)
    text = np.asarray(corpus.split(o["split"]))
    per_stream = min(o["tokens"] + 1, len(text) // o["streams"])
    ids = text[:o["streams"] * per_stream].reshape(o["streams"], per_stream)
    inputs_, targets = ids[:, :-1], ids[:, 1:]
    rows, start = [], time.time()
    if o["keras_rows"]:
        import tensorflow as tf
        tf.config.experimental.enable_tensor_float_32_execution(False)
        core = load_core(source, config)
        runs = {p: read_through_cache(core, inputs_, o["mem_len"], p) for p in PRECISIONS}
        rows += [{"precision": p, **compare_precisions(runs["float32"], runs[p], targets)}
                 for p in PRECISIONS]
    if o["through_exports"]:
        exported = read_through_exports(o, inputs_, config)
        reference = exported["export, float32 cache"]
        rows += [{"precision": name, **compare_precisions(reference, log_probs, targets)}
                 for name, log_probs in exported.items()]
    result = {"settings": o, "tokens": int(targets.size), "seconds": time.time() - start,
              "rows": rows, "sizes": cache_sizes(), "text": text_read(ids)}
    where = f"; the exports on {o['device']}" if o["through_exports"] else ""
    print(f"{o['model_dir']}: {targets.size:,} tokens of {o['split']} read one at a time, "
          f"memory {o['mem_len']}{where}")
    print("| keys and values stored in | ppl | max abs log-prob change | mean | any log-prob | "
          "argmax changed |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['precision']} | {r['ppl']:.3f} | {r['max_abs_log_prob_change']:.2e} | "
              f"{r['mean_abs_log_prob_change']:.2e} | {r['max_abs_change_any_log_prob']:.2e} | "
              f"{100 * r['argmax_changed']:.2f}% |")
    print("| preset | memory | per stream, float32 | with 16-bit keys and values |")
    print("|---|---|---|---|")
    for r in result["sizes"]:
        print(f"| {r['preset']} | {r['mem_len']:,} | {r['float32_mb']:.1f} MB | "
              f"{r['keys_values_16bit_mb']:.1f} MB |")
    write_json(o["output"], result)
    if o["through_exports"]:
        print(precision_line(result))


def text_read(ids):
    """What says which text a `cache_precision` run read, for results from
    two machines: the sha256 of its ids (`[B, T + 1]`, little-endian int32)
    and this Python's version (`--dataset=pystdlib` reads its standard
    library, another text under another version)."""
    import numpy as np
    return {"ids_sha256": hashlib.sha256(np.asarray(ids, "<i4").tobytes()).hexdigest(),
            "python": platform.python_version()}


def precision_line(result):
    """One line of a `cache_precision` result's export rows: where they ran,
    each one's perplexity, then the 16-bit ones' largest log-prob change and
    how many of the most likely next tokens changed, against the float32
    export's."""
    rows = {r["precision"]: r for r in result["rows"] if r["precision"] in EXPORT_PRECISIONS}
    tokens = result["tokens"]
    ppl = ", ".join(f"{name[len('export, '):]} {r['ppl']:.4f}" for name, r in rows.items())
    changes = "; ".join(
        f"{name[len('export, '):]}: largest log-prob change {r['max_abs_log_prob_change']:.1e}, "
        f"most likely token changed {round(r['argmax_changed'] * tokens):,} of {tokens:,}"
        for name, r in list(rows.items())[1:])
    return (f"the exports' decode on {result['settings']['device']}, {tokens:,} tokens: "
            f"ppl {ppl}; {changes}")


PARTS = {"speed": (SPEED_SPEC, run_speed),
         "evaluation": (EVALUATION_SPEC, run_evaluation),
         "runtime_memory": (RUNTIME_MEMORY_SPEC, run_runtime_memory),
         "soak": (SOAK_SPEC, run_soak),
         "onnx_weights": (ONNX_WEIGHTS_SPEC, run_onnx_weights),
         "cuda_parity": (CUDA_PARITY_SPEC, run_cuda_parity),
         "cache_precision": (CACHE_PRECISION_SPEC, run_cache_precision)}
SPEC = suite_spec({name: spec for name, (spec, _) in PARTS.items()})


def main(argv):
    run_part(PARTS, values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
