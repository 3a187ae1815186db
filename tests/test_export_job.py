"""The export job end to end through its flags, and the model-directory loader."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tensorflow as tf
from absl import flags

from export import ExportError, ModelDirError, ParityError, open_runtime, run_export
from export import job
from export.job import SPEC
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.app.flagspec import define, values
from txl_tf.errors import TxlError
from txl_tf.weights import save_pretrained
from txl_tf.weights.model_dir import load

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A model directory as training writes it: config.json, weights.npz, vocab/."""
    root = tmp_path_factory.mktemp("model")
    core = TransformerXL(TransformerXLConfig.preset("tiny", mem_len=6))
    rng = np.random.default_rng(0)
    for w in core.weights:
        w.assign(rng.normal(0.0, 0.3, w.shape).astype(np.float32))
    vocab = root / "vocab_src"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("".join(f"t{i}\n" for i in range(256)))
    save_pretrained(core, str(root / "model"))
    shutil.copytree(vocab, root / "model" / "vocab")
    return root / "model", core


def run_job(*argv):
    """`python -m export` in this process: the flags parsed, then `run_export`."""
    fv = flags.FlagValues()
    define(SPEC, fv)
    fv(["export", *argv])
    return run_export(**values(SPEC, fv))


def test_job_exports_both_formats_from_model_dir(model_dir, tmp_path):
    path, core = model_dir
    out = tmp_path / "out"
    report = run_job(f"--model_dir={path}", f"--output_dir={out}",
                     "--formats=saved_model,onnx", "--mem_len=4", "--opset=17",
                     "--log_probs=last", "--zero_filled_memory", "--verify")
    assert sorted(os.listdir(out)) == ["config.json", "decode_init.onnx", "decode_read.onnx",
                                       "decode_step.onnx", "decode_token.onnx",
                                       "export_report.json", "model.onnx", "model.onnx.data",
                                       "saved_model", "vocab"]
    assert "vocab.txt" in os.listdir(out / "saved_model" / "assets")
    assert set(report["parity"]) == {"onnxruntime", "saved_model"}
    assert json.loads((out / "export_report.json").read_text())["parity"] == report["parity"]
    # The keys run_export's docstring names.
    assert set(report) == {"metadata", "seconds", "decode_cache_bytes", "parity", "files"}
    assert set(report["seconds"]) == {"saved_model", "onnx", "parity"}
    meta = {p.key: p.value for p in onnx.load(str(out / "model.onnx")).metadata_props}
    assert (meta["mem_len"], meta["log_probs"], meta["zero_filled_memory"],
            meta["weights_quantization"]) == ("4", "last", "true", "none")
    for name in ("decode_init", "decode_step", "decode_read"):
        # The decode graphs' metadata said "false": a client of them alone
        # started from an empty memory, not the export's zero-filled one.
        graph = onnx.load(str(out / f"{name}.onnx"), load_external_data=False)
        assert {p.key: p.value for p in graph.metadata_props}["zero_filled_memory"] == "true"
    for backend in ("onnx", "saved_model"):
        rt = open_runtime(str(out), backend=backend)
        memory = rt.initial_memory(2)
        assert memory.numpy()[1].all()  # zero-filled start: every slot attended
        ids = np.array([[1, 2, 3], [4, 5, 6]])
        log_probs, _ = rt.step(ids, memory)
        expected, _ = core(ids, core.initial_memory(2, 4, zero_filled=True))
        np.testing.assert_allclose(log_probs, expected.numpy()[:, -1], atol=1e-4)
    with pytest.raises(ValueError, match="log_probs='last'"):
        open_runtime(str(out), backend="onnx").score(ids, ids)


def test_job_as_module_with_explicit_config_and_weights(model_dir, tmp_path, jobs):
    path, _ = model_dir
    out = tmp_path / "out"
    done = jobs.run("export", [f"--config={path / 'config.json'}",
                               f"--weights={path / 'weights.npz'}", f"--output_dir={out}",
                               "--formats=saved_model"], check=True)
    # stdout: one JSON document (stages' seconds, parity), the last line
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(printed) == {"seconds", "parity"} and "saved_model" in printed["seconds"]
    assert sorted(os.listdir(out / "saved_model" / "assets")) == ["config.json",
                                                                  "export_metadata.json"]
    assert not (out / "model.onnx").exists()
    assert open_runtime(str(out)).mem_len == 6  # the config's mem_len by default


@pytest.mark.parametrize("argv, message", [
    ([], r"^pass --model_dir, or both --config and --weights$"),
    (["--config=c.json"], r"^pass --model_dir, or both --config and --weights$"),
    (["--model_dir=m", "--formats=tflite"],
     r"^--formats must be a non-empty list of saved_model, onnx, triton, got 'tflite'$"),
    (["--model_dir=m", "--formats=onnx,pdf"], r"got 'onnx,pdf'$"),
    (["--model_dir=m", "--formats="], r"non-empty list .* got ''$"),
    (["--model_dir=m", "--opset=12"], r"^--opset must be an ONNX opset from 13 to \d+ "),
    (["--model_dir=m", "--opset=99"], r"--opset .* got 99$"),
    (["--model_dir=m", "--tolerance=-1"], r"^--tolerance must be >= 0, got -1.0$"),
    (["--model_dir=m", "--tolerance=nan"], r"^--tolerance must be >= 0, got nan$"),
    (["--model_dir=m", "--mem_len=-1"], r"^--mem_len must be >= 0, got -1$"),
    (["--model_dir=m", "--triton_max_batch_size=0"],
     r"^--triton_max_batch_size must be >= 1, got 0$"),
    (["--model_dir=m", "--decode_dtype=float16", "--cache_dtype=float32"],
     r"^--decode_dtype=float16 keeps the keys and values in float16: drop "
     r"--cache_dtype=float32$"),
    # Recorded in the metadata of graphs that hold no cache (model.onnx, the SavedModel).
    (["--model_dir=m", "--formats=saved_model", "--cache_dtype=float16"],
     r"^--cache_dtype=float16 is the ONNX decode graphs' cache: it needs onnx in --formats "
     r"and --decode_cache$"),
    (["--model_dir=m", "--nodecode_cache", "--cache_dtype=float16"],
     r"^--cache_dtype=float16 is the ONNX decode graphs' cache"),
], ids=["no_model", "config_alone", "formats", "one_bad_format", "no_format", "opset_low",
        "opset_high", "tolerance", "tolerance_nan", "mem_len", "triton_batch", "decode_dtype",
        "cache_dtype_no_onnx", "cache_dtype_no_decode_cache"])
def test_job_flag_errors_name_the_flag(tmp_path, argv, message):
    """Checked before the model is read: `m` and `c.json` do not exist."""
    with pytest.raises(ExportError, match=message):
        run_job(f"--output_dir={tmp_path / 'out'}", *argv)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("options, message", [
    (dict(triton_options={"max_batch_size": 8, "max_candidate_sequences": 4}),
     r"^cannot write a Triton repository: max_candidate_sequences \(4\) must be at least "
     r"max_batch_size \(8\)"),
    (dict(triton_model_name='my "best" lm'), "^cannot write a Triton repository: model_name "
                                              r"\(--triton_model_name\) must be a plain "
                                              "folder name"),
    (dict(mem_len=0), "^cannot write a Triton repository: .*mem_len >= 1"),
], ids=["candidates", "name", "mem_len"])
def test_triton_options_are_refused_before_the_model_loads(model_dir, tmp_path, monkeypatch,
                                                           options, message):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")
    for name in ("load", "load_core", "load_weights"):
        monkeypatch.setattr(job.model_dir_loader, name, no_load)
    with pytest.raises(ExportError, match=message):
        run_export(str(tmp_path / "out"), str(model_dir[0]), formats=["onnx", "triton"],
                   **options)
    assert not (tmp_path / "out").exists()


def test_job_flag_errors_from_absl_and_python(model_dir, tmp_path):
    path, _ = model_dir
    with pytest.raises(ExportError, match="^--output_dir is required$"):
        run_job(f"--model_dir={path}")
    with pytest.raises(flags.IllegalFlagValueError, match=r"value should be one of <all\|last>"):
        run_job(f"--model_dir={path}", f"--output_dir={tmp_path}", "--log_probs=first")
    with pytest.raises(flags.IllegalFlagValueError,
                       match=r"value should be one of <float32\|float16>"):
        run_job(f"--model_dir={path}", f"--output_dir={tmp_path}", "--cache_dtype=bfloat16")
    for options, message in [  # a string, not a list: the list it means is named
            (dict(formats="onnx"), r"not a string: formats=\['onnx'\], got 'onnx'$"),
            (dict(formats="saved_model,onnx"),
             r"not a string: formats=\['saved_model', 'onnx'\], got 'saved_model,onnx'$"),
            (dict(log_probs="first"), "--log_probs must be one of all, last"),
            (dict(opset=None), "got None")]:
        with pytest.raises(ExportError, match=message):
            run_export(str(tmp_path / "out"), str(path), **options)
    with pytest.raises(TypeError, match=r"unknown options \['formt'\]"):
        run_export(str(tmp_path / "out"), str(path), formt=["onnx"])
    assert not (tmp_path / "out").exists()


def test_the_flags_parse_to_the_spec_defaults():
    fv = flags.FlagValues()
    define(SPEC, fv)
    fv(["export"])
    parsed = values(SPEC, fv)
    assert parsed["formats"] == ["saved_model", "onnx"] and parsed["opset"] == 17
    assert parsed["triton_model_name"] == "txl" and parsed["output_dir"] is None
    assert not hasattr(job, "define_flags") and not hasattr(job, "run_from_flags")


def test_the_loader_the_job_uses_names_each_problem(model_dir, tmp_path):
    path, core = model_dir
    loaded, source = load(str(path))
    assert source.vocab_dir and loaded.config == core.config
    np.testing.assert_array_equal(loaded.weights[0].numpy(), core.weights[0].numpy())
    with pytest.raises(ModelDirError, match="does not exist"):
        load(str(tmp_path / "nope"))
    with pytest.raises(ModelDirError, match="weights file"):
        load(str(path), weights_path=str(tmp_path / "missing.npz"))
    other = tmp_path / "other.json"
    TransformerXLConfig.preset("tiny", d_model=64, d_head=32).to_json(str(other))
    with pytest.raises(ModelDirError, match="cannot load weights"):
        load(str(path), config_path=str(other))


def test_the_removed_model_dir_layer_names_what_replaces_it():
    import export
    for name, replacement in [("load_model", "load_pretrained"),
                              ("save_model_dir", "save_pretrained")]:
        with pytest.raises(AttributeError, match=f"export.{name} was removed; use .*{replacement}"):
            getattr(export, name)


def snapshot(folder):
    """`{relative path: bytes}` of every file under `folder`."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def previous_export(model_dir, tmp_path_factory):
    """A finished export (SavedModel only), copied per test from this template."""
    path, _ = model_dir
    out = tmp_path_factory.mktemp("previous") / "out"
    run_job(f"--model_dir={path}", f"--output_dir={out}", "--formats=saved_model",
            "--mem_len=4", "--noverify")
    return out


def copy_of(folder, tmp_path):
    import shutil
    parent = tmp_path / "exports"
    parent.mkdir()
    return Path(shutil.copytree(folder, parent / "out"))


def test_job_refuses_a_non_empty_output_folder(model_dir, previous_export, tmp_path):
    path, _ = model_dir
    out = copy_of(previous_export, tmp_path)
    before = snapshot(out)
    with pytest.raises(ExportError, match=rf"{out}.*not empty.*--overwrite"):
        run_job(f"--model_dir={path}", f"--output_dir={out}", "--formats=onnx", "--mem_len=4")
    assert snapshot(out) == before and os.listdir(out.parent) == ["out"]


def test_overwrite_never_replaces_the_input(model_dir, tmp_path):
    path, _ = model_dir
    run = copy_of(path, tmp_path)  # a model directory as the output of its own export
    before = snapshot(run)
    with pytest.raises(ExportError, match=r"holds the export's input"):
        run_job(f"--model_dir={run}", f"--output_dir={run}", "--overwrite", "--formats=onnx")
    assert snapshot(run) == before


def test_overwrite_never_replaces_an_input_reached_through_a_link(model_dir, tmp_path):
    """A model directory inside the output folder, named through a symbolic
    link outside it, was deleted with the folder the export replaced."""
    path, _ = model_dir
    out = tmp_path / "out"
    out.mkdir()
    run = Path(shutil.copytree(path, out / "model"))
    (tmp_path / "link").symlink_to(run)
    before = snapshot(run)
    with pytest.raises(ExportError, match=r"holds the export's input"):
        run_job(f"--model_dir={tmp_path / 'link'}", f"--output_dir={out}", "--overwrite",
                "--formats=onnx")
    assert snapshot(run) == before


def test_overwrite_replaces_the_whole_folder(model_dir, previous_export, tmp_path, capfd):
    path, _ = model_dir
    out = copy_of(previous_export, tmp_path)
    (out / "stale.txt").write_text("from an older export")
    report = run_job(f"--model_dir={path}", f"--output_dir={out}", "--formats=onnx",
                     "--mem_len=4", "--overwrite")
    assert sorted(os.listdir(out)) == ["config.json", "decode_init.onnx", "decode_read.onnx",
                                       "decode_step.onnx", "decode_token.onnx",
                                       "export_report.json", "model.onnx", "model.onnx.data",
                                       "vocab"]
    assert os.listdir(out.parent) == ["out"]  # no temporary or old folder left behind
    assert report["files"] == ["config.json", "decode_init.onnx", "decode_read.onnx",
                               "decode_step.onnx", "decode_token.onnx", "model.onnx",
                               "model.onnx.data", "vocab/vocab.txt", "export_report.json"]
    stages = [line.split("] ")[1].split(":")[0] for line in capfd.readouterr().err.splitlines()
              if line.startswith("[export")]
    # Each parity check has its line as it ends (minutes apiece at lm1b_large: no silence);
    # each stage that takes minutes at the paper's sizes has one as it starts too (the ONNX
    # conversion's two minutes at wt103_large followed the SavedModel's line in silence).
    assert stages == ["loading", "ONNX conversion and weights...",
                      "ONNX conversion and weights", "parity...",
                      "parity, the Keras core's outputs", "parity, onnxruntime",
                      "parity, onnxruntime decode_token", "parity", "done"]


def test_overwrite_through_a_link_replaces_the_folder_it_names(model_dir, previous_export,
                                                                tmp_path):
    """An output folder named by a symbolic link: the link stays and names
    the new export (the link was moved to `.out.old-*`, left there for good,
    and the old export stayed in the folder it named)."""
    path, _ = model_dir
    real = copy_of(previous_export, tmp_path)
    (tmp_path / "exports" / "link").symlink_to(real)
    run_job(f"--model_dir={path}", f"--output_dir={tmp_path / 'exports' / 'link'}",
            "--formats=onnx", "--mem_len=4", "--overwrite", "--nodecode_cache", "--noverify")
    assert sorted(os.listdir(real.parent)) == ["link", "out"]
    assert (tmp_path / "exports" / "link").is_symlink()
    assert sorted(os.listdir(real)) == ["config.json", "export_report.json", "model.onnx",
                                        "vocab"]


def test_the_output_folders_mode_follows_the_umask(model_dir, tmp_path):
    """The export's folder is made as `mkdir` makes one (it was always 0755:
    readable by all under umask 077, not group-writable under 002)."""
    path, _ = model_dir
    for umask, mode in [(0o077, 0o700), (0o002, 0o775)]:
        out = tmp_path / f"out{umask:o}"
        old = os.umask(umask)
        try:
            run_export(str(out), model_dir=str(path), formats=["onnx"], mem_len=4,
                       decode_cache=False, verify=False)
        finally:
            os.umask(old)
        assert out.stat().st_mode & 0o777 == mode


class Interrupted(KeyboardInterrupt):
    pass


@pytest.mark.parametrize("failure", [RuntimeError("conversion failed"), Interrupted()],
                         ids=["exception", "keyboard_interrupt"])
def test_failed_export_leaves_the_previous_one_untouched(model_dir, previous_export, tmp_path,
                                                          monkeypatch, failure):
    path, _ = model_dir
    out = copy_of(previous_export, tmp_path)
    before = snapshot(out)

    def failing_export_onnx(core, path, **options):  # fails with the graph half written
        with open(path, "wb") as f:
            f.write(b"\x08\x07")
        raise failure
    monkeypatch.setattr("export.job.export_onnx", failing_export_onnx)
    with pytest.raises(type(failure)):
        run_job(f"--model_dir={path}", f"--output_dir={out}", "--mem_len=4", "--overwrite",
                "--formats=onnx")
    assert snapshot(out) == before
    assert os.listdir(out.parent) == ["out"]
    fresh = tmp_path / "exports" / "fresh"
    with pytest.raises(type(failure)):
        run_job(f"--model_dir={path}", f"--output_dir={fresh}", "--mem_len=4", "--formats=onnx")
    assert not fresh.exists() and os.listdir(out.parent) == ["out"]


def test_failed_parity_leaves_nothing(model_dir, tmp_path, monkeypatch):
    """Nor the TF32 setting it turns off for the parity (as the caller had it:
    TF32 has no effect on the CPU; tests/conftest.py turns it off)."""
    path, _ = model_dir
    out = tmp_path / "exports" / "out"
    out.parent.mkdir()
    check_runtime, tf32_in_parity = job.check_runtime, []

    def impossible(reference, runtime, segments, tol, token_reference):
        tf32_in_parity.append(tf.config.experimental.tensor_float_32_execution_enabled())
        return check_runtime(reference, runtime, segments, -1.0, token_reference)
    monkeypatch.setattr(job, "check_runtime", impossible)  # no export passes tolerance -1
    tf.config.experimental.enable_tensor_float_32_execution(True)
    try:
        with pytest.raises(ParityError):  # model.onnx alone: its check is the one that fails
            run_export(str(out), model_dir=str(path), formats=["onnx"], mem_len=4,
                       decode_cache=False)
        assert tf32_in_parity == [False]
        assert tf.config.experimental.tensor_float_32_execution_enabled()
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(False)
    assert os.listdir(out.parent) == []


def test_a_killed_exports_staging_is_removed_by_the_next_export(model_dir, tmp_path):
    """SIGKILL leaves `.out.tmp-<pid>-*`; the next export into `out` removes
    it (its pid is gone) and leaves a running export's staging alone."""
    path, _ = model_dir
    out = tmp_path / "exports" / "out"
    out.parent.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    killed = out.parent / f".out.tmp-{dead}-abc123"
    (killed / "saved_model").mkdir(parents=True)
    running = out.parent / f".out.tmp-{os.getpid()}-def456"
    running.mkdir()
    run_export(str(out), model_dir=str(path), formats=["onnx"], mem_len=4, verify=False,
               decode_cache=False)  # model.onnx alone: any export clears the staging
    assert sorted(os.listdir(out.parent)) == sorted(["out", running.name])


def resident_anonymous_bytes():
    """The process's resident anonymous memory (Linux `RssAnon`): not the
    pages of a mapped file (`model.onnx.data`), which the page cache shares."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc")
def test_the_onnx_parity_holds_no_copy_of_the_weights(tmp_path, monkeypatch):
    """The ONNX runtime the parity opens (every graph, decode graphs included)
    reads the one mapped `model.onnx.data`: no session holds a copy of a
    weight of its own. Its tied output embedding (64 MB here) is one
    `Transpose` of the embedding in each graph that returns log-probs, which
    ONNX Runtime's constant folding stored as a folded copy per session
    (three, 1.3 GB at wt103_base: the export job's parity peaked at 5.2× the
    weights)."""
    cfg = TransformerXLConfig.preset("tiny", n_token=2 ** 18, n_layer=1, d_model=64,
                                     d_head=32, mem_len=4)
    core = TransformerXL(cfg)
    save_pretrained(core, str(tmp_path / "model"))
    embedding_bytes = cfg.n_token * cfg.d_model * 4
    grown = {}
    open_runtime_, check_runtime = job.open_runtime, job.check_runtime

    def measured_open(*args, **kwargs):
        job._free()
        grown["before"] = resident_anonymous_bytes()
        return open_runtime_(*args, **kwargs)

    def measured_check(reference, runtime, *args):
        diff = check_runtime(reference, runtime, *args)
        job._free()  # the check's outputs; the runtime and all its sessions are still open
        grown[runtime.backend] = resident_anonymous_bytes() - grown["before"]
        assert runtime._decode_sessions is not None  # the decode graphs were checked too
        return diff
    monkeypatch.setattr(job, "open_runtime", measured_open)
    monkeypatch.setattr(job, "check_runtime", measured_check)
    report = run_export(str(tmp_path / "out"), model_dir=str(tmp_path / "model"),
                        formats=["onnx"], mem_len=4)
    assert set(report["parity"]["onnxruntime"]) >= {"decode_cache"}
    assert grown["onnxruntime"] < embedding_bytes / 2, (grown, embedding_bytes)


def test_attn_type_1_exports_its_step_and_refuses_decode_graphs_first(tmp_path):
    """attn_type 1-3 have no decode cache: the SavedModel carries the step
    signatures alone, the Triton repository the step model alone, and the
    ONNX decode graphs are one ExportError before anything is written (the
    SavedModel and the Triton cached model failed deep in the export)."""
    cfg = TransformerXLConfig.preset("tiny", n_layer=1, mem_len=4, attn_type=1)
    save_pretrained(TransformerXL(cfg), str(tmp_path / "model"))
    out = tmp_path / "out"
    report = run_export(str(out), model_dir=str(tmp_path / "model"),
                        formats=["saved_model", "triton"], mem_len=4)
    assert set(report["parity"]) == {"saved_model", "triton"}
    assert "decode_cache" not in report["parity"]["saved_model"]
    assert os.listdir(out / "triton") == ["txl"]
    runtime = open_runtime(str(out / "saved_model"), backend="saved_model")
    with pytest.raises(ValueError, match="no cached decode interface: attn_type 1 reads the "
                                         "whole memory"):  # not "re-export it with --decode_cache"
        runtime.decode_init(runtime.initial_memory(1))
    with pytest.raises(ExportError, match="attn_type 1 has no cached decode .*--nodecode_cache"):
        run_export(str(tmp_path / "onnx"), model_dir=str(tmp_path / "model"), formats=["onnx"])
    assert not (tmp_path / "onnx").exists()


def test_a_vocabulary_link_to_a_file_outside_it_is_refused_before_the_model_loads(
        model_dir, tmp_path, monkeypatch):
    """A downloaded model's vocab/ holding `notes.txt -> ~/.ssh/id_rsa`: the
    export copied the link's target into its vocab/ and the SavedModel's
    assets, for whoever the export is shipped to."""
    from export import saved_model
    secret = tmp_path / "secret"
    secret.write_text("private\n")
    model = shutil.copytree(model_dir[0], tmp_path / "model")
    os.symlink(secret, model / "vocab" / "notes.txt")

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the vocabulary was checked")
    for name in ("load", "load_core", "load_weights"):
        monkeypatch.setattr(job.model_dir_loader, name, no_load)
    with pytest.raises(ExportError, match=rf"{model / 'vocab' / 'notes.txt'} is a symbolic link "
                                          rf"to {secret}, outside"):
        run_export(str(tmp_path / "out"), str(model), formats=["saved_model"])
    assert not (tmp_path / "out").exists()
    with pytest.raises(TxlError, match=r"notes\.txt is a symbolic link"):
        saved_model._vocab_files(str(model / "vocab"))
    os.remove(model / "vocab" / "notes.txt")  # a link inside the folder is copied as its file
    os.symlink("vocab.txt", model / "vocab" / "same.txt")
    assert [os.path.basename(p) for p in saved_model._vocab_files(str(model / "vocab"))] == \
        ["same.txt", "vocab.txt"]


def test_the_onnx_writers_name_their_bad_options_before_writing(tmp_path):
    from export.onnx_export import export_decode_onnx, export_onnx
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=20))
    with pytest.raises(TxlError, match=r"^decode graphs computing in float16 keep their keys and "
                                       r"values in float16, not float32$"):
        export_decode_onnx(core, str(tmp_path / "d"), 4, None, cache_dtype="float32",
                           decode_dtype="float16")
    with pytest.raises(TxlError, match=r"^log_probs must be one of \('all', 'last'\), got 'some'"):
        export_onnx(core, str(tmp_path / "m.onnx"), 4, log_probs="some")
    with pytest.raises(TxlError, match=r"^mem_len must be an integer >= 0, got -1$"):
        export_onnx(core, str(tmp_path / "m.onnx"), -1)
    assert list(tmp_path.iterdir()) == []
