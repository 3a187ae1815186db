"""One owner per model directory: an OS lock that dies with its process.

`DirectoryLock(path, what)` takes the OS's lock on `path` (`fcntl.flock` on
POSIX, `msvcrt.locking` on Windows; kept open until `release()` or the
process's end, so a killed job leaves no lock behind) and writes `{"pid",
"host", "started"}` into the file for the message a second job gets. Where
the platform has neither, the job runs unlocked and says so.
"""
import contextlib
import errno
import json
import os
import socket
import sys
import time

from training.errors import TrainingError
from txl_tf.app.files import parse_json

# The byte Windows locks: its locks are mandatory (a locked byte cannot be
# read), so the lock stays clear of the owner's text a second job reads.
WINDOWS_LOCKED_BYTE = 2 ** 30


def os_lock():
    """`(lock, unlock)`, functions of an open file: the platform's exclusive,
    non-blocking lock (`lock` raises `OSError` where another holds it), or
    None where there is none.

    Returns:
        The pair, or None.
    """
    try:
        import fcntl
    except ImportError:
        pass
    else:
        return (lambda f: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB),
                lambda f: fcntl.flock(f, fcntl.LOCK_UN))
    try:
        import msvcrt
    except ImportError:
        return None

    def locking(f, mode):
        os.lseek(f.fileno(), WINDOWS_LOCKED_BYTE, os.SEEK_SET)
        msvcrt.locking(f.fileno(), mode, 1)

    return (lambda f: locking(f, msvcrt.LK_NBLCK), lambda f: locking(f, msvcrt.LK_UNLCK))


class DirectoryLock:
    """An exclusive lock on `path`, held from construction to `release()`."""

    def __init__(self, path, what):
        self.path = path
        self._os_lock = os_lock()
        if self._os_lock is None:
            print(f"warning: this platform has no file lock: nothing stops a second job "
                  f"on {what}", file=sys.stderr, flush=True)
        try:
            self._file = open(path, "a+", encoding="utf-8")
        except OSError as err:
            raise TrainingError(f"cannot create the lock file of {what}: {err}") from None
        try:
            if self._os_lock is not None:
                self._os_lock[0](self._file)
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
            self._unlock()
            with contextlib.suppress(OSError):  # its close flushes again
                self._file.close()
            raise TrainingError(f"cannot write the lock file {path} of {what}: "
                                f"{err.strerror or err}") from None

    def _unlock(self):
        if self._os_lock is not None:
            self._os_lock[1](self._file)

    def release(self):
        if not self._file.closed:
            self._unlock()
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def describe_owner(text):
    """`" (pid 12 on host h, started ...)"` from a lock file's text, or `""`."""
    try:
        owner = parse_json(text)
        return f" (pid {owner['pid']} on host {owner['host']}, started {owner['started']})"
    except (ValueError, KeyError, TypeError):
        return ""


def lock_path(model_dir, task_id=0, is_chief=True):
    """The chief locks `<model_dir>/.lock`; worker k `<model_dir>/.lock-worker-<k>`."""
    return os.path.join(model_dir, ".lock" if is_chief else f".lock-worker-{task_id}")
