"""A model directory has one owner: a second job on it is refused and touches
nothing; the lock dies with its holder, so a restart after a kill proceeds."""
import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from training.errors import TrainingError
from training.lock import WINDOWS_LOCKED_BYTE, DirectoryLock, lock_path
from job_helpers import job_command, job_env, tail, write_text_corpus


def _args(tmp_path, **changes):
    flags = {"model_dir": tmp_path / "run", "dataset": "text",
             "data_dir": tmp_path / "corpus.txt", "cache_dir": tmp_path / "cache",
             "preset": "tiny", "batch_size": 4, "train_steps": 100_000,
             "checkpoint_every": 5, "log_every": 1, "strategy": "one_device", "verbose": 0}
    flags.update(changes)
    return [f"--{k}={v}" for k, v in flags.items()] + ["--nofinal_eval"]


def _files(run):
    paths = (run / "flags.json", run / "config.json", run / "checkpoints" / "run.json")
    return {p.name: p.read_bytes() for p in paths if p.exists()}


def test_second_job_is_refused_until_the_owner_dies(tmp_path, jobs):
    write_text_corpus(tmp_path / "corpus.txt", 20_000, seed=6)
    run = tmp_path / "run"
    owner = subprocess.Popen(job_command("training.train", _args(tmp_path)), env=job_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while not (run / "checkpoints" / "checkpoint").exists() and owner.poll() is None \
                and time.time() < deadline:
            time.sleep(0.05)
        assert owner.poll() is None, tail(owner.communicate()[0])
        before = _files(run)

        second = jobs.run("training.train", _args(tmp_path, train_steps=7, batch_size=2))
        assert second.returncode == 2, tail(second.stdout + second.stderr)
        assert (f"error: --model_dir {run} is in use by another training job (pid "
                f"{owner.pid} on host") in second.stderr
        assert "Traceback" not in second.stderr and "starting at step" not in second.stdout
        assert _files(run) == before  # the owner's files are untouched
        lines = (run / "train_log.jsonl").read_text().split("\n")[:-1]  # the owner may be
        steps = [json.loads(line)["step"] for line in lines]            # mid-line: drop it
        assert steps == list(range(1, len(steps) + 1))  # one writer: no line twice
        assert owner.poll() is None
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.communicate(timeout=60)

    restart = jobs.run("training.train", _args(tmp_path, train_steps=1), check=True)
    assert "resumed from" in restart.stdout and "nothing to train" in restart.stdout
    assert json.loads((run / ".lock").read_text())["pid"] != owner.pid


def test_lock_per_task(tmp_path):
    chief = DirectoryLock(lock_path(tmp_path), "--model_dir x")
    worker = DirectoryLock(lock_path(tmp_path, 1, False), "--model_dir x (worker 1)")
    with pytest.raises(TrainingError, match=r"--model_dir x is in use by another training "
                                            r"job \(pid \d+ on host"):
        DirectoryLock(lock_path(tmp_path), "--model_dir x")
    chief.release()
    DirectoryLock(lock_path(tmp_path), "--model_dir x").release()
    worker.release()


def _fake_msvcrt(calls):
    """Windows's `msvcrt.locking`, made of `flock` (also per open file), with
    the byte each call locks recorded."""
    import fcntl
    import types

    def locking(fd, mode, nbytes):
        calls.append((mode, os.lseek(fd, 0, os.SEEK_CUR), nbytes))
        try:
            fcntl.flock(fd, fcntl.LOCK_UN if mode == 0 else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PermissionError(errno.EACCES, "Permission denied") from None

    return types.SimpleNamespace(locking=locking, LK_UNLCK=0, LK_NBLCK=2)


def test_without_fcntl_windows_locks_a_byte_past_the_owner(tmp_path, monkeypatch):
    """Windows has no `fcntl` (training.lock imported it: every training job
    ended in a traceback). There `msvcrt.locking` locks one byte far past the
    owner's text, which a second job reads (Windows's locks are mandatory)."""
    calls = []
    monkeypatch.setitem(sys.modules, "msvcrt", _fake_msvcrt(calls))
    monkeypatch.setitem(sys.modules, "fcntl", None)
    owner = DirectoryLock(lock_path(tmp_path), "--model_dir x")
    with pytest.raises(TrainingError, match=rf"--model_dir x is in use by another training "
                                            rf"job \(pid {os.getpid()} on host"):
        DirectoryLock(lock_path(tmp_path), "--model_dir x")
    owner.release()
    DirectoryLock(lock_path(tmp_path), "--model_dir x").release()
    assert calls == [(2, WINDOWS_LOCKED_BYTE, 1)] * 2 + [(0, WINDOWS_LOCKED_BYTE, 1)] + \
        [(2, WINDOWS_LOCKED_BYTE, 1), (0, WINDOWS_LOCKED_BYTE, 1)]
    assert json.loads((tmp_path / ".lock").read_text(encoding="utf-8"))["pid"] == os.getpid()


def test_without_any_file_lock_the_job_runs_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "msvcrt", None)
    monkeypatch.setitem(sys.modules, "fcntl", None)
    with DirectoryLock(lock_path(tmp_path), "--model_dir x"):
        assert json.loads((tmp_path / ".lock").read_text(encoding="utf-8"))["pid"] == \
            os.getpid()
    assert capsys.readouterr().err == ("warning: this platform has no file lock: nothing "
                                       "stops a second job on --model_dir x\n")
