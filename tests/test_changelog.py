"""CHANGELOG.md agrees with the code: its newest release is the version that
setup.py gives pip and `txl_tf.__version__`, every deprecated name the
code still answers is listed under that release's "Deprecated" with the
release that removes it, the one its warning names, and every removed name
that names its replacement under "Removed"."""
import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import txl_tf
from txl_tf.app.deprecation import REMOVED, REMOVED_IN

REPO = Path(__file__).resolve().parent.parent
CHANGELOG = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")


def releases():
    """The changelog's release numbers, newest first."""
    return re.findall(r"^## (\d+\.\d+\.\d+) ", CHANGELOG, re.M)


def newest_section(heading):
    """The text under `### heading` of the newest release."""
    newest = CHANGELOG.split(f"\n## {releases()[0]} ")[1].split("\n## ")[0]
    return newest.split(f"\n### {heading}\n")[1].split("\n### ")[0]


def version(text):
    return tuple(int(part) for part in text.split("."))


def test_setup_py_the_package_and_the_changelog_name_one_version():
    built = subprocess.run([sys.executable, "setup.py", "--version"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-2000:]
    assert built.stdout.split()[-1] == txl_tf.__version__ == releases()[0]
    assert releases() == sorted(releases(), key=version, reverse=True)


@functools.cache
def code_nodes():
    """`{path: [every AST node]}` of the three packages' modules."""
    return {str(path.relative_to(REPO)): list(ast.walk(ast.parse(path.read_text("utf-8"))))
            for package in ("txl_tf", "export", "training")
            for path in sorted((REPO / package).rglob("*.py"))}


def warned_names():
    """The first argument of every `warn_deprecated("Class.name", ...)` call."""
    return [node.args[0].value for nodes in code_nodes().values() for node in nodes
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "warn_deprecated"
            and isinstance(node.args[0], ast.Constant)]


def unreleased_section(heading):
    """The text under `### heading` of "Unreleased" (empty without one)."""
    unreleased = CHANGELOG.split("\n## Unreleased\n")[1].split("\n## ")[0]
    parts = unreleased.split(f"\n### {heading}\n")
    return parts[1].split("\n### ")[0] if len(parts) > 1 else ""


def bullets(text):
    """The bullets of a section, each on one line."""
    return [" ".join(b.split()) for b in ("\n" + text).split("\n- ")[1:]]


def test_every_deprecated_name_is_listed_with_the_release_that_removes_it():
    """Under the newest release's "Deprecated", or, deprecated since, Unreleased's."""
    assert version(REMOVED_IN) > version(txl_tf.__version__)
    deprecated = bullets(newest_section("Deprecated") + "\n" + unreleased_section("Deprecated"))
    names = [old.split(".", 1)[1].replace("...", "") for old in warned_names()]
    assert names, "warned_names finds no warn_deprecated call"
    for name in names:
        listed = [b for b in deprecated if f"`{name}`" in b]
        assert listed and all(f"removed in {REMOVED_IN}" in b for b in listed), (name, listed)
        assert not any(removed.endswith(f".{name}") for removed in REMOVED), name


def test_every_removed_name_is_listed_under_removed():
    """Under "Removed" (Unreleased's, or the release's that removed it),
    beside the call that replaces it."""
    removed = bullets("\n".join(part.split("\n### ")[0].split("\n## ")[0]
                                for part in CHANGELOG.split("\n### Removed\n")[1:]))
    for old, replacement in REMOVED.items():
        name = old.split(".", 1)[1]
        listed = [b for b in removed if f"`{name}`" in b]
        assert listed, old
        assert any(f"`{replacement.split('(')[0]}" in b for b in listed), (old, listed)


def test_only_the_one_helper_warns_of_a_deprecation():
    """So every deprecated name's warning names `REMOVED_IN`."""
    warners = [path for path, nodes in code_nodes().items()
               if any(isinstance(n, ast.Name) and n.id == "DeprecationWarning" for n in nodes)]
    assert warners == ["txl_tf/app/deprecation.py"]
