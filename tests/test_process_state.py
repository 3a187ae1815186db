"""The library lives in the user's process (a notebook, a server, a script
with Keras models of its own): its calls leave that process's global state
as they found it (`process_state`), and its log records go to loggers of
its own, never to the root logger (whose `logging.info` would configure
logging for the whole process, so that the user's `logging.basicConfig`
then does nothing)."""
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import types
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from export.onnx_export import write_weights_file
from export.tf_runtime import choose_tf_device
from export.saved_model import export_saved_model
from process_state import changes, snapshot, unconfigured_logging
from txl_tf.app.progress import Progress
from txl_tf.classification import read_tsv
from txl_tf.data.corpora import iter_text_chunks
from txl_tf import ReplicaClippedAdam, TransformerXL, TransformerXLConfig, TransformerXLLM

REPO = Path(__file__).resolve().parent.parent
ROOT_LOGGER_CALL = re.compile(r"^\s*logging\.(debug|info|warning|error|exception|critical|log)\(",
                              re.M)


def test_logging_calls_leave_the_root_logger_unconfigured(tmp_path, monkeypatch):
    records = []
    keep = logging.Handler()
    keep.emit = records.append
    monkeypatch.setattr(logging.getLogger("export"), "handlers", [keep])
    monkeypatch.setattr(logging.getLogger("export"), "level", logging.INFO)
    with unconfigured_logging():
        write_weights_file([keras.Variable(np.zeros(3, np.float32))], str(tmp_path / "w.data"))
        choose_tf_device("cuda")  # without a GPU: a warning
        assert logging.root.handlers == []
    assert "export.onnx_export" in {r.name for r in records}
    assert {r.name for r in records} <= {"export.onnx_export", "export.tf_runtime"}


def test_a_saved_model_export_leaves_logging_as_found(tmp_path):
    """TensorFlow's save logs through absl (which calls `basicConfig` on an
    unconfigured root logger) and resets absl's verbosity (`save_module`)."""
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=20, tgt_len=4, mem_len=4))
    with unconfigured_logging():
        export_saved_model(core, str(tmp_path / "saved_model"), 4)
        assert logging.root.handlers == []
        assert logging.getLogger("absl").level == logging.NOTSET


def test_logging_as_found_leaves_what_its_docstring_says_it_leaves():
    """Its docstring and docs/command-line.md say what it does not put back:
    absl's verbosity, and a handler or level set inside the block (by any
    thread) is undone. Each is as said (a change here needs their words)."""
    from absl import logging as absl_logging

    from txl_tf.app.tf_logs import logging_as_found
    doc = " ".join(logging_as_found.__doc__.split())
    page = " ".join((REPO / "docs" / "command-line.md").read_text(encoding="utf-8").split())
    assert "absl.logging.get_verbosity()" in doc and "absl.logging.get_verbosity()" in page
    assert "another thread" in doc and "your thread sets" in page
    verbosity, level = absl_logging.get_verbosity(), logging.root.level
    with unconfigured_logging():
        try:
            with logging_as_found():
                absl_logging.set_verbosity(absl_logging.ERROR)
                thread = threading.Thread(target=lambda: (logging.basicConfig(),
                                                          logging.root.setLevel(logging.DEBUG)))
                thread.start()
                thread.join()
                assert logging.root.handlers
            assert absl_logging.get_verbosity() == absl_logging.ERROR  # not put back
            assert logging.root.handlers == [] and logging.root.level == level
        finally:
            absl_logging.set_verbosity(verbosity)


def test_no_module_logs_through_the_root_logger():
    """absl's `logging` (the commands' own) is not the standard library's."""
    found = []
    for package in ("txl_tf", "export", "training"):
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if re.search(r"^\s*import logging\b", text, re.M):
                found += [f"{path.relative_to(REPO)}: {m.group(0).strip()}"
                          for m in ROOT_LOGGER_CALL.finditer(text)]
    assert not found


def test_building_fitting_and_calling_models_leave_the_process_as_found():
    before = snapshot()
    config = TransformerXLConfig.preset("tiny", n_token=20, tgt_len=4, mem_len=4, dropout=0.0)
    core = TransformerXL(config)
    core(np.ones([1, 4], np.int32), core.initial_memory(1))
    model = TransformerXLLM(config, batch_size=2)
    model.compile(optimizer=ReplicaClippedAdam(1e-3))
    ids = np.ones([1, 2, 4], np.int32)
    model.fit(tf.data.Dataset.from_tensor_slices((ids, ids)), verbose=0)
    # Keras's initializers draw their seeds from Python's generator (a draw, not a reseed).
    assert changes(before, snapshot()) in ([], ["python random"])


def test_progress_bars_leave_no_thread_running(tmp_path):
    """tqdm starts a monitor thread with its first bar (shown or disabled)
    and leaves it running for good; the library's bars start none."""
    from tqdm._monitor import TMonitor
    for thread in threading.enumerate():
        if isinstance(thread, TMonitor):  # one an earlier test's tqdm left
            thread.exit()
    path = tmp_path / "a.tsv"
    path.write_text("ab\tab ab\nmn\tmn mn\n", encoding="utf-8")
    for progress in (False, True):
        assert len(read_tsv(path, progress=progress)) == 2
        assert "".join(iter_text_chunks(path, progress)).count("\n") == 2
    Progress("steps", bar=True)(1, 1)
    assert not [t for t in threading.enumerate() if isinstance(t, TMonitor)]


def test_importing_txl_tf_changes_only_what_the_docs_list():
    """docs/command-line.md, "What the library changes in your process"; in a
    process that imported TensorFlow, Keras and keras-hub first (their own
    changes aside)."""
    script = ("import json, sys; sys.path.insert(0, 'tests'); import tensorflow, keras, keras_hub; "
              "from process_state import changes, snapshot; before = snapshot(); import txl_tf; "
              "print(json.dumps(changes(before, snapshot())))")
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == ["env KERAS_BACKEND", "hooks", "meta path"]


def test_another_keras_backend_is_one_clear_import_error(monkeypatch):
    """`KERAS_BACKEND=numpy` (or jax, torch) failed deep in TensorFlow Text's
    import with "Keras cannot be imported. Check that it is installed."."""
    message = ("ImportError: txl_tf runs on Keras's TensorFlow backend, but Keras's backend is "
               "'numpy' (KERAS_BACKEND or ~/.keras/keras.json): unset KERAS_BACKEND or set it "
               "to 'tensorflow'")
    env = dict(os.environ, KERAS_BACKEND="numpy")
    done = subprocess.run([sys.executable, "-c", "import txl_tf"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == message, done.stderr[-2000:]
    # Keras imported on another backend before txl_tf (here a stand-in: that backend's
    # packages are not installed), whatever the variable says by then.
    from txl_tf.app.tf_startup import require_tensorflow_backend
    monkeypatch.setitem(sys.modules, "keras", types.SimpleNamespace(
        config=types.SimpleNamespace(backend=lambda: "numpy")))
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    with pytest.raises(ImportError, match=re.escape(message.split(": ", 1)[1])):
        require_tensorflow_backend()


# A stand-in `tensorflow` package: on import, and when it lists its devices, it
# writes to file descriptor 2 what the real one's C++ start-up logs (noise) and
# a line of another kind (what a real error would be).
STAND_IN_TENSORFLOW = '''
import os, types
os.write(2, b"I0000 00:00:1796169815.269366    5422 port.cc:153] oneDNN custom operations\\n")
os.write(2, b"a line of another kind\\n")


def _devices():
    os.write(2, b"E0000 00:00:1796169817.856044    5422 cuda_platform.cc:52] failed call to "
                b"cuInit: CUDA error\\n")
    return []


config = types.SimpleNamespace(list_physical_devices=_devices)
'''


def test_tensorflows_first_import_anywhere_drops_only_its_start_up_noise(tmp_path):
    """`import txl_tf` imports no TensorFlow (a process serving an ONNX
    export never loads it); TensorFlow's first import after it, by whichever
    module, drops its C++ start-up lines from stderr, keeps every other
    line, and leaves TensorFlow its own loader."""
    code = ("import importlib.machinery, sys, txl_tf\n"
            "assert 'tensorflow' not in sys.modules\n"
            "import tensorflow\n"
            "print(isinstance(tensorflow.__loader__, importlib.machinery.SourceFileLoader),\n"
            "      tensorflow.__spec__.loader is tensorflow.__loader__)\n")
    done = _run_beside(tmp_path, code, tensorflow=STAND_IN_TENSORFLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "True True\n"
    assert done.stderr == "a line of another kind\n"


def test_on_a_machine_with_nvidias_driver_the_cuda_lines_are_kept(tmp_path):
    """There `failed call to cuInit` (or a CUDA library that does not load)
    is why TensorFlow uses no GPU: it was dropped as noise everywhere, and a
    GPU machine trained on its CPU without a word. The other noise still goes."""
    driver = tmp_path / "nvidia_version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.07\n")
    done = _run_beside(tmp_path, "from txl_tf.app import nvidia_driver\n"
                       f"nvidia_driver.DRIVER_FILE = {str(driver)!r}\n"
                       "import tensorflow\n",
                       tensorflow=STAND_IN_TENSORFLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ("a line of another kind\nE0000 00:00:1796169817.856044    5422 "
                           "cuda_platform.cc:52] failed call to cuInit: CUDA error\n")


def test_on_a_gpu_machine_only_the_gpu_stacks_lines_are_kept():
    from txl_tf.app.stderr_filter import is_noise
    cudart = b"I0000 00:00:17.2 5422 cudart_stub.cc:31] Could not find cuda drivers on your machine"
    dlopen = b"W0000 00:00:17.2 5422 gpu_device.cc:2344] Cannot dlopen some GPU libraries."
    twice = (b"E0000 00:00:17.2 5422 cuda_fft.cc:467] Unable to register cuFFT factory: "
             b"Attempting to register factory for plugin cuFFT when one has already been "
             b"registered")
    onednn = b"I0000 00:00:17.2 5422 port.cc:153] oneDNN custom operations are on."
    python = b"W1202 02:45:13.225713 140444690278080 gpu.py:6] the GPU is busy"
    for line in (cudart, dlopen, twice, onednn):
        assert is_noise(line)
    assert not is_noise(cudart, gpu_machine=True) and not is_noise(dlopen, gpu_machine=True)
    assert is_noise(twice, gpu_machine=True) and is_noise(onednn, gpu_machine=True)
    assert not is_noise(python) and not is_noise(python, gpu_machine=True)


def _stand_ins(tmp_path, after=(REPO,), **stand_ins):
    """The environment of a process whose `PYTHONPATH` puts a stand-in
    package (`name=its __init__.py`, written into `tmp_path`) of each of
    `stand_ins` first, then the paths `after`."""
    for name, source in stand_ins.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(source)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, [tmp_path, *after])))


def _run_beside(tmp_path, code, **stand_ins):
    """Runs `code` in a fresh process with `_stand_ins`."""
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                          env=_stand_ins(tmp_path, **stand_ins), capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("first", ["import txl_tf.layers.memory",
                                   "import txl_tf.models.transformer_xl"])
def test_a_module_of_the_package_as_the_first_import_registers_every_class(tmp_path, first):
    """A package module whose import imports TensorFlow (and with it Keras)
    as a process's first import: the registration, run when Keras came in,
    met that module half-imported, failed with it, and left the modules
    after it unregistered (`keras.models.load_model` could not find
    `TransformerXLLM`); it now waits for the module's import to end."""
    done = _run_beside(tmp_path, f"{first}\nimport keras\n"
                       "print(keras.saving.get_registered_object('txl_tf>TransformerXLLM'), "
                       "keras.saving.get_registered_object('txl_tf>TransformerXL'))\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["<class", "'txl_tf.model.TransformerXLLM'>", "<class",
                                   "'txl_tf.core.TransformerXL'>"]


def test_a_broken_keras_hub_fails_the_names_that_need_it_not_import_keras(tmp_path):
    """keras-hub for another Keras (its import raises, not an ImportError):
    a plain `import keras` after `import txl_tf` raised its error (the
    registration runs inside Keras's import); now Keras imports, and the
    names that need keras-hub raise it when used."""
    done = _run_beside(tmp_path, "import txl_tf\nimport keras\nprint(keras.__name__)\n"
                       "try:\n    txl_tf.TransformerXLCausalLM\n"
                       "except AttributeError as error:\n    print(error)\n",
                       keras_hub="raise AttributeError('keras-hub needs another Keras')\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "keras\nkeras-hub needs another Keras\n"


def test_tensorflows_first_import_with_sys_stderr_set_to_none(tmp_path):
    """A program that sets `sys.stderr` to None (a GUI, a daemon): the quiet
    import failed on `None.flush` (`import tensorflow` raised); its lines
    that are not noise go to file descriptor 2, as without the package."""
    done = _run_beside(tmp_path, "import sys, txl_tf\nsys.stderr = None\nimport tensorflow\n"
                       "print('imported')\n", tensorflow=STAND_IN_TENSORFLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (done.stdout, done.stderr) == ("imported\n", "a line of another kind\n")


def test_tensorflows_first_import_beside_a_stderr_nobody_reads(tmp_path):
    """stderr a pipe whose reader is gone: TensorFlow's C++ lines fail to
    write there without a word; the quiet import's replay of a line that is
    not noise raised BrokenPipeError, and `import tensorflow` with it."""
    stand_in = ("import ctypes, types\n"
                "line = b'E0000 00:00:1.0 1 some_op.cc:12] an error of another kind\\n'\n"
                "ctypes.CDLL(None).write(2, line, len(line))\n"
                "config = types.SimpleNamespace(list_physical_devices=list)\n")
    env = _stand_ins(tmp_path, tensorflow=stand_in)
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-c", "import txl_tf, tensorflow; print('ok')"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=write,
                              text=True, timeout=120)
    finally:
        os.close(write)
    assert done.stdout == "ok\n"


TEE = """
import io, sys, txl_tf
class Tee(io.TextIOBase):
    def write(self, text):
        sys.__stderr__.write(text)
        return kept.write(text)
    def flush(self):
        sys.__stderr__.flush()
kept = io.StringIO()
sys.stderr = Tee()
import tensorflow
print(repr(kept.getvalue()))
"""


def test_a_line_through_a_stderr_tee_during_tensorflows_import_is_written_once(tmp_path):
    """`sys.stderr` a tee (the terminal and a log): a line that reached the
    descriptor through it while TensorFlow's import held that (another
    thread's, or TensorFlow's own Python warning) was replayed through
    `sys.stderr`, so the log had it twice; it goes back to the descriptor."""
    done = _run_beside(tmp_path, TEE, tensorflow="import sys\nprint('a warning', file=sys.stderr)\n"
                       "config = type(sys)('config')\nconfig.list_physical_devices = list\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (done.stdout, done.stderr) == ("'a warning\\n'\n", "a warning\n")


def test_a_second_finder_that_asks_the_others_does_not_recurse(tmp_path):
    """Another finder at the head of `sys.meta_path` that, like this one,
    asks the others (here this one's module reloaded and installed again):
    each asked the other without end (RecursionError on `import
    tensorflow`)."""
    done = _run_beside(tmp_path, "import importlib, txl_tf\n"
                       "from txl_tf.app import first_imports, tf_startup\n"
                       "importlib.reload(first_imports)\ntf_startup.install_quiet_import()\n"
                       "import tensorflow\nprint('imported')\n", tensorflow=STAND_IN_TENSORFLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (done.stdout, done.stderr) == ("imported\n", "a line of another kind\n")


def test_python_absl_lines_of_another_thread_are_not_start_up_noise():
    """TensorFlow's first import captures file descriptor 2 for the whole
    process: a warning that another thread logs through absl then (`W...
    script.py:6]`) was dropped with the C++ lines it looks like."""
    from txl_tf.app.tf_startup import NOISE
    assert NOISE.match("I0000 00:00:1796169815.269366    5422 port.cc:153] oneDNN custom")
    assert NOISE.match("W0000 00:00:1796169815.269366    5422 cpu_feature_guard.cc:12] AVX")
    assert not NOISE.match("W1202 02:45:13.225713 140444690278080 serve.py:6] disk almost full")
    assert not NOISE.match("I1202 02:45:13.225713 140444690278080 __init__.py:61] loaded")


def test_a_callback_waits_for_its_own_threads_half_imported_module_only(tmp_path, monkeypatch):
    """`when_keras_is_imported(callback, package)` (Keras imported here):
    inside an import of one of the package's modules the callback waits for
    that import to end (it would find the module without its names); another
    thread's call runs it at once (a module another thread half-imports is
    behind its import lock, not partial) instead of leaving it pending until
    that import ends."""
    from txl_tf.app.first_imports import when_keras_is_imported
    package = tmp_path / "held_by_first_imports"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "registers.py").write_text(
        "import sys\nfrom txl_tf.app.first_imports import when_keras_is_imported\n"
        "when_keras_is_imported(lambda: sys.modules['__log__'].append(DONE))\nDONE = 'done'\n")
    (package / "waits.py").write_text(
        "import sys\nsys.modules['__log__'].append('started')\n"
        "sys.modules['__log__'].release.wait(60)\n")
    log = types.SimpleNamespace(entries=[], release=threading.Event())
    log.append = log.entries.append
    monkeypatch.setitem(sys.modules, "__log__", log)
    monkeypatch.syspath_prepend(str(tmp_path))
    when_keras_is_imported(lambda: None, package="held_by_first_imports")
    import held_by_first_imports.registers  # noqa: F401
    assert log.entries == ["done"]
    importing = threading.Thread(target=__import__, args=("held_by_first_imports.waits",))
    importing.start()
    while "started" not in log.entries and importing.is_alive():
        importing.join(0.01)
    when_keras_is_imported(lambda: log.append("another thread"))
    seen = list(log.entries)
    log.release.set()
    importing.join(60)
    assert seen == ["done", "started", "another thread"]


def test_what_tensorflow_writes_before_it_dies_in_its_import_reaches_stderr(tmp_path):
    """TensorFlow that aborts in its import (a CPU without the instructions
    it was built for says so, then aborts): its line reached a temporary
    file that no one read back, and the process died without a word; the
    filter process passes it on as it comes."""
    done = _run_beside(tmp_path, "import txl_tf, tensorflow\n", tensorflow=(
        "import os\n"
        "os.write(2, b'I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations\\n')\n"
        "os.write(2, b'This TensorFlow binary needs AVX instructions; this CPU has none\\n')\n"
        "os.abort()\n"))
    assert done.returncode != 0
    assert done.stderr == "This TensorFlow binary needs AVX instructions; this CPU has none\n"


def test_a_child_started_during_tensorflows_import_keeps_its_stderr(tmp_path):
    """A process started while TensorFlow's first import holds stderr
    inherits what stderr is then: it was the temporary file, gone for good
    with what the child wrote after the import; it is the filter's pipe,
    which the filter reads until the child closes it."""
    child = "import os, time; time.sleep(0.5); os.write(2, b'the child has news\\n')"
    done = _run_beside(tmp_path, "import txl_tf, tensorflow\ntensorflow.child.wait()\n",
                       tensorflow=("import subprocess, sys, types\n"
                                   f"child = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
                                   "config = types.SimpleNamespace(list_physical_devices=list)\n"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "the child has news\n"


def test_ctrl_c_during_tensorflows_import_is_one_keyboard_interrupt(tmp_path):
    """Ctrl-C reaches the whole foreground process group: the filter, in it,
    died with a traceback of its own, and what the import wrote after (a
    `finally`, the user's handler) reached a pipe no one read."""
    stand_in = ("import os, signal, time\n"
                "try:\n"
                "    os.killpg(0, signal.SIGINT)\n"
                "    time.sleep(60)\n"
                "finally:\n"
                "    os.write(2, b'the import cleans up\\n')\n")
    done = subprocess.run([sys.executable, "-c", "import txl_tf, tensorflow"], cwd=tmp_path,
                          env=_stand_ins(tmp_path, tensorflow=stand_in), capture_output=True,
                          text=True, timeout=120,
                          start_new_session=True)  # its own group, for the test's SIGINT
    assert done.returncode == -signal.SIGINT, done.stderr[-3000:]
    assert done.stderr.startswith("the import cleans up\nTraceback"), done.stderr[-3000:]
    assert done.stderr.count("Traceback") == 1, done.stderr[-3000:]
    assert done.stderr.endswith("\nKeyboardInterrupt\n"), done.stderr[-3000:]


# The stand-in's child holds stderr (the filter's pipe) until its stdin closes.
STAND_IN_WITH_A_CHILD = """
import subprocess, sys, types
child = subprocess.Popen([sys.executable, "-c", "import os, sys; sys.stdin.read(); "
                          "os.write(2, b'the child is done\\\\n')"], stdin=subprocess.PIPE)
config = types.SimpleNamespace(list_physical_devices=list)
"""

# Waits for the process's children to be gone, zombies too (Linux's /proc), and prints
# those left.
CHILDREN_LEFT = """
def children():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                state, parent = stat.read().rsplit(")", 1)[1].split()[:2]
        except OSError:  # gone meanwhile
            continue
        if int(parent) == os.getpid():
            found.append(state)
    return found
deadline = time.monotonic() + 30
while children() and time.monotonic() < deadline:
    time.sleep(0.05)
print(children())
"""


def test_a_filter_that_outlives_the_import_is_reaped_without_a_warning(tmp_path):
    """A child started during the import holds the filter's pipe past
    `FILTER_WAIT_S`: the filter's `Popen` went unreferenced while it ran
    (`ResourceWarning: subprocess ... is still running`) and, once it ended,
    stayed a zombie for the process's life."""
    code = ("import os, time, warnings, txl_tf\nwarnings.simplefilter('default')\n"
            "from txl_tf.app import tf_startup\ntf_startup.FILTER_WAIT_S = 0.1\n"
            "import tensorflow\ntensorflow.child.stdin.close()\ntensorflow.child.wait()\n"
            + CHILDREN_LEFT)
    done = _run_beside(tmp_path, code, tensorflow=STAND_IN_WITH_A_CHILD)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (done.stdout, done.stderr) == ("[]\n", "the child is done\n")


def _shell_script(path, line):
    """An executable file at `path` that runs `line` in sh (a `sys.executable`
    that is no Python)."""
    path.write_text(f"#!/bin/sh\n{line}\n")
    path.chmod(0o755)
    return path


def test_a_frozen_app_does_not_start_itself_as_the_filter(tmp_path):
    """In a frozen app (PyInstaller and the like) `sys.executable` is the app:
    the filter started the app again (which imported TensorFlow and started
    another), and lines written meanwhile went to an app that did not read
    them; there TensorFlow's import writes to stderr as it is."""
    app = _shell_script(tmp_path / "app", f"echo started >> {tmp_path / 'started'}")
    done = _run_beside(tmp_path, f"import sys, txl_tf\nsys.frozen = True\n"
                       f"sys.executable = {str(app)!r}\nimport tensorflow\n",
                       tensorflow=STAND_IN_TENSORFLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "started").exists()
    assert "a line of another kind\n" in done.stderr


def test_txl_tf_imported_from_a_zip_archive_still_drops_the_noise(tmp_path):
    """The package in a zip archive (a zipapp): the filter's file is no file
    to run (python said "can't find '__main__' module" and ended), and every
    line written during the import went to a pipe no one read."""
    archive = tmp_path / "txl_tf.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in (REPO / "txl_tf").rglob("*.py"):
            zipped.write(path, path.relative_to(REPO).as_posix())
    env = _stand_ins(tmp_path, after=(), tensorflow=STAND_IN_TENSORFLOW)
    env["PYTHONPATH"] = os.pathsep.join([str(archive), env["PYTHONPATH"]])
    done = subprocess.run([sys.executable, "-c", "import txl_tf, tensorflow\n"
                           "print(txl_tf.__file__)"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(str(archive))
    assert done.stderr == "a line of another kind\n"


@pytest.mark.parametrize("executable", ["exit 2", "exec sleep 60"])
def test_a_sys_executable_that_is_no_python_leaves_stderr_as_it_is(tmp_path, executable):
    """`sys.executable` that is no Python (uWSGI's is the uwsgi binary): it
    took the filter's arguments for its own, and ended (`exit 2`) or ran on
    (`exec sleep 60`) without reading the pipe, and the lines of the import
    were lost (or `print` to stderr raised BrokenPipeError); now the filter
    must say it runs before it gets stderr, else stderr stays as it is."""
    app = _shell_script(tmp_path / "app", executable)
    code = (f"import os, sys, time, txl_tf\nsys.executable = {str(app)!r}\n"
            "from txl_tf.app import tf_startup\ntf_startup.FILTER_START_S = 0.5\n"
            "import tensorflow\n" + CHILDREN_LEFT)
    done = _run_beside(tmp_path, code, tensorflow=STAND_IN_TENSORFLOW)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "[]\n"
    assert "a line of another kind\n" in done.stderr


# The stand-in kills the filter (its process's one child), then writes to a
# `sys.stderr` that buffers (the user's), left for the flush at the import's end.
STAND_IN_THAT_KILLS_THE_FILTER = """
import os, signal, sys, types
def parent(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])
pid = next(int(p) for p in os.listdir("/proc") if p.isdigit() and parent(p) == os.getpid())
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
sys.stderr.write("a line the import leaves unflushed\\n")
config = types.SimpleNamespace(list_physical_devices=list)
"""


def test_stderr_is_back_after_the_import_though_its_last_flush_fails(tmp_path):
    """The filter gone during the import (killed), `sys.stderr` a stream that
    buffers: its flush at the import's end raised BrokenPipeError before file
    descriptor 2 was restored, which stayed the dead pipe for the process's
    life (every later line lost), and failed the import; it is restored
    whatever the flush does, and what it could not write is written after."""
    code = ("import os, sys, txl_tf\nsys.stderr = open(2, 'w', closefd=False)\n"
            "import tensorflow\nos.write(2, b'after the import\\n')\n")
    done = _run_beside(tmp_path, code, tensorflow=STAND_IN_THAT_KILLS_THE_FILTER)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "after the import\na line the import leaves unflushed\n"


def test_a_ctrl_c_while_the_import_waits_for_the_filter_leaves_no_zombie(tmp_path):
    """Ctrl-C (here SIGALRM raising KeyboardInterrupt) while the import's end
    waits for a filter that a child keeps: the filter's `Popen` went
    unreferenced while it ran, and it stayed a zombie once it ended."""
    stand_in = STAND_IN_WITH_A_CHILD + (
        "import builtins, signal\nbuiltins.stand_in_child = child\n"
        "signal.signal(signal.SIGALRM, signal.default_int_handler)\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.5)\n")
    code = ("import builtins, os, time, warnings, txl_tf\nwarnings.simplefilter('default')\n"
            "from txl_tf.app import tf_startup\ntf_startup.FILTER_WAIT_S = 60\n"
            "try:\n    import tensorflow\nexcept KeyboardInterrupt:\n    print('interrupted')\n"
            "builtins.stand_in_child.stdin.close()\nbuiltins.stand_in_child.wait()\n"
            + CHILDREN_LEFT)
    done = _run_beside(tmp_path, code, tensorflow=stand_in)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (done.stdout, done.stderr) == ("interrupted\n[]\n", "the child is done\n")
