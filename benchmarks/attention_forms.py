r"""One layer's attention of the cached decode step (issue 53) in the forms
ONNX Runtime's fused attention ops can take, beside today's, on the same
ring: parity to a numpy statement and to today's form, and milliseconds a
call with every input and output bound on the device (on CUDA replayed as
a CUDA graph).

    python -m benchmarks.attention_forms [--device=cpu|cuda] \
        [--shape=tiny|enwik8_base] [--batch_sizes=1,16] [--forms=today,mha,...] \
        [--dtypes=float32,float16] [--sdpa_kernel=0] \
        [--output=benchmarks/results/attention_forms_<device>.json]

The step's attention for one token a row against a ring of S slots
(`RelativeMultiHeadAttention._token_on_ring`, write first): the token's
own key and value go into the ring at each row's slot (in place: each ring
output is bound to its input's buffer), then

    score_j = q_u·k_j + q_v·(W_r r_j) + hidden_j,  p = softmax(score),  p·V

with q_u, q_v the query with u and with v, already scaled by
1/sqrt(d_head) (the step's one projection delivers them so), r_j slot j's
relative encoding and hidden_j -1e30 (float16: -3e4) at slots a row does
not see. The relative term is one additive bias, the same nodes in every
form (`FORMS`):

* `today`: keys as columns `[B, H, d_head, S]`, values `[B, H, S, d_head]`,
  written by ScatterElements; MatMul, two Adds, Softmax, MatMul (ONNX
  Runtime fuses the Add and the Softmax into BiasSoftmax on CUDA).
* `mha`: com.microsoft MultiHeadAttention, keys and values BNSH `[B, H, S,
  d_head]`, the relative term and the mask as `attention_bias [B, H, 1, S]`
  (added after the op's scale, here 1).
* `attention23`: the ONNX opset-23 Attention, 4-D Q, K, V (BNSH), the bias
  as its float `attn_mask` (added after the scale too).
* `mha_pad`, `attention23_pad`: the same with the slots padded by hidden
  ones to a multiple of `PAD`: the memory-efficient (cutlass) kernel wants
  the bias rows aligned (2,101 slots are not).
* `attention24_pad`: `attention23_pad` at opset 24, the rings written by
  TensorScatter (`mode="circular"`, one write index a row, in place): the
  opset's own pattern of a cache updated outside Attention.
* `dmmha`: com.microsoft DecoderMaskedMultiHeadAttention with
  `past_present_share_buffer`: keys and values with one scratch slot more
  (`S + 1`). The op appends the token's key and value at
  `past_sequence_length` (a constant S, the scratch slot; it is no ring)
  and takes `attention_bias` only so (not in its cross-attention mode), so
  the ring slot is written first as in the other forms and the scratch
  slot is hidden by the bias; its present outputs are bound to the ring's
  buffers (no copy). Its CUDA kernel reads the keys in FasterTransformer's
  chunks (`chunked_keys`), its CPU kernel as BNSH. `dmmha_inflight`: the
  same with `ORT_DECODER_MASKED_ATTENTION_LOAD_KV_DATA_IN_FLIGHT=1` (the
  CUDA kernel's loads of keys and values unrolled; read at each call).
* `gqa`: com.microsoft GroupQueryAttention the same way (the scratch slot
  at `seqlens_k` = S, `total_sequence_length` S + 1, a constant); its CUDA
  kernel is registered for 16-bit types only.

Per form, dtype and batch: the largest difference of its output and written
rings to the numpy statement (`reference`) and to today's form; ms a call
(median of `--iters`); the nodes ONNX Runtime ran a call by op type (its
profiler; view ops left out); on CUDA, where torch is importable, the CUDA
kernels a call launched by name (torch's profiler sees every kernel of the
process), and what ONNX Runtime says of the kernel it picked (the lines of
its verbose log and of `ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1` printed
in the form's first run); the ratio to today's form; and the bound: the K/V
rings read once at the bandwidth of a device copy measured in the same run
(an ONNX Runtime Identity into another buffer: read and write counted).
A form the provider cannot run (e.g. float32 GroupQueryAttention on CUDA)
gets its error, or its nodes left to the CPU (`on_cpu`).
"""
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(1, REPO)

from benchmarks.common import BenchmarkError, at_least, integer_list, names_from  # noqa: E402
from txl_tf.app.flagspec import option  # noqa: E402

from benchmarks.attention_nodes import (  # noqa: E402, F401 (PAD: the docstring's)
    DTYPES, FORMS, HIDDEN, INFLIGHT, OPSET, PAD, SCRATCH, Nodes, attention_nodes, bnsh, chunk,
    chunked_keys, form_rings, opset_of, ring_dims, scatter_writes, slots_of)

DEVICES = ("cpu", "cuda")
# One layer of each shape: heads, head width, model width, ring slots (memory + 1).
SHAPES = {"tiny": dict(n_head=2, d_head=16, d_model=32, slots=17),
          "enwik8_base": dict(n_head=8, d_head=64, d_model=512, slots=2101)}
VIEW_OPS = ("Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten")
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


# ------------------------------------------------------------ the inputs
def make_case(shape, batch, seed=0):
    """Random inputs of one layer's step, numpy float32, in no form's
    layout: `q_u`, `q_v`, `key`, `value` `[B, H * d]`; the rings `keys`,
    `values` BNSH `[B, H, S, d]` (stale at each row's slot); `positions`
    `[S, d_model]` (each slot's encoding); `visible` bool `[B, S]` (each
    row's own slot seen, some others not); `slot` int64 `[B]`; and the
    layer's weight `r_kernel` `[d_model, H * d]`."""
    h, d, dm, s = (SHAPES[shape][k] for k in ("n_head", "d_head", "d_model", "slots"))
    rng = np.random.default_rng(seed)

    def normal(*dims, std=1.0):
        return (rng.standard_normal(dims) * std).astype(np.float32)
    slot = rng.integers(0, s, batch).astype(np.int64)
    visible = rng.random((batch, s)) > 0.2
    visible[np.arange(batch), slot] = True
    return {"q_u": normal(batch, h * d, std=d ** -0.5), "q_v": normal(batch, h * d, std=d ** -0.5),
            "key": normal(batch, h * d), "value": normal(batch, h * d),
            "keys": normal(batch, h, s, d), "values": normal(batch, h, s, d),
            "positions": normal(s, dm), "visible": visible, "slot": slot,
            "r_kernel": normal(dm, h * d, std=dm ** -0.5)}


def reference(case, dtype="float32"):
    """The numpy statement of the attention: `{"out" [B, H * d], "keys",
    "values" (BNSH, written)}` in float64."""
    keys, values = (case[k].astype(np.float64).copy() for k in ("keys", "values"))
    b, h, s, d = keys.shape
    rows = np.arange(b)
    keys[rows, :, case["slot"]] = case["key"].reshape(b, h, d)
    values[rows, :, case["slot"]] = case["value"].reshape(b, h, d)
    q_u, q_v = (case[k].astype(np.float64).reshape(b, h, d) for k in ("q_u", "q_v"))
    r = (case["positions"].astype(np.float64) @ case["r_kernel"]).reshape(s, h, d)
    score = (np.einsum("bhd,bhsd->bhs", q_u, keys) + np.einsum("bhd,shd->bhs", q_v, r)
             + np.where(case["visible"], 0.0, HIDDEN[dtype])[:, None, :])
    prob = np.exp(score - score.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    return {"out": np.einsum("bhs,bhsd->bhd", prob, values).reshape(b, h * d),
            "keys": keys, "values": values}


def ring_layout(form, case, dtype, device="cpu"):
    """The feeds of `form`'s graph on `device` from `case`: the rings in its
    layout (`form_rings`), the write indices, the slots' encodings and
    visibility (the slots past the ring's, `slots_of`, zero and hidden),
    floats in `dtype`."""
    positions, visible, slot = (case[k] for k in ("positions", "visible", "slot"))
    b, h, s, d = case["keys"].shape
    extra = slots_of(form, s) - s
    if extra:
        positions = np.concatenate([positions, np.zeros((extra, positions.shape[1]),
                                                        positions.dtype)], 0)
        visible = np.concatenate([visible, np.zeros((b, extra), bool)], 1)
    keys, values = form_rings(form, case["keys"].astype(dtype), case["values"].astype(dtype),
                              device)
    index = np.broadcast_to(slot.reshape(b, 1, 1, 1), (b, h, 1, d))
    feeds = {"q_u": case["q_u"], "q_v": case["q_v"], "key": case["key"],
             "value": case["value"], "keys": keys, "values": values, "positions": positions,
             "visible": visible}
    if scatter_writes(form):
        feeds["write_index"] = slot
    else:
        feeds["value_index"] = np.ascontiguousarray(index)
    if form == "today":
        feeds["key_index"] = np.ascontiguousarray(index.transpose(0, 1, 3, 2))
    elif chunked_keys(form, device):
        x = chunk(dtype)
        feeds["key_index"] = np.ascontiguousarray(np.broadcast_to(
            slot.reshape(b, 1, 1, 1, 1), (b, h, d // x, 1, x)))
    if form == "gqa":  # each row's length less one: the token goes to the scratch slot
        feeds["seqlens"] = np.full(b, s, np.int32)
    return {k: (v.astype(dtype) if v.dtype == np.float32 else v) for k, v in feeds.items()}


def bnsh_rings(form, outputs, slots):
    """A form's written rings `(keys, values)` (`outputs["keys_out"]`,
    `["values_out"]`) as BNSH `[B, H, S, d]` (`bnsh`)."""
    return bnsh(form, outputs["keys_out"], outputs["values_out"], slots)


# ------------------------------------------------------------ the graphs
def build_form(form, shape, dtype="float32", r_kernel=None, device="cpu"):
    """The one-layer ONNX model of `form` (see the module's docstring) at
    `shape` in `dtype` for `device` (`chunked_keys`); `r_kernel` `[d_model,
    H * d]` (float32) its position projection. Inputs: `ring_layout`'s
    names; outputs `out` `[B, H * d]`, `keys_out`, `values_out` (the
    written rings, to be bound to the input rings' buffers), and for
    `SCRATCH` forms `present_keys`, `present_values` (likewise)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; known: {', '.join(FORMS)}")
    h, d, dm, s = (SHAPES[shape][k] for k in ("n_head", "d_head", "d_model", "slots"))
    ft = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    slots = slots_of(form, s)
    if r_kernel is None:
        r_kernel = np.zeros((dm, h * d), np.float32)
    by_head = r_kernel.reshape(dm, h, d).transpose(1, 2, 0).astype(dtype)  # [H, d, d_model]
    nodes = Nodes()
    for name, value in (("r_by_head", by_head), ("zero", np.array([0.0], dtype)),
                        ("hidden_value", np.array([HIDDEN[dtype]], dtype))):
        nodes.inits[name] = numpy_helper.from_array(value, name)
    add = nodes.add
    q_v4 = add("Reshape", ["q_v", nodes.const("heads_1_d", [-1, h, 1, d])], ["q_v4"])
    through_r = add("MatMul", [q_v4, "r_by_head"], ["through_r"])  # [B, H, 1, d_model]
    positions_t = add("Transpose", ["positions"], ["positions_t"], perm=[1, 0])
    position = add("MatMul", [through_r, positions_t], ["position"])  # [B, H, 1, slots]
    hidden2 = add("Where", ["visible", "zero", "hidden_value"], ["hidden2"])
    hidden = add("Reshape", [hidden2, nodes.const("mask_shape", [-1, 1, 1, slots])], ["hidden"])
    chunked = chunk(dtype) if chunked_keys(form, device) else 0
    names = {name: name for name in ("q_u", "key", "value", "keys", "values", "value_index",
                                     "key_index", "write_index", "seqlens", "out", "keys_out",
                                     "values_out", "present_keys", "present_values")}
    attention_nodes(nodes, form, dict(names, bias_terms=[position, hidden]), h, d, slots,
                    chunked)

    def info(name, elem, dims):
        return helper.make_tensor_value_info(name, elem, dims)
    ring_k, ring_v = ring_dims(form, h, d, slots, chunked)
    inputs = [info("q_u", ft, [None, h * d]), info("q_v", ft, [None, h * d]),
              info("key", ft, [None, h * d]), info("value", ft, [None, h * d]),
              info("keys", ft, ring_k), info("values", ft, ring_v),
              info("positions", ft, [slots, dm]), info("visible", TensorProto.BOOL, [None, slots])]
    if scatter_writes(form):
        inputs.append(info("write_index", TensorProto.INT64, [None]))
    else:
        inputs.append(info("value_index", TensorProto.INT64, [None, h, 1, d]))
    if form == "today" or chunked:
        inputs.append(info("key_index", TensorProto.INT64, ring_k[:3] + [1] + ring_k[4:]))
    if form == "gqa":
        inputs.append(info("seqlens", TensorProto.INT32, [None]))
    outputs = [info("out", ft, [None, h * d]), info("keys_out", ft, ring_k),
               info("values_out", ft, ring_v)]
    if form in SCRATCH:
        outputs += [info("present_keys", ft, ring_v), info("present_values", ft, ring_v)]
    graph = helper.make_graph(nodes.nodes, f"attention_{form}", inputs, outputs,
                              list(nodes.inits.values()))
    opsets = [helper.make_opsetid("", opset_of(form) or OPSET),
              helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


# ------------------------------------------------------------ running them
IN_PLACE = {"keys_out": "keys", "values_out": "values", "present_keys": "keys",
            "present_values": "values"}


def open_session(model_bytes, device, cuda_graph=False, profile_dir=None, cuda_options=None):
    """An ONNX Runtime session of the serialized model `model_bytes` on
    `device` (on CUDA: TF32 off, `cuda_options` added, replayed as CUDA
    graphs with `cuda_graph`), profiled into `profile_dir` where given."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if profile_dir:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(profile_dir, "session")
    provider = PROVIDERS[device]
    options_cuda = {"use_tf32": "0", **(cuda_options or {})}
    if cuda_graph:
        options_cuda["enable_cuda_graph"] = "1"
    entry = (provider, options_cuda) if device == "cuda" else provider
    return ort.InferenceSession(model_bytes, options, providers=[entry])


class Bound:
    """A session of one form with its feeds on `device` and its outputs
    bound: `out` to a buffer of its own, the rings' outputs to the input
    rings' buffers (written in place, as the device step writes them)."""

    def __init__(self, model, feeds, device, cuda_graph=False, profile_dir=None,
                 cuda_options=None):
        import onnxruntime as ort
        self.session = open_session(model.SerializeToString(), device, cuda_graph, profile_dir,
                                    cuda_options)
        self.values = {name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x), device, 0)
                       for name, x in feeds.items()}
        b = feeds["q_u"].shape[0]
        self.values["out"] = ort.OrtValue.ortvalue_from_shape_and_type(
            [b, feeds["q_u"].shape[1]], feeds["q_u"].dtype, device, 0)
        self.binding = self.session.io_binding()
        for name in (i.name for i in self.session.get_inputs()):
            self.binding.bind_ortvalue_input(name, self.values[name])
        ring = self.values["values"].shape()
        for name in (o.name for o in self.session.get_outputs()):
            if name not in IN_PLACE:
                self.binding.bind_ortvalue_output(name, self.values[name])
                continue
            # the ring's own buffer, in the output's shape (the present outputs are
            # [B, H, S, d] also where the keys are chunked)
            source = self.values[IN_PLACE[name]]
            shape = source.shape() if name.endswith("_out") else ring
            self.binding.bind_output(name, device, 0, feeds["values"].dtype, shape,
                                     source.data_ptr())
        self.device = device

    def run(self):
        self.session.run_with_iobinding(self.binding)
        if self.device == "cuda":
            self.binding.synchronize_outputs()

    def result(self):
        """`{"out", "keys_out", "values_out"}` as numpy float32 (the rings
        read from the buffers written in place)."""
        return {"out": self.values["out"].numpy().astype(np.float32),
                "keys_out": self.values["keys"].numpy().astype(np.float32),
                "values_out": self.values["values"].numpy().astype(np.float32)}

    def profile(self):
        """Ends profiling: the profile file's events."""
        path = self.session.end_profiling()
        with open(path, encoding="utf-8") as f:
            return json.load(f)


KERNEL_WORDS = ("ONNX Attention: using", "Operator=", "SdpaKernel", "AttentionKernelOptions",
                "Unfused", "Flash", "Efficient", "DecoderMasked", "XQA", "cuDNN")


class Captured:
    """What ONNX Runtime's C++ code prints to the process's stdout and
    stderr (file descriptors 1 and 2) while in the block: `lines`, those
    that name an attention kernel (`KERNEL_WORDS`), deduplicated."""

    def __enter__(self):
        sys.stdout.flush(), sys.stderr.flush()
        self.file = tempfile.TemporaryFile(mode="w+b")
        self.saved = [os.dup(1), os.dup(2)]
        for fd in (1, 2):
            os.dup2(self.file.fileno(), fd)
        return self

    def __exit__(self, *exc):
        sys.stdout.flush(), sys.stderr.flush()
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)
        self.file.seek(0)
        text = self.file.read().decode("utf-8", "replace")
        self.file.close()
        found = [line.strip()[:300] for line in text.splitlines()
                 if any(word in line for word in KERNEL_WORDS)]
        self.lines = list(dict.fromkeys(found))[:20]
        return False


def node_counts(events, runs):
    """`({op: nodes a run}, [op types run by the CPU provider])` of the last
    `runs` runs in an ONNX Runtime profile's `events`, view ops left out (a
    node left to the CPU in a CUDA session, e.g. an op without a CUDA kernel
    of its dtype, costs copies and rules out a CUDA graph)."""
    starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    if len(starts) < runs:
        raise BenchmarkError(f"the profile holds {len(starts)} runs, not {runs}")
    counts, on_cpu = {}, set()
    for e in events:
        if e.get("cat") == "Node" and e["ts"] >= starts[-runs] \
                and e["name"].endswith("_kernel_time"):
            op = e["args"]["op_name"]
            if e["args"].get("provider") == "CPUExecutionProvider":
                on_cpu.add(op)
            if op not in VIEW_OPS:
                counts[op] = counts.get(op, 0) + 1
    return {op: count // runs for op, count in sorted(counts.items())}, sorted(on_cpu)


def cuda_kernels(run, runs=3):
    """`{kernel name: launches a call}` of `run` on CUDA, from torch's
    profiler (CUPTI sees every kernel of the process, ONNX Runtime's too);
    None without torch."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            run()
        torch.cuda.synchronize()
    try:  # the raw device activities, those no torch op launched included
        names = [e.name() for e in prof.profiler.kineto_results.events()
                 if e.device_type() == torch.autograd.DeviceType.CUDA]
    except AttributeError:
        names = [e.name for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA]
    counts = {}
    for name in names:
        if "memcpy" not in name.lower() and "memset" not in name.lower():
            counts[name[:120]] = counts.get(name[:120], 0) + 1
    return {name: count / runs for name, count in sorted(counts.items())}


def median_ms(run, iters, warmup=3):
    """Median milliseconds of `iters` calls of `run` after `warmup`."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def copy_bandwidth(device, mib, repeats=5):
    """Bytes a second of a device copy (ONNX Runtime Identity into a bound
    buffer of its own, read and write counted): over the difference of the
    best times of a copy of `mib` MiB and one of twice that, so a call's
    fixed cost cancels (the larger copy's own rate where noise leaves no
    positive difference)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "copy",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    session = ort.InferenceSession(model.SerializeToString(), providers=[PROVIDERS[device]])
    runs = []
    count = int(mib * 2 ** 20) // 4
    for n in (count, 2 * count):
        binding = session.io_binding()
        binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(
            np.ones(n, np.float32), device, 0))
        binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_shape_and_type(
            [n], np.float32, device, 0))

        def copy(binding=binding):
            session.run_with_iobinding(binding)
            if device == "cuda":
                binding.synchronize_outputs()
        runs.append(copy)
    best = [min(median_ms(copy, 1, warmup=1) for _ in range(repeats)) for copy in runs]
    moved = 2 * 4 * count  # read and written
    if best[1] > best[0]:
        return moved / ((best[1] - best[0]) / 1e3)
    return 2 * moved / (best[1] / 1e3)


@contextlib.contextmanager
def environment(name, value):
    """The environment variable `name` set to `value` (None: unset) in the block."""
    saved = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def measure(form, shape, dtype, batch, device, iters, case=None, kernels=True, diagnose=None,
            cuda_options=None):
    """One row: parity to `reference` (float32 inputs cast to `dtype`), ms
    a call, nodes a call, and on CUDA the kernels and the CUDA graph's ms;
    `error` where ONNX Runtime cannot build or run the form. `diagnose`
    (default: on CUDA): keep what ONNX Runtime logs of its kernel choice in
    the first run (`kernel_log`). `cuda_options`: more options of the CUDA
    provider (`sdpa_kernel`)."""
    inflight = "1" if form == "dmmha_inflight" else os.environ.get(INFLIGHT)
    with environment(INFLIGHT, inflight):
        return _measure(form, shape, dtype, batch, device, iters, case, kernels, diagnose,
                        cuda_options)


def _measure(form, shape, dtype, batch, device, iters, case, kernels, diagnose, cuda_options):
    case = case if case is not None else make_case(shape, batch)
    diagnose = device == "cuda" if diagnose is None else diagnose
    row = {"form": form, "dtype": dtype, "batch": batch}
    try:
        model = build_form(form, shape, dtype, case["r_kernel"], device)
        feeds = ring_layout(form, case, dtype, device)
        with tempfile.TemporaryDirectory(prefix="attention_forms_") as folder:
            bound = Bound(model, feeds, device, profile_dir=folder, cuda_options=cuda_options)
            if diagnose:
                import onnxruntime as ort
                ort.set_default_logger_severity(0)  # its kernel choice is logged verbosely
                try:
                    with Captured() as captured:
                        bound.run()
                finally:
                    ort.set_default_logger_severity(3)
                row["kernel_log"] = captured.lines
            else:
                bound.run()
            outputs = bound.result()
            for _ in range(3):
                bound.run()
            row["nodes"], on_cpu = node_counts(bound.profile(), 3)
        if device == "cuda":
            row["on_cpu"] = on_cpu
        row["node_count"] = sum(row["nodes"].values())
        want = reference(case, dtype)
        keys, values = bnsh_rings(form, outputs, SHAPES[shape]["slots"])
        row["max_abs_out"] = float(np.abs(outputs["out"] - want["out"]).max())
        row["max_abs_rings"] = float(max(np.abs(keys - want["keys"]).max(),
                                         np.abs(values - want["values"]).max()))
        row["out"] = outputs["out"]  # for the comparison with today's form; dropped from JSON
        timed = Bound(model, ring_layout(form, case, dtype, device), device,
                      cuda_options=cuda_options)
        row["ms"] = median_ms(timed.run, iters)
        if device == "cuda":
            if kernels:
                try:
                    row["cuda_kernels"] = cuda_kernels(timed.run)
                except Exception as e:  # torch's profiler where CUPTI is missing
                    row["cuda_kernels_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            try:
                graphed = Bound(model, ring_layout(form, case, dtype, device), device,
                                cuda_graph=True, cuda_options=cuda_options)
                row["graph_ms"] = median_ms(graphed.run, iters)
            except Exception as e:  # onnxruntime's own types
                row["graph_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    except Exception as e:  # onnxruntime's own types: the provider cannot run the form
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return row


def ring_bytes(shape, batch, dtype):
    """Bytes of one layer's K and V rings at `batch`."""
    s = SHAPES[shape]
    return 2 * batch * s["n_head"] * s["slots"] * s["d_head"] * np.dtype(dtype).itemsize


def run(forms, shape, dtypes, batches, device, iters, copy_mib, kernels=True,
        cuda_options=None):
    """The table's rows and the copy bandwidth: every form beside today's
    at each dtype and batch, on the same random case."""
    bandwidth = copy_bandwidth(device, copy_mib)
    rows = []
    for batch in batches:
        case = make_case(shape, batch)
        for dtype in dtypes:
            found = []
            for form in forms:
                found.append(measure(form, shape, dtype, batch, device, iters, case, kernels,
                                     cuda_options=cuda_options))
                gc.collect()  # the row's sessions and buffers, before the next's
            base = next((r for r in found if r["form"] == "today" and "error" not in r), None)
            bound_ms = 1e3 * ring_bytes(shape, batch, dtype) / bandwidth
            for row in found:
                row["bound_ms"] = bound_ms
                if "error" in row:
                    continue
                best = row.get("graph_ms", row["ms"])
                row["x_bound"] = best / bound_ms
                if base is not None:
                    row["max_abs_vs_today"] = float(np.abs(row["out"] - base["out"]).max())
                    row["ratio_to_today"] = best / base.get("graph_ms", base["ms"])
            for row in found:
                row.pop("out", None)
            rows.extend(found)
    return rows, bandwidth


def table(rows):
    """The rows as text, one line each."""
    lines = []
    for r in rows:
        head = f"{r['form']:>15} {r['dtype']} b{r['batch']:<3}"
        if "error" in r:
            lines.append(f"{head} error: {r['error']}")
            continue
        graph = f", graph {r['graph_ms']:.4f} ms" if "graph_ms" in r else ""
        kernels = (f", {sum(r['cuda_kernels'].values()):g} kernels"
                   if r.get("cuda_kernels") else "")
        ratio = f", {r['ratio_to_today']:.2f}x today" if "ratio_to_today" in r else ""
        cpu = f" ({', '.join(r['on_cpu'])} on the CPU)" if r.get("on_cpu") else ""
        lines.append(f"{head} {r['ms']:.4f} ms{graph}, {r['node_count']} nodes{cpu}{kernels}"
                     f"{ratio}, {r['x_bound']:.1f}x bound ({r['bound_ms'] * 1e3:.2f} us); "
                     f"max |out - numpy| {r['max_abs_out']:.2e}, rings "
                     f"{r['max_abs_rings']:.1e}")
    return "\n".join(lines)


def summary(rows):
    """One line: per dtype and batch, today's form against the bound and the
    fastest other form against today's (the GPU check's row)."""
    parts = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for batch in dict.fromkeys(r["batch"] for r in rows):
            ran = [r for r in rows if (r["dtype"], r["batch"]) == (dtype, batch)
                   and "error" not in r]
            today = next((r for r in ran if r["form"] == "today"), None)
            others = [r for r in ran if r["form"] != "today" and "ratio_to_today" in r]
            if today is None:
                parts.append(f"{dtype} b{batch}: today's form failed")
                continue
            best = min(others, key=lambda r: r["ratio_to_today"], default=None)
            line = f"{dtype} b{batch}: today {today['x_bound']:.1f}x bound"
            if best is not None:
                line += (f", fastest {best['form']} {best['ratio_to_today']:.2f}x today "
                         f"({best['x_bound']:.1f}x bound)")
            parts.append(line)
    return "attention forms, ms a call (÷ today, ÷ bound): " + "; ".join(parts)


SPEC = (
    option("enum", "device", "cpu", "Where the graphs run.", list(DEVICES)),
    option("enum", "shape", "tiny", "One layer of this shape: " + ", ".join(
        f"{k} (H {v['n_head']}, d_head {v['d_head']}, S {v['slots']})"
        for k, v in SHAPES.items()) + ".", list(SHAPES)),
    option("string", "batch_sizes", "1,16", "Comma-separated batch sizes."),
    option("list", "forms", list(FORMS), "Forms: " + ", ".join(FORMS) + "."),
    option("list", "dtypes", ["float32"], "Dtypes: " + ", ".join(DTYPES) + "."),
    option("integer", "iters", 200, "Calls timed per form (the median)."),
    option("integer", "copy_mib", 256, "MiB of the device copy that measures the bandwidth."),
    option("integer", "sdpa_kernel", 0, "On CUDA, the provider's sdpa_kernel option: the "
           "attention kernels its fused ops may pick, a bit mask (ONNX Runtime's "
           "AttentionBackend: 1 flash, 2 memory-efficient, 8 cuDNN flash, 16 math, ...); "
           "0: its own choice."),
    option("bool", "kernels", True, "On CUDA, count each form's kernels with torch's "
           "profiler where torch is importable."),
    option("string", "output", None, "Where to write the JSON results (default "
           "benchmarks/results/attention_forms_<device>.json)."),
)


def main(argv):
    del argv
    from txl_tf.app.flagspec import values
    o = values(SPEC)
    at_least(o, 1, "iters", "copy_mib")
    batches = integer_list(o["batch_sizes"], "batch_sizes", 1, "comma-separated integers >= 1")
    forms = names_from(o["forms"], "forms", FORMS)
    dtypes = names_from(o["dtypes"], "dtypes", DTYPES)
    import onnxruntime as ort
    if PROVIDERS[o["device"]] not in ort.get_available_providers():
        raise BenchmarkError(f"--device={o['device']}: onnxruntime {ort.__version__} has no "
                             f"{PROVIDERS[o['device']]}")
    if o["device"] == "cuda":  # the kernels each attention op picks, in its first run's output
        os.environ.setdefault("ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO", "1")
    ort.set_default_logger_severity(3)
    started = time.perf_counter()
    if o["sdpa_kernel"] < 0:
        raise BenchmarkError(f"--sdpa_kernel must be a bit mask >= 0, got {o['sdpa_kernel']}")
    cuda_options = {"sdpa_kernel": str(o["sdpa_kernel"])} if o["sdpa_kernel"] else None
    rows, bandwidth = run(forms, o["shape"], dtypes, batches, o["device"], o["iters"],
                          o["copy_mib"], o["kernels"], cuda_options)
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write)")
    print(table(rows))
    output = o["output"] or os.path.join(REPO, "benchmarks", "results",
                                         f"attention_forms_{o['device']}.json")
    result = {"question": "one layer's cached-step attention in ONNX Runtime's fused forms "
                          "against today's (issue 53)",
              "onnxruntime": ort.__version__, "device": o["device"], "shape": o["shape"],
              "layer": SHAPES[o["shape"]], "batch_sizes": batches, "dtypes": dtypes,
              "iters": o["iters"], "sdpa_kernel": o["sdpa_kernel"],
              "copy_bytes_per_s": bandwidth,
              "seconds": time.perf_counter() - started, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {output}")
    print(summary(rows))


if __name__ == "__main__":
    from txl_tf.app import cli
    cli.run(main, SPEC)
