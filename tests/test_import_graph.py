"""The house's shape, read from the code's own imports (every `import` and
`from ... import`, function-local ones included), so it cannot drift back:

* the library (`txl_tf`) imports neither the jobs (`training`) nor `export`;
* `export` does not import `training`;
* no circle of imports anywhere in the three packages;
* the top of `txl_tf/` holds only the package's face and the model itself.
"""
import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("txl_tf", "training", "export")
TOP_OF_TXL_TF = {"__init__", "config", "convert", "core", "errors", "model"}


def module_name(path):
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules():
    """`{module name: path}` of every module of the three packages."""
    return {module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}


def imports_of(name, path, known):
    """The project's modules that `name` imports (a name imported from a
    package is that package's submodule when there is one)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in known else base)
    return {m for m in found if m in known and m != name}


def graph():
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def package(module):
    return module.split(".")[0]


def test_imports_only_go_down():
    upward = [(a, b) for a, targets in graph().items() for b in targets
              if (package(a), package(b)) in {("txl_tf", "training"), ("txl_tf", "export"),
                                              ("export", "training")}]
    assert upward == []


def test_no_circle_of_imports():
    edges = graph()
    # A package's __init__ that re-exports its own submodules is not a circle
    # unless a submodule imports the package back; drop only __init__ -> own child.
    edges = {a: {b for b in targets if not b.startswith(a + ".")} for a, targets in edges.items()}
    state, stack, circles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert circles == []


def test_the_top_of_the_library_is_the_face_and_the_model():
    top = {p.stem for p in (REPO / "txl_tf").glob("*.py")}
    assert top == TOP_OF_TXL_TF
    folders = {p.name for p in (REPO / "txl_tf").iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {"app", "baselines", "checks", "classification", "data", "generation",
                       "keras_support", "layers", "learning", "models", "text", "weights"}


@pytest.mark.parametrize("statement, new", [
    ("from txl_tf import checkpoints", "txl_tf.weights.checkpoints"),
    ("from txl_tf.evaluation import evaluate_ids", "txl_tf.learning.evaluation"),
    ("import txl_tf.decoder", "txl_tf.generation.decoder"),
])
def test_an_import_path_from_before_the_relayout_names_where_it_went(statement, new):
    import txl_tf  # noqa: F401  (installs the hint)
    with pytest.raises(ImportError, match=f"moved to {new}"):
        exec(statement, {})


def test_every_moved_module_exists_where_it_went():
    import importlib

    from txl_tf.app.moved_modules import MOVED
    for old, new in MOVED.items():
        importlib.import_module(new)
        with pytest.raises(ImportError, match="moved to"):
            importlib.import_module(old)


@pytest.mark.parametrize("old, name", [
    ("export.cache_slab", "CacheSlab"), ("export.device_ring", "ring_write_model"),
    ("export.graph_replay", "Resident"), ("export.host_cache", "host_cache"),
    ("export.device_slab", "DeviceSlab")])
def test_a_moved_module_names_the_module_that_holds_its_names_now(old, name):
    """Where an old path's error sends the reader, its names are (0.2.0's
    `export.device_ring` named `export.decode_cache`, which no longer holds them)."""
    import importlib

    from txl_tf.app.moved_modules import MOVED
    assert hasattr(importlib.import_module(MOVED[old]), name), (old, MOVED[old])


def test_a_name_that_moved_out_of_a_module_that_stayed_names_where_it_went():
    import importlib

    from txl_tf.app.moved_modules import MOVED_NAMES
    for module, names in MOVED_NAMES.items():
        for name, new in names.items():
            assert hasattr(importlib.import_module(new), name), (name, new)
            with pytest.raises(ImportError, match=f"^{module}.{name} moved to {new}: "):
                exec(f"from {module} import {name}", {})
        with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
            importlib.import_module(module).no_such_name


# The public names of export/decode_cache.py in release 0.4.0.
DECODE_CACHE_0_4_0 = (
    "ALIGNMENT BATCH_AXES CACHE_NAMES CHANGING_NAMES CacheSlab DeviceCache FixedStep IN_PLACE "
    "INIT_INPUTS INIT_OUTPUTS LAYER_STACKED MOVED NUMPY_TYPES OPSET READ_INPUTS READ_OUTPUTS "
    "RINGS Resident RingPositions SLOT_AXES STEP_OUTPUTS WRITE_INPUTS WRITE_OUTPUTS "
    "aligned_empty bind_ring bind_rows cache_bytes cache_shapes check_admission concat_rows "
    "copy_cache copy_model copy_on_device device_step empty_like host_cache host_empty "
    "in_time_order is_ortvalue layer_aligned_empty on_device one_thread_at_a_time ortvalue "
    "realign_rows replay_run_options ring_axis ring_memory_model ring_positions "
    "ring_write_model run_on_device slab_row_bytes small_model step_feeds step_inputs "
    "take_rows with_cache_dtype write_on_device write_token").split()


def test_every_name_a_release_of_decode_cache_had_is_there_or_names_where_it_went():
    """`from export.decode_cache import FixedStep` (0.4.0) was a bare 'cannot
    import name' after the split: only five of its moved names were listed."""
    from export import decode_cache
    from txl_tf.app.moved_modules import MOVED_NAMES
    missing = [name for name in DECODE_CACHE_0_4_0 if name not in vars(decode_cache)
               and name not in MOVED_NAMES["export.decode_cache"]]
    assert missing == []


# Each form of an old import path, as the first import of a fresh process.
# The txl_tf form runs with TensorFlow unimportable: `import txl_tf` imports
# it otherwise, and the finder's answer does not depend on it; so it leaves
# out the old paths inside `txl_tf.data`, which needs TensorFlow
# (test_every_moved_module_exists_where_it_went imports those).
OLD_PATH_FORMS = {
    "import export.X": ("export", "import {old}"),
    "from export import X": ("export", "from export import {leaf}"),
    "from export.X import Y": ("export", "from {old} import Y"),
    "import txl_tf.X": ("txl_tf", "import {old}"),
}
WITHOUT_TENSORFLOW = """
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "keras"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Blocked())
"""


@pytest.mark.parametrize("form", OLD_PATH_FORMS)
def test_an_old_module_path_names_where_it_went_from_the_first_import(form):
    from txl_tf.app.moved_modules import MOVED, REMOVED
    package, statement = OLD_PATH_FORMS[form]
    old_paths = [old for old in [*MOVED, *REMOVED] if old.split(".")[0] == package
                 and not old.startswith("txl_tf.data.")]
    code = (WITHOUT_TENSORFLOW if package == "txl_tf" else "") + textwrap.dedent(f"""
        import json, sys
        for old in {old_paths!r}:  # the first one is the process's first import
            try:
                exec({statement!r}.format(old=old, leaf=old.split(".", 1)[1]), {{}})
                print(json.dumps([old, "imported"]))
            except ImportError as error:
                print(json.dumps([old, type(error).__name__ + ": " + str(error)]))
        print(json.dumps(["tensorflow imported", "tensorflow" in sys.modules]))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    said = dict(json.loads(line) for line in done.stdout.splitlines())
    assert said.pop("tensorflow imported") is False
    for old in old_paths:
        named = f"{old} moved to {MOVED[old]}: " if old in MOVED else f"{old} was removed; "
        assert said[old].startswith(f"ModuleNotFoundError: {named}"), (old, said[old])
