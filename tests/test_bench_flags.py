"""The benchmarks declare their flags once, as a `txl_tf.app.flagspec` SPEC,
and run as `txl_tf.app.cli` jobs: `--help` lists the flags (and exits as
every job's `--help` does, absl's status 1), a bad flag is one `error:` line
and exit status 2, before any export or measurement. Every entry point's SPEC
is checked in this process; a few representative scripts run from their
command lines (`tests.cli_runner`: the libraries imported once)."""
import importlib
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from absl import flags

from txl_tf.app.flagspec import defaults, define, values

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
KINDS = {"string": str, "integer": int, "float": (int, float), "bool": bool, "enum": str,
         "list": list, "multi_string": list}
# Every benchmark run from the command line (the paper's-code workers,
# paper_reference.py and pytorch_parity.py's torch stages, take positional
# arguments from the benchmarks that start them and have no flags).
ENTRY_POINTS = sorted(p.stem for p in BENCHMARKS.glob("*.py")
                      if re.search(r"^\s+cli\.run\(main, SPEC\)", p.read_text(), re.M))


def test_every_flag_defining_benchmark_is_an_entry_point():
    assert len(ENTRY_POINTS) >= 8
    raw = [p.name for p in BENCHMARKS.glob("*.py") if "flags.DEFINE" in p.read_text()]
    assert raw == []


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_the_spec_is_a_valid_flagspec_spec(name):
    spec = importlib.import_module(f"benchmarks.{name}").SPEC
    names = [option[1] for option in spec]
    assert len(names) == len(set(names)), names
    for kind, flag, default, help, choices in spec:
        assert kind in KINDS and re.fullmatch(r"[a-z][a-z0-9_]*", flag), (kind, flag)
        assert isinstance(help, str) and help.strip(), flag
        assert default is None or isinstance(default, KINDS[kind]), (flag, default)
        assert (choices is not None) == (kind == "enum"), flag
        if kind == "enum":
            assert default is None or default in choices, (flag, default)
    flag_values = flags.FlagValues()
    define(spec, flag_values)
    flag_values([name])
    assert values(spec, flag_values) == defaults(spec)


def last_error_line(jobs, module, flag_args):
    done = jobs.run(module, flag_args)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("name", ["throughput"])
def test_help_lists_the_spec(jobs, name):
    done = jobs.run(f"benchmarks.{name}", ["--help"])
    assert done.returncode == 1 and "error:" not in done.stderr, done.stderr[-2000:]
    spec = importlib.import_module(f"benchmarks.{name}").SPEC
    for option in spec:
        shown = f"--[no]{option[1]}" if option[0] == "bool" else f"--{option[1]}"
        assert shown in done.stdout, option[1]


@pytest.mark.parametrize("value", ["1,x", "2,-1"])
def test_a_bad_batch_size_is_one_error_line(jobs, value):
    assert last_error_line(jobs, "benchmarks.long_memory", [f"--batch_sizes={value}"]) == \
        f"error: --batch_sizes must be comma-separated positive integers, got '{value}'"


@pytest.mark.parametrize("module, flag_args, message", [
    ("benchmarks.long_memory", ["--reuse_exports"], "--reuse_exports needs --work_dir"),
    ("benchmarks.long_memory", ["--device=tpu"], "--device must be cpu, cuda or auto"),
    ("benchmarks.long_memory", ["--reuse_exports", "--work_dir=.", "--clamp_len=820"],
     "--clamp_len makes this run's model"),
    ("benchmarks.long_memory", ["--device_cache=maybe"], "--device_cache must be"),
    ("benchmarks.long_memory", ["--backends=onnx,bogus"], "--backends: unknown ['bogus']"),
    ("benchmarks.long_memory", ["--part=onnx_weights", "--fill"], "--skeleton_dir is required"),
    ("benchmarks.long_memory", ["--part=onnx_weights", "--fill", "--skeleton_dir=.", "--seed=-1"],
     "--seed must be >= 0, got -1"),  # numpy's ValueError traceback, after the first graph
    ("benchmarks.long_memory", ["--part=onnx_weights", "--fill", "--skeleton_dir=/nowhere"],
     "no .onnx files in /nowhere"),  # as strip says of its --export_dir ("filled 0 weights")
    ("benchmarks.long_memory", ["--part=cuda_parity"], "--exports is required"),
    ("benchmarks.long_memory", ["--part=soak", "--presets=tiny"],
     "--part=soak takes no --presets"),
    ("benchmarks.long_memory", ["--part=disk"], "--part"),
    ("benchmarks.long_memory", ["--part=evaluation", "--device=cuda"],
     "--device=cuda: this onnxruntime"),  # has no CUDA provider, or its does not load
    ("benchmarks.quality", ["--part=memory_use"], "--model_dirs is required"),
    ("benchmarks.quality", ["--part=memory_use", "--model_dirs=m", "--mem_lens=0,-1"],
     "--mem_lens must be"),
    ("benchmarks.quality", ["--part=memory_use", "--split=dev"], "--split"),
    # ValueError tracebacks ("cannot convert float NaN to integer") after the timing probe,
    # or before any line was split
    ("benchmarks.memory_worth", ["--budget_s=nan"],
     "--budget_s must be a finite number of seconds > 0, got nan"),
    ("benchmarks.quality", ["--heldout_fraction=nan"],
     "--heldout_fraction must be in (0, 1), got nan"),
    ("benchmarks.eval_speed", ["--lengths=8,x"], "--lengths must be"),
    ("benchmarks.throughput", ["--iters=many"], "--iters"),
    ("benchmarks.throughput", ["--shapes=huge"], "--shapes takes"),
    ("benchmarks.throughput", ["--part=eval", "--mem_lens=8,x"], "--mem_lens must be"),
    ("benchmarks.throughput", ["--part=tails", "--shapes=tiny,small"],
     "--part=tails needs shapes with an adaptive softmax (cutoffs); small has none"),
    ("benchmarks.gpu_check", ["--parts=parity,gpu"], "--parts takes"),
    ("benchmarks.attention_forms", ["--forms=today,bogus"], "--forms takes a non-empty list of "
     "today, mha"),
    ("benchmarks.fused_step", ["--forms=today,flash"], "--forms takes a non-empty list of "
     "today, mha"),
    ("benchmarks.fused_step", ["--steps=0"], "--steps must be"),
    # its groups, named with its parts
    ("benchmarks.gpu_check", ["--parts=training,servings"],
     "train, decode_xla, serving_long_memory, serving_evaluation, serving_soak, "
     "serving_device_tests, serving_parity, serving_profile, serving_float16, "
     "serving_parity_float16, serving_precision, attention_forms, fused_step, training, "
     "serving; unknown: servings"),
    ("benchmarks.long_memory", ["--part=soak", "--soak_sessions=0"],
     "--soak_sessions must be >= 1, got 0"),
    ("benchmarks.long_memory", ["--part=soak", "--device=tpu"],
     "--device must be cpu, cuda or auto"),
    ("benchmarks.ablation", ["--models=xl,gru"], "--models: unknown ['gru']"),
    ("benchmarks.inference", ["--part=profile"],
     "--export_dir '' holds no decode_token.onnx, model.onnx"),
    ("benchmarks.inference", ["--part=profile", "--device=tpu"], "--device must be cpu or cuda"),
    ("benchmarks.inference", ["--part=profile", "--graphs=decode_read"], "--graphs takes"),
    ("benchmarks.gpu_check", ["--serving_exports=/nowhere"],
     "--serving_exports: /nowhere has no float32 or float16 export of enwik8_base"),
])
def test_bad_flags_are_checked_first(jobs, module, flag_args, message):
    last = last_error_line(jobs, module, flag_args)
    assert last.startswith("error: ") and message in last, last


def test_the_soak_runs_on_its_device_or_says_the_gpu_is_missing(monkeypatch):
    """`--part=soak --device=cuda` opens ONNX Runtime on CUDA; where it opens
    on the CPU instead (no GPU, no onnxruntime-gpu), one error before any
    session, and the SavedModel is not asked for CUDA at all."""
    import export
    from benchmarks import long_memory
    from txl_tf.errors import TxlError
    opened = []
    monkeypatch.setattr(export, "open_runtime", lambda path, backend, device: opened.append(
        (backend, device)) or SimpleNamespace(device="cpu"))
    o = {"export_dir": "out", "backend": "onnx", "device": "cuda", "soak_sessions": 1,
         "max_open": 1, "report_every": 1}
    with pytest.raises(TxlError, match="--device=cuda: ONNX Runtime could not open its CUDA"):
        long_memory.run_soak(o)
    with pytest.raises(TxlError, match="--device=cuda runs --backend=onnx only"):
        long_memory.run_soak({**o, "backend": "saved_model"})
    assert opened == [("onnx", "cuda")]


def test_quality_warmups_are_ascii_step_counts():
    """`str.isdigit` took "²", which `int()` refused once the runs had begun."""
    from benchmarks.quality import parse_warmups
    from training.errors import TrainingError
    assert parse_warmups("default, 0,75") == ["default", "0", "75"]
    for bad in ("\u00b2", "1\u00b2", "\u0663", "-1", "x"):
        with pytest.raises(TrainingError, match=rf"^--warmups takes 'default' or step counts, "
                                                rf"got '{bad}'$"):
            parse_warmups(f"default,{bad}")


def test_quality_job_flags_split_as_a_shell_would_and_a_bad_quote_is_one_error():
    from benchmarks.quality import parse_job_flags
    from training.errors import TrainingError
    assert parse_job_flags("") == []
    assert parse_job_flags("--jit_compile '--config_override=cutoffs=[2000, 6000]'") == [
        "--jit_compile", "--config_override=cutoffs=[2000, 6000]"]
    with pytest.raises(TrainingError, match=r"^--job_flags \"--seed='1\": No closing quotation$"):
        parse_job_flags("--seed='1")


def test_the_latency_part_reports_each_measurement_as_it_ends(capsys):
    """`make bench`'s first command printed nothing for its minute and more
    of exports and timings, then the whole table: each batch's timings now
    have a line on stderr as they end (the table stays on stdout)."""
    from benchmarks import inference
    o = {**defaults(inference.LATENCY_SPEC), "preset": "tiny", "batch_sizes": ["1", "2"],
         "iters": 2, "warmup": 1, "backends": ["keras"], "workloads": ["decode"],
         "output": ""}
    inference.run_latency(o)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert [line.split(":")[0] for line in lines] == ["decode batch 1", "decode batch 2"], err
    assert all(re.search(r"keras [0-9.]+ ms", line) for line in lines), err
    assert out.startswith("workload batch"), out
