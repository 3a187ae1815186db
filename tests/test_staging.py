"""The export folder's staging (`export.staging`): a kill between
`swap_in`'s two renames loses nothing at the next run."""
import os
import subprocess
import sys

import pytest

from export.staging import remove_stale, staged_folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Writes "new" through staged_folder into argv[1], killed (os._exit) at swap_in's second rename.
KILLED_SWAP = """
import os, sys
from export import staging
renames = []
def rename(src, dst):
    renames.append(src)
    if len(renames) == 2:
        os._exit(9)
    os.rename(src, dst)
staging.os = type("os", (), {**vars(os), "rename": staticmethod(rename)})
with staging.staged_folder(sys.argv[1]) as out:
    open(os.path.join(out, "new"), "w").close()
"""


@pytest.fixture
def killed_between_the_renames(tmp_path):
    """`exports/out` held the file `previous`; an export into it was killed
    after moving it aside, before putting the new one in its place."""
    out = tmp_path / "exports" / "out"
    out.mkdir(parents=True)
    (out / "previous").write_text("the previous export")
    killed = subprocess.run([sys.executable, "-c", KILLED_SWAP, str(out)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": REPO}, capture_output=True)
    assert killed.returncode == 9, killed.stderr.decode()[-2000:]
    assert not out.exists() and len(os.listdir(out.parent)) == 2  # its old and staging folders
    return out


def test_a_failed_next_export_puts_the_previous_one_back(killed_between_the_renames):
    out = killed_between_the_renames
    with pytest.raises(RuntimeError):
        with staged_folder(str(out)):
            raise RuntimeError("the next export fails")
    assert os.listdir(out.parent) == ["out"]
    assert (out / "previous").read_text() == "the previous export"


def test_the_next_export_replaces_the_previous_one(killed_between_the_renames):
    out = killed_between_the_renames
    with staged_folder(str(out)) as staging:
        open(os.path.join(staging, "next"), "w").close()
    assert os.listdir(out.parent) == ["out"] and os.listdir(out) == ["next"]


def test_a_staging_folder_named_with_non_ascii_digits_is_no_traceback(tmp_path):
    """`str.isdigit` takes '²', which `int()` refuses: every export beside
    such a folder ended in a `ValueError` traceback. It is stale, as any
    name without a pid."""
    (tmp_path / ".out.tmp-\u00b2-1").mkdir()
    (tmp_path / f".out.tmp-{os.getpid()}-1").mkdir()  # a running export's: kept
    assert remove_stale(str(tmp_path / "out")) == [".out.tmp-\u00b2-1"]
