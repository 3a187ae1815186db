"""The benchmarks turn a bad flag into one `error:` line and exit 2, before
any export or measurement (they run as `txl_tf.app.cli` jobs)."""
import subprocess
import sys

import pytest

from job_helpers import job_env


def last_error_line(module, flags):
    done = subprocess.run([sys.executable, "-m", module, *flags], env=job_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("value", ["1,x", "2,-1"])
def test_a_bad_batch_size_is_one_error_line(value):
    assert last_error_line("benchmarks.bench_long_memory", [f"--batch_sizes={value}"]) == \
        f"error: --batch_sizes must be comma-separated positive integers, got '{value}'"


@pytest.mark.parametrize("module, flags, message", [
    ("benchmarks.bench_long_memory", ["--reuse_exports"], "--reuse_exports needs --work_dir"),
    ("benchmarks.bench_long_memory", ["--device=tpu"], "--device must be cpu, cuda or auto"),
    ("benchmarks.bench_long_memory", ["--reuse_exports", "--work_dir=.", "--clamp_len=820"],
     "--clamp_len makes this run's model"),
    ("benchmarks.bench_long_memory", ["--device_cache=maybe"], "--device_cache must be"),
    ("benchmarks.onnx_weights", ["--fill"], "--skeleton_dir is required"),
    ("benchmarks.cuda_parity", [], "--exports is required"),
    ("benchmarks.memory_use", [], "--model_dirs is required"),
    ("benchmarks.memory_use", ["--model_dirs=m", "--mem_lens=0,-1"], "--mem_lens must be"),
    ("benchmarks.eval_speed", ["--lengths=8,x"], "--lengths must be"),
    ("benchmarks.train_throughput", ["--iters=many"], "--iters"),
    ("benchmarks.ablation", ["--models=xl,gru"], "--models: unknown ['gru']"),
])
def test_bad_flags_are_checked_first(module, flags, message):
    last = last_error_line(module, flags)
    assert last.startswith("error: ") and message in last, last
