"""Serving the ONNX export needs onnxruntime and numpy, not TensorFlow: a
process where TensorFlow, Keras, tf2onnx and tensorflow-text cannot be
imported opens the export and generates the same ids as this one."""
import importlib.metadata
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from export import open_runtime, run_export
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.weights import save_pretrained

CONFIG = TransformerXLConfig.preset("tiny", n_token=50, cutoffs=[20], mem_len=4)
ROOT = Path(__file__).resolve().parents[1]

# Makes the TensorFlow side unimportable, as on a box without it.
BLOCK = textwrap.dedent("""
    import sys
    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tensorflow", "keras", "tensorflow_text", "tf2onnx"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Blocked())
""")


def _run_without_tensorflow(code):
    done = subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def model_onnx(tmp_path_factory):
    root = tmp_path_factory.mktemp("no_tf")
    save_pretrained(TransformerXL(CONFIG), root / "model")
    # Parity with the core is not the point here: test_export_job.py and
    # test_decode_cache_export.py check it (adaptive softmax included).
    run_export(str(root / "out"), str(root / "model"), formats=("onnx",), verify=False)
    return root / "out" / "model.onnx"


@pytest.mark.parametrize("device_cache", [False, True])
def test_the_onnx_runtime_generates_without_tensorflow(model_onnx, device_cache):
    prompts, options = [[1, 2, 3], [4]], dict(temperature=0.8, seed=7)
    out = _run_without_tensorflow(f"""
        import json, sys
        from export import open_runtime
        rt = open_runtime({str(model_onnx)!r}, device="cpu", device_cache={device_cache})
        first = rt.generate({prompts}, 6, **{options})
        turn = rt.generate([[5], [6, 7]], 4, resume=first.state, **{options})
        assert not [m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras")]
        print(json.dumps([first.ids.tolist(), turn.ids.tolist()]))
    """)
    runtime = open_runtime(str(model_onnx), device="cpu")
    first = runtime.generate(prompts, 6, **options)
    turn = runtime.generate([[5], [6, 7]], 4, resume=first.state, **options)
    assert json.loads(out) == [first.ids.tolist(), turn.ids.tolist()]
    assert np.asarray(first.ids).shape == (2, 6)


def test_the_onnx_runtime_on_the_cpu_needs_no_onnx_package(model_onnx):
    """README's serving box: numpy and onnxruntime only (onnx shares the
    weights between sessions when it is there)."""
    out = _run_without_tensorflow(f"""
        import json, sys
        class NoOnnx:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "onnx":
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, NoOnnx())
        from export import open_runtime
        rt = open_runtime({str(model_onnx)!r}, device="cpu")
        print(json.dumps(rt.generate([[1, 2, 3]], 6, temperature=0.8, seed=7).ids.tolist()))
    """)
    runtime = open_runtime(str(model_onnx), device="cpu")
    assert json.loads(out) == runtime.generate([[1, 2, 3]], 6, temperature=0.8, seed=7).ids.tolist()


def _serving_box_packages(text):
    """The distributions a serving-box install line names (extras and quotes dropped)."""
    words = re.findall(r"[\w.\-\[\],\"]+", text)
    return {w.strip('"').split("[")[0].lower().replace("_", "-") for w in words} - {
        "pip", "install", "--no-deps", ".", "plus", "or"}


def test_the_serving_box_needs_only_the_packages_the_docs_install(model_onnx):
    """README's and docs/export-and-serving.md's serving box: the package with
    `--no-deps` plus the packages they name. Every other requirement of
    setup.py is unimportable here (absl-py was needed but not named)."""
    readme = (ROOT / "README.md").read_text()
    line = re.search(r"^`pip install --no-deps \.` plus (.*)$", readme, re.M).group(1)
    docs = (ROOT / "docs" / "export-and-serving.md").read_text()
    section = docs.split("### Serving without TensorFlow", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    installs = " ".join(l.split("#")[0] for l in block.splitlines() if "pip install" in l)
    named = _serving_box_packages(" ".join(re.findall(r"`([^`]*)`", line)))
    named &= _serving_box_packages(installs)  # what both name of setup.py's requirements
    assert "numpy" in named, named
    setup = (ROOT / "setup.py").read_text()
    requires = re.search(r"install_requires=\[(.*?)\]", setup, re.S).group(1)
    required = {re.split(r"[<>=\[]", r)[0].lower() for r in re.findall(r'"([^"]+)"', requires)}
    modules = {name: module for module, names in importlib.metadata.packages_distributions().items()
               for name in (n.lower() for n in names)}
    blocked = sorted(modules.get(name, name.replace("-", "_")) for name in required - named)
    assert "tensorflow" in blocked and "numpy" not in blocked, blocked
    out = _run_without_tensorflow(f"""
        import json, sys
        class NotInstalled:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {blocked!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, NotInstalled())
        import export
        rt = export.open_runtime({str(model_onnx)!r}, device="cpu")
        table = export.SessionTable(rt, max_batch=2)
        table.open("a", [1, 2, 3], 2)
        table.step()
        print(json.dumps(rt.generate([[1, 2, 3]], 6, temperature=0.8, seed=7).ids.tolist()))
    """)
    runtime = open_runtime(str(model_onnx), device="cpu")
    assert json.loads(out) == runtime.generate([[1, 2, 3]], 6, temperature=0.8, seed=7).ids.tolist()


def test_the_tensorflow_names_say_they_need_it():
    out = _run_without_tensorflow("""
        import txl_tf
        try:
            txl_tf.TransformerXL
        except ImportError as error:
            print(error)
    """)
    assert "txl_tf.TransformerXL needs TensorFlow" in out and "ONNX Runtime" in out


def test_the_long_memory_benchmark_times_an_export_without_tensorflow(model_onnx, tmp_path):
    """As on the GPU machine: its bound's reads and its ONNX rows need no TensorFlow."""
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "out").symlink_to(model_onnx.parent)
    _run_without_tensorflow(f"""
        import runpy, sys
        sys.argv = ["long_memory", "--presets=tiny", "--mem_len={CONFIG.mem_len}",
                    "--backends=onnx", "--batch_sizes=1", "--tokens=2", "--noturns",
                    "--nosessions", "--reuse_exports", "--work_dir={tmp_path}",
                    "--output={tmp_path / 'result.json'}"]
        runpy.run_module("benchmarks.long_memory", run_name="__main__")
    """)
    result = json.loads((tmp_path / "result.json").read_text())
    assert set(result["reads_gb_per_s"]) == {"numpy", "onnxruntime"}
    [row] = result["rows"]
    assert row["backend"] == "onnx" and row["per_token_ms"] > 0 and row["over_bound"] > 0


def test_the_xla_backend_without_tensorflow_is_one_error_line():
    """`benchmarks.long_memory --backends=xla` on a box without TensorFlow:
    one `error:` line saying what it needs (was an ImportError traceback)."""
    code = BLOCK + textwrap.dedent("""
        import runpy, sys
        sys.argv = ["long_memory", "--backends=xla", "--presets=tiny"]
        runpy.run_module("benchmarks.long_memory", run_name="__main__")
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and lines[-1].startswith(
        "error: --backends=xla needs TensorFlow") and "Traceback" not in done.stderr, done.stderr
