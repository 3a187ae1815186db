"""The serving benchmarks turn a bad `--batch_sizes` into one `error:` line
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
