"""`txl_tf.app.files.stage`: a folder's files replaced together, the marker
last; what a kill at any point leaves."""
import os
import shutil
import sys

import pytest

from txl_tf.app import files


def _save(folder, version, marker="config.json"):
    with files.stage(os.path.join(folder, marker)) as staged:
        with open(staged.path(os.path.join(folder, "weights.bin")), "w") as f:
            f.write(version)
        os.makedirs(staged.path(os.path.join(folder, "vocab")))
        with open(os.path.join(staged.path(os.path.join(folder, "vocab")), "v.txt"), "w") as f:
            f.write(version)
        with open(staged.path(os.path.join(folder, marker)), "w") as f:
            f.write(version)
        staged.drop(os.path.join(folder, "export"))


def _state(folder):
    """The version the folder holds, None without its marker, or "mixed"."""
    if not os.path.exists(os.path.join(folder, "config.json")):
        return None
    found = {open(os.path.join(folder, name)).read()
             for name in ("config.json", "weights.bin", os.path.join("vocab", "v.txt"))}
    return found.pop() if len(found) == 1 else "mixed"


def test_a_kill_at_any_rename_leaves_one_version_or_no_marker(tmp_path,
                                                              killed_at_file_operation):
    seen = set()
    for k in range(1, 30):
        folder = str(tmp_path / f"k{k}")
        _save(folder, "old")
        os.makedirs(os.path.join(folder, "export", "deep"))
        done = killed_at_file_operation(lambda: _save(folder, "new"), k)
        state = _state(folder)
        assert state != "mixed", f"killed at {k}"
        seen.add(state)
        if done:
            break
    assert done and seen == {"old", None, "new"}
    _save(folder, "again")  # a later save in this process: its own leftovers aside
    assert _state(folder) == "again"


def test_a_dropped_folder_goes_at_once(tmp_path, monkeypatch):
    """A folder of the previous save that the new one does not write went
    with `shutil.rmtree` in place: a kill during it left half of it."""
    folder = str(tmp_path / "m")
    _save(folder, "old")
    os.makedirs(os.path.join(folder, "export", "deep"))

    def killed(path, *args, **kwargs):
        raise KeyboardInterrupt  # a SIGKILL while deleting
    monkeypatch.setattr(files.Staged, "discard", lambda self: None)
    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        _save(folder, "new")
    assert not os.path.exists(os.path.join(folder, "export"))


def test_a_failed_save_leaves_the_folder_as_it_was(tmp_path):
    folder = str(tmp_path / "m")
    _save(folder, "old")
    with pytest.raises(OSError):
        with files.stage(os.path.join(folder, "config.json")) as staged:
            with open(staged.path(os.path.join(folder, "weights.bin")), "w") as f:
                f.write("new")
            raise OSError("disk full")
    assert sorted(os.listdir(folder)) == ["config.json", "vocab", "weights.bin"]
    assert _state(folder) == "old"


def test_leftovers_of_processes_that_are_gone_are_removed(tmp_path):
    import subprocess
    import sys
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for name in (f".tmp-{gone}-weights.bin", f".tmp-{os.getpid()}-weights.bin",
                 ".tmp-x-weights.bin", "weights.bin"):
        (tmp_path / name).write_text("x")
    (tmp_path / f".tmp-{gone}-vocab.old").mkdir()
    assert files.remove_leftovers(str(tmp_path)) == [f".tmp-{gone}-vocab.old",
                                                     f".tmp-{gone}-weights.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".tmp-{os.getpid()}-weights.bin", ".tmp-x-weights.bin", "weights.bin"]
    shutil.rmtree(tmp_path)


def test_a_linked_or_other_kind_of_entry_is_replaced_not_broken(tmp_path):
    """`vocab` a link to a shared folder: the rename of the new folder onto
    the link failed (NotADirectoryError) after the marker was removed, so the
    previous save lost its config.json. The link is replaced (what it names
    is left alone), as a folder is where the new save writes a file (the
    marker's went with IsADirectoryError, the others' after it was gone)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "v.txt").write_text("shared")
    folder = str(tmp_path / "m")
    os.makedirs(folder)
    os.symlink(shared, os.path.join(folder, "vocab"))
    for name in ("weights.bin", "config.json"):  # folders where files are written
        (tmp_path / "m" / name).mkdir()
    _save(folder, "new")
    assert _state(folder) == "new" and not os.path.islink(os.path.join(folder, "vocab"))
    assert (shared / "v.txt").read_text() == "shared"
    assert sorted(os.listdir(folder)) == ["config.json", "vocab", "weights.bin"]


def test_replacing_puts_the_file_in_with_one_rename_or_leaves_it(tmp_path):
    import subprocess
    import sys
    path = tmp_path / "a.png"
    path.write_bytes(b"old")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / f".tmp-{gone}-a.png").write_bytes(b"half")  # a killed writer's
    with pytest.raises(RuntimeError):
        with files.replacing(str(path)) as temporary:
            assert temporary.endswith("a.png")  # the suffix a writer reads its format from
            with open(temporary, "wb") as f:
                f.write(b"ha")
            raise RuntimeError("failed")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["a.png"]
    with files.replacing(str(path)) as temporary:
        with open(temporary, "wb") as f:
            f.write(b"new")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["a.png"]


def test_a_figure_written_over_another_is_whole_or_the_old_one(tmp_path, monkeypatch):
    """The PNG figures were written in place: a kill (or a full disk) while
    matplotlib wrote one left half a file over the previous figure."""
    import matplotlib
    matplotlib.use("Agg")
    import numpy as np
    from matplotlib.figure import Figure

    from benchmarks.eval_speed import plot
    from training import demo, recl
    from txl_tf.classification.attention_picture import write_attention_png

    def killed(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"\x89PNG half")
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(Figure, "savefig", killed)
    writers = {
        "recl.png": lambda p: recl._plot({"contexts": [1, 2], "gains": {},
                                          "mean_loss": {"m": [1.0, 0.5]}}, p),
        "loss_by_context.png": lambda p: demo._plot([(0, 1, 2.0), (1, 2, 1.5)], p),
        "attention.png": lambda p: write_attention_png(p, np.full((2, 3), 0.5),
                                                       np.ones((2, 3), bool), 1),
        "speed.png": lambda p: plot([{"batch": 1, "length": 2, "speedup": 1.5}], p)}
    for name, write in writers.items():
        (tmp_path / name).write_bytes(b"old figure")
        with pytest.raises(KeyboardInterrupt):
            write(str(tmp_path / name))
        assert (tmp_path / name).read_bytes() == b"old figure", name
    assert sorted(os.listdir(tmp_path)) == sorted(writers)


class _Kernel32:
    """Windows's kernel32 as `process_alive` calls it: the pids in `running`
    run, those in `others` are another user's (access denied), those in
    `exited` have ended while a handle keeps their process object."""

    def __init__(self, running, others, exited=()):
        self.running, self.others, self.exited = running, others, set(exited)
        self.error, self.closed = 0, []

    def OpenProcess(self, access, inherit, pid):
        self.error = 5 if pid in self.others else 87  # access denied; no such process
        return pid if pid in self.running | self.exited else 0

    def GetExitCodeProcess(self, handle, code):
        code._obj.value = 0 if handle in self.exited else 259  # STILL_ACTIVE
        return 1

    def CloseHandle(self, handle):
        self.closed.append(handle)


def test_leftovers_on_windows_are_told_by_a_process_handle(tmp_path, monkeypatch):
    """On Windows `os.kill(pid, 0)` is no probe: it sends Ctrl-C to pid's
    process group, and fails (`OSError`, WinError 87) for any other pid, so
    a leftover of a killed writer made every later save of its folder fail."""
    import ctypes

    def kill(pid, signum):  # GenerateConsoleCtrlEvent(CTRL_C_EVENT, pid)
        raise OSError(22, "The parameter is incorrect")

    kernel32 = _Kernel32(running={4242}, others={4343}, exited={4444})
    monkeypatch.setattr(ctypes, "WinDLL", lambda name, use_last_error: kernel32, raising=False)
    monkeypatch.setattr(ctypes, "get_last_error", lambda: kernel32.error, raising=False)
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(files.os, "kill", kill)
    for pid in (4141, 4242, 4343, 4444, 2 ** 40):
        (tmp_path / f".tmp-{pid}-weights.bin").write_text("x", encoding="utf-8")
    assert files.remove_leftovers(str(tmp_path)) == [".tmp-1099511627776-weights.bin",
                                                     ".tmp-4141-weights.bin",
                                                     ".tmp-4444-weights.bin"]
    assert sorted(kernel32.closed) == [4242, 4444]
    _save(str(tmp_path), "1")
    assert _state(str(tmp_path)) == "1"


def test_a_leftover_with_a_pid_past_c_int_is_gone(tmp_path):
    """A pid past C's int ended in an `OverflowError` traceback, one of
    digits that are not ASCII (`str.isdigit`: '²') in a `ValueError` one."""
    (tmp_path / f".tmp-{2 ** 70}-weights.bin").write_text("x", encoding="utf-8")
    (tmp_path / ".tmp-\u00b2-weights.bin").write_text("x", encoding="utf-8")
    assert files.remove_leftovers(str(tmp_path)) == [f".tmp-{2 ** 70}-weights.bin"]
    assert os.listdir(tmp_path) == [".tmp-\u00b2-weights.bin"]  # no writer of ours: kept
