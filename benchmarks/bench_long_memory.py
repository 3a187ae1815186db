r"""Serving long memory: ms per new token against the bandwidth bound, turns, prompts.

    python -m benchmarks.bench_long_memory [--presets=enwik8_base,wt103_base] \
        [--batch_sizes=1,16] [--backends=xla,onnx,saved_model] [--tokens=16]

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
  1 GiB (best of 3 each). The ratio is printed; a ratio below 1 means the
  bandwidth was measured too low, and is flagged as a measurement error.

At batch 1 also (`--turns`):
- **turn**: a conversation's next turn after a full memory, 32 ids in and
  32 generated (`generate(turn, 32, resume=state)`), beside what its parts
  cost alone (one 32-id `decode_read` on the cache + 32 decode steps; the
  two alternate over 5 rounds and `÷ parts` is the median of the rounds'
  ratios), and beside the turn read on the memory (`memory=`: the memory
  projected again).
- **prompt**: a prompt of the memory's length read into an empty memory
  (`generate(prompt, 1)`, a later call: compile excluded) in tokens/s,
  the first call's seconds (compiling included), beside the evaluation throughput at that memory (`step` over segments of
  `tgt_len` on a full memory).

At batch > 1 on the runtimes also (`--sessions`):
- **sessions**: a `SessionTable` of that many sessions, each on its own full
  memory: ms per step on the decode cache's slab, beside the runtime's own
  step on the slab's rows without the table (its `GenerationBackend`'s
  unchecked `next_cached`; the two
  alternate over 3 rounds; `÷ own` is the median of the rounds' ratios), and ms per step of the same table through
  `step_last` (the table without the cache: every step projects every
  memory again).

With `triton` in `--backends`: the Triton repository's two models run in
onnxruntime as Triton's sequence batcher runs them (the state fed back as
the next input), one id per request on a full memory: the step model (the
memory as layer inputs, projected again every request) and the cached
model (the memory as keys and values, written whole every request).

Prints a table and writes JSON.
"""
import json
import os
import statistics
import shutil
import sys
import tempfile
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.common import integer_list  # noqa: E402
from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from txl_tf.errors import TxlError  # noqa: E402

PAPER_MEMORY = {"enwik8_base": 2100, "wt103_base": 1600}
CACHE_PLACES = {"auto": "auto", "true": True, "false": False}
TURN = 32

SPEC = (
    option("string", "presets", "enwik8_base", "Comma-separated model presets (random weights)."),
    option("integer", "mem_len", None, "Memory length (default: the paper's evaluation memory for "
           "enwik8_base / wt103_base, else the preset's)."),
    option("integer", "clamp_len", None, "The model's clamp_len (default: the preset's: none). "
           "The paper evaluates enwik8_base with 820, its large models at memory "
           "1,600-3,800 with 1,000; the XLA decoder keeps keys for the distinct "
           "distances only."),
    option("string", "batch_sizes", "1,16", "Comma-separated batch sizes."),
    option("string", "backends", "xla,onnx,saved_model", "Comma-separated: xla, onnx, "
           "saved_model, triton."),
    option("integer", "tokens", 16, "Timed steps per measurement."),
    option("bool", "turns", True, "Also time a conversation turn and a prompt read (batch 1)."),
    option("bool", "sessions", True, "Also time a session table (runtimes, batch > 1)."),
    option("string", "work_dir", None, "Where the exports go, kept (default: a temporary folder, "
           "removed at the end)."),
    option("bool", "reuse_exports", False, "Time the exports already in --work_dir (<preset>/out, "
           "e.g. made on another machine: benchmarks/onnx_weights.py) instead of "
           "exporting; ONNX needs no TensorFlow then."),
    option("string", "device", "cpu", "The ONNX Runtime backend's device: cpu, cuda or auto (the "
           "XLA decoder and the SavedModel run on the CPU). On cuda the bound is read "
           "at the GPU's bandwidth."),
    option("string", "device_cache", "auto", "ONNX Runtime's decode cache: auto (on the device on "
           "CUDA), true or false (numpy in host memory)."),
    option("string", "cuda_graph", "auto", "ONNX Runtime's device steps replayed as CUDA graphs: "
           "auto (with the cache on CUDA), true or false."),
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
    reduction and an XLA-compiled one (best of `repeats` each). The bound
    uses the fastest: a step cannot read faster than the best read this
    machine shows in the same run."""
    import numpy as np
    data = np.ones(gib * 2 ** 30 // 4, np.float32)
    kernels = {"numpy": lambda: data.sum(), "onnxruntime": ort_reader(data, "cpu")}
    try:
        import tensorflow as tf
    except ImportError:  # a serving box: only numpy and ONNX Runtime read there
        tf = None
    if tf is not None:
        held = tf.constant(data)
        compiled = tf.function(tf.reduce_sum, jit_compile=True)
        kernels.update(tensorflow=lambda: tf.reduce_sum(held).numpy(),
                       xla=lambda: compiled(held).numpy())
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


def cuda_read_bandwidth(gib=1, repeats=5):
    """Bytes per second of an ONNX Runtime ReduceSum over `gib` GiB held on
    the GPU (best of `repeats`): the bound's bandwidth when the runtime's
    state lives there."""
    import numpy as np
    read = ort_reader(np.ones(gib * 2 ** 30 // 4, np.float32), "cuda")
    read()
    return gib * 2 ** 30 / min(seconds(read) for _ in range(repeats))


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_seconds(fn, calls):
    """Median seconds of `fn()` over `calls` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    return statistics.median(seconds(fn) for _ in range(calls))


def step_bytes(config, mem_len, batch):
    """What one decode step reads: float32 weights + each row's keys and values."""
    from txl_tf.checks.memory_budget import parameter_count
    cache = 2 * 4 * config.n_layer * (mem_len + 1) * config.n_head * config.d_head
    return 4 * parameter_count(config) + batch * cache


def full_memory(config, mem_len, batch, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    mems = rng.normal(size=(config.n_layer, batch, mem_len, config.d_model)).astype(np.float32)
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
    short, long = [], []
    for _ in range(3):
        short.append(run(tokens))
        long.append(run(tokens + more))
    per_token = (statistics.median(long) - statistics.median(short)) / more
    return {"per_token_ms": per_token * 1e3,
            "first_call_s": first - statistics.median(short) - statistics.median(long)}


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
    module's docstring)."""
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
    return (statistics.median(run(3 * TURN) for _ in range(3))
            - statistics.median(run(TURN) for _ in range(3))) / (2 * TURN)


def run_preset(preset, o, bandwidth, work):
    from export import open_runtime
    from export.runtime import generation_backend
    from txl_tf.config import TransformerXLConfig
    mem_len = o["mem_len"] or PAPER_MEMORY.get(preset)
    config = TransformerXLConfig.preset(preset, **({"mem_len": mem_len} if mem_len else {}),
                                        **({"clamp_len": o["clamp_len"]}
                                           if o["clamp_len"] is not None else {}))
    mem_len = config.mem_len
    backends = [b.strip() for b in o["backends"].split(",") if b.strip()]
    formats = tuple(b for b in backends if b in ("onnx", "saved_model", "triton"))
    folder = os.path.join(work, preset)
    core = None
    if "xla" in backends or (formats and not o["reuse_exports"]):
        from txl_tf import TransformerXL
        core = TransformerXL(config)
    if formats and not o["reuse_exports"]:
        from export import run_export
        from txl_tf.weights import save_pretrained
        save_pretrained(core, os.path.join(folder, "model"))
        start = time.perf_counter()
        run_export(os.path.join(folder, "out"), os.path.join(folder, "model"), formats=formats,
                   verify=False, overwrite=True, log_probs="last" if "triton" in formats
                   else "all")
        print(f"{preset}: exported in {time.perf_counter() - start:.0f} s", flush=True)
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
        if backend == "xla":
            import tensorflow as tf
            from txl_tf import Decoder, Memory
            runner = Decoder(core, mem_len=mem_len)

            def step(ids, memory, runner=runner):
                return runner.step_last(ids, Memory(tf.constant(memory[0]),
                                                    tf.constant(memory[1])))
            parts, model_config = decoder_parts(runner), config
        else:
            options = {"device": o["device"], "device_cache": CACHE_PLACES[o["device_cache"]],
                       "cuda_graph": CACHE_PLACES[o["cuda_graph"]]
                       } if backend == "onnx" else {"device": "cpu"}
            runner = open_runtime(os.path.join(folder, "out"), backend=backend, **options)
            if runner.mem_len != mem_len:
                raise TxlError(f"the export in {folder} holds {runner.mem_len} memory "
                               f"slots, not {mem_len} (--mem_len)")
            step, parts = generation_backend(runner).step_last, runtime_parts(runner)
            model_config = runner.config  # a reused export's own sizes
        for batch in parse_batch_sizes(o["batch_sizes"]):
            memory = full_memory(model_config, mem_len, batch)
            timing = (time_xla if backend == "xla" else time_runtime)(runner, memory, batch,
                                                                     o["tokens"])
            device = getattr(runner, "device", "cpu")
            bound_ms = step_bytes(model_config, mem_len, batch) / bandwidth[device] * 1e3
            row = {"preset": preset, "mem_len": mem_len, "clamp_len": model_config.clamp_len,
                   "backend": backend, "batch": batch,
                   "device": device, "device_cache": getattr(runner, "device_cache", False),
                   "cuda_graph": getattr(runner, "cuda_graph", False),
                   **timing, "bound_ms": bound_ms,
                   "over_bound": timing["per_token_ms"] / bound_ms,
                   "tokens_per_s": batch * 1e3 / timing["per_token_ms"]}
            if batch == 1 and o["turns"]:
                row.update(time_turn(runner, memory, parts))
                row.update(time_prompt(runner, model_config, mem_len, step))
            if batch > 1 and o["sessions"] and backend != "xla":
                row.update(time_sessions(runner, model_config, mem_len, batch, o["tokens"]))
            print(json.dumps(row), flush=True)
            rows.append(row)
        del runner
    return rows


def run(o):
    parse_batch_sizes(o["batch_sizes"])  # a bad value fails before any export
    if o["device"] not in ("cpu", "cuda", "auto"):
        raise TxlError(f"--device must be cpu, cuda or auto, got {o['device']!r}")
    for name in ("device_cache", "cuda_graph"):
        if o[name] not in CACHE_PLACES:
            raise TxlError(f"--{name} must be auto, true or false, got {o[name]!r}")
    if o["reuse_exports"] and not o["work_dir"]:
        raise TxlError("--reuse_exports needs --work_dir (the folder holding the exports)")
    if o["reuse_exports"] and o["clamp_len"] is not None:
        raise TxlError("--clamp_len makes this run's model; with --reuse_exports the exports "
                       "keep the clamp they were made with")
    work = o["work_dir"] or tempfile.mkdtemp(prefix="txl_long_memory_")
    reads = read_bandwidths()
    bandwidth = {"cpu": max(reads.values())}  # bytes/s of each device a backend runs on
    if _on_cuda(o["device"]):
        bandwidth["cuda"] = cuda_read_bandwidth()
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
    below = [r for r in rows if r["bound_ms"] > 0 and r.get("over_bound", 1) < 1]
    for r in below:
        print(f"MEASUREMENT ERROR: {r['preset']} {r['backend']} batch {r['batch']} ran at "
              f"{r['over_bound']:.2f}x the bound: the read bandwidth was measured too low")
    print("| preset | memory | backend | device | batch | ms / token | tokens/s | bound ms | ÷ bound | "
          "turn ms | ÷ parts | turn on memory ms | prompt tok/s | ÷ eval | prompt first s |")
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
              f"{r['over_bound']:.2f} | {turn} |")
    sessions = [r for r in rows if "table_ms" in r]
    if sessions:
        print("\n| preset | backend | sessions | table ms / step | ÷ own batch step | "
              "through step_last ms |")
        print("|---|---|---|---|---|---|")
    for r in sessions:
        print(f"| {r['preset']} | {r['backend']} | {r['batch']} | {r['table_ms']:.1f} | "
              f"{r['table_over_own']:.2f} | {r['table_step_last_ms']:.0f} |")
    if triton:
        print("\n| preset | batch | bound ms | Triton step model ms (÷ bound) | "
              "cached model ms (÷ bound) |")
        print("|---|---|---|---|---|")
    for r in triton:
        print(f"| {r['preset']} | {r['batch']} | {r['bound_ms']:.1f} | "
              f"{r['triton_step_ms']:.1f} ({r['triton_step_ms'] / r['bound_ms']:.2f}) | "
              f"{r['triton_cached_ms']:.1f} ({r['triton_cached_ms'] / r['bound_ms']:.2f}) |")
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)


def _on_cuda(device):
    if device == "cpu":
        return False
    import onnxruntime as ort
    return "CUDAExecutionProvider" in ort.get_available_providers()


def main(argv):
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
