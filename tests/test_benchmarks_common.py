"""`benchmarks.common.integer_list`, the parsing of the benchmarks'
comma-separated integer flags: good values are their integers, bad ones a
`BenchmarkError` naming the flag, what it takes and the value given."""
import importlib
import os
import sys

import pytest

from benchmarks.common import BenchmarkError, integer_list, peak_rss_bytes


@pytest.mark.parametrize("text, minimum, numbers", [
    ("1,16", 1, [1, 16]),
    ("0", 0, [0]),
    (" 2, 8 ,", 2, [2, 8]),  # spaces and a trailing comma
    (["3", "4"], 1, [3, 4]),  # absl's list flag: already split
])
def test_good_values_are_their_integers(text, minimum, numbers):
    assert integer_list(text, "batch_sizes", minimum, "positive integers") == numbers


@pytest.mark.parametrize("text", ["", ",", "1,x", "2.5", "1,,0", "-1", []])
def test_bad_values_are_an_error_naming_the_flag(text):
    shown = text if isinstance(text, str) else ""
    with pytest.raises(BenchmarkError) as raised:
        integer_list(text, "mem_lens", 1, "comma-separated integers >= 1")
    assert str(raised.value) == f"--mem_lens must be comma-separated integers >= 1, got {shown!r}"


@pytest.mark.parametrize("platform, factor", [("linux", 1024), ("darwin", 1)])
def test_peak_rss_is_in_bytes_on_linux_and_macos(monkeypatch, platform, factor):
    """`ru_maxrss` is KiB on Linux, bytes on macOS (export_memory's and
    memory_worth's peaks were 1024 times too large there)."""
    import types
    monkeypatch.setattr(sys, "platform", platform)
    assert peak_rss_bytes(types.SimpleNamespace(ru_maxrss=3000)) == 3000 * factor


def test_without_resource_or_getloadavg_the_benchmarks_still_describe_the_machine(
        monkeypatch):
    """Windows has neither `resource` nor `os.getloadavg` (memory_worth
    imported the first, throughput's `environment` called the second: both
    ended in a traceback)."""
    from benchmarks import throughput
    monkeypatch.setitem(sys.modules, "resource", None)
    monkeypatch.delattr(os, "getloadavg")
    assert peak_rss_bytes() is None
    assert throughput.environment()["loadavg"] is None
    monkeypatch.delitem(sys.modules, "benchmarks.memory_worth", raising=False)
    importlib.import_module("benchmarks.memory_worth")


def test_a_row_faster_than_the_matmul_shows_and_moves_no_other_row(monkeypatch, capsys):
    """MFU is against the same-run matmul: a row above it (a step that
    skipped work, or a peak timed too low) keeps an MFU above 1 and is
    flagged, and the other rows keep their MFU against the matmul (a row
    taken as the peak would read 100% and lower every other row's)."""
    import benchmarks.throughput as tp
    monkeypatch.setattr(tp, "matmul_peak", lambda dtype: {"float32": 100.0,
                                                          "bfloat16": 300.0}[dtype])
    monkeypatch.setattr(tp, "environment", lambda: {"loadavg": None})
    rows = [{"variant": "skipped", "peak_dtype": "float32", "model_gflops_per_s": 120.0},
            {"variant": "f32", "peak_dtype": "float32", "model_gflops_per_s": 80.0},
            {"variant": "bf16", "peak_dtype": "bfloat16", "model_gflops_per_s": 150.0},
            {"variant": "failed", "peak_dtype": "float32", "error": "failed"}]
    tp.report(rows, {"float32": 90.0, "bfloat16": 200.0}, {"loadavg": None},
              [("MFU", "mfu", ".1%")], None, "q", {})
    assert [r.get("mfu") for r in rows] == [1.2, 0.8, 0.5, None]
    assert [r.get("peak_gflops") for r in rows] == [100.0, 100.0, 300.0, None]
    assert [r.get("above_peak", False) for r in rows] == [True, False, False, False]
    assert "skipped" in capsys.readouterr().out
