"""Lines of the project's Python files and shell scripts are at most 100
characters (the house style), so that a diff reads side by side and no line
hides its end."""
import os
import subprocess

import pytest

from repo_files import REPO, python_files

LIMIT = 100


def long_lines(root=REPO):
    """`path:line: length` of every line of the project's Python files and
    shell scripts over `LIMIT`."""
    found = []
    for path in python_files(root, suffixes=(".py", ".sh")):
        with open(os.path.join(root, path), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                length = len(line.rstrip("\n"))
                if length > LIMIT:
                    found.append(f"{path}:{number}: {length}")
    return found


def test_a_long_line_is_found(tmp_path):
    (tmp_path / "txl_tf").mkdir()
    (tmp_path / "txl_tf" / "a.py").write_text("x = 1\n" + "#" * LIMIT + "\n" + "y" * (LIMIT + 1))
    (tmp_path / "txl_tf" / "b.sh").write_text("z" * (LIMIT + 2) + "\n")
    assert long_lines(str(tmp_path)) == [f"txl_tf/a.py:3: {LIMIT + 1}",
                                         f"txl_tf/b.sh:1: {LIMIT + 2}"]


@pytest.mark.parametrize("tracked", [True, False], ids=["git checkout", "source archive"])
def test_a_long_line_of_setup_py_is_found(tmp_path, tracked):
    (tmp_path / "setup.py").write_text("x = '" + "y" * LIMIT + "'\n")
    (tmp_path / "notes.txt").write_text("z" * (LIMIT + 1))  # not Python: not read
    if tracked:
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
        subprocess.run(["git", "-C", str(tmp_path), "add", "setup.py", "notes.txt"], check=True)
    assert long_lines(str(tmp_path)) == [f"setup.py:1: {LIMIT + 6}"]


def test_no_line_is_over_the_limit():
    found = long_lines()
    assert not found, f"lines over {LIMIT} characters:\n" + "\n".join(found)
