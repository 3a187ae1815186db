"""The serving benchmarks turn a bad flag into one `error:` line
and exit 2, before any export or measurement."""
import subprocess
import sys

import pytest

from benchmarks.bench_long_memory import parse_batch_sizes


@pytest.mark.parametrize("module", ["benchmarks.bench_long_memory",
                                    "benchmarks.tf_decode_kernels"])
def test_a_bad_batch_size_is_one_error_line(module):
    done = subprocess.run([sys.executable, "-m", module, "--batch_sizes=1,x"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == \
        "error: --batch_sizes must be comma-separated positive integers, got '1,x'"


def test_batch_sizes_parse():
    assert parse_batch_sizes("1, 16,") == [1, 16]
    for bad in ("", "0", "2,-1", "one"):
        with pytest.raises(ValueError, match="--batch_sizes"):
            parse_batch_sizes(bad)


@pytest.mark.parametrize("module, flags, message", [
    ("benchmarks.bench_long_memory", ["--reuse_exports"], "--reuse_exports needs --work_dir"),
    ("benchmarks.bench_long_memory", ["--device=tpu"], "--device must be cpu, cuda or auto"),
    ("benchmarks.bench_long_memory", ["--reuse_exports", "--work_dir=.", "--clamp_len=820"],
     "--clamp_len makes this run's model"),
    ("benchmarks.bench_long_memory", ["--device_cache=maybe"], "--device_cache must be"),
    ("benchmarks.onnx_weights", ["--fill"], "--skeleton_dir is required"),
    ("benchmarks.cuda_parity", [], "--exports is required"),
    ("benchmarks.ort_step_profile", [], "--export_dir is required"),
    ("benchmarks.ort_cuda_graph_check", [], "--step_graph is required"),
    ("benchmarks.memory_use", [], "--model_dirs is required"),
    ("benchmarks.memory_use", ["--model_dirs=m", "--mem_lens=0,-1"], "--mem_lens must be"),
])
def test_the_gpu_benchmarks_flags_are_checked_first(module, flags, message):
    done = subprocess.run([sys.executable, "-m", module, *flags],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, last
