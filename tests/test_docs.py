"""The README and docs/ say what the code does: the README stays short, its
links resolve, every `python -m ...` command they show names a job that
exists and flags that job defines, and the README's tour runs as written
(from the model shipped with the package)."""
import ast
import importlib
import re
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ABSL_FLAGS = {"flagfile", "help", "helpfull", "helpshort", "undefok", "verbosity", "v"}


def code_blocks(path, languages=("bash", "")):
    """The fenced code blocks of `path` in one of `languages`, as text."""
    return [m.group(2) for m in re.finditer(r"^```(\w*)\n(.*?)^```", path.read_text(), re.M | re.S)
            if m.group(1) in languages]


def commands(text):
    """`python -m MODULE ...` lines of a shell block, continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip().startswith("python -m ")]


def job_flags(module):
    """The flag names the job `module` defines: its spec's options, or the
    absl flags defined in its source and in the benchmark helpers it imports."""
    if module == "export":
        return {spec[1] for spec in importlib.import_module("export.job").SPEC}
    if module == "txl_tf.convert":
        return {spec[1] for spec in importlib.import_module("txl_tf.weights.convert")._spec()}
    path = Path(importlib.util.find_spec(module).origin)
    source = path.read_text()
    for helper in re.findall(r"^from benchmarks(?:\.| import )(\w+)", source, re.M):
        if (path.parent / f"{helper}.py").is_file():
            source += (path.parent / f"{helper}.py").read_text()
    return set(re.findall(r'(?:option\("\w+",|DEFINE_\w+\()\s*"(\w+)"', source)
               + re.findall(r'add_argument\(\s*"--(\w+)"', source))


def part_flags(module, command):
    """The flags of the part a benchmark suite's `command` runs (`--part=`,
    else the suite's first part), or None for a job without parts."""
    parts = getattr(importlib.import_module(module), "PARTS", None) \
        if module.startswith("benchmarks.") else None
    if parts is None:
        return None
    chosen = re.search(r"--part=(\w+)", command)
    spec = parts[chosen.group(1) if chosen else next(iter(parts))][0]
    return {option[1] for option in spec} | {"part"}


def test_the_readme_is_short_and_its_links_resolve():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#:\s]+)(?:#[\w-]+)?\)", path.read_text()):  # .md, .png
            assert (path.parent / target).is_file(), (path.name, target)


def test_cross_document_anchors_exist():
    def anchors(path):
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}
    for path in DOCS:
        for target, anchor in re.findall(r"\]\(([\w./-]*\.md)?#([\w-]+)\)", path.read_text()):
            assert anchor in anchors(path.parent / target if target else path), (path.name, anchor)


def documented_commands():
    found = []
    for path in [*DOCS, REPO / "benchmarks" / "README.md"]:
        for block in code_blocks(path):
            found += [(path.name, c) for c in commands(block)]
    return found


def test_every_documented_command_names_a_job_and_its_flags():
    checked = 0
    for name, command in documented_commands():
        module = command.split()[2]
        if module in ("training.configs", "txl_tf.text.pickled_vocab"):
            assert importlib.util.find_spec(module), (name, command)
            continue
        known = (part_flags(module, command) or job_flags(module)) | ABSL_FLAGS
        used = {re.sub(r"^no", "", f) if re.sub(r"^no", "", f) in known else f
                for f in re.findall(r"(?<!\S)--([a-z_]+)", command)}
        assert used <= known, (name, command, sorted(used - known))
        checked += 1
    assert checked >= 25


# Flags of other tools the docs show: pip, pytest, saved_model_cli, tensorboard, tritonserver.
OTHER_TOOLS_FLAGS = {"no-deps", "dist", "no-loadscope-reorder", "durations", "inputs",
                     "input_exprs", "dir", "tag_set", "signature_def", "outdir", "logdir",
                     "model-repository"}


def test_every_flag_the_docs_name_is_defined():
    """Every `--flag` in the docs' prose and blocks (not only in `python -m`
    lines) is a flag of some job or benchmark; XLA's own (`--xla_...`,
    `--tf_xla_...`, in XLA_FLAGS) aside."""
    known = set(ABSL_FLAGS) | OTHER_TOOLS_FLAGS
    for module in ("export", "txl_tf.convert", *(f"training.{p.stem}" for p in
                   (REPO / "training").glob("*.py") if "SPEC = (" in p.read_text()),
                   *(f"benchmarks.{p.stem}" for p in (REPO / "benchmarks").glob("*.py"))):
        known |= job_flags(module)
    unknown = []
    for path in [*DOCS, REPO / "benchmarks" / "README.md"]:
        for negated, name in re.findall(r"(?<![\w-])--(no)?([a-z][\w-]*)", path.read_text()):
            if name.startswith(("xla_", "tf_xla_")) or name in known or (
                    negated and f"no{name}" in known):
                continue
            unknown.append((path.name, f"--{negated}{name}"))
    assert unknown == []
    assert len(known) > 150


def test_the_sections_the_code_points_to_exist():
    """A docstring or `--help` text that sends the reader to `README, "Section"`
    or `docs/x.md, "Section"` names a heading that file has."""
    found = []
    for folder in ("txl_tf", "training", "export", "benchmarks"):
        for source in (REPO / folder).rglob("*.py"):
            text = re.sub(r"\s+", " ", source.read_text().replace('\\"', '"'))
            for doc, section in re.findall(r"\b(README|docs/[\w-]+\.md), \"([^\"]+)\"", text):
                path = REPO / ("README.md" if doc == "README" else doc)
                headings = (re.findall(r"^#+ (.*)$", path.read_text(), re.M)
                            if path.is_file() else [])
                found.append((source.name, doc, section, section in headings))
    assert [f for f in found if not f[3]] == []
    assert len(found) >= 3


def test_the_repository_paths_the_docs_name_exist():
    """`tests/...`, `txl_tf/...`, `benchmarks/results/...` and the like in the
    docs name a file or folder of the repository (or, ending in `_`, the start
    of file names); `export/` not followed by a module is a run's folder."""
    missing, checked = [], 0
    for path in [*DOCS, REPO / "benchmarks" / "README.md"]:
        for name in re.findall(r"`((?:txl_tf|tests|training|export|benchmarks|docs)/[\w./-]+)",
                               path.read_text()):
            name = name.rstrip(".")
            if name.startswith("export/") and not name.endswith(".py"):
                continue
            checked += 1
            target = REPO / name
            if not (target.exists() or (path.parent / name).exists()
                    or (name.endswith("_") and list(target.parent.glob(target.name + "*")))):
                missing.append((path.name, name))
    assert missing == []
    assert checked >= 50


def test_the_command_table_is_setup_pys_console_scripts():
    """docs/command-line.md's table of installed commands names each console
    script of setup.py once, with the module it runs; the README lists them."""
    scripts = dict(re.findall(r'"(txl-[\w-]+) = ([\w.]+?)(?:\.__main__)?:console"',
                              (REPO / "setup.py").read_text()))
    table = (REPO / "docs" / "command-line.md").read_text().split("## The installed commands")[1]
    rows = dict(re.findall(r"^\| `(txl-[\w-]+)` \| `([\w.]+)` \|", table, re.M))
    assert len(scripts) >= 10
    assert rows == scripts
    assert set(re.findall(r"`(txl-[\w-]+)`", (REPO / "README.md").read_text())) == set(scripts)


def test_the_decode_cache_size_table_is_cache_bytes():
    """docs/export-and-serving.md's table of cache sizes per preset is what
    `export.decode_cache.cache_bytes` says (MB of 10^6 bytes, one decimal)."""
    from export.decode_cache import cache_bytes
    from txl_tf import TransformerXLConfig
    text = (REPO / "docs" / "export-and-serving.md").read_text()
    table = text.split("**Its size**")[1].split("\n\n")[1]
    rows = re.findall(r"^\| (`.*?) \| ([\d,]+) \| ([\d,.]+) MB \| ([\d,.]+) MB \|$", table, re.M)
    checked = 0
    for presets, memory, per_stream, shared in rows:
        for preset in re.findall(r"`(\w+)`", presets):
            size = cache_bytes(TransformerXLConfig.preset(preset), int(memory.replace(",", "")))
            assert (f"{size['per_stream'] / 1e6:,.1f}", f"{size['shared'] / 1e6:,.1f}") == (
                per_stream, shared), preset
            checked += 1
    assert checked == 7


def test_the_readmes_code_tree_names_every_package():
    """README's "The code" tree and txl_tf's docstring name every sub-package
    of txl_tf, and the tree every top-level folder of code."""
    import txl_tf
    tree = (REPO / "README.md").read_text().split("## The code")[1].split("```")[1]
    packages = {p.parent.name for p in (REPO / "txl_tf").glob("*/__init__.py")}
    assert {p for p in packages if not re.search(rf"^\s+{p}/", tree, re.M)} == set()
    assert {p for p in packages if f"`{p}/`" not in txl_tf.__doc__} == set()
    assert {p for p in ("txl_tf", "training", "export", "benchmarks", "tests")
            if not re.search(rf"^{p}/", tree, re.M)} == set()
    assert len(packages) >= 10


def test_the_config_fields_the_model_doc_lists_are_the_configs():
    """docs/model.md's list of `TransformerXLConfig`'s fields is all of them."""
    from txl_tf import TransformerXLConfig
    text = (REPO / "docs" / "model.md").read_text().split("## The pure core")[0]
    listed = re.search(r"`TransformerXLConfig` holds .*?\(`([\w,\s]+)`\)", text, re.S).group(1)
    named = set(re.split(r",\s*", listed.strip())) | set(re.findall(r"`(vocab_fingerprint)`", text))
    assert named == set(TransformerXLConfig.__dataclass_fields__)


def test_the_docs_python_imports_resolve():
    checked = 0
    for path in DOCS:
        for block in code_blocks(path, ("python",)):
            for module, names in re.findall(r"^\s*from ((?:txl_tf|export)[\w.]*) import ([\w, ]+)",
                                            block, re.M):
                found = importlib.import_module(module)
                for name in filter(None, (n.strip() for n in names.split(","))):
                    assert hasattr(found, name) or importlib.util.find_spec(
                        f"{module}.{name}"), (path.name, f"from {module} import {name}")
                    checked += 1
    assert checked >= 20


def _resolves(dotted):
    """Whether `dotted` names a module or an attribute of one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attribute in parts[i:]:
                found = getattr(found, attribute)
        except AttributeError:
            return False
        return True
    return False


def test_the_docs_dotted_names_resolve():
    """`txl_tf.x.y` and `export.x.y` in backticks name a module or an attribute."""
    names = [(path.name, n) for path in DOCS
             for n in re.findall(r"`((?:txl_tf|export)(?:\.[A-Za-z_]\w*)+)", path.read_text())]
    assert len(names) >= 50
    assert [n for n in names if not _resolves(n[1])] == []


def test_the_codes_dotted_names_resolve():
    """`txl_tf.x.y`, `export.x.y` and `training.x.y` in the docstrings and
    `--help` texts of the code name a module or an attribute, as in the docs."""
    names = [(source.name, n) for folder in ("txl_tf", "export", "training")
             for source in (REPO / folder).rglob("*.py")
             for n in re.findall(r"`((?:txl_tf|export|training)(?:\.[A-Za-z_]\w*)+)",
                                 source.read_text())]
    assert len(names) >= 100
    assert [n for n in names if not _resolves(n[1])] == []


def test_every_exported_name_imports_and_is_documented():
    import txl_tf
    text = "\n".join(path.read_text() for path in DOCS)
    for name in txl_tf.__all__:
        getattr(txl_tf, name)
    assert [n for n in txl_tf.__all__ if not re.search(rf"\b{n}\b", text)] == []


@pytest.mark.skipif(sys.platform == "win32", reason="bash tour")
def test_the_readme_tour_runs(tmp_path, jobs):
    """Its command and its Python blocks, each in a forked child of the
    worker's job runner (`tests.cli_runner`), as `python -m` and `python -c`
    run them."""
    readme = REPO / "README.md"
    tour_section = readme.read_text().split("## A five-minute tour")[1].split("\n## ")[0]
    shell = commands(re.search(r"```bash\n(.*?)```", tour_section, re.S).group(1))
    python = re.findall(r"```python\n(.*?)```", tour_section, re.S)
    assert [c.split()[2] for c in shell] == ["export"]
    assert 'TransformerXLCausalLM.from_preset("pystdlib_small")' in python[0]
    for command in shell:
        _, _, module, *args = shlex.split(command)
        jobs.run(module, args, check=True, cwd=tmp_path)
    for block in python:  # the causal LM (generate, fit, save_to_preset), then ONNX Runtime
        done = jobs.run("-c", [block], check=True, cwd=tmp_path)
        assert len(done.stdout) > 0
    assert (tmp_path / "runs" / "tour_preset" / "model.weights.h5").is_file()


def test_the_readme_python_section_runs(tmp_path, jobs):
    """As written, at the tiny preset's size (the same calls)."""
    section = (REPO / "README.md").read_text().split("## In Python")[1].split("\n## ")[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    assert 'preset("wt103_base")' in block
    jobs.run("-c", [block.replace('"wt103_base"', '"tiny"')], check=True, cwd=tmp_path)


def test_the_serving_sections_python_block_runs_as_written(tmp_path, jobs):
    """docs/export-and-serving.md's "Serving without TensorFlow" block, on an
    export job's `out/` (a tiny byte-level model): opens it, generates from
    the prompt and prints the prompt and its continuation."""
    from txl_tf import TransformerXL, TransformerXLConfig
    from txl_tf.text import ByteTokenizer
    from txl_tf.weights import save_pretrained
    section = (REPO / "docs" / "export-and-serving.md").read_text().split(
        "### Serving without TensorFlow")[1].split("\n### ")[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    assert 'open_runtime("out", device="cpu")' in block
    save_pretrained(TransformerXL(TransformerXLConfig.preset("tiny", n_token=256, mem_len=8)),
                    str(tmp_path / "model"), ByteTokenizer())
    jobs.run("export", [f"--model_dir={tmp_path / 'model'}", f"--output_dir={tmp_path / 'out'}",
                        "--formats=onnx", "--noverify"], check=True)
    done = jobs.run("-c", [block], check=True, cwd=tmp_path)
    assert done.stdout.startswith("import os") and len(done.stdout) > len("import os\n")


# Exported callables whose parameters are documented elsewhere than an `Args:`
# section, each with where.
ARGS_ELSEWHERE = {
    "TransformerXLConfig": "a dataclass of some 30 hyper-parameters: docs/model.md lists and "
                           "explains every field (a test above holds the list whole)",
    "Generation": "a result the decoders build, not called by users; its docstring names "
                  "each field",
    "DecodeState": "a result the decoders build, not called by users; its docstring names "
                   "each field",
}


def _lacks_args(obj):
    """Whether `obj` takes parameters but neither its docstring nor (for a
    class) its `__init__`'s has an `Args:` section."""
    import inspect
    try:
        params = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
    except (TypeError, ValueError):
        return False
    docs = [inspect.getdoc(obj) or ""]
    if inspect.isclass(obj) and "__init__" in vars(obj):
        docs.append(vars(obj)["__init__"].__doc__ or "")
    return bool(params) and not any(re.search(r"^\s*Args:\s*$", d, re.M) for d in docs)


def test_every_exported_callable_documents_its_arguments():
    import inspect

    import export
    import txl_tf

    def prose_only(a, b=1):
        """Takes `a` and `b`."""

    def documented(a):
        """Takes a.

        Args:
            a: a thing.
        """
    assert _lacks_args(prose_only) and not _lacks_args(documented)
    lacking = set()
    for package in (txl_tf, export):
        for name in package.__all__:
            obj = getattr(package, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                continue  # exceptions take their message
            if callable(obj) and _lacks_args(obj):
                lacking.add(name)
    assert sorted(lacking - set(ARGS_ELSEWHERE)) == []
    assert sorted(set(ARGS_ELSEWHERE) - lacking) == []  # an exception no longer needed


def test_the_bad_input_tables_jobs_are_the_ones_the_docs_name():
    """docs/command-line.md and docs/testing.md say how many command lines of
    which jobs `tests/test_bad_inputs.py` runs: its `CLI_CASES`' modules."""
    cases = importlib.import_module("test_bad_inputs").CLI_CASES  # tests/ is on sys.path
    short = {c[1].split(".")[-1].replace("attention_picture", "attention") for c in cases}
    numbers = {"eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
    text = re.sub(r"\s+", " ", (REPO / "docs" / "command-line.md").read_text())
    count, word, names = re.search(r"~(\d+) command lines of (\w+) jobs \(([^)]*)\)",
                                   text).groups()
    assert set(names.split(", ")) == short
    assert numbers[word] == len(short)
    assert abs(int(count) - len(cases)) <= 0.1 * len(cases), len(cases)
    testing = re.sub(r"\s+", " ", (REPO / "docs" / "testing.md").read_text())
    assert numbers[re.search(r"(\w+) of the command-line jobs", testing).group(1)] == len(short)


def test_every_extra_of_setup_py_is_named_in_the_docs():
    """An extra the docs never name (`pip install ".[viz]"`) is one a user
    cannot find; the README's and docs' PNGs need one."""
    extras = set(setup_extras((REPO / "setup.py").read_text()))
    text = "\n".join(p.read_text() for p in [*DOCS, REPO / "benchmarks" / "README.md",
                                             REPO / "Makefile"])
    assert len(extras) >= 5
    assert sorted(e for e in extras if f"[{e}]" not in text) == []


def setup_extras(source):
    """`{extra: [requirement, ...]}`: the `extras_require` literal of a
    setup.py's source, read with `ast` (any name, any layout)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg == "extras_require":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py passes no extras_require")


def test_the_readmes_extras_table_is_setup_pys_extras():
    """README's table of what each extra adds: one row per extra, naming each
    of its requirements, and the versions it names are setup.py's: a floor
    (≥) the requirement's floor, a version the requirement admits."""
    from packaging.requirements import Requirement
    extras = setup_extras((REPO / "setup.py").read_text())
    readme = (REPO / "README.md").read_text()
    table = readme.split("What each extra adds")[1].split("\n\n")[1]
    rows = dict(re.findall(r"^\| `([\w.-]+)` \| ([^|]+) \|", table, re.M))
    assert sorted(rows) == sorted(extras)
    for extra, requirements in extras.items():
        for requirement in map(Requirement, requirements):
            assert requirement.name.lower() in rows[extra].lower(), (extra, requirement.name)
            named = re.search(rf"(?<![\w-])`?{re.escape(requirement.name)}`? (≥ )?(\d[\d.]*)",
                              rows[extra])
            if named and named.group(1):
                assert f">={named.group(2)}" in map(str, requirement.specifier), named.group(0)
            elif named:
                assert requirement.specifier.contains(named.group(2)), named.group(0)


def test_setup_pys_extras_are_read_whatever_their_names_and_layout():
    """A line regex over setup.py missed an extra named with a hyphen (or
    written without a space): the two tests above passed without its row."""
    source = ('setup(name="x", extras_require={"a-b": ["p>=1"], "c":["q>=2,<3"],\n'
              '    "d_e": [\n        "r"]})')
    assert setup_extras(source) == {"a-b": ["p>=1"], "c": ["q>=2,<3"], "d_e": ["r"]}


def test_flags_written_after_a_command_in_prose_are_that_commands():
    """A `` `training.classify --grad_segments=K` `` or `` `txl-generate
    --num_tokens=N` `` span of the prose names flags of that command (the
    code-block test above checks `python -m` lines; a flag of another job
    would pass `test_every_flag_the_docs_name_is_defined`)."""
    scripts = dict(re.findall(r'"(txl-[\w-]+) = ([\w.]+?)(?:\.__main__)?:console"',
                              (REPO / "setup.py").read_text()))
    scripts = {k: ("txl_tf.convert" if v == "txl_tf.weights.convert" else v)
               for k, v in scripts.items()}
    wrong, checked = [], 0
    for path in [*DOCS, REPO / "benchmarks" / "README.md"]:
        for span in re.findall(r"`([^`\n]+)`", path.read_text()):
            found = re.match(r"(?:python -m )?((?:training|benchmarks)\.\w+|export|"
                             r"txl_tf\.convert|txl-[\w-]+)\s+(.*)", span)
            flags = re.findall(r"(?<!\S)--([a-z_]+)", found.group(2)) if found else []
            if not flags:
                continue
            module = scripts.get(found.group(1), found.group(1))
            known = (part_flags(module, span) or job_flags(module)) | ABSL_FLAGS
            checked += 1
            wrong += [(path.name, span, f) for f in flags
                      if f not in known and not (f.startswith("no") and f[2:] in known)]
    assert wrong == []
    assert checked >= 30


def test_the_packages_docstring_examples_import_what_they_call():
    """`export`'s docstring example calls `write_triton_repository`,
    `export_classifier`, ...: each name of the package it calls is imported
    in the example, so it runs as written."""
    import export
    import txl_tf
    checked = 0
    for package in (txl_tf, export):
        for block in re.findall(r"```python\n(.*?)```", package.__doc__ or "", re.S):
            imported = set()
            for names in re.findall(r"^from [\w.]+ import \(?([\w,\s]+)\)?", block, re.M):
                imported |= {n.strip() for n in names.split(",") if n.strip()}
            called = set(re.findall(r"(?<![\w.])(\w+)\(", block)) & set(package.__all__)
            assert sorted(called - imported) == [], package.__name__
            checked += 1
    assert checked >= 1


# Short names the docs use for a variable or a file, not the module of that name.
NOT_MODULES = {"model", "runtime", "core", "memory", "cache", "config", "weights", "parity",
               "metrics", "vocab", "recl", "saved_model", "slab"}


def test_the_docs_short_module_references_resolve():
    """`` `decode_cache.write_token` ``, `` `ring_cache.after` ``: a module of
    txl_tf or export by its last name, then an attribute it has."""
    import pkgutil
    modules = {}
    for base in ("txl_tf", "export"):
        for info in pkgutil.walk_packages(importlib.import_module(base).__path__, base + "."):
            if not info.name.endswith("__main__"):
                modules.setdefault(info.name.rsplit(".", 1)[1], []).append(info.name)
    missing, checked = [], 0
    for path in DOCS:
        for short, attribute in re.findall(r"`(?<![\w.])([a-z_]\w*)\.([A-Za-z_]\w*)",
                                           path.read_text()):
            if short not in modules or short in NOT_MODULES:
                continue
            checked += 1
            if not any(hasattr(importlib.import_module(m), attribute) for m in modules[short]):
                missing.append((path.name, f"{short}.{attribute}"))
    assert missing == []
    assert checked >= 3
