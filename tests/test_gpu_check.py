"""The one GPU check's logic on the CPU (`benchmarks/gpu_check.py`): its
command table names flags the benchmarks and jobs have, a part that fails,
hangs or cannot run is one line of the table and the check goes on, the
kill-and-resume verdict, the ptxas floor, log-prob parity's plumbing, and
the one `error:` line without a GPU. The throughput suite's sequential and
interleaved timing with fake runners. (The GPU numbers come from a GPU.)"""
import importlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from absl import flags

from benchmarks import gpu_check as gc
from benchmarks import throughput as tp
from benchmarks.attention_nodes import FORMS
from txl_tf.app.flagspec import defaults, define


@pytest.mark.parametrize("tiny, device, exports", [(False, "gpu", None), (True, "cpu", "/x"),
                                                    (False, "gpu", "/x")])
def test_every_command_names_a_module_and_flags_it_takes(tiny, device, exports):
    """Each command line parses with its module's SPEC (names and values)."""
    o = {"reference_dir": "/ref", "reference_python": "python", "tiny": tiny, "device": device,
         "work_dir": "/w", "parts": gc.CHECKS, "serving_exports": exports}
    commands = gc.commands_for(o, "/out")
    assert list(commands) == gc.CHECKS
    for part, argv in commands.items():
        assert argv[:2] == [sys.executable, "-m"], argv
        assert not any("{" in arg for arg in argv), argv  # every field filled
        if argv[2] == "pytest":  # the device tests: files of this checkout
            assert all(os.path.isfile(arg) for arg in argv if arg.startswith("tests/")), argv
            continue
        flag_values = flags.FlagValues()
        define(importlib.import_module(argv[2]).SPEC, flag_values)
        assert flag_values([argv[2], *argv[3:]]) == [argv[2]], part  # raises on a bad flag
    for part in ("serving_long_memory", "serving_evaluation"):  # one export, on the device
        assert f"--device={'cpu' if tiny else 'cuda'}" in commands[part]
        assert "--work_dir=/w/serving" in commands[part]
    assert "--reuse_exports" in commands["serving_evaluation"]
    # the export brought along (--serving_exports) is timed, not made again
    assert ("--reuse_exports" in commands["serving_long_memory"]) == bool(exports)
    for part in gc.FLOAT16_PARTS:  # the float16 export, in its own work folder
        assert any(arg.startswith("--work_dir=/w/serving_float16") or
                   arg.startswith("--exports=/w/serving_float16/") for arg in commands[part])
    assert "--tolerance=5e-2" in commands["serving_parity_float16"]
    # the whole step in the fused forms: both exports brought along, as the serving parts
    serving = "tiny" if tiny else "enwik8_base"
    assert f"--exports=/w/serving/{serving}/out,/w/serving_float16/{serving}/out" \
        in commands["fused_step"]
    assert sorted(gc.FUSED_FORMS) == sorted(FORMS) and gc.FUSED_FORMS[0] == "today"
    assert f"--device={'cpu' if tiny else 'cuda'}" in commands["serving_soak"]
    # the trained model's exports brought along, read in place, no Keras model beside them
    precision = commands["serving_precision"]
    assert f"--work_dir={exports or '/w'}/precision" in precision
    assert {"--reuse_exports", "--nokeras_rows", "--model_dir=pystdlib_small",
            f"--device={'cpu' if tiny else 'cuda'}", f"--tokens={20 if tiny else 300}",
            "--mem_len=128"} <= set(precision)
    serving = "tiny" if tiny else "enwik8_base"  # the export made above
    assert f"--export_dir=/w/serving/{serving}/out" in commands["serving_soak"]
    assert "--reference_dir=/ref" in commands["serving_evaluation"]
    assert f"--device={device}" in commands["parity"]
    assert "--reference_dir=/ref" in commands["pair_wt103_base"]
    shape = "tiny" if tiny else "wt103_base"
    assert f"--shapes={shape}" in commands["pair_wt103_base"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_float16_parts_settings_say_float16_and_a_mismatch_is_refused(monkeypatch, dtype):
    """`serving_float16` times the float16 export: its command sets
    `--decode_dtype=float16`, which its JSON's settings record (the run of
    2026-11-30 recorded the flag's default, float32, beside float16 rows);
    and `long_memory` refuses to time a reused export whose decode graphs
    are not in `--decode_dtype` (the settings would not say what ran)."""
    import export
    from types import SimpleNamespace

    from benchmarks import long_memory as lm
    from txl_tf.errors import TxlError
    argv = gc.commands_for({"reference_dir": None, "reference_python": "python", "tiny": False,
                            "device": "gpu", "work_dir": "/w", "parts": gc.CHECKS,
                            "serving_exports": "/x"}, "/out")["serving_float16"]
    flag_values = flags.FlagValues()
    define(lm.SPEC, flag_values)
    flag_values([argv[2], *argv[3:]])
    assert flag_values["decode_dtype"].value == "float16" and flag_values["reuse_exports"].value
    runtime = SimpleNamespace(device="cpu", mem_len=8, info=SimpleNamespace(decode_dtype=dtype))
    monkeypatch.setattr(export, "open_runtime", lambda path, backend, **options: runtime)
    assert lm.open_export("/w/tiny", "onnx", 8, "cpu", decode_dtype=dtype) is runtime
    other = {"float32": "float16", "float16": "float32"}[dtype]
    with pytest.raises(TxlError, match=re.escape(
            f"the export in /w/tiny has {dtype} decode graphs, not {other} (--decode_dtype: "
            f"pass --decode_dtype={dtype} to time them)")):
        lm.open_export("/w/tiny", "onnx", 8, "cpu", decode_dtype=other)


# The gpu and serving_exports rows' seconds in the checks on an H200 (taken from --total_s
# before the parts run), the longer of 2026-11-30's (14, 9) and 2026-12-01's (13, 12).
ROWS_BEFORE_S = {"gpu": 14, "serving_exports": 12}


def test_each_group_fits_one_session():
    """`--parts=training` and `--parts=serving` each fit what a device session
    leaves (`SESSION_S`, the default `--total_s`) with the rows before the
    parts; the parts left out to fit are the ones named
    (benchmarks/device/README.md's plan), and the ones left out of the
    training half fit a session of their own."""
    assert set(gc.BUDGETS) == set(gc.CHECKS)
    assert defaults(gc.SPEC)["total_s"] == gc.SESSION_S == 540.0
    grouped = [part for parts in gc.GROUPS.values() for part in parts]
    assert len(grouped) == len(set(grouped)) and set(grouped) <= set(gc.CHECKS)
    assert set(gc.GROUPS["serving"]) == {p for p in gc.CHECKS if p.startswith("serving_")}
    assert gc.needs_onnxruntime("attention_forms") and not gc.needs_onnxruntime("decode_xla")
    assert gc.needs_onnxruntime("fused_step")
    assert set(gc.CHECKS) - set(grouped) == {"mirrored", "losses", "pair_wt103_base",
                                             "decode_xla", "attention_forms", "fused_step"}
    assert gc.GROUPS["training"][0] == "compile_flags"  # its figures first
    for group, parts in gc.GROUPS.items():
        before = ROWS_BEFORE_S["gpu"] + ROWS_BEFORE_S["serving_exports"] * (group == "serving")
        assert sum(gc.BUDGETS[p] for p in parts) + before <= gc.SESSION_S, group
    others = gc.selected_parts(["parity", "losses", "mirrored", "pair_wt103_base"])
    assert sum(gc.BUDGETS[p] for p in others) + ROWS_BEFORE_S["gpu"] <= gc.SESSION_S
    # what a compile of a minute leaves no room for: one variant per pair
    sized = gc.sizes(False, "gpu")
    assert (sized["enwik8_variants"], sized["wt103_variants"]) == ("bf16+jit", "f32+jit")
    # the compile settings on the step whose compile outran its budget (the job's default)
    assert sized["compile_variant"] == "bf16+jit"


def test_parts_and_groups_select_parts_in_their_order():
    assert gc.selected_parts(["training"]) == list(gc.GROUPS["training"])
    assert gc.selected_parts(["serving_soak", "serving", "mirrored", "mirrored"]) == [
        "serving_soak", *[p for p in gc.GROUPS["serving"] if p != "serving_soak"], "mirrored"]
    assert gc.selected_parts(["train", "parity"]) == ["train", "parity"]
    for bad, unknown in ((["training", "servings"], "servings"), ([], "(none given)")):
        with pytest.raises(gc.BenchmarkError) as error:
            gc.selected_parts(bad)
        assert str(error.value) == ("--parts takes a non-empty list of " + ", ".join(
            gc.CHECKS + ["training", "serving"]) + f"; unknown: {unknown}")


def fake(code):
    return [sys.executable, "-c", code]


def test_each_part_is_one_line_and_the_check_goes_on():
    result = json.dumps({"summary": "max |d| 0", "ok": True})
    bad = json.dumps({"summary": "max |d| 3e-2", "ok": False})
    commands = {  # the slow part first: no earlier part's time left over for it
        "pair_enwik8_base": fake("import time; time.sleep(30)"),
        "parity": fake(f"print('noise'); print({gc.RESULT_PREFIX + result!r})"),
        "losses": fake(f"print({gc.RESULT_PREFIX + bad!r})"),
        "mirrored": fake("import sys; print('x'); print('error: no such thing', file=sys.stderr);"
                         " sys.exit(2)"),
        "pair_wt103_base": fake("print('row'); print('last line')") + ["--output=/o/p.json"],
        "serving_parity": fake("print('never run')"),
    }
    budgets = dict(gc.BUDGETS, pair_enwik8_base=1)
    rows = gc.run_parts(commands, budgets, total_s=60, env=None,
                        skip={"serving_parity": "needs CUDA"})
    got = {r["part"]: (r["status"], r["result"]) for r in rows}
    assert got == {
        "parity": ("ok", "max |d| 0"),
        "losses": ("failed", "failed (max |d| 3e-2)"),
        "mirrored": ("failed", "failed (error: no such thing)"),
        "pair_enwik8_base": ("failed", "failed (timed out after 1 s)"),
        "pair_wt103_base": ("ok", "last line (all of it: /o/p.json)"),
        "serving_parity": ("skipped", "skipped (needs CUDA)"),
    }
    assert rows[1]["command"] == shlex.join(commands["parity"])
    lines = gc.table(rows).splitlines()
    assert len(lines) == 2 + len(commands) and lines[0].split(" | ")[0].strip() == "part"
    assert lines[4].startswith("losses ") and lines[4].endswith(" | failed (max |d| 3e-2)")
    # the whole check's time spent: the rest is skipped, not run
    rows = gc.run_parts({"parity": fake("import time; time.sleep(30)"),
                         "losses": fake("print(1)")}, gc.BUDGETS, total_s=1.5, env=None)
    assert [r["status"] for r in rows] == ["failed", "skipped"]
    assert re.fullmatch(r"failed \(timed out after [12] s\)", rows[0]["result"]), rows[0]
    assert rows[1]["result"] == "skipped (the check's 1.5 s were spent)"


def _throughput_like(first_s, tokens_per_s=None, sleep=0, timers=False):
    """A fake part that writes a throughput JSON to its --output (a row, or
    only its start where `tokens_per_s` is None), with the XLA_FLAGS and
    OTHER it ran with, (with `timers`) logs two of XLA's compile timers,
    then sleeps `sleep` seconds."""
    logged = ("print('I0 device_compiler.h:1] Compilation of XLA executable time: 9 s "
              "(9000000 us)'); print('I0 gpu_compiler.cc:1] GpuCompiler::RunHloPasses for m "
              "time: 3 s (3000000 us)'); ") if timers else ""
    row = {"variant": "f32+jit", "first_step_s": first_s, "tokens_per_s": tokens_per_s}
    data = ({"results": [row]} if tokens_per_s is not None else
            {"partial": True, "results": [], "started": [dict(row, tokens_per_s=None)]})
    return fake("import json, os, sys, time; out = [a.split('=', 1)[1] for a in sys.argv "
                "if a.startswith('--output=')][0]; "
                f"data = dict({data!r}, seen=[os.environ.get('XLA_FLAGS'), "
                "os.environ.get('OTHER')]); "
                f"json.dump(data, open(out, 'w')); print('wrote ' + out); {logged}"
                f"time.sleep({sleep})")


def test_a_part_with_settings_runs_once_per_setting_in_its_environment(tmp_path):
    """`SETTINGS`: the part's command once per setting, each run with the
    setting's variables added after the check's (XLA_FLAGS keeps
    run_check.sh's), its own file and an equal share of the part's time;
    the row's line and JSON hold each setting's first step and tok/s, what a
    stopped run showed too."""
    assert gc.with_settings({"XLA_FLAGS": "--a=1", "K": "v"}, {"XLA_FLAGS": "--b=2"}) == {
        "XLA_FLAGS": "--a=1 --b=2", "K": "v"}
    assert gc.with_settings({}, {"XLA_FLAGS": "--b=2"}) == {"XLA_FLAGS": "--b=2"}
    # any other variable is set (a log level, a module list: no list of flags)
    assert gc.with_settings({"TF_CPP_MIN_LOG_LEVEL": "2"}, gc.COMPILE_TIMERS) == gc.COMPILE_TIMERS
    assert gc.setting_output("/o/compile_flags.json", "level=0") == "/o/compile_flags.level_0.json"
    out = tmp_path / "compile_flags.json"
    settings = {"compile_flags": {"gemm_off": {"XLA_FLAGS": "--one"},
                                  "level_0": {"XLA_FLAGS": "--two", "OTHER": "x"}}}
    env = dict(os.environ, XLA_FLAGS="--data_dir=/c")
    env.pop("OTHER", None)
    commands = {"compile_flags": _throughput_like(20.5, 190401.2, timers=True)
                + [f"--output={out}"]}
    rows = gc.run_parts(commands, {"compile_flags": 60}, total_s=60, env=env, settings=settings)
    phase = " (costliest compile phase: GpuCompiler::RunHloPasses 3.0 s)"  # XLA's timers
    assert (rows[0]["status"], rows[0]["result"]) == (
        "ok", f"gemm_off 1st 20.5 s, 190,401 tok/s{phase}; level_0 1st 20.5 s, 190,401 tok/s"
        f"{phase}"), rows[0]
    runs = rows[0]["json"]["settings"]
    assert runs["gemm_off"]["compile_phases"] == {gc.WHOLE_COMPILE: 9.0,
                                                  "GpuCompiler::RunHloPasses": 3.0}
    assert runs["gemm_off"]["json"]["seen"] == ["--data_dir=/c --one", None]
    assert runs["level_0"]["json"]["seen"] == ["--data_dir=/c --two", "x"]
    assert runs["level_0"]["env"] == {"XLA_FLAGS": "--data_dir=/c --two", "OTHER": "x"}
    assert (runs["gemm_off"]["first_step_s"], runs["gemm_off"]["tokens_per_s"]) == (20.5, 190401.2)
    assert (tmp_path / "compile_flags.gemm_off.json").exists()
    assert "--- level_0" in rows[0]["output_tail"]
    # a run past its share: the next still gets its own; the part fails, showing both
    settings["compile_flags"]["gemm_off"]["SLEEP"] = "1"
    commands = {"compile_flags": fake(
        "import os, subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1] if "
        "os.environ.get('SLEEP') else sys.argv[2]] + sys.argv[3:], check=True)")
        + [_throughput_like(61.2, sleep=30)[2], _throughput_like(9.0, 150000.0)[2],
           f"--output={out}"]}
    rows = gc.run_parts(commands, {"compile_flags": 6}, total_s=60, env=env, settings=settings)
    assert rows[0]["status"] == "failed"
    assert rows[0]["result"] == (
        "failed (gemm_off: timed out after 3 s; so far: gemm_off not done (1st 61.2 s); "
        "level_0 1st 9.0 s, 150,000 tok/s)"), rows[0]
    assert rows[0]["json"]["settings"]["gemm_off"]["first_step_s"] == 61.2


def test_xlas_compile_timers_split_a_compile_into_its_phases():
    """compile_flags' runs log XLA's own timers (`COMPILE_TIMERS`):
    `compile_phases` sums them by label, a module's name left out. Here on
    the CPU, the lines this TensorFlow writes for a compiled function; on a
    GPU the same timer writes the GPU compiler's phases."""
    code = ("import tensorflow as tf\n"
            "f = tf.function(lambda x: tf.nn.softmax(tf.matmul(x, x)), jit_compile=True)\n"
            "f(tf.ones([32, 32])).numpy(); f(tf.ones([16, 16])).numpy()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=gc.with_settings(dict(os.environ), gc.COMPILE_TIMERS), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    phases = gc.compile_phases(done.stdout + done.stderr)
    whole = phases["Compilation of XLA executable"]  # TensorFlow's: both programs, summed
    assert 0 < phases["Compiling [...] for CPU using JIT"] <= whole < 300, phases
    assert list(phases.values()) == sorted(phases.values(), reverse=True)
    assert gc.compile_phases(
        "I0 gpu_compiler.cc:9] GpuCompiler::RunHloPasses for a_inference_1 time: 2.5 s "
        "(2500000 us) (cumulative: 1 s)\nI0 gpu_compiler.cc:9] GpuCompiler::RunHloPasses for "
        "a_inference_2 time: 500 ms (500000 us)\nI0 x.cc:1] other time: 1 s") == {
        "GpuCompiler::RunHloPasses": 3.0}
    assert gc.compile_phases("no timers") == {}


def test_a_line_with_time_but_no_timer_takes_no_timers_figure():
    """A log line with " time: " but no microseconds (not one of XLA's
    timers) is left out, and the timer on the next line keeps its own
    label (was: the pattern ran on across the line break, giving the other
    line's label the next timer's seconds and dropping the timer)."""
    log = ("I0 x.cc:1] step time: 1 s\n"
           "I0 gpu_compiler.cc:9] GpuCompiler::RunHloPasses for m time: 2.5 s (2500000 us) "
           "(cumulative: 2.5 s, max: 2.5 s, #called: 1)\n")
    assert gc.compile_phases(log) == {"GpuCompiler::RunHloPasses": 2.5}


def test_sigterm_during_a_setting_keeps_the_settings_before_it(tmp_path):
    out = tmp_path / "compile_flags.json"
    settings = {"compile_flags": {"a": {"STOP": ""}, "b": {"STOP": "1"}}}
    command = fake("import os, signal, subprocess, sys, time; "
                   "subprocess.run([sys.executable, '-c', sys.argv[1]] + sys.argv[2:]); "
                   "os.environ['STOP'] and (os.kill(os.getppid(), signal.SIGTERM), "
                   "time.sleep(30))") + [_throughput_like(12.0, 1000.0)[2], f"--output={out}"]
    previous = gc.stop_on_sigterm()
    try:
        rows = gc.run_parts({"compile_flags": command, "parity": fake("print(1)")},
                            {"compile_flags": 60, "parity": 5}, total_s=120, env=None,
                            settings=settings)
    finally:
        signal.signal(signal.SIGTERM, previous)
        gc._RUNNING["stopped"] = None
    assert re.fullmatch(r"failed \(stopped by SIGTERM after \d+ s; so far: a 1st 12.0 s, "
                        r"1,000 tok/s; b 1st 12.0 s, 1,000 tok/s\)", rows[0]["result"]), rows[0]
    assert rows[0]["json"]["settings"]["b"]["status"] == "started"
    assert [r["status"] for r in rows] == ["failed", "skipped"]


def test_a_part_gets_the_time_the_parts_before_it_left():
    """A part over its budget runs on in the time the parts before it did not
    use, never in what the parts after it are budgeted."""
    assert gc.part_limit(20, left=480, later=400) == 80  # 60 s left unused before it
    assert gc.part_limit(20, left=410, later=400) == 20  # none: its own budget
    assert gc.part_limit(20, left=10, later=400) == 10  # --total_s cut short: what is left
    rows = gc.run_parts({"parity": fake("print(1)"), "losses": fake("import time; time.sleep(2)"),
                         "mirrored": fake("print(3)")}, dict(parity=4, losses=1, mirrored=1),
                        total_s=6, env=None)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"], rows
    # a part rerun alone (--parts=X --budget_scale=2) keeps its own budget: the check's
    # other seconds were no earlier part's to leave (a hang there once took all of --total_s)
    assert gc.part_limit(50, left=480, later=0, budgeted=50) == 50
    assert gc.part_limit(50, left=480, later=0, budgeted=80) == 80  # 30 s left before it
    rows = gc.run_parts({"losses": fake("import time; time.sleep(30)")}, dict(losses=1),
                        total_s=60, env=None)
    assert rows[0]["result"] == "failed (timed out after 1 s)", rows


def _running(pid):
    """Whether process `pid` runs (a zombie no parent reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _ends(pid, within_s=30.0):
    """Whether process `pid` ends within `within_s` seconds: a SIGKILL takes
    effect when the process next runs, which on a busy machine is a moment
    after `killpg` returns."""
    import time
    deadline = time.monotonic() + within_s
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_sigterm_kills_the_part_and_its_children_and_the_table_is_still_written(tmp_path):
    """SIGTERM (a device call's time limit) while a part runs: its process
    group (the paper's worker too) is killed, the part fails saying so, the
    rest are skipped, and the JSON written after each part holds them all;
    the train part's runs too."""
    worker = tmp_path / "worker.pid"
    stops = fake("import os, signal, subprocess, sys, time; "
                 "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                 f"open({str(worker)!r}, 'w').write(str(w.pid)); "
                 "os.kill(os.getppid(), signal.SIGTERM); time.sleep(60)")
    commands = {"parity": fake("print('fine')"), "losses": stops, "mirrored": fake("print(1)")}
    saved, budgets = [], dict(gc.BUDGETS, losses=30, train=30)
    previous = gc.stop_on_sigterm()
    try:
        rows = gc.run_parts(commands, budgets, total_s=120, env=None, done=lambda rows: (
            saved.append(gc.write_result(str(tmp_path / "check.json"), rows, True))))
        assert [(r["part"], r["status"]) for r in rows] == [
            ("parity", "ok"), ("losses", "failed"), ("mirrored", "skipped")]
        assert re.fullmatch(r"failed \(stopped by SIGTERM after \d+ s\)", rows[1]["result"])
        assert rows[1]["seconds"] < 15, rows[1]  # at once, not at its budget's end
        assert rows[2]["result"] == "skipped (the check was stopped by SIGTERM)"
        assert _ends(int(worker.read_text()))  # the part's child went with it
        assert saved == [[], ["losses"], ["losses"]]  # after every part
        result = json.loads((tmp_path / "check.json").read_text())
        assert result["partial"] and [r["part"] for r in result["parts"]] == list(commands)
        assert result["table"] == gc.table(rows)
        gc.stop_on_sigterm()  # the train part: its first run stopped
        rows = gc.run_parts({"train": stops}, budgets, total_s=120, env=None,
                            train_work=str(tmp_path))
        assert re.fullmatch(r"failed \(stopped by SIGTERM after \d+ s\)", rows[0]["result"])
        assert rows[0]["seconds"] < 15, rows[0]
        assert _ends(int(worker.read_text()))
    finally:
        signal.signal(signal.SIGTERM, previous)
        gc._RUNNING["stopped"] = None


def test_a_check_killed_outright_takes_its_running_part_along(tmp_path):
    """SIGKILL (a time limit's second signal) reaches no handler: the part's
    process, in a session of its own, dies with the check all the same."""
    import time
    pid_file = tmp_path / "part.pid"
    sleeper = fake(f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                   "time.sleep(60)")
    check = os.fork()
    if check == 0:  # the check, running a part
        try:
            gc.run_group(sleeper, 60, None)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the part did not start"
        time.sleep(0.05)
    part = int(pid_file.read_text())
    assert _running(part)
    os.kill(check, signal.SIGKILL)
    os.waitpid(check, 0)
    assert _ends(part)


def test_a_stopped_pair_shows_the_rows_it_wrote(tmp_path):
    """A pair part killed at its budget: the table's line has the rows its
    JSON holds so far and the variant it was on; a file left by an earlier
    check is not read."""
    row = dict(tokens_per_s=38762.4, ratio=1.0, peak_gib=20.04, first_step_s=9.6)
    partial = {"partial": True, "results": [
        dict(row, variant="paper f32"), dict(row, variant="f32+jit", tokens_per_s=81000.0,
                                             ratio=2.0897, first_step_s=41.2),
        dict(row, variant="bf16+jit", ratio=None, peak_gib=None)],
        "started": [{"shape": "enwik8_base", "variant": "f16+jit", "first_step_s": None}]}
    out = tmp_path / "pair.json"
    writes = (f"import json, time; json.dump({partial!r}, open({str(out)!r}, 'w')); "
              "time.sleep(30)")
    out.write_text(json.dumps({"results": [dict(row, variant="stale")]}))
    commands = {"pair_enwik8_base": fake(writes) + [f"--output={out}"],
                "pair_wt103_base": fake("print('no row'); exit(3)") + [f"--output={out}"]}
    budgets = dict(gc.BUDGETS, pair_enwik8_base=1)  # and no time left over for it
    rows = gc.run_parts(commands, budgets, total_s=1 + budgets["pair_wt103_base"], env=None)
    assert rows[0]["result"] == (
        "failed (timed out after 1 s; so far: paper f32 38,762 tok/s (1.00x, 20.0 GiB, 1st 10 s)"
        "; f32+jit 81,000 tok/s (2.09x, 20.0 GiB, 1st 41 s); bf16+jit 38,762 tok/s (-, 1st 10 s)"
        "; f16+jit not done (no step))"), rows[0]
    assert rows[1]["result"] == "failed (no row)"  # the file it found was removed first
    # the part's own file is copied into its row: the check's one JSON brings it back
    assert rows[0]["json"] == json.loads(json.dumps(partial)) and "json" not in rows[1]
    commands = {"pair_wt103_base": fake(f"open({str(out)!r}, 'w').write('{{}}'); exit(3)")
                + [f"--output={out}"]}  # a JSON without its rows: the table still prints
    rows = gc.run_parts(commands, gc.BUDGETS, total_s=60, env=None)
    assert rows[0]["result"] == ("failed (exit 3; so far: its JSON unreadable: KeyError: "
                                 "'results')"), rows[0]
    out.write_text("{")
    assert gc._json_of(str(out))["not_copied"].startswith(f"{out}: JSONDecodeError")
    assert gc._json_of(str(out), most=0) == {"not_copied": f"{out} holds 1 bytes"}
    partial["results"], partial["started"][0]["first_step_s"] = [], 63.4
    out.write_text(json.dumps(partial))
    assert gc.pair_summary(str(out)) == "f16+jit not done (1st 63 s)"


def test_a_stopped_fused_step_shows_the_forms_it_measured(tmp_path):
    """fused_step writes its JSON after each form: killed at its budget, its
    line of the table has the summary of the forms it measured."""
    out = tmp_path / "fused.json"
    partial = {"partial": True, "rows": [], "summary": "fused step on cuda (...): float32 b1: "
               "fastest attention24_pad 0.500 ms"}
    writes = (f"import json, time; json.dump({partial!r}, open({str(out)!r}, 'w')); "
              "time.sleep(30)")
    rows = gc.run_parts({"fused_step": fake(writes) + [f"--output={out}"]},
                        dict(gc.BUDGETS, fused_step=1), total_s=2, env=None)
    assert rows[0]["result"] == ("failed (timed out after 1 s; so far: fused step on cuda "
                                 "(...): float32 b1: fastest attention24_pad 0.500 ms)"), rows[0]
    assert rows[0]["json"]["partial"] is True


def test_the_pairs_log_xlas_compile_by_phase_a_stopped_one_too(tmp_path):
    """The pair parts run with XLA's compile timers on (`COMPILE_TIMERS`,
    `TIMED_COMPILES`): the default flags' first step by phase, in the row's
    `compile_phases` and its line, also where the run was stopped at its
    budget in the middle of its compile; other parts run without them."""
    timers = ("print('I0 device_compiler.h:1] Compilation of XLA executable time: 9 s "
              "(9000000 us)'); print('I0 gpu_compiler.cc:1] GpuCompiler::RunHloPasses for m "
              "time: 3 s (3000000 us)', flush=True); ")
    out = tmp_path / "pair.json"
    row = dict(variant="bf16+jit", tokens_per_s=95000.0, ratio=2.29, first_step_s=40.0)
    pair = (f"import json, os, time; json.dump({{'results': [{row!r}]}}, open({str(out)!r}, "
            "'w')); print(os.environ.get('TF_CPP_VMODULE')); " + timers)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CPP_VMODULE", None)
    commands = {"pair_enwik8_base": fake(pair) + [f"--output={out}"],
                "parity": fake("import os; print(os.environ.get('TF_CPP_VMODULE'))")}
    rows = gc.run_parts(commands, gc.BUDGETS, total_s=60, env=env)
    assert rows[0]["result"] == ("bf16+jit 95,000 tok/s (2.29x bf16+jit, 1st 40 s) (costliest "
                                 "compile phase: GpuCompiler::RunHloPasses 3.0 s)"), rows[0]
    assert rows[0]["compile_phases"] == {gc.WHOLE_COMPILE: 9.0, "GpuCompiler::RunHloPasses": 3.0}
    assert gc.COMPILE_TIMERS["TF_CPP_VMODULE"] in rows[0]["output_tail"]
    assert rows[1]["result"] == "None" and "compile_phases" not in rows[1]
    commands = {"pair_enwik8_base": fake(pair + "time.sleep(30)") + [f"--output={out}"]}
    rows = gc.run_parts(commands, dict(gc.BUDGETS, pair_enwik8_base=2), total_s=2, env=env)
    assert rows[0]["result"] == (
        "failed (timed out after 2 s; so far: bf16+jit 95,000 tok/s (2.29x bf16+jit, 1st 40 s) "
        "(costliest compile phase: GpuCompiler::RunHloPasses 3.0 s))"), rows[0]
    assert rows[0]["compile_phases"]["GpuCompiler::RunHloPasses"] == 3.0


def test_a_run_whose_result_line_is_not_json_keeps_its_compile_phases():
    """Its row said what failed but dropped the compile timers it logged, as
    a stopped or failed run keeps them."""
    code = ("print('I0 gpu_compiler.cc:1] GpuCompiler::RunHloPasses for m time: 3 s "
            "(3000000 us)'); print(%r + '{not json')" % gc.RESULT_PREFIX)
    result = gc.run_command(fake(code), 60, None)
    assert result["status"] == "failed" and "its result line is not JSON" in result["result"]
    assert result["compile_phases"] == {"GpuCompiler::RunHloPasses": 3.0}, result


def test_a_training_runs_progress(tmp_path):
    """How far a training run got, and the train part's XLA cache: its
    folder added to TF_XLA_FLAGS (`--noxla_cache`: not)."""
    shows = fake("import os; print('step 3/40 loss 5.1'); print(os.environ['TF_XLA_FLAGS'])")
    for cache in (True, False):
        result = gc.run_train(shows, str(tmp_path), 10, dict(os.environ, TF_XLA_FLAGS="--x=1"),
                              xla_cache=cache)
        assert result["result"] == ("failed (the first run was not killed mid-run (exit 0; the "
                                    "first run at step 3))"), result
        assert result["output_tail"].splitlines()[-1] == "--x=1" + (
            f" --tf_xla_persistent_cache_directory={tmp_path}/xla_cache" if cache else "")
    output = ("starting at step 0\nstep 1/40 loss 5.6 bpc 8.1\n"
              "step 2/40 loss 5.5 bpc 7.9 ppl 241.95 lr 0.00025 3,126 tok/s compile 10.9s (XLA)\n"
              "step 23/40 loss 5.1 bpc 7.4\n")
    assert gc.run_progress(output) == "at step 23, compile 10.9 s"
    assert gc.run_progress(output.split("step 2/")[0]) == "at step 1"
    assert gc.run_progress("loading\n") == "no step shown"
    # Still in its first call (XLA compiling): how long, from the job's own lines.
    from training.callbacks import ProgressLine
    lines = ["starting at step 0"]
    job_line = ProgressLine(40, 10, 1, log=lines.append)
    for seconds in (30.2, 60.4):
        job_line.waiting(seconds)
    assert gc.run_progress("\n".join(lines)) == "no step shown, the first call running at 60 s"


def _batches(killed_steps, resumed_steps, changed=()):
    ids = {s: [s, s + 1] for s in range(40)}
    return ([{"step": s, "first_ids": ids[s], "pid": 1} for s in killed_steps]
            + [{"step": s, "first_ids": [0, 0] if s in changed else ids[s], "pid": 2}
               for s in resumed_steps])


def test_the_resume_verdict():
    killed, resumed = range(0, 24), range(20, 40)
    first = "step 1/40 loss 5.4 12 tok/s compile 12.5s\n"
    second = "resumed from /m/checkpoints/ckpt-20 at step 20"
    log = [{"step": s} for s in range(1, 41)]
    ok, line = gc.resume_verdict(first, second, _batches(killed, resumed), log)
    assert ok and "resumed at step 20" in line and "4 steps compared" in line, line
    assert "batch log at step 23" in line
    assert line.endswith("compile 12.5 s"), line
    again = second + "\ntrain step: 1 step(s) per call, no XLA\nstep 22/40 loss 5.1 compile 1.5s"
    ok, line = gc.resume_verdict(first, again, _batches(killed, resumed), log)
    assert ok and line.endswith("compile 12.5 s (the resume's 1.5 s)"), line
    cached = again.replace("no XLA", "XLA, XLA cache /w/xla_cache")
    ok, line = gc.resume_verdict(first, cached, _batches(killed, resumed), log)
    assert ok and line.endswith("compile 12.5 s (the resume's 1.5 s, XLA cache)"), line
    assert gc.resume_verdict("", second, _batches(killed, resumed), log)[1].endswith(
        "compile not on the progress line")
    logged = [{"step": 1, "compile_s": 7.25}] + log[1:]
    assert gc.resume_verdict("", second, _batches(killed, resumed), logged)[1].endswith(
        "compile 7.2 s")
    for batches, log_, second_, why in [
            (_batches(killed, resumed, changed={22}), log, second, "steps [22] got other"),
            (_batches(killed, range(21, 40)), log, second, "first batch is not step 20"),
            (_batches(range(0, 20), resumed), log, second, "no step was fed by both"),
            (_batches(killed, resumed), log[:-1], second, "ends at step 39"),
            (_batches(killed, resumed), log, "starting at step 0", "no 'resumed from"),
            (_batches(killed, []), log, second, "holds 1 runs"),
    ]:
        ok, line = gc.resume_verdict(first, second_, batches, log_)
        assert not ok and why in line, (why, line)


def _skeleton(path, marked=True, name=None):
    """A one-node ONNX graph with one weight of `MIN_ELEMENTS` (named `name`,
    default a model weight's), stripped as `long_memory.strip` strips
    (`marked`), at `path`/model.onnx."""
    import onnx
    from onnx import TensorProto, helper

    from benchmarks.long_memory import MARK, MIN_ELEMENTS
    from export.metadata import WEIGHT_PREFIX
    weight = helper.make_tensor(name or f"{WEIGHT_PREFIX}0000", TensorProto.FLOAT,
                                [MIN_ELEMENTS], np.zeros(MIN_ELEMENTS, np.float32))
    if marked:
        weight.ClearField("float_data")
        weight.ClearField("raw_data")
        weight.doc_string = MARK
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", weight.name], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [MIN_ELEMENTS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [MIN_ELEMENTS])], [weight])
    path.mkdir(parents=True)
    onnx.save(helper.make_model(graph), str(path / "model.onnx"))


def test_the_serving_exports_are_made_here_and_filled_there(monkeypatch, tmp_path):
    """--make_serving_exports strips one export per decode dtype into
    <dtype>/<preset>/out; --serving_exports checks they are all there, and
    the check copies them into the serving parts' work folders and fills
    their weights (the skeletons stay as they were); the float16 parts are
    skipped without them, and their parity on the CPU."""
    import onnx

    from benchmarks import long_memory
    made = []

    def export_random(core, folder, **options):  # a real export is test_onnx_weights's
        made.append((core.config.n_layer, options))
        _skeleton(Path(folder) / "out", marked=False)

    def export_precisions(model_dir, work_dir, mem_len):  # test_cache_precision's
        made.append((model_dir, mem_len))
        folders = [os.path.join(work_dir, name, "out") for name in ("a", "float16_decode")]
        for folder in folders:
            _skeleton(Path(folder), marked=False)
        return folders

    monkeypatch.setattr(long_memory, "export_random", export_random)
    monkeypatch.setattr(long_memory, "export_precisions", export_precisions)
    gx = tmp_path / "gx"
    (gx / "precision" / "stale").mkdir(parents=True)  # an earlier make's: replaced whole
    written = gc.make_serving_exports(str(gx), "tiny")
    assert written == [str(gx / dtype / "tiny" / "out") for dtype in ("float32", "float16")] + [
        str(gx / "precision" / name / "out") for name in ("a", "float16_decode")]
    assert made.pop() == ("pystdlib_small", 128) and not (gx / "precision" / "stale").exists()
    # the trained model's exports: checked for, each folder of long_memory's EXPORT_PRECISIONS
    with pytest.raises(gc.GpuCheckError, match=re.escape(
            f"{gx} has no float32 or float16_cache export of pystdlib_small "
            f"(precision/<precision>/out); made by --make_serving_exports={gx} --tiny")):
        gc.check_serving_exports(str(gx), "tiny")
    for name in ("float32", "float16_cache"):
        _skeleton(gx / "precision" / name / "out", marked=False)
    assert [options["decode_dtype"] for _, options in made] == ["float32", "float16"]
    assert all(options["log_probs"] == "all" and options["formats"] == ("onnx",)
               for _, options in made)
    for folder in written[:2]:  # stripped (the trained model's exports are whole)
        [weight] = onnx.load(os.path.join(folder, "model.onnx")).graph.initializer
        assert weight.doc_string == long_memory.MARK and not weight.raw_data
    gc.check_serving_exports(str(gx), "tiny")
    with pytest.raises(gc.GpuCheckError, match="no float32 or float16 export of enwik8_base"):
        gc.check_serving_exports(str(gx), "enwik8_base")
    row = gc.fill_serving_exports(str(gx), str(tmp_path / "w"))
    assert row["status"] == "ok" and row["result"].startswith("2 weights of the float32 and "
                                                              "float16 exports filled"), row
    for name in ("serving", "serving_float16"):
        [weight] = onnx.load(str(tmp_path / "w" / name / "tiny" / "out" / "model.onnx")
                             ).graph.initializer
        values = np.frombuffer(weight.raw_data, np.float32)
        assert weight.doc_string == "" and values.size == long_memory.MIN_ELEMENTS
        assert 0.01 < values.std() < 0.03  # random, not the skeleton's zeros
    [weight] = onnx.load(str(gx / "float16" / "tiny" / "out" / "model.onnx")).graph.initializer
    assert weight.doc_string == long_memory.MARK  # the skeleton itself is kept
    row = gc.fill_serving_exports(str(tmp_path / "none"), str(tmp_path / "w"))
    assert row["status"] == "failed" and "none/float32" in row["result"], row
    o = {"serving_exports": None, "device": "gpu"}
    assert all("needs --serving_exports" in gc.skip_reason(p, o)
               for p in (*gc.FLOAT16_PARTS, "fused_step", "serving_precision"))
    assert gc.reads_exports("fused_step") and not gc.reads_exports("attention_forms")
    o = {"serving_exports": str(gx), "device": "cpu"}
    assert [gc.skip_reason(p, o) for p in gc.FLOAT16_PARTS] == [None, None]  # parity: on the CPU


def test_a_skeleton_stripped_before_the_weights_had_their_names_is_refused(tmp_path):
    """A skeleton from before c940911 also emptied constants that are not
    weights (`decode_init`'s relative encodings): refilled at random, its
    graphs would not be one model. `fill` names the tensor and changes no
    file; the check's row fails saying so (the serving parts fail alone)."""
    import onnx

    from benchmarks import long_memory
    from txl_tf.errors import TxlError
    gx = tmp_path / "gx"
    _skeleton(gx / "float32" / "tiny" / "out")
    old = gx / "float16" / "tiny" / "out"
    _skeleton(old, name="positions")  # in model.onnx, after a weight in decode_init.onnx
    _skeleton(tmp_path / "new")
    (old / "decode_init.onnx").write_bytes((tmp_path / "new" / "model.onnx").read_bytes())
    with pytest.raises(TxlError, match=r"model\.onnx.*'positions'.*strip the export again"):
        long_memory.fill(str(old))
    for name in ("decode_init.onnx", "model.onnx"):  # neither filled
        [weight] = onnx.load(str(old / name)).graph.initializer
        assert weight.doc_string == long_memory.MARK and not weight.raw_data, name
    row = gc.fill_serving_exports(str(gx), str(tmp_path / "w"))
    assert row["status"] == "failed" and "'positions'" in row["result"], row


def test_ptxas_version_and_its_floor():
    text = ("ptxas: NVIDIA (R) Ptx optimizing assembler\n"
            "Cuda compilation tools, release 12.5, V12.5.82")
    assert gc.ptxas_version(text) == (12, 5, 82) < gc.PTXAS_FLOOR
    assert gc.ptxas_version("release 12.6, V12.6.85") == gc.PTXAS_FLOOR
    assert gc.ptxas_version("no version") is None
    facts = {"ptxas": None, "tensorflow_gpus": ["NVIDIA H100"],
             "onnxruntime_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}
    row = gc.gpu_row(dict(facts), "gpu")
    assert row["status"] == "failed" and "ptxas not found" in row["result"], row
    assert gc.gpu_row(dict(facts), "cpu")["status"] == "skipped"


def test_a_ptxas_that_does_not_run_is_the_gpu_rows_failure(tmp_path):
    """A ptxas unzipped without its exec bits is a failed row, not a
    traceback before any part ran."""
    ptxas = tmp_path / "ptxas"
    ptxas.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    facts = {"ptxas": str(ptxas), "tensorflow_gpus": ["NVIDIA H200"],
             "onnxruntime_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}
    row = gc.gpu_row(dict(facts), "gpu")
    assert row["status"] == "failed" and f"ptxas {ptxas} does not run (PermissionError" in \
        row["result"], row
    ptxas.chmod(0o755)
    row = gc.gpu_row(dict(facts), "gpu")
    assert row["status"] == "ok" and row["result"].endswith("ptxas 12.8.93"), row


def test_logprob_parity_compares_the_two_devices_outputs():
    result = gc.logprob_parity("tiny", "cpu")
    assert result["max_abs_diff"] == 0.0 and result["ok"], result  # the same device twice
    assert "tiny" in result["summary"] and "TF32 off" in result["summary"]


def test_without_a_gpu_the_check_is_one_error_line(jobs):
    done = jobs.run("benchmarks.gpu_check", [])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and errors == [done.stderr.strip().splitlines()[-1]], done.stderr
    # why TensorFlow sees none, in its own words (its warnings are hidden in the check)
    # and onnxruntime, in its own: no CUDA provider (onnxruntime), or one whose libraries did
    # not load (onnxruntime-gpu without a GPU: never TensorFlow's lines)
    assert re.match(r"error: no GPU for the check: TensorFlow sees no GPU \(.*(cuInit|cuda "
                    r"drivers).*\); onnxruntime( has no CUDA provider \([^)]*CPUExecutionProvider"
                    r"\)|'s CUDA provider does not load \((?!.*(cuInit|cuda drivers)).*\)) "
                    r"\(install the \[gpu\] extra", errors[0]), errors[0]


def test_the_probe_says_why_a_side_has_no_gpu_and_the_other_sides_parts_run():
    """TensorFlow's and onnxruntime's own lines on a library that did not
    load; where only one side works, its parts run and the other's are
    skipped with the reason (the gpu row fails saying it)."""
    tf_log = ("I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on.\n"
              "W0000 00:00:1.1 1 dso_loader.cc:78] Could not load dynamic library 'libcudnn.so.9';"
              " dlerror: libcudnn.so.9: cannot open shared object file: No such file\n"
              "W0000 00:00:1.2 1 gpu_device.cc:2344] Cannot dlopen some GPU libraries. Skipping "
              "registering GPU devices...\n")
    assert gc.probe_reasons(tf_log) == (
        "Could not load dynamic library 'libcudnn.so.9'; dlerror: libcudnn.so.9: cannot open "
        "shared object file: No such file / Cannot dlopen some GPU libraries. Skipping "
        "registering GPU devices...")
    ort_log = ("2026-11-29 10:00:00.0 [E:onnxruntime:Default, provider_bridge_ort.cc:2195 "
               "TryGetProviderInfo_CUDA] " + "/onnxruntime_src/x.cc:1778 " * 8
               + "[ONNXRuntimeError] : 1 : FAIL : Failed to load library "
               "libonnxruntime_providers_cuda.so with error: libcublasLt.so.12: cannot open "
               "shared object file\n")
    assert gc.probe_reasons(ort_log) == (  # without onnxruntime's status words
        "Failed to load library libonnxruntime_providers_cuda.so with error: libcublasLt.so.12: "
        "cannot open shared object file")
    assert gc.probe_reasons("I0000 all is well\n") == ""
    # a line without a log prefix, whole (its first character was once cut)
    assert gc.probe_reasons("Failed to load library libcublasLt.so.13\n") == (
        "Failed to load library libcublasLt.so.13")
    # each side's problem in its own library's words, from the probe's one log
    assert gc.probe_reasons_by_side(tf_log + gc.PROBE_SPLIT + "\n" + ort_log) == (
        gc.probe_reasons(tf_log), gc.probe_reasons(ort_log))
    facts = {"ptxas": None, "tensorflow_gpus": ["NVIDIA H200"],
             "onnxruntime_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
             "tensorflow_problem": None,
             "onnxruntime_problem": "onnxruntime's CUDA provider does not load (libcublasLt)"}
    o = {"device": "gpu", "serving_exports": "/x"}
    skipped = {part: gc.skip_reason(part, o, facts) for part in gc.CHECKS}
    assert [p for p, why in skipped.items() if why is None] == [
        "compile_flags", "parity", "losses", "mirrored", "pair_enwik8_base", "pair_wt103_base",
        "train", "decode_xla"]
    assert skipped["serving_soak"] == facts["onnxruntime_problem"]
    row = gc.gpu_row(dict(facts), "gpu")
    assert row["status"] == "failed" and row["result"].endswith(
        "ptxas not found: onnxruntime's CUDA provider does not load (libcublasLt))"), row
    facts.update(tensorflow_problem="TensorFlow sees no GPU (libcudnn)", onnxruntime_problem=None)
    skipped = {part: gc.skip_reason(part, o, facts) for part in gc.CHECKS}
    assert [p for p, why in skipped.items() if why is None] == [
        p for p in gc.CHECKS if gc.needs_onnxruntime(p)]
    assert gc.skip_reason("train", dict(o, device="cpu"), facts) is None  # the logic run


def test_the_probes_graph_runs_on_this_onnxruntime():
    """The probe's one-node graph, run on the CPU provider in its place: a
    graph this onnxruntime cannot read would stand as "the CUDA provider
    does not load" on a GPU (onnx's default IR version once did)."""
    probe = gc.PROBE.replace('if "CUDAExecutionProvider" in', 'if "CPUExecutionProvider" in')
    probe = probe.replace('providers=["CUDAExecutionProvider", ', 'providers=[')
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    found = [line for line in done.stdout.splitlines() if line.startswith("probe: ")]
    assert found and json.loads(found[-1][len("probe: "):])["onnxruntime"] == \
        "CPUExecutionProvider", done.stdout + done.stderr[-2000:]
    assert gc.PROBE_SPLIT in done.stderr
    # onnxruntime's side alone (the other library order's probe): no TensorFlow imported
    done = subprocess.run([sys.executable, "-c", probe + "print('tf', 'tensorflow' in "
                           "sys.modules)", "onnxruntime"], capture_output=True, text=True,
                          timeout=300)
    found = [line for line in done.stdout.splitlines() if line.startswith("probe: ")]
    assert found and json.loads(found[-1][len("probe: "):]) == {
        "tensorflow_gpus": None, "onnxruntime": "CPUExecutionProvider"}, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "tf False"


PACKED, MACHINE, REST = "/site/nvidia/cudnn/lib:/site/nvidia/cublas/lib:", "/own/cudnn/lib:", \
    "/usr/local/lib"


def test_both_library_orders_from_run_check_shs_lists():
    """The order the check runs with (LD_LIBRARY_PATH starts with the lists
    in it), then the other, each with what followed them; none where there
    is no choice."""
    lists = {"TXL_PACKED_LIBS": PACKED, "TXL_MACHINE_LIBS": MACHINE}
    assert gc.library_orders(dict(lists, LD_LIBRARY_PATH=PACKED + MACHINE + REST)) == [
        ("packed", PACKED + MACHINE + REST), ("machine", MACHINE + PACKED + REST)]
    assert gc.library_orders(dict(lists, LD_LIBRARY_PATH=MACHINE + PACKED)) == [
        ("machine", MACHINE + PACKED), ("packed", PACKED + MACHINE)]
    for environ in ({"LD_LIBRARY_PATH": PACKED + MACHINE},  # a user's machine: no lists
                    dict(lists, TXL_MACHINE_LIBS="", LD_LIBRARY_PATH=PACKED),  # one order only
                    dict(lists, LD_LIBRARY_PATH=REST + ":" + PACKED + MACHINE)):  # not theirs
        assert gc.library_orders(environ) == [], environ


def test_onnxruntime_gets_the_order_its_cuda_provider_works_in(monkeypatch):
    """The current order where onnxruntime works there (no second probe),
    else the other where the onnxruntime-only probe says it works there,
    else the current one with both reasons (its parts skipped, as before)."""
    orders = [("packed", PACKED + MACHINE), ("machine", MACHINE + PACKED)]
    assert gc.onnxruntime_order(orders, None, lambda path: pytest.fail("probed")) == (
        "packed", {"packed": None})
    probed = []
    assert gc.onnxruntime_order(orders, "no cuDNN", lambda path: probed.append(path)) == (
        "machine", {"packed": "no cuDNN", "machine": None})
    assert probed == [MACHINE + PACKED]
    assert gc.onnxruntime_order(orders, "no cuDNN", lambda path: "no cuBLAS") == (
        "packed", {"packed": "no cuDNN", "machine": "no cuBLAS"})
    # gpu_problems with the probes faked: the facts, the gpu row, the skipped parts, the envs
    import onnxruntime
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setenv("TXL_PACKED_LIBS", PACKED)
    monkeypatch.setenv("TXL_MACHINE_LIBS", MACHINE)
    monkeypatch.setenv("LD_LIBRARY_PATH", PACKED + MACHINE + REST)
    packed = "onnxruntime's CUDA provider does not load (libcudnn_graph.so.9)"
    o = {"device": "gpu", "serving_exports": "/x"}

    def check(first, second):
        monkeypatch.setattr(gc, "probe_gpu", lambda: first)
        monkeypatch.setattr(gc, "probe_onnxruntime", lambda path: (
            pytest.fail("no second probe") if second == "never" else second[path]))
        problems, facts = gc.gpu_problems("gpu")
        facts.update(tensorflow_gpus=["NVIDIA H200"], tensorflow_problem=None)  # this CPU's none
        return (facts, gc.gpu_row(dict(facts), "gpu")["result"],
                [p for p in gc.CHECKS if gc.skip_reason(p, o, facts)],
                gc.part_envs(gc.CHECKS, dict(os.environ), facts))

    works = {"tensorflow": None, "onnxruntime": None}
    facts, row, skipped, envs = check((works, {}), "never")  # both work in the packed order
    assert facts["library_order"] == {"tensorflow": "packed", "onnxruntime": "packed"}
    assert facts["onnxruntime_problem"] is None and envs == {} and skipped == []
    assert row.endswith("; every part with the packed libraries first"), row
    # onnxruntime's provider works only with the machine's libraries first: its parts get them
    machine = {MACHINE + PACKED + REST: None}
    facts, row, skipped, envs = check((dict(works, onnxruntime=packed), {}), machine)
    assert facts["library_order"] == {"tensorflow": "packed", "onnxruntime": "machine"}
    assert facts["onnxruntime_by_order"] == {"packed": packed, "machine": None}
    assert facts["onnxruntime_problem"] is None and skipped == []
    assert row.endswith("; TensorFlow's parts with the packed libraries first, onnxruntime's "
                        f"with the machine's libraries first (with the packed libraries first: "
                        f"{packed})"), row
    serving = [p for p in gc.CHECKS if gc.needs_onnxruntime(p)]
    assert list(envs) == serving and {
        e["LD_LIBRARY_PATH"] for e in envs.values()} == {MACHINE + PACKED + REST}
    # the probe itself failed (the list is trusted, as before): an order shown to work wins
    facts, row, skipped, envs = check((None, "the probe failed: exit -11"), machine)
    assert facts["library_order"]["onnxruntime"] == "machine" and list(envs) == serving
    # neither order: as before, its parts skipped, with both orders' reasons
    other = "onnxruntime's CUDA provider does not load (libcublasLt.so.13)"
    facts, row, skipped, envs = check((dict(works, onnxruntime=packed), {}),
                                      {MACHINE + PACKED + REST: other})
    assert facts["library_order"] == {"tensorflow": "packed", "onnxruntime": "packed"}
    assert facts["onnxruntime_problem"] == (
        f"{packed}; with the machine's libraries first: {other}")
    assert skipped == serving and envs == {}
    assert gc.skip_reason("serving_soak", o, facts) == facts["onnxruntime_problem"]
    # without run_check.sh's lists (a user's machine): one probe, one order, as before
    monkeypatch.delenv("TXL_MACHINE_LIBS")
    facts, row, skipped, envs = check((dict(works, onnxruntime=packed), {}), "never")
    assert "library_order" not in facts and facts["onnxruntime_problem"] == packed
    assert skipped == serving and envs == {} and row.endswith(f": {packed})"), row


def test_the_second_probe_runs_with_the_other_order_and_no_tensorflow(monkeypatch):
    """probe_onnxruntime's child: the LD_LIBRARY_PATH given (the loader
    reads it as the process starts) and the probe's onnxruntime-only
    argument; its reasons are onnxruntime's."""
    monkeypatch.setattr(gc, "PROBE", "import json, os, sys\n"
                        "sys.stderr.write('Failed to load library libcublasLt.so.13\\n')\n"
                        "print('probe: ' + json.dumps({'tensorflow_gpus': None, 'onnxruntime': "
                        "os.environ['LD_LIBRARY_PATH'] + ' ' + ' '.join(sys.argv[1:])}))")
    assert gc.probe_onnxruntime(MACHINE + PACKED) == (
        "onnxruntime's CUDA provider does not load (Failed to load library libcublasLt.so.13)")
    monkeypatch.setattr(gc, "PROBE", gc.PROBE.replace("Failed to load library libcublasLt.so.13",
                                                      "all is well"))
    assert gc.probe_onnxruntime(MACHINE + PACKED) == (
        f"onnxruntime's CUDA provider does not load ({MACHINE + PACKED} onnxruntime)")
    monkeypatch.setattr(gc, "PROBE", "import sys; sys.exit('error: no onnx')")
    assert gc.probe_onnxruntime(MACHINE) == "the probe failed: error: no onnx"


def test_the_parts_that_need_onnxruntime_run_with_its_order(tmp_path):
    """Each part a process of its own: the serving parts with the order
    onnxruntime works in, the others with the check's; each such row says
    its LD_LIBRARY_PATH."""
    env = dict(os.environ, TXL_PACKED_LIBS=PACKED, TXL_MACHINE_LIBS=MACHINE,
               LD_LIBRARY_PATH=PACKED + MACHINE + REST)
    shows = fake("import os; print(os.environ['LD_LIBRARY_PATH'])")
    commands = {"parity": shows, "train": shows, "serving_soak": shows, "serving_parity": shows}
    facts = {"library_order": {"tensorflow": "packed", "onnxruntime": "machine"}}
    envs = gc.part_envs(commands, env, facts)
    rows = gc.run_parts(commands, gc.BUDGETS, total_s=60, env=env, envs=envs)
    assert {r["part"]: r["result"] for r in rows} == {
        "parity": PACKED + MACHINE + REST, "train": PACKED + MACHINE + REST,
        "serving_soak": MACHINE + PACKED + REST, "serving_parity": MACHINE + PACKED + REST}
    assert [r["part"] for r in rows if "env" in r] == ["serving_soak", "serving_parity"]
    assert rows[2]["env"] == {"LD_LIBRARY_PATH": MACHINE + PACKED + REST}
    # the same order for both sides, or no lists: every part with the check's env
    assert gc.part_envs(commands, env, {"library_order": {"tensorflow": "packed",
                                                          "onnxruntime": "packed"}}) == {}
    assert gc.part_envs(commands, dict(os.environ), facts) == {}


def test_each_sides_problem_is_the_probes_where_it_ran(monkeypatch):
    """onnxruntime listing CUDA is trusted only where the probe could not
    run; TensorFlow's missing GPU gets the probe's reason (this CPU has none)."""
    import onnxruntime
    monkeypatch.delenv("TXL_MACHINE_LIBS", raising=False)  # one order (run_check.sh's: below)
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(gc, "probe_gpu", lambda: (
        {"tensorflow": "TensorFlow sees no GPU (libcudnn)",
         "onnxruntime": "onnxruntime's CUDA provider does not load (libcublasLt)"}, {}))
    problems, facts = gc.gpu_problems("gpu")
    assert problems == ["TensorFlow sees no GPU (libcudnn)",
                        "onnxruntime's CUDA provider does not load (libcublasLt)"]
    monkeypatch.setattr(gc, "probe_gpu", lambda: (None, "the probe failed: no onnx"))
    problems, facts = gc.gpu_problems("gpu")
    assert problems == ["TensorFlow sees no GPU"] and facts["probe"] == "the probe failed: no onnx"
    monkeypatch.setattr(gc, "probe_gpu", lambda: pytest.fail("no probe for the logic run"))
    assert gc.gpu_problems("cpu")[0] == ["TensorFlow sees no GPU"]


def test_the_serving_parts_need_onnxruntimes_gpu_alone(monkeypatch):
    """A machine with the base set only (pack_wheels.sh: TensorFlow without
    its CUDA libraries) or no TensorFlow at all: the serving parts need
    onnxruntime's GPU alone, so TensorFlow's missing GPU, and ptxas, do not
    fail the gpu row of a serving run; without TensorFlow installed the parts
    that import it are skipped, saying so."""
    serving = list(gc.GROUPS["serving"])
    assert gc.sides_needed(serving) == ("onnxruntime",)
    assert gc.sides_needed(["parity", "train"]) == ("tensorflow",)
    assert gc.sides_needed(["parity", "serving_soak"]) == gc.SIDES
    facts = {"ptxas": None, "tensorflow_gpus": [], "tensorflow_problem": "TensorFlow sees no GPU",
             "onnxruntime_problem": None,
             "onnxruntime_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}
    row = gc.gpu_row(dict(facts, needed=("onnxruntime",)), "gpu")
    assert row["status"] == "ok" and row["result"].startswith(
        "GPU not needed (TensorFlow sees no GPU); onnxruntime CUDA; ptxas not found"), row
    row = gc.gpu_row(dict(facts), "gpu")  # every side needed (the facts of an older caller)
    assert row["status"] == "failed" and "TensorFlow sees no GPU" in row["result"], row
    assert gc.needed_problems(dict(facts, needed=("onnxruntime",))) == []
    # TensorFlow not installed: its parts, the device tests, and any serving part that would
    # export, skipped with the reason; the serving parts over brought exports run
    import onnxruntime
    monkeypatch.setattr(gc, "tensorflow_installed", lambda: False)
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.delenv("TXL_MACHINE_LIBS", raising=False)
    probed = []
    monkeypatch.setattr(gc, "probe_gpu", lambda onnxruntime_only=False: (
        probed.append(onnxruntime_only) or ({"tensorflow": None, "onnxruntime": None}, {})))
    problems, facts = gc.gpu_problems("gpu", serving + ["parity"])
    assert probed == [True]  # the probe imports no TensorFlow
    assert problems == [gc.NO_TENSORFLOW] and facts["tensorflow_installed"] is False
    assert gc.gpu_problems("gpu", serving)[0] == []
    o = {"device": "gpu", "serving_exports": "/x"}
    skipped = {p: gc.skip_reason(p, o, facts) for p in serving + ["parity"]}
    assert {p: r for p, r in skipped.items() if r} == {
        "parity": gc.NO_TENSORFLOW,
        "serving_device_tests": f"{gc.NO_TENSORFLOW} (the tests export their models)"}
    assert gc.skip_reason("serving_soak", dict(o, serving_exports=None), facts) == (
        f"{gc.NO_TENSORFLOW} (without --serving_exports the serving parts export)")


def test_the_cpu_run_writes_the_table_and_exits_1_on_a_failed_part(jobs, tmp_path):
    args = ["--device=cpu", "--tiny", f"--work_dir={tmp_path / 'w'}",
            f"--output={tmp_path / 'check.json'}"]
    done = jobs.run("benchmarks.gpu_check", args + ["--parts=serving_device_tests"])
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "check.json").read_text())
    assert [(r["part"], r["status"]) for r in result["parts"]] == [
        ("gpu", "skipped"), ("serving_device_tests", "skipped")]
    assert result["table"] in done.stdout and result["failed"] == []
    assert result["partial"] is False  # true in the copies written after each part
    # the XLA flags the caller ran the check under (the pairs' figures depend on them)
    assert result["flags"] == {name: os.environ.get(name, "") for name in gc.FLAG_LISTS}
    # the gpu row's seconds (TensorFlow's and onnxruntime's imports, the probes on a GPU) are
    # the check's, taken from --total_s
    assert 0 < result["parts"][0]["seconds"] <= result["seconds"]
    # the issues' targets after the table, none judged from a CPU run (tests/test_issue_targets.py)
    assert result["targets"]["table"] in done.stdout.split(result["table"])[1]
    assert {(r["verdict"], r["why"].split(" (and: ")[0]) for r in result["targets"]["rows"]} \
        == {("not judged", "CPU run")}
    # a group and a part: the group's parts in its order (no time left: each skipped, cheaply)
    done = jobs.run("benchmarks.gpu_check", args + ["--parts=training,serving_parity",
                                                    "--total_s=0"])
    result = json.loads((tmp_path / "check.json").read_text())
    assert done.returncode == 0, done.stderr[-2000:]
    assert [(r["part"], r["result"]) for r in result["parts"][1:]] == [
        *((part, "skipped (the check's 0 s were spent)") for part in gc.GROUPS["training"]),
        ("serving_parity", "skipped (the check's 0 s were spent)")]
    done = jobs.run("benchmarks.gpu_check", args + ["--parts=training,servings"])
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(
        "training, serving; unknown: servings"), done.stderr[-2000:]
    done = jobs.run("benchmarks.gpu_check", args + [f"--serving_exports={tmp_path}"])
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        f"error: --serving_exports: {tmp_path} has no float32 or float16 export of tiny "
        f"(<dtype>/tiny/out) and no float32 or float16_cache or float16_decode export of "
        f"pystdlib_small (precision/<precision>/out); made by "
        f"--make_serving_exports={tmp_path} --tiny"), done.stderr
    done = jobs.run("benchmarks.gpu_check", args + ["--parts=parity", "--budget_scale=0.001"])
    result = json.loads((tmp_path / "check.json").read_text())
    assert done.returncode == 1 and result["failed"] == ["parity"], done.stdout[-2000:]
    assert "1 of 2 parts failed: parity" in done.stdout


class FakeRunner:
    def __init__(self, log, name, peak=None):
        self.log, self.name, self.calls = log, name, 0
        if peak is not None:
            self.peak_bytes = peak

    def __call__(self, n):
        self.log.append((self.name, n))
        self.calls += 1
        return [10.0 if self.calls == 1 else 1.0] * n

    def close(self):
        self.log.append((self.name, "close"))


@pytest.mark.parametrize("interleave", [True, False])
def test_measure_times_each_runner_after_its_warmup(interleave):
    log = []
    makers = {"a": lambda: FakeRunner(log, "a", peak=7), "b": lambda: FakeRunner(log, "b")}
    calls = []
    results = tp.measure(makers, iters=5, warmup=2, block=2, interleave=interleave,
                         progress=lambda name, result: calls.append(
                             (name, result if result is None else sorted(result))))
    for name in "ab":
        assert results[name]["first_step_s"] == 10.0
        assert list(results[name]["seconds"]) == [1.0] * 5
    made, first, done = None, ["first_step_s"], sorted(results["a"])
    assert calls == ([("a", made), ("b", made), ("a", first), ("b", first), ("a", done),
                      ("b", done)] if interleave else
                     [("a", made), ("a", first), ("a", done), ("b", made), ("b", first),
                      ("b", done)])
    assert results["a"]["peak_bytes"] == 7 and results["b"]["peak_bytes"] is None  # no GPU
    if interleave:
        assert log == [("a", 2), ("b", 2), ("a", 2), ("b", 2), ("a", 2), ("b", 2),
                       ("a", 1), ("b", 1), ("a", "close"), ("b", "close")]
    else:  # one at a time: made, measured and closed before the next
        assert log == [("a", 2), ("a", 5), ("a", "close"), ("b", 2), ("b", 5), ("b", "close")]


class ProfiledRunner(FakeRunner):
    def profile(self, n):
        self.log.append((self.name, "profile", n))
        return {"source": "fake", "ms_per_step": 1.0}


@pytest.mark.parametrize("interleave", [True, False])
def test_a_runner_that_profiles_runs_more_steps_under_it_after_its_row(interleave):
    log, calls = [], []
    makers = {"paper": lambda: FakeRunner(log, "paper"),
              "ours": lambda: ProfiledRunner(log, "ours")}
    results = tp.measure(makers, iters=3, warmup=1, block=3, interleave=interleave,
                         progress=lambda name, result: calls.append(
                             (name, None if result is None else "profile" in result)),
                         profile_steps=2)
    assert results["ours"]["profile"] == {"source": "fake", "ms_per_step": 1.0}
    assert "profile" not in results["paper"]
    assert ("ours", "profile", 2) in log and log.index(("ours", 3)) < log.index(
        ("ours", "profile", 2))
    if not interleave:  # its row is reported first, then again with the profile
        assert calls[-2:] == [("ours", False), ("ours", True)]
    assert tp.measure(makers, iters=3, warmup=1, block=3, interleave=interleave)[
        "ours"].get("profile") is None  # not asked


class FailingProfile(FakeRunner):
    def profile(self, n):
        raise KeyError("total_self_time")


@pytest.mark.parametrize("interleave", [True, False])
def test_a_profile_that_fails_says_why_and_the_next_variants_still_run(interleave):
    """On the GPU the profile reads XLA's tables, which no CPU run has: where
    it fails, the rows after it (bf16, f16 in the check's pair) are still
    measured."""
    log = []
    makers = {"f32": lambda: FailingProfile(log, "f32"),
              "bf16": lambda: ProfiledRunner(log, "bf16")}
    results = tp.measure(makers, iters=2, warmup=1, block=2, interleave=interleave,
                         profile_steps=2)
    assert results["f32"]["profile"] == {
        "source": None, "why": "the profile failed: KeyError: 'total_self_time'"}
    assert list(results["bf16"]["seconds"]) == [1.0, 1.0]
    assert results["bf16"]["profile"]["source"] == "fake"


def test_a_profile_summary_by_category_and_top_ops(tmp_path):
    from benchmarks import tf_profile
    rows = [{"hlo_op_name": "dot.1", "category": "convolution fusion", "total_self_time": 6000.0},
            {"hlo_op_name": "loop.2", "category": "loop fusion", "total_self_time": 3000.0},
            {"hlo_op_name": "dot.3", "category": "convolution fusion", "total_self_time": 1000.0}]
    summary = tf_profile.summarize_rows(rows, 2, "hlo_stats")
    assert summary["ms_per_step"] == 5.0
    assert summary["by_category_ms"] == {"convolution fusion": 3.5, "loop fusion": 1.5}
    assert [(t["name"], t["ms"], t["share"]) for t in summary["top"]] == [
        ("dot.1", 3.0, 0.6), ("loop.2", 1.5, 0.3), ("dot.3", 0.5, 0.1)]
    assert tf_profile.one_line(summary) == (
        "5.0 ms a step (hlo_stats): convolution fusion 3.5, loop fusion 1.5")
    # a real trace on the CPU: TensorFlow's ops (XLA's are traced on GPUs only)
    import tensorflow as tf
    step = tf.function(lambda x: tf.reduce_sum(tf.matmul(x, x)))
    x = tf.ones([64, 64])
    step(x)
    summary = tf_profile.profiled(lambda n: [step(x).numpy() for _ in range(n)], 3,
                                  str(tmp_path))
    assert summary["source"] == "framework_op_stats" and summary["ms_per_step"] > 0, summary
    assert "IDLE" not in summary["by_category_ms"]
    assert tf_profile.summarize(str(tmp_path / "none"), 1)["source"] is None


def test_adaptive_softmax_flops_count_the_head_and_the_tails_share():
    full = tp.config_for("tiny", cutoffs=[])
    adaptive = tp.config_for("tiny")  # cutoffs 100, 200 of 300
    d = adaptive.d_model
    saved = (2 * d * 300 - (2 * d * (100 + 2) + 2 * d * (100 * 100 + 100 * 100) / 300))
    difference = (tp.model_flops_per_token(full, 16, 16, 4, training=False)
                  - tp.model_flops_per_token(adaptive, 16, 16, 4, training=False))
    assert difference == pytest.approx(saved)


FAKE_PIP = r'''
import sys, zipfile
args = sys.argv[1:]
assert args[0] == "download" and "--python-version" in args, args
dest = args[args.index("--dest") + 1]
wheels = {
    "nvidia_cuda_nvcc_cu12-12.9.86-py3-none-manylinux_2_17_x86_64.whl": {
        "nvidia/cuda_nvcc/bin/ptxas":
            "#!/bin/sh\necho 'Cuda compilation tools, release 12.9, V12.9.86'\n"},
    "nvidia_cublas_cu12-12.9.3.13-py3-none-manylinux_2_27_x86_64.whl": {
        "nvidia/cublas/lib/libcublas.so.12": "x" * 500},
    "numpy-2.5.5-cp312-cp312-manylinux_2_27_x86_64.whl": {"numpy/__init__.py": ""},
    "tensorflow-2.21.0-cp312-cp312-manylinux_2_27_x86_64.whl": {
        "tensorflow/__init__.py": "# tf\n", "tensorflow/include/tensorflow/c/c_api.h": "int;\n"},
    "txl_tf-0.1.0-py3-none-any.whl": {"txl_tf/__init__.py": ""},
}
for name, files in wheels.items():
    with zipfile.ZipFile(f"{dest}/{name}", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
'''


@pytest.mark.parametrize("skip", ["numpy", "numpy nvidia-cublas-cu12"])
def test_the_wheels_pack_into_pieces_and_unpack_on_the_device(tmp_path, skip):
    """pack_wheels.sh with a fake pip (small wheels, 300-byte pieces), then
    run_check.sh's unpacking: the environment the check runs in, also where
    SKIP leaves out every CUDA library (only the nvcc wheel travels); the
    base set's pieces alone first (the serving parts' environment: no CUDA 12
    library), then the cuda set's beside them (base is not unpacked again)."""
    import os
    import subprocess
    (tmp_path / "pip.py").write_text(FAKE_PIP)
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "mem_transformer.py").write_text("")
    device = Path(__file__).resolve().parent.parent / "benchmarks" / "device"
    env = dict(os.environ, PIP=f"{sys.executable} {tmp_path / 'pip.py'}", PIECE_BYTES="300",
               SKIP=skip, REFERENCE_DIR=str(tmp_path / "ref"), STREAM_BYTES="200")
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(device / "pack_wheels.sh"), str(out)], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    sets = {name: sorted(out.glob(f"{name}.tar.part-*")) for name in ("base", "cuda")}
    assert all(len(pieces) > 1 for pieces in sets.values()), sets
    assert all(p.stat().st_size <= 300 for p in out.glob("*.part-*"))
    assert sorted(line.split()[1] for line in (out / "gpu_wheels.sha256").read_text().splitlines()
                  ) == sorted(p.name for pieces in sets.values() for p in pieces)
    cublas = "nvidia-cublas-cu12" not in skip
    wheels = sorted((out / "wheels").iterdir())
    assert [p.name for p in wheels] == (  # numpy skipped, no txl_tf
        ["nvidia_cublas_cu12-12.9.3.13-py3-none-manylinux_2_27_x86_64.whl"] * cublas
        + ["nvidia_cuda_nvcc_cu12-12.9.86-py3-none-manylinux_2_17_x86_64.whl",
           "tensorflow-2.21.0-cp312-cp312-manylinux_2_27_x86_64.whl"])
    assert sorted(p.name for p in out.iterdir()) == sorted(  # the sets' folders in the pieces
        ["wheels", "gpu_wheels.sha256"] + [p.name for pieces in sets.values() for p in pieces])
    site = tmp_path / "device" / "site"
    exports = tmp_path / "gpu_exports"
    base_only = tmp_path / "base_only"  # a session that carried the base set's pieces alone
    base_only.mkdir()
    for piece in sets["base"] + [out / "gpu_wheels.sha256"]:
        shutil.copy(piece, base_only)
    env = dict(os.environ, PIECES=str(base_only), SITE=str(site), PREPARE_ONLY="1",
               PYTHON=sys.executable, EXPORTS=str(exports))
    done = subprocess.run(["bash", str(device / "run_check.sh")], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()) == [
        ".complete-base", "tensorflow/__init__.py"]
    assert f"{site}/nvidia" not in done.stdout.split("LD_LIBRARY_PATH=")[1].split("\n")[0]
    (site / "kept").write_text("")  # a second call unpacks the cuda set beside base
    env["PIECES"] = str(out)
    done = subprocess.run(["bash", str(device / "run_check.sh")], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (site / "kept").exists() and (site / ".complete-cuda").exists()
    (site / "kept").unlink()
    assert "serving exports: none (the serving part exports" in done.stdout
    exports.mkdir()  # carried along: the serving parts time them
    done = subprocess.run(["bash", str(device / "run_check.sh")], env=env,
                          capture_output=True, text=True)
    assert f"serving exports: --serving_exports={exports}\n" in done.stdout, done.stdout
    shown = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line
                 and not line.startswith(("reference", "serving")))
    assert (shown["LD_LIBRARY_PATH"].split(":")[0] == f"{site}/nvidia/cublas/lib") == cublas
    assert f"{site}/nvidia/" not in shown["LD_LIBRARY_PATH"].replace(f"{site}/nvidia/cublas/", "")
    assert shown["PATH"].startswith(f"{site}/nvidia/cuda_nvcc/bin:")
    # the environment the check's process gets: a fake python names the machine's own CUDA
    # libraries and prints what the check would be run with
    (tmp_path / "python").write_text(
        '#!/bin/sh\ncase "$*" in *getsitepackages*) echo /own/nvidia/cudnn/lib:; exit;;\n'
        '*benchmarks.gpu_check*) env | grep -E "^(LD_LIBRARY_PATH|TXL_[A-Z]+_LIBS)="; exit;;\n'
        f'esac\nexec {sys.executable} "$@"\n')
    (tmp_path / "python").chmod(0o755)
    own, packed = "/own/nvidia/cudnn/lib", f"{site}/nvidia/cublas/lib" * cublas
    check_env = {k: v for k, v in env.items() if k not in ("PREPARE_ONLY", "LD_LIBRARY_PATH")}
    for order, first, caller in (("", packed or own, ""), ("auto", packed or own, "/caller/lib"),
                                 ("packed", packed or own, ""), ("machine", own, "/caller/lib"),
                                 ("cuda13", None, "")):
        ordered = subprocess.run(["bash", str(device / "run_check.sh")], capture_output=True,
                                 text=True, env=dict(check_env, LIB_ORDER=order,
                                                     OUT=str(tmp_path / "check"),
                                                     TXL_PACKED_LIBS="/stale:",
                                                     PYTHON=str(tmp_path / "python"),
                                                     **({"LD_LIBRARY_PATH": caller} if caller
                                                        else {})))
        if first is None:
            assert ordered.returncode == 2 and ordered.stderr.startswith("error: LIB_ORDER=cuda13")
            continue
        got = dict(line.split("=", 1) for line in ordered.stdout.splitlines())
        libs = got["LD_LIBRARY_PATH"].split(":")
        assert libs[0] == first and own in libs, got
        # the caller's own folders last, and no empty entry (the loader's current folder)
        assert "" not in libs and libs[-1] == (caller or own), got
        if order in ("", "auto"):  # both lists, for the check to give onnxruntime its order
            assert (got["TXL_PACKED_LIBS"], got["TXL_MACHINE_LIBS"]) == (packed, own), got
            assert gc.library_orders(got) == [
                ("packed", got["LD_LIBRARY_PATH"]),
                ("machine", ":".join([own, packed] + [caller] * bool(caller)))] * cublas
        else:  # an order given: every part runs with it (a caller's stale list dropped)
            assert "TXL_PACKED_LIBS" not in got and "TXL_MACHINE_LIBS" not in got, got
    assert f"TXL_MACHINE_LIBS={shown['TXL_MACHINE_LIBS']}\n" in done.stdout  # PREPARE_ONLY's
    assert shown["PYTHONPATH"].split(":")[1] == str(site)
    # the call brings back 8 files of $OUT: only gpu_check.json goes there (its rows hold the
    # parts' JSON)
    script = (device / "run_check.sh").read_text()
    assert re.search(r'--output="\$OUT/gpu_check.json" \\\n\s+--parts_dir=/tmp/', script)
    assert f"--reference_dir={tmp_path}/device/txl_unpacked/reference/pytorch" in done.stdout
    ptxas = subprocess.run([f"{site}/nvidia/cuda_nvcc/bin/ptxas", "--version"],
                           capture_output=True, text=True).stdout
    assert gc.ptxas_version(ptxas) == (12, 9, 86)
    # every file of the wheels, byte for byte, but the headers DROP leaves out by default
    # (libcublas's 500 bytes span three 200-byte xz streams); the streams are gone
    expected = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            expected.update({name: z.read(name) for name in z.namelist()
                             if not name.startswith("tensorflow/include/")})
    assert {str(p.relative_to(site)): p.read_bytes() for p in site.rglob("*")
            if p.is_file() and not p.name.startswith(".complete-")} == expected
    assert not list((tmp_path / "device" / "txl_unpacked").glob("*/site"))
    # pieces of an older pack (one tar), or none: one error line
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "gpu_wheels.tar.part-00").write_bytes(b"")
    done = subprocess.run(["bash", str(device / "run_check.sh")], capture_output=True, text=True,
                          env=dict(env, PIECES=str(tmp_path / "old"),
                                   SITE=str(tmp_path / "other_site")))
    assert done.returncode == 2 and done.stderr.startswith("error: no pieces in ") and \
        done.stderr.count("\n") == 1, done.stderr



def _pack(tmp_path, skip="numpy"):
    """pack_wheels.sh's pieces of the fake pip's wheels (300-byte pieces) in
    `tmp_path`/out: `(the finished run, the out folder)`."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "pip.py").write_text(FAKE_PIP)
    device = Path(__file__).resolve().parent.parent / "benchmarks" / "device"
    env = dict(os.environ, PIP=f"{sys.executable} {tmp_path / 'pip.py'}", PIECE_BYTES="300",
               SKIP=skip, STREAM_BYTES="200")
    env.pop("REFERENCE_DIR", None)
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(device / "pack_wheels.sh"), str(out)], env=env,
                          capture_output=True, text=True)
    return done, out


def test_a_pack_whose_cuda_set_skip_left_empty_ends_well(tmp_path):
    """SKIP leaving out every CUDA 12 wheel (the machine has its own) leaves
    the cuda set empty: the base set is packed and the run ends with exit 0
    (was: the count of the cuda set's pieces, an `ls` failing under
    pipefail, ended it with exit 2 after the packing)."""
    done, out = _pack(tmp_path, skip="numpy nvidia-cublas-cu12 nvidia-cuda-nvcc-cu12")
    assert done.returncode == 0, done.stderr
    assert "cuda: 0 pieces" in done.stdout and "only the pieces" in done.stdout, done.stdout
    assert list(out.glob("base.tar.part-*")) and not list(out.glob("cuda.tar.part-*"))


def _unpack(pieces, site, **extra):
    device = Path(__file__).resolve().parent.parent / "benchmarks" / "device"
    return subprocess.run(["bash", str(device / "run_check.sh")], capture_output=True, text=True,
                          env=dict(os.environ, PIECES=str(pieces), SITE=str(site),
                                   PREPARE_ONLY="1", PYTHON=sys.executable, **extra))


def test_run_check_says_what_is_wrong_with_the_pieces_sha256(tmp_path):
    """gpu_wheels.sha256 against the pieces carried: a set it lists none of
    (the file of another pack), a piece it does not list (left from another
    pack), a piece that differs: each one `error:` line, exit 2, nothing
    unpacked (was: a set it listed none of ended the run with exit 1 and
    sha256sum's words alone)."""
    done, out = _pack(tmp_path)
    assert done.returncode == 0, done.stderr
    pieces = tmp_path / "pieces"
    pieces.mkdir()
    for piece in out.glob("base.tar.part-*"):
        shutil.copy(piece, pieces)
    (pieces / "gpu_wheels.sha256").write_text(f"{'0' * 64}  gpu_wheels.tar.part-00\n")  # older
    done = _unpack(pieces, tmp_path / "s1" / "site")
    assert done.returncode == 2 and done.stderr.startswith(
        f"error: {pieces}/gpu_wheels.sha256 lists no base.tar.part-*") and \
        done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "s1" / "site" / ".complete-base").exists()
    shutil.copy(out / "gpu_wheels.sha256", pieces)
    (pieces / "base.tar.part-99").write_bytes(b"stale")  # not this pack's
    done = _unpack(pieces, tmp_path / "s2" / "site")
    assert done.returncode == 2 and done.stderr.startswith(
        "error: gpu_wheels.sha256 does not list base.tar.part-99") and \
        done.stderr.count("\n") == 1, done.stderr
    (pieces / "base.tar.part-99").unlink()
    (pieces / "base.tar.part-01").write_bytes(b"damaged")
    done = _unpack(pieces, tmp_path / "s3" / "site")
    assert done.returncode == 2 and done.stderr.startswith(
        "error: base.tar.part-01 does not match") and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "s3" / "site" / ".complete-base").exists()


def test_a_set_partly_carried_waits_and_the_unpacked_set_serves(tmp_path):
    """The README's session: base carried and unpacked, then the cuda set's
    pieces carried one a call. A call that runs the check while the cuda set
    is partly there (gpu_wheels.sha256 lists pieces not yet carried) runs on
    base, saying the cuda set waits (was: sha256sum's missing files ended
    every such call, the serving run too); once all are there it unpacks."""
    done, out = _pack(tmp_path)
    assert done.returncode == 0, done.stderr
    pieces, site = tmp_path / "pieces", tmp_path / "device" / "site"
    pieces.mkdir()
    for piece in [*out.glob("base.tar.part-*"), out / "gpu_wheels.sha256"]:
        shutil.copy(piece, pieces)
    assert _unpack(pieces, site).returncode == 0
    cuda = sorted(out.glob("cuda.tar.part-*"))
    shutil.copy(cuda[1], pieces)  # a later piece first: the set is seen without its part-00
    done = _unpack(pieces, site)
    assert done.returncode == 0, done.stderr
    assert f"note: cuda: 1 of {len(cuda)} pieces in {pieces}" in done.stderr, done.stderr
    for piece in cuda[:2]:
        shutil.copy(piece, pieces)
    done = _unpack(pieces, site)
    assert done.returncode == 0, done.stderr
    assert f"note: cuda: 2 of {len(cuda)} pieces in {pieces}" in done.stderr, done.stderr
    assert (site / ".complete-base").exists() and not (site / ".complete-cuda").exists()
    assert not (site / "nvidia").exists()
    for piece in cuda[2:]:
        shutil.copy(piece, pieces)
    done = _unpack(pieces, site)
    assert done.returncode == 0 and "note:" not in done.stderr, done.stderr
    assert (site / ".complete-cuda").exists() and (site / "nvidia" / "cuda_nvcc").is_dir()
    # base partly there and nothing unpacked yet: nothing to run on, one error line
    partial = tmp_path / "partial"
    partial.mkdir()
    for piece in [*sorted(out.glob("base.tar.part-*"))[:1], out / "gpu_wheels.sha256"]:
        shutil.copy(piece, partial)
    done = _unpack(partial, tmp_path / "other" / "site")
    assert done.returncode == 2 and done.stderr.splitlines()[-1].startswith(
        f"error: no set of pieces in {partial} is whole"), done.stderr
    # no gpu_wheels.sha256 carried (run_check.sh then checks no sums): a set without its
    # part-00 waits, saying so (was: left out without a word)
    unlisted = tmp_path / "unlisted"
    unlisted.mkdir()
    for piece in [*out.glob("base.tar.part-*"), cuda[1]]:
        shutil.copy(piece, unlisted)
    done = _unpack(unlisted, tmp_path / "third" / "site")
    assert done.returncode == 0 and f"note: cuda: cuda.tar.part-00 is not in {unlisted} yet" \
        in done.stderr, done.stderr
    assert (tmp_path / "third" / "site" / ".complete-base").exists()
    # ... and with its part-00 but not the rest: one error line that says so too (was: "pack
    # them again", which would not help)
    shutil.copy(cuda[0], unlisted)
    done = _unpack(unlisted, tmp_path / "third" / "site")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"error: the pieces {unlisted}/cuda.tar.part-* hold no cuda/site.json: some not carried "
        "yet (carry them, with the gpu_wheels.sha256 that counts them), or packed by an older "
        "pack_wheels.sh (pack them again with this checkout's)"], done.stderr



def test_a_set_unpacked_from_another_packs_pieces_is_unpacked_afresh(tmp_path):
    """A warm machine's SITE holds the base set of one pack; the pieces of
    another pack (packed again: another SKIP, other wheels) are carried with
    their gpu_wheels.sha256: its marker, which holds the sums it was
    unpacked from, is stale, and SITE is unpacked afresh from these pieces,
    saying so (was: `.complete-base` alone kept the old pack's files)."""
    first, out = _pack(tmp_path / "a", skip="numpy")
    again, out_again = _pack(tmp_path / "b", skip="")  # numpy packed too this time
    assert first.returncode == 0 and again.returncode == 0, (first.stderr, again.stderr)
    pieces, site = tmp_path / "pieces", tmp_path / "device" / "site"
    pieces.mkdir()
    for piece in [*out.glob("base.tar.part-*"), out / "gpu_wheels.sha256"]:
        shutil.copy(piece, pieces)
    assert _unpack(pieces, site).returncode == 0
    assert not (site / "numpy").exists()
    done = _unpack(pieces, site)  # the same pieces: kept, nothing said
    assert done.returncode == 0 and "note:" not in done.stderr, done.stderr
    for piece in pieces.iterdir():
        piece.unlink()
    for piece in [*out_again.glob("base.tar.part-*"), out_again / "gpu_wheels.sha256"]:
        shutil.copy(piece, pieces)
    done = _unpack(pieces, site)
    assert done.returncode == 0, done.stderr
    assert f"note: {site} holds the base set of another pack" in done.stderr, done.stderr
    assert (site / "numpy" / "__init__.py").exists() and (site / ".complete-base").exists()



def test_sitepack_cuts_streams_exactly_and_refuses_damage_with_one_error_line(tmp_path):
    """sitepack.py (the pieces' format): files laid end to end are cut into
    streams of at most the given bytes, each byte in one stream; a stream cut
    short or altered, an index naming a path outside the folder, and pieces of
    the older wheels-only layout each stop the unpacking with one `error:` line."""
    import importlib.util
    device = Path(__file__).resolve().parent.parent / "benchmarks" / "device"
    spec = importlib.util.spec_from_file_location("sitepack", device / "sitepack.py")
    sitepack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sitepack)
    assert sitepack.split([0, 5, 3, 0, 9], 4) == [
        [[1, 0, 4]], [[1, 4, 1], [2, 0, 3]], [[4, 0, 4]], [[4, 4, 4]], [[4, 8, 1]]]
    with zipfile.ZipFile(tmp_path / "a-1-py3-none-any.whl", "w") as z:
        z.writestr("a/lib.so", bytes(range(256)) * 40)
    packed = tmp_path / "packed"
    assert sitepack.main(["pack", str(tmp_path), str(packed), "--stream_bytes=4096"]) == 0
    streams = sorted((packed / "site").iterdir())
    assert len(streams) == 3

    def unpack(index=packed / "site.json"):
        done = subprocess.run([sys.executable, str(device / "sitepack.py"), "unpack", str(index),
                               str(tmp_path / "site")], capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done
        return done.stderr

    good = streams[1].read_bytes()
    streams[1].write_bytes(good[:-9])
    assert unpack() == "error: site/0001.xz ends before its xz stream does\n"
    streams[1].write_bytes(good[:40] + bytes([good[40] ^ 1]) + good[41:])
    assert unpack().startswith("error: site/0001.xz: ")  # lzma's own words
    index = json.loads((packed / "site.json").read_text())
    index["files"][0][0] = "../a/lib.so"
    (packed / "site.json").write_text(json.dumps(index))
    assert unpack() == "error: unsafe path '../a/lib.so' in a wheel or index\n"
    # pieces without their set's site.json: run_check.sh says to pack again
    (tmp_path / "old" / "wheels").mkdir(parents=True)
    subprocess.run(["tar", "-cf", str(tmp_path / "base.tar.part-00"), "-C",
                    str(tmp_path / "old"), "wheels"], check=True)
    done = subprocess.run(["bash", str(device / "run_check.sh")], capture_output=True, text=True,
                          env=dict(os.environ, PIECES=str(tmp_path), PREPARE_ONLY="1",
                                   SITE=str(tmp_path / "device" / "site"), PYTHON=sys.executable))
    assert done.returncode == 2 and done.stderr.startswith(
        f"error: the pieces {tmp_path}/base.tar.part-* hold no base/site.json"), done

def test_sitepack_unpacks_a_stream_of_many_small_files_with_few_descriptors(tmp_path):
    """Regression: a stream kept every file it wrote to open until its end; a
    64 MiB stream of a wheel's small .py files (thousands) on each of 16
    threads ran out of file descriptors ("Too many open files")."""
    import resource
    device = Path(__file__).resolve().parent.parent / "benchmarks" / "device"
    contents = {f"t/m{i:03d}.py": bytes([i % 251]) * (i % 7) for i in range(300)}
    with zipfile.ZipFile(tmp_path / "t-1-py3-none-any.whl", "w") as z:
        for name, data in contents.items():
            z.writestr(name, data)
    sitepack = [sys.executable, str(device / "sitepack.py")]
    subprocess.run(sitepack + ["pack", str(tmp_path), str(tmp_path / "packed")], check=True,
                   capture_output=True)

    def few_descriptors():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    done = subprocess.run(sitepack + ["unpack", str(tmp_path / "packed" / "site.json"),
                                      str(tmp_path / "site")],
                          capture_output=True, text=True, preexec_fn=few_descriptors)
    assert done.returncode == 0, done.stderr
    assert {str(p.relative_to(tmp_path / "site")): p.read_bytes()
            for p in (tmp_path / "site").rglob("*") if p.is_file()} == contents


FAKE_WORKER = r'''
import json, sys
setups = open(sys.argv[-1] + "/setups.jsonl", "a")
for line in sys.stdin:
    request = json.loads(line)
    if "setup" in request:
        setup = request["setup"]
        setups.write(json.dumps(setup) + "\n")
        setups.flush()
        reply = {"ok": True, "parameters": 123}
    else:
        step = 0.5 if setup["precision"] == "bf16" else 1.0
        reply = {"seconds": [step] * request["run"], "peak_bytes": 2 ** 30}
    print(json.dumps(reply), flush=True)
'''


def fake_paper_worker(tmp_path):
    """A `--reference_python` running `FAKE_WORKER`, which logs each setup to
    `tmp_path`/setups.jsonl."""
    (tmp_path / "worker.py").write_text(FAKE_WORKER)
    (tmp_path / "python").write_text(f"#!/bin/sh\nexec {sys.executable} "
                                     f"{tmp_path / 'worker.py'} \"$@\"\n")
    (tmp_path / "python").chmod(0o755)
    return str(tmp_path / "python")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_each_variant_is_paired_with_the_papers_code_in_its_precision(monkeypatch, tmp_path,
                                                                     device):
    """The pair's rows, ratios and the worker's setup, with a fake worker
    speaking `paper_reference.py`'s protocol and fake Keras runners. The
    paper row's label names the precision its worker was set up with: on a
    GPU float32 runs with TF32 matmuls allowed, `PyTorch tf32` (the GPU
    check of 2026-11-30 labelled it `PyTorch float32`)."""
    python = fake_paper_worker(tmp_path)
    monkeypatch.setattr(tp, "paper_device", lambda: device)
    monkeypatch.setattr(tp, "shape_data", lambda shape, make: (tp.config_for(shape), 4, None))
    monkeypatch.setattr(tp, "build_model", lambda *args, **kwargs: None)
    def keras_runner(model, data, training):
        run = lambda n: [0.25] * n  # noqa: E731
        run.parameters = 123
        return run
    monkeypatch.setattr(tp, "keras_runner", keras_runner)
    o = tp.check_options(dict(defaults(tp.SPEC), shapes=["tiny"],
                              variants=["f32", "bf16+jit", "bf16"], iters=3, warmup=1,
                              interleave=False, reference_dir=str(tmp_path),
                              reference_python=python))
    partials = []
    rows, columns, _ = tp.train_part(o, {"float32": 1.0, "bfloat16": 1.0}, partial=lambda
                                     done, started: partials.append((list(done), started)))
    # as they come: each variant made, its first step, its row; the ratio once its pair is done
    shown = [([(r["variant"], r["ratio"]) for r in done],
              [(s["variant"], s["first_step_s"]) for s in started]) for done, started in partials]
    paper, f32 = [("paper f32", 1.0)], [("paper f32", 1.0), ("f32", 4.0)]
    assert shown[:7] == [([], [("paper f32", None)]), ([], [("paper f32", 1.0)]), (paper, []),
                         (paper, [("f32", None)]), (paper, [("f32", 0.25)]), (f32, []),
                         (f32, [("paper bf16", None)])]
    assert len(partials) == 15 and partials[-1] == (rows, [])
    got = [(r["variant"], r["policy"], r["ratio"], r["peak_gib"]) for r in rows]
    float32 = "tf32" if device == "cuda" else "float32"
    assert got == [("paper f32", f"PyTorch {float32}", 1.0, 1.0), ("f32", "float32", 4.0, None),
                   ("paper bf16", "PyTorch bf16", 1.0, 1.0),
                   ("bf16+jit", "mixed_bfloat16", 2.0, None), ("bf16", "mixed_bfloat16", 2.0, None)]
    assert ("x its paper row", "ratio", ".2f") in columns
    assert {r["parameters"] for r in rows} == {123}
    setups = [json.loads(line) for line in (tmp_path / "setups.jsonl").read_text().splitlines()]
    assert [(s["precision"], s["device"], s["cutoffs"], s["mode"]) for s in setups] == [
        (float32, device, [100, 200], "train"), ("bf16", device, [100, 200], "train")]
    assert "div_val" not in setups[0] and setups[0]["batch_size"] == 4


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_eval_parts_paper_row_names_the_precision_it_ran(monkeypatch, tmp_path, device):
    """`--part=eval`'s paper row (float32) is labelled with its worker's
    precision: `PyTorch tf32` on a GPU, where TF32 matmuls are allowed."""
    python = fake_paper_worker(tmp_path)
    monkeypatch.setattr(tp, "paper_device", lambda: device)
    monkeypatch.setattr(tp, "shape_data", lambda shape, make: (tp.config_for(shape), 4, None))
    monkeypatch.setattr(tp, "build_model", lambda *args, **kwargs: None)
    monkeypatch.setattr(tp, "keras_runner", lambda model, data, training: lambda n: [0.25] * n)
    o = tp.check_options(dict(defaults(tp.SPEC), part="eval", shapes=["tiny"], variants=["f32"],
                              mem_lens=["4"], iters=2, warmup=1, interleave=False,
                              reference_dir=str(tmp_path), reference_python=python))
    rows, _, _ = tp.eval_part(o, {"float32": 1.0})
    float32 = "tf32" if device == "cuda" else "float32"
    assert [(r["variant"], r["policy"]) for r in rows] == [("paper", f"PyTorch {float32}"),
                                                           ("f32", "float32")]
    setups = [json.loads(line) for line in (tmp_path / "setups.jsonl").read_text().splitlines()]
    assert [(s["precision"], s["device"], s["mode"]) for s in setups] == [
        (float32, device, "eval")]


class _ExitedPopen(subprocess.Popen):
    """A process that has exited by the time its caller writes to it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.wait()


@pytest.mark.parametrize("exited_first,profile_steps", [(False, 0), (True, 0), (False, 2)])
def test_our_rows_are_measured_when_the_papers_code_fails(monkeypatch, tmp_path, exited_first,
                                                          profile_steps):
    """A paper worker that exits (its code broken on that machine), before or
    after the request reaches it, is a failed row with its reason; the Keras
    rows beside it are still measured, their ratio None, and the check's
    summary shows both; so with the profile the check's enwik8 pair asks for
    (a paper row failing first once left nothing to profile: a traceback)."""
    (tmp_path / "python").write_text("#!/bin/sh\nexit 3\n")
    (tmp_path / "python").chmod(0o755)
    if exited_first:  # the request's write meets a closed pipe
        monkeypatch.setattr(tp.subprocess, "Popen", _ExitedPopen)
    monkeypatch.setattr(tp, "shape_data", lambda shape, make: (tp.config_for(shape), 4, None))
    monkeypatch.setattr(tp, "build_model", lambda *args, **kwargs: None)
    monkeypatch.setattr(tp, "keras_runner", lambda model, data, training: lambda n: [0.25] * n)
    o = tp.check_options(dict(defaults(tp.SPEC), shapes=["tiny"], variants=["f32", "bf16"],
                              iters=3, warmup=1, interleave=False, reference_dir=str(tmp_path),
                              reference_python=str(tmp_path / "python"),
                              profile_steps=profile_steps))
    rows, _, _ = tp.train_part(o, {"float32": 1.0, "bfloat16": 1.0})
    speed = 4 * tp.config_for("tiny").tgt_len / 0.25  # batch 4, 0.25 s a step
    assert [(r["variant"], r.get("error"), r.get("tokens_per_s"), r["ratio"]) for r in rows] == [
        ("paper f32", "the reference worker exited (3); see its error above", None, None),
        ("f32", None, speed, None),
        ("paper bf16", "the reference worker exited (3); see its error above", None, None),
        ("bf16", None, speed, None)]
    tp.write_json(str(tmp_path / "pair.json"), {"results": rows}, quiet=True)
    assert gc.pair_summary(str(tmp_path / "pair.json")).startswith(
        "paper f32 failed (the reference worker exited (3); see its error above); "
        f"f32 {speed:,.0f} tok/s (-, 1st 0 s); paper bf16 failed")


def test_a_piece_and_the_working_tree_fit_one_device_call():
    """A device call carries the working tree (tracked files and untracked
    ones git does not ignore) and one piece of pack_wheels.sh, 64 MiB in
    all: the default piece leaves room for the tree as it is now."""
    import subprocess
    root = Path(__file__).resolve().parent.parent
    script = (root / "benchmarks" / "device" / "pack_wheels.sh").read_text()
    piece = int(re.search(r"PIECE_BYTES=\$\{PIECE_BYTES:-(\d+)\}", script).group(1))
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=root, capture_output=True, text=True, check=True).stdout
    tree = sum((root / name).stat().st_size for name in listed.split("\0")
               if name and (root / name).is_file())
    assert piece + tree <= 64 * 2 ** 20, (
        f"a {piece:,}-byte piece and the {tree:,}-byte working tree exceed one call's 64 MiB: "
        "lower PIECE_BYTES in benchmarks/device/pack_wheels.sh")
