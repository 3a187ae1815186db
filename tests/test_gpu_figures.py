"""The figures the GPU check prints, where their logic runs on the CPU: the
bound's bandwidth without a call's fixed cost, the measurement-error flag
of a 16-bit step, the CUDA parity over every live row, the check's parity
threshold (issue 53's), the clocks that wait for the device (a Keras batch,
the evaluation-speed calls after their warm-up), the paper's TF32 setting
beside TensorFlow's, TensorFlow sharing the GPU with the paper's worker, the
MFU's peak matmul, and what a pair's ratio is over. (A GPU decides the
numbers themselves.)"""
import inspect
import json
import os

import numpy as np
import pytest

from benchmarks import common, eval_speed, gpu_check, paper_reference
from benchmarks import long_memory as lm
from benchmarks import throughput as tp
from txl_tf.app.flagspec import defaults

GIB = 2 ** 30


def test_the_bandwidth_leaves_out_a_calls_fixed_cost(monkeypatch):
    """A read and one of twice its bytes, each with the same 50 us of launch
    and wait: the bandwidth is the device's own 4 TB/s (a read of 1 GiB
    alone over its time gave 3.37, and a bound 19 % too high). The larger
    read stays under 2 GiB by default."""
    fixed, rate = 50e-6, 4e12
    made = []

    def reader(data, device):
        made.append((data.nbytes, device))
        read = lambda: None  # noqa: E731
        read.nbytes = data.nbytes
        return read
    monkeypatch.setattr(lm, "ort_reader", reader)
    monkeypatch.setattr(lm, "seconds", lambda read: fixed + read.nbytes / rate)
    assert lm.cuda_read_bandwidth(gib=1 / 64) == pytest.approx(rate, rel=1e-9)
    assert made == [(GIB // 64, "cuda"), (GIB // 32, "cuda")]
    assert GIB / (fixed + GIB / rate) < 0.85 * rate  # what one size alone measured
    default = inspect.signature(lm.cuda_read_bandwidth).parameters["gib"].default
    assert GIB / 2 <= 2 * default * GIB < 2 ** 31


def test_the_xla_decoder_on_a_gpu_is_timed_against_the_gpus_bound(monkeypatch, tmp_path):
    """`--xla_device=gpu` (the Keras side's compiled generate on TensorFlow's
    GPU): its rows say the device the decoder ran on and divide by that
    device's bandwidth, not the CPU's. Here the GPU is the CPU under another
    name; a GPU decides the numbers."""
    monkeypatch.setattr(lm, "XLA_DEVICES", dict(lm.XLA_DEVICES, gpu=("/CPU:0", "cuda")))
    o = dict(defaults(lm.SPEED_SPEC), presets="tiny", batch_sizes="1", backends="xla",
             tokens=2, turns=False, sessions=False, xla_device="gpu")
    bandwidth = {"cpu": 1e10, "cuda": 4e12}
    (row,) = lm.run_preset("tiny", o, bandwidth, str(tmp_path))
    config = lm.preset_config("tiny", None, None)
    assert row["device"] == "cuda" and row["backend"] == "xla"
    assert row["bound_ms"] == pytest.approx(lm.step_bytes(config, config.mem_len, 1) / 4e12 * 1e3)
    assert lm.tf_read_bandwidth("/CPU:0", gib=1 / 256, repeats=1) > 0  # the XLA read, any device


def test_the_xla_decoder_on_a_gpu_gets_the_gpus_bound_however_backends_are_spaced(
        monkeypatch, tmp_path):
    """`--backends="onnx, xla" --xla_device=gpu`: the backends are read with
    their spaces stripped (as the run reads them), so the GPU's bound is
    measured for the XLA decoder (was: the bound's check split the flag
    without stripping, measured nothing, and the xla rows found no "cuda"
    bandwidth: a KeyError, or the ONNX read alone on --device=cuda)."""
    import tensorflow as tf
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"])
    monkeypatch.setattr(lm, "read_bandwidths", lambda: {"numpy": 1e10})
    monkeypatch.setattr(lm, "tf_read_bandwidth", lambda device, **kw: 4e12)
    seen = []
    monkeypatch.setattr(lm, "run_preset", lambda preset, o, bandwidth, work: seen.append(
        dict(bandwidth)) or [])
    o = dict(defaults(lm.SPEED_SPEC), presets="tiny", backends="onnx, xla", xla_device="gpu",
             work_dir=str(tmp_path), output=str(tmp_path / "out.json"))
    lm.run_speed(o)
    assert seen == [{"cpu": 1e10, "cuda": 4e12}]


def test_the_xla_decoder_on_a_gpu_needs_one(monkeypatch):
    """`--xla_device=gpu` where TensorFlow sees no GPU: one error before any
    model is built (TensorFlow's GPU list faked empty, as on this CPU: the
    same on a machine with one)."""
    import tensorflow as tf
    from txl_tf.errors import TxlError
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    o = dict(defaults(lm.SPEED_SPEC), backends="onnx, xla", xla_device="gpu")
    with pytest.raises(TxlError, match=r"^--xla_device=gpu: TensorFlow sees no GPU here$"):
        lm.run_speed(o)


def test_the_bandwidth_of_reads_whose_difference_is_noise(monkeypatch):
    """Where the larger read was not the slower (noise), the larger read's
    own rate; each read is warmed up once and timed in alternating rounds."""
    calls = []
    small, large = (lambda: calls.append("s")), (lambda: calls.append("l"))
    times = iter([2.0, 1.0, 2.0, 1.0])  # small, large, small, large
    monkeypatch.setattr(lm, "seconds", lambda read: (read(), next(times))[1])
    assert lm.bandwidth_between(small, large, 100, repeats=2) == 200 / 1.0
    assert calls == ["s", "l"] * 3


def test_a_step_below_its_bound_is_a_measurement_error_on_its_own_bytes():
    """A float16 step reads about half the float32 step's bytes: at 0.8x the
    float32 bound it is 1.6x its own, a possible step, not an error; below
    its own bound it is one, and so is a float32 step below its bound. The
    check's line says so where it does."""
    def row(batch, over, own=None):
        r = {"preset": "enwik8_base", "backend": "onnx", "device": "cuda", "batch": batch,
             "bound_ms": 1.0, "per_token_ms": over, "over_bound": over}
        if own is not None:
            r.update(decode_dtype="float16", own_bound_ms=0.5, over_own_bound=own)
        return r
    rows = [row(1, 0.8, own=1.6), row(2, 0.45, own=0.9), row(16, 0.9), row(4, 1.2)]
    assert lm.below_bound(rows) == [rows[1], rows[2]]
    parts = lm.speed_summary(rows).split(": ", 1)[1].split("; ")
    assert ["MEASUREMENT ERROR" in part for part in parts] == [False, True, True, False]
    assert parts[0] == "enwik8_base onnx cuda b1 0.80 (0.8x, 1.6x of its float16 bytes)"


def test_the_cuda_parity_reads_every_row_until_it_stops():
    """Row 1 differs by 1e-3 while it runs (it was never compared before)
    and by 5 once stopped (its log-probs mean nothing then)."""
    reference = np.zeros([2, 4], np.float32)
    log_probs = reference.copy()
    log_probs[0] += 1e-6
    log_probs[1] += 1e-3
    assert lm.live_difference(log_probs, reference, [False, False]) == pytest.approx(1e-3)
    log_probs[1] = 5.0
    assert lm.live_difference(log_probs, reference, [False, True]) == pytest.approx(1e-6)
    assert lm.live_difference(log_probs, reference, [True, True]) == 0.0


def test_the_checks_cuda_parity_holds_issue_53s_threshold():
    """float32 with TF32 off: within 1e-5 of the CPU (the part's own default,
    1e-3, let a hundred times that pass); the float16 step keeps 5e-2."""
    o = dict(defaults(gpu_check.SPEC), work_dir="/w", serving_exports="/x")
    commands = gpu_check.commands_for(o, "/out")
    assert "--tolerance=1e-5" in commands["serving_parity"]
    assert "--tolerance=5e-2" in commands["serving_parity_float16"]


class Pending:
    """A device result: reading it on the host waits for the device."""

    def __init__(self, log):
        self.log = log

    def __array__(self, dtype=None, copy=None):
        self.log.append("wait")
        return np.zeros(1)


def test_the_evaluation_speed_clock_starts_after_the_warm_up_is_done(monkeypatch):
    log = []
    monkeypatch.setattr(eval_speed.time, "perf_counter", lambda: log.append("clock") or 0.0)

    def call():
        log.append("call")
        return Pending(log)
    eval_speed._timed(call, 2, warmup=3)
    assert log == ["call"] * 3 + ["wait", "clock", "call", "call", "wait", "clock"]


def test_a_keras_batch_clock_stops_after_its_logs_are_on_the_host(monkeypatch):
    log = []
    monkeypatch.setattr(tp.time, "perf_counter", lambda: log.append("clock") or 0.0)
    timer = tp.batch_timer()
    timer.on_train_batch_begin(0)
    timer.on_train_batch_end(0, {"loss": Pending(log)})
    assert log == ["clock", "wait", "clock"] and timer.times == [0.0]


@pytest.mark.parametrize("precision, tf32", [("float32", False), ("tf32", True), ("bf16", True),
                                             ("fp16", True)])
def test_the_papers_tf32_is_tensorflows_in_each_precision(precision, tf32):
    """TensorFlow keeps TF32 on under its mixed policies for what stays
    float32; the paper's worker did so only for `tf32`."""
    assert paper_reference.tf32_allowed(precision) is tf32


def test_the_pair_lets_tensorflow_share_the_gpu_with_the_papers_worker(monkeypatch):
    """Run alone (not from the check, which sets it), the pair's TensorFlow
    would take the whole GPU at its first op, before the paper's worker."""
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "x")
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH")
    seen = []

    class Stop(Exception):
        pass

    def check_options(o):
        seen.append(os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"))
        raise Stop
    monkeypatch.setattr(tp, "values", defaults)
    monkeypatch.setattr(tp, "check_options", check_options)
    with pytest.raises(Stop):
        tp.main([])
    assert seen == ["true"]
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "false")  # the caller's choice stays
    common.share_the_gpu()
    assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"


def test_the_mfus_matmul_is_large_enough_on_a_gpu():
    """The peak the MFU divides by: 8192 a side on a GPU, where a 2048
    matmul is about as long as its launch and read-back; the CPU keeps 2048."""
    assert tp.matmul_size(on_gpu=True) == 8192 and tp.matmul_size(on_gpu=False) == 2048
    assert tp.matmul_peak("float32", repeats=1) > 0  # 2048 here, on the CPU


def test_a_pair_without_the_papers_rows_says_what_its_ratio_is_over(tmp_path):
    """Without `--reference_dir` throughput's ratio is over its first row: the
    check's line names it, so that 1.40x is not read as the paper's ratio."""
    row = dict(tokens_per_s=50000.0, ratio=1.0, peak_gib=None, first_step_s=40.0)
    out = tmp_path / "pair.json"
    out.write_text(json.dumps({"results": [dict(row, variant="f32+jit"),
                                           dict(row, variant="bf16+jit", ratio=1.4)]}))
    assert gpu_check.pair_summary(str(out)) == (
        "f32+jit 50,000 tok/s (1.00x f32+jit, 1st 40 s); "
        "bf16+jit 50,000 tok/s (1.40x f32+jit, 1st 40 s)")
    out.write_text(json.dumps({"results": [dict(row, variant="paper f32"),
                                           dict(row, variant="f32+jit", ratio=2.1)]}))
    assert gpu_check.pair_summary(str(out)) == (
        "paper f32 50,000 tok/s (1.00x, 1st 40 s); f32+jit 50,000 tok/s (2.10x, 1st 40 s)")


def test_the_cuda_profile_runs_the_step_as_the_runtime_times_it(monkeypatch):
    """TF32 off, as `OnnxRuntime` opens the graphs the serving rows time
    (ONNX Runtime's own default turns it on)."""
    import onnxruntime

    from benchmarks import inference
    opened = []

    def session(path, options, providers, disabled_optimizers):
        opened.append(providers)
        raise RuntimeError("enough")
    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    with pytest.raises(RuntimeError, match="enough"):
        inference.profile_graph("decode_step.onnx", {}, "cuda", 1)
    assert opened == [[("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]]
