"""What differs off a Linux box with a UTF-8 locale, simulated here: a
non-UTF-8 stdout (a latin-1 locale; Windows writing into a file, cp1252),
and text files opened in the locale's encoding (cp1252 on Windows)."""
import ast
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Calls that open a file in the locale's encoding unless given one.
OPENERS = {"open", "fdopen", "TextIOWrapper", "read_text", "write_text"}


def test_a_command_writes_what_stdouts_encoding_cannot_hold_as_escapes(jobs):
    """Generated text under a latin-1 locale (`txl-generate` of a byte-level
    model: U+C0B5) ended the job in a `UnicodeEncodeError` traceback."""
    code = ("import io, sys\n"
            "sys.stdout = io.TextIOWrapper(io.FileIO(1, 'w', closefd=False), "
            "encoding='latin-1')\n"
            "from txl_tf.app import cli\n"
            "cli.run(lambda argv: print('caf\\u00e9 \\uc0b5'))\n")
    done = jobs.run("-c", [code])
    assert (done.returncode, done.stdout, done.stderr) == (0, "caf\ufffd \\uc0b5\n", "")


def _text_opens_without_encoding(path):
    """`(line, call)` of each call in `path` that opens a file as text in the
    locale's encoding (no `encoding=`, not a binary mode)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name not in OPENERS or any(k.arg == "encoding" for k in node.keywords):
            continue
        if name == "open" and isinstance(node.func, ast.Attribute) and \
                getattr(node.func.value, "id", None) != "io":
            continue  # a zip member's, a session table's
        mode = [k.value for k in node.keywords if k.arg == "mode"] + node.args[1:2]
        if name in ("open", "fdopen") and mode and isinstance(mode[0], ast.Constant) and \
                "b" in str(mode[0].value):
            continue
        found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_no_text_file_is_opened_in_the_locales_encoding():
    """Corpora, vocabularies, configs and reports are UTF-8 on every
    platform: a text file opened without `encoding=` reads and writes cp1252
    on Windows (and latin-1 under such a locale)."""
    found = {str(path.relative_to(REPO)): calls
             for package in ("txl_tf", "training", "export", "benchmarks")
             for path in sorted((REPO / package).rglob("*.py"))
             if (calls := _text_opens_without_encoding(path))}
    assert found == {}


WITHOUT_POSIX = '''
import importlib, os, pkgutil, signal, sys
for name in ("SIGPIPE", "SIGKILL", "SIGHUP", "SIGALRM", "SIGUSR1", "SIGUSR2", "SIGCHLD",
             "SIGQUIT"):
    if hasattr(signal, name):
        delattr(signal, name)
for name in ("fork", "getloadavg", "sysconf", "wait4", "killpg", "setsid", "getpgid",
             "getuid"):
    if hasattr(os, name):
        delattr(os, name)
for name in ("fcntl", "resource", "termios", "pwd", "grp"):
    sys.modules[name] = None
for name in [m for m in sys.modules if m.split(".")[0] in PACKAGES]:
    del sys.modules[name]
failed = []
for package in PACKAGES:
    for found in pkgutil.walk_packages(importlib.import_module(package).__path__,
                                       package + "."):
        if found.name.endswith("__main__"):  # runs a command
            continue
        try:
            importlib.import_module(found.name)
        except Exception as err:
            failed.append(f"{found.name}: {type(err).__name__}: {err}")
print(failed)
'''


def test_every_module_imports_without_what_windows_lacks(jobs):
    """Windows has no `fcntl`, `resource`, SIGPIPE, SIGKILL, `os.fork`...:
    no module of ours may need them to import (training.lock did)."""
    code = "PACKAGES = ('txl_tf', 'training', 'export', 'benchmarks')\n" + WITHOUT_POSIX
    done = jobs.run("-c", [code])
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr[-2000:]


def test_without_proc_or_resource_the_memory_checks_fall_back_or_step_aside(monkeypatch):
    """macOS and /proc-less containers: the physical memory; Windows (no
    /proc, `resource` or `os.sysconf`): no check, never an error."""
    import builtins
    from txl_tf import TransformerXLConfig
    from txl_tf.checks import memory_budget
    from txl_tf.keras_support import precision
    from export import job

    real_open = builtins.open

    def without_proc(path, *args, **kwargs):
        if str(path).startswith(("/proc/", "/sys/")):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", without_proc)
    monkeypatch.setitem(sys.modules, "resource", None)
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert memory_budget.available_bytes() == physical
    assert memory_budget.room_words(2 ** 30) == "this machine has 1.0 GiB available"
    assert job._peak_rss() == ""
    precision.cpu_flags.cache_clear()
    assert precision.cpu_flags() == frozenset()
    precision.cpu_flags.cache_clear()
    monkeypatch.delattr(os, "sysconf")
    assert memory_budget.available_bytes() is None
    config = TransformerXLConfig(n_token=2 ** 31, n_layer=2, d_model=8, n_head=2, d_head=4,
                                 d_inner=16)
    memory_budget.check_fits(config, 10 ** 6, 10 ** 6, 10 ** 6, host_only=False)


def test_a_path_tensorflow_and_onnx_would_write_elsewhere_is_refused(tmp_path, monkeypatch):
    """Under `LC_ALL=en_US.ISO-8859-1` (file names latin-1) `txl-train
    --model_dir=runé` wrote its config, vocabulary and logs into `runé/` and
    TensorFlow its checkpoints and TensorBoard logs into `runÃ©/` (the UTF-8
    bytes of the same name read as latin-1); `txl-export --output_dir=outé`
    ended in ONNX's checker's traceback (no `model.onnx` at the UTF-8 path)."""
    from export.job import ExportError, run_export
    from training.errors import TrainingError
    from training.train import run
    from txl_tf import TransformerXL, TransformerXLConfig
    from txl_tf.weights import save_pretrained
    from txl_tf.app.paths import utf8_path_problem

    assert utf8_path_problem(tmp_path / "runé") is None  # this box: UTF-8 file names
    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: "iso8859-1")
    assert utf8_path_problem(tmp_path / "run") is None
    assert utf8_path_problem(tmp_path / "runé").startswith(f"{tmp_path / 'runé'} is not ASCII")
    with pytest.raises(TrainingError,
                       match="^--model_dir: .*runé is not ASCII and this locale's "
                             "file names are iso8859-1, not UTF-8: TensorFlow and ONNX"):
        run(model_dir=str(tmp_path / "runé"), dataset="text", data_dir=str(tmp_path))
    assert not (tmp_path / "runé").exists()
    save_pretrained(TransformerXL(TransformerXLConfig.preset("tiny")), str(tmp_path / "model"))
    with pytest.raises(ExportError, match="^--output_dir: .*outé is not ASCII"):
        run_export(str(tmp_path / "outé"), str(tmp_path / "model"), formats=["onnx"])
    assert not (tmp_path / "outé").exists()


def test_only_what_tensorflow_would_write_elsewhere_or_cannot_name_is_refused(tmp_path,
                                                                            monkeypatch):
    """A relative ASCII `--model_dir` in a non-ASCII working folder is one
    folder for Python and TensorFlow alike (it was refused, its absolute
    path checked); under a UTF-8 locale a name whose bytes are not UTF-8
    (`--model_dir=$'run\\xe9'`) ended `txl-train` in TensorFlow's
    `UnicodeEncodeError` traceback."""
    from training.errors import TrainingError
    from training.train import run
    from txl_tf.app.paths import utf8_path_problem

    escaped = os.fsdecode(bytes(tmp_path / "run") + b"\xe9")  # run\udce9
    assert utf8_path_problem(escaped).startswith(f"{escaped} names bytes that are not UTF-8")
    with pytest.raises(TrainingError, match="^--model_dir: .* names bytes that are not UTF-8"):
        run(model_dir=escaped, dataset="text", data_dir=str(tmp_path))
    assert utf8_path_problem(tmp_path / "runé") is None
    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: "iso8859-1")
    (tmp_path / "cwdé").mkdir()
    monkeypatch.chdir(tmp_path / "cwdé")
    assert utf8_path_problem("run") is None
    assert utf8_path_problem(os.path.abspath("run")).startswith(f"{tmp_path / 'cwdé'}")
    from training import classify
    from txl_tf.app.flagspec import merge
    for export in ("", "onnx"):  # the export is written at its absolute path
        o = merge(classify.SPEC, {"mode": "train", "output_dir": "cls", "export": export,
                                  "train_data": "x", "preset": "tiny"})
        if export:
            with pytest.raises(TrainingError, match="^--output_dir: .*cwdé/cls is not ASCII"):
                classify.check_options(o)
        else:
            classify.check_options(o)
    assert utf8_path_problem(b"/tmp/run\xe9") is None  # bytes: the same for both
