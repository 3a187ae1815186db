"""A folder's files replaced together, so that a kill (SIGKILL, a full
disk) never leaves one save's config beside another's weights: each file or
subfolder is written under a temporary name beside its final one, then the
folder's marker (the file a loader looks for first, e.g. `config.json`) is
removed, the others are renamed in, and the marker is renamed in last. A kill
leaves the previous save whole, the new one whole, or a folder without its
marker, which loaders refuse by name. A single file (a figure) is written
likewise under a temporary name and renamed over its final one (`replacing`).
Standard library only."""
import contextlib
import errno as errnos
import json
import os
import re
import shutil
import sys

from txl_tf.errors import TxlError

PREFIX = ".tmp-"  # `.tmp-<pid>-<name>`: keeps the name's suffix (.npz, .keras, .h5)

# The errnos of a write the file system refused: a full disk or quota, a file
# size limit, a read-only or forbidden folder, a device's failure.
WRITE_ERRNOS = frozenset({errnos.ENOSPC, errnos.EFBIG, errnos.EDQUOT, errnos.EROFS,
                          errnos.EACCES, errnos.EPERM, errnos.EIO})
SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")  # numpy's `tofile`, no errno


def parse_json(text):
    """`json.loads(text)`, where JSON nested deeper than the parser recurses
    is a `json.JSONDecodeError` (a ValueError) as other bad JSON is, not a
    RecursionError (a file of 200 KB of `[` reached past every handler)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", "", 0) from None


def temporary_path(path):
    """The temporary name `stage` writes `path` under (same folder, the
    writer's pid in it, the name's suffixes kept)."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f"{PREFIX}{os.getpid()}-{name}")


class Staged:
    """The temporary paths of one save (see `stage`)."""

    def __init__(self, marker):
        self.marker = os.path.abspath(marker)
        self.paths, self.dropped = {}, []

    def path(self, final):
        """Where to write what goes to `final` (a file or a folder).

        Args:
            final: the final path, in the marker's folder.

        Returns:
            The temporary path to write instead.
        """
        final = os.path.abspath(final)
        self.paths[final] = temporary_path(final)
        return self.paths[final]

    def drop(self, final):
        """Deletes `final` (a file or a folder of the previous save that this
        one does not write) at the commit, once the marker is gone.

        Args:
            final: the path to delete.
        """
        self.dropped.append(os.path.abspath(final))

    def commit(self):
        """Removes the marker and the dropped paths, renames the other files
        in, then the marker."""
        for final in [self.marker] + self.dropped:
            if os.path.lexists(final):  # gone at once: a kill leaves no half of it
                old = temporary_path(final) + ".old"
                os.rename(final, old)
                _remove(old)
        for final, temporary in self.paths.items():
            if final != self.marker:
                _replace(temporary, final)
        if self.marker in self.paths:
            _replace(self.paths[self.marker], self.marker)

    def naming(self, err, folder):
        """`err`, an `OSError` of this save, naming the final path of the
        temporary it names (or `folder`, where it names none: see `naming`).

        Args:
            err: the `OSError`.
            folder: the folder saved into.

        Returns:
            `err`, or a `WriteError`.
        """
        name = err.filename
        if name is None or not is_write_error(err):
            return naming(err, folder)
        found = [(temporary, final) for final, temporary in self.paths.items()
                 if isinstance(name, str) and (name == temporary or name.startswith(
                     (temporary + os.sep, temporary + ".")))]
        if not found:
            return err
        temporary, final = max(found, key=lambda pair: len(pair[0]))  # `vocab.json`, not `vocab`
        rest = name[len(temporary):]
        return WriteError(final + rest if rest.startswith(os.sep) else final,
                          err.strerror or str(err), err.errno)

    def discard(self):
        """Deletes the temporaries written so far."""
        for temporary in self.paths.values():
            _remove(temporary)


@contextlib.contextmanager
def stage(marker):
    """Yields a `Staged` whose `path(final)` names the temporary to write
    for `final`; when the block succeeds they replace their final paths,
    `marker` last (see the module doc); when it raises they are deleted and
    the folder is left as it was. Leftovers of a killed writer (`.tmp-<pid>-`
    entries of a process that is gone) are deleted first.

    Args:
        marker: the folder's marker file (its folder is made if missing).
    """
    folder = os.path.dirname(os.path.abspath(marker))
    os.makedirs(folder, exist_ok=True)
    remove_leftovers(folder)
    staged = Staged(marker)
    try:
        yield staged
        staged.commit()
    except BaseException as err:
        staged.discard()
        named = staged.naming(err, folder) if isinstance(err, OSError) else err
        if named is not err:
            raise named from err
        raise


@contextlib.contextmanager
def replacing(path):
    """Yields the temporary path to write instead of the file `path`; when
    the block succeeds one rename puts it at `path`, when it raises it is
    deleted and `path` is left as it was. Leftovers of a killed writer of
    `path` are deleted first.

    Args:
        path: the file to write (its folder must exist).
    """
    remove_leftovers(os.path.dirname(os.path.abspath(path)), os.path.basename(path))
    temporary = temporary_path(path)
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException as err:
        _remove(temporary)
        if isinstance(err, OSError) and err.filename is None:
            raise naming(err, path) from err
        raise


class WriteError(OSError, TxlError):
    """A write that failed, naming where: `cannot write '<path>': <cause>`
    (`filename` the path, `strerror` the cause, `errno` the failed call's,
    None for numpy's short write). An `OSError` as the failed call's was, and
    one of the project's errors (`TxlError`).

    Args:
        path: the file or folder being written.
        cause: what went wrong (an `OSError`'s `strerror`).
        errno: the failed call's errno, or None.
    """

    def __init__(self, path, cause, errno=None):
        super().__init__(errno, cause, os.fspath(path))

    def __str__(self):
        return f"cannot write {self.filename!r}: {self.strerror}"


def naming(err, path):
    """`err`, a failed write's `OSError`, as one that names `path`: a full
    disk met at a write or a close, or numpy's short write, names no file
    (its `error:` line would say "No space left on device" and not where).

    Args:
        err: the `OSError`.
        path: the file or folder being written.

    Returns:
        `err` if it names a file or is no write's (`is_write_error`: a
        broken pipe, a read's error, `shutil.Error`); else a `WriteError`
        naming `path`.
    """
    if err.filename is not None or not is_write_error(err):
        return err
    return WriteError(path, err.strerror or str(err), err.errno)


def reading(err, path):
    """`err`, a failed read of `path`, as one naming `path`: a read() error
    (EIO, a stale network file handle) names no file, and a save around the
    read (the corpus cache's build) would name it as a write (`naming`).

    Args:
        err: the `OSError`.
        path: the file being read.

    Returns:
        `err` if it names a file; else an `OSError` of its errno naming `path`.
    """
    if err.filename is not None:
        return err
    return OSError(err.errno, err.strerror or str(err), os.fspath(path))


def is_write_error(err):
    """Whether `err` is a write the file system refused (`WRITE_ERRNOS`), or
    numpy's short write (no errno), or a `WriteError` made of either.

    Args:
        err: an exception.

    Returns:
        True or False.
    """
    if isinstance(err, WriteError):  # made of one (a nested save's, named by its path)
        return True
    if not isinstance(err, OSError):
        return False
    if err.errno is None:
        return type(err) is OSError and SHORT_WRITE.fullmatch(str(err)) is not None
    return err.errno in WRITE_ERRNOS


def remove_leftovers(folder, final=None):
    """Deletes the `.tmp-<pid>-*` entries of `folder` whose process is gone.

    Args:
        folder: the folder to clear.
        final: None (all), or a name: only the leftovers of writes of that
            name (`.tmp-<pid>-<final>`, `.tmp-<pid>-<final>.old`).

    Returns:
        The names removed.
    """
    removed = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        pid, _, rest = name[len(PREFIX):].partition("-") if name.startswith(PREFIX) else ("",) * 3
        if final is not None and rest not in (final, final + ".old"):
            continue
        if pid.isascii() and pid.isdigit() and not process_alive(int(pid)):  # not '²'
            _remove(os.path.join(folder, name))
            removed.append(name)
    return removed


def _replace(temporary, final):
    """Renames `temporary` to `final`: one rename where both are files (or
    `final` a link to one), else `final` renamed away first (a link is
    replaced, not what it names)."""
    real_folder = os.path.isdir(final) and not os.path.islink(final)
    if os.path.lexists(final) and (os.path.isdir(temporary) or real_folder):
        old = temporary + ".old"  # a leftover of this pid's name: cleared as one
        os.rename(final, old)
        os.rename(temporary, final)
        _remove(old)
    else:
        os.replace(temporary, final)


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def process_alive(pid):
    """Whether a process `pid` runs on this host (one of another user counts).

    Args:
        pid: a process id.

    Returns:
        bool.
    """
    if sys.platform == "win32":  # there os.kill(pid, 0) sends Ctrl-C to pid's group
        return _windows_process_alive(pid)
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such pid (one past C's int)
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _windows_process_alive(pid, kernel32=None, last_error=None):
    """`process_alive` on Windows: a handle to `pid` opens and its exit code is
    STILL_ACTIVE (`kernel32`, `last_error`: `ctypes.WinDLL("kernel32")` and
    `ctypes.get_last_error`, given by tests)."""
    import ctypes
    if not 0 < pid < 2 ** 32:
        return False
    if kernel32 is None:
        kernel32, last_error = ctypes.WinDLL("kernel32", use_last_error=True), \
            ctypes.get_last_error
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return last_error() == 5  # ERROR_ACCESS_DENIED: another user's
    try:
        code = ctypes.c_ulong()
        if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
            return True
        return code.value == 259  # STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)
