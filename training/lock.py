"""One owner per model directory: an OS lock that dies with its process.

`acquire(path, what)` takes `fcntl.flock` on `path` (kept open until
`release()` or the process's end, so a killed job leaves no lock behind) and
writes `{"pid", "host", "started"}` into the file for the message a second
job gets.
"""
import contextlib
import errno
import fcntl
import json
import os
import socket
import time

from training.errors import TrainingError


class DirectoryLock:
    """An exclusive lock on `path`, held from construction to `release()`."""

    def __init__(self, path, what):
        self.path = path
        try:
            self._file = open(path, "a+", encoding="utf-8")
        except OSError as err:
            raise TrainingError(f"cannot create the lock file of {what}: {err}") from None
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                self._file.close()
                raise TrainingError(f"cannot lock {path} ({err}); the file system may not "
                                    "support locks: use a local --model_dir") from None
            self._file.seek(0)
            owner = describe_owner(self._file.read())
            self._file.close()
            raise TrainingError(
                f"{what} is in use by another training job{owner} (lock {path}); wait for "
                "it to end or stop it, or use another --model_dir") from None
        try:
            self._file.seek(0)
            self._file.truncate()
            self._file.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                         "started": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
            self._file.flush()
        except OSError as err:  # a full disk: it names no file
            fcntl.flock(self._file, fcntl.LOCK_UN)
            with contextlib.suppress(OSError):  # its close flushes again
                self._file.close()
            raise TrainingError(f"cannot write the lock file {path} of {what}: "
                                f"{err.strerror or err}") from None

    def release(self):
        if not self._file.closed:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def describe_owner(text):
    """`" (pid 12 on host h, started ...)"` from a lock file's text, or `""`."""
    try:
        owner = json.loads(text)
        return f" (pid {owner['pid']} on host {owner['host']}, started {owner['started']})"
    except (ValueError, KeyError, TypeError):
        return ""


def lock_path(model_dir, task_id=0, is_chief=True):
    """The chief locks `<model_dir>/.lock`; worker k `<model_dir>/.lock-worker-<k>`."""
    return os.path.join(model_dir, ".lock" if is_chief else f".lock-worker-{task_id}")
