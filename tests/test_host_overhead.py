"""The host-overhead benchmark's logic (`benchmarks/host_overhead.py`): its
verbs run on a tiny export with their floors, a worker answers over its
pipe, and the rows' medians, spreads and before/after ratios are what the
samples say. No timing is asserted."""
import io
import json

import pytest

from benchmarks import host_overhead as bench
from test_decode_cache_export import export_of_config


@pytest.fixture(scope="module")
def export_dir(built_once):
    return str(export_of_config(built_once)[1])


def test_every_verb_and_its_floor_run_on_the_device_path(export_dir):
    runtime = bench.open_tiny(export_dir)
    assert runtime.device_cache and runtime.cuda_graph and runtime.device == "cpu"
    for verb in bench.VERBS:
        made = bench.make_verb(runtime, verb)
        assert (made[2] is not None) == (verb == "generate")
        timed = bench.time_verb(made, 20)
        assert set(timed) == {"us", "floor_us"} and timed["floor_us"] > 0, (verb, timed)
    # The floors are the graphs' runs alone: a floor run leaves the verb's state working.
    decode = bench.make_verb(runtime, "decode_step")
    decode[1]()
    decode[0]()


def test_a_worker_answers_each_question_on_its_line_and_names_a_failure(export_dir):
    questions = [{"export_dir": export_dir, "verb": "next_cached", "calls": 10},
                 {"export_dir": export_dir, "verb": "next_cached", "calls": 10,
                  "profile": True},
                 {"export_dir": export_dir, "verb": "no_such_verb", "calls": 1}]
    out = io.StringIO()
    bench.serve(io.StringIO("".join(json.dumps(q) + "\n" for q in questions)), out)
    timed, profiled, failed = (json.loads(line) for line in out.getvalue().splitlines())
    assert set(timed) == {"us", "floor_us"}
    assert 0 < len(profiled) <= bench.PROFILED
    assert all(set(row) == {"function", "own_us", "calls"} for row in profiled)
    assert any("decode" in row["function"] or "run_with_iobinding" in row["function"]
               for row in profiled), profiled
    assert failed == {"error": "ValueError: unknown verb 'no_such_verb'"}


def test_a_worker_process_runs_the_code_it_is_given(export_dir):
    worker = bench.Worker(bench.REPO)
    try:
        answer = worker.ask(export_dir=export_dir, verb="decode_step", calls=10)
        assert answer["floor_us"] > 0
        with pytest.raises(bench.BenchmarkFailure, match="unknown verb"):
            worker.ask(export_dir=export_dir, verb="nothing", calls=1)
    finally:
        worker.close()
    assert worker.process.returncode == 0


def test_rows_are_medians_over_rounds_and_after_is_divided_by_before():
    def samples(pairs):
        return [{"us": us, "floor_us": floor} for us, floor in pairs]
    before = bench.summarize(samples([(50, 10), (70, 20), (90, 10)]))
    assert (before["us"], before["floor_us"], before["over_us"]) == (70, 10, 50)
    assert (before["over_min_us"], before["over_max_us"]) == (40, 80)
    assert before["over_best_us"] == 50 - 10 and before["rounds"] == 3
    after = bench.summarize(samples([(30, 10), (40, 20), (35, 15)]))
    rows = bench.compare([{"verb": "step", "mem_len": 4, "code": "before", **before},
                          {"verb": "step", "mem_len": 4, "code": "after", **after},
                          {"verb": "step", "mem_len": 64, "code": "after", **after}])
    assert rows[1]["over_before_us"] == 50 and rows[1]["over_ratio"] == 0.4
    assert rows[1]["over_best_ratio"] == 0.5  # (30 - 10) / (50 - 10)
    assert "over_ratio" not in rows[0] and "over_ratio" not in rows[2]  # no before of 64
    lines = bench.table(rows).splitlines()
    assert len(lines) == 5 and "| step | 4 | after |" in lines[3] and "0.40 / 0.50" in lines[3]


def test_profiled_functions_are_named_from_their_package_on():
    assert bench.short_name(("/venv/lib/site-packages/onnxruntime/capi/x.py", 5, "run")) == \
        "onnxruntime/capi/x.py:5(run)"
    assert bench.short_name(("/work/tree/export/runtime.py", 9, "step")) == \
        "export/runtime.py:9(step)"
    assert bench.short_name(("/usr/lib/python3.11/collections/__init__.py", 452, "_replace")) == \
        "collections/__init__.py:452(_replace)"
    assert bench.short_name(("~", 0, "<built-in method len>")) == "<built-in method len>"
