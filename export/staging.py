"""The output folder of an export, written whole or not at all: a staging
folder beside it that replaces it in two renames when the writing succeeds
(`staged_folder`), and the leftovers of a killed export cleared at the next
(`remove_stale`, which puts back the previous export where a kill between the
two renames left it under its old folder's name). The export job and the
classifier's export write through it; a Triton repository's model folders,
which share their folder with other models, are replaced together by
`staged_folders`."""
import contextlib
import os
import shutil
import sys
import tempfile

from txl_tf.app.files import WRITE_ERRNOS, WriteError, is_write_error, naming, process_alive

# TensorFlow's file-system errors end with the cause's `strerror`.
WRITE_CAUSES = frozenset(os.strerror(code) for code in WRITE_ERRNOS)


@contextlib.contextmanager
def staged_folder(output_dir):
    """Yields a fresh, empty sibling folder of `output_dir` to write into. If
    the block succeeds the staging folder replaces `output_dir` whole
    (`swap_in`); if it raises, the staging folder is removed and `output_dir`
    is left as it was. An `output_dir` that is a symbolic link stays one:
    the folder it names is replaced."""
    output_dir = os.path.realpath(output_dir)
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    remove_stale(output_dir)
    staging = _new_staging(_prefix(output_dir, "tmp"), parent, output_dir)
    try:
        yield staging
        swap_in(staging, output_dir)
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        failed = _write_error(err, staging, output_dir)
        if failed is not None:
            raise failed from err
        raise


def swap_in(staging, output_dir):
    """Replaces `output_dir` by `staging` (same parent: the renames are atomic)."""
    if not os.path.exists(output_dir):
        os.rename(staging, output_dir)
        return
    old = tempfile.mkdtemp(prefix=_prefix(output_dir, "old"), dir=os.path.dirname(output_dir))
    os.rmdir(old)
    os.rename(output_dir, old)
    try:
        os.rename(staging, output_dir)
    except BaseException:
        os.rename(old, output_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_folders(parent, names, drop=()):
    """Sibling folders `parent/<name>` replaced together, and `drop`'s
    deleted with them, so that a kill never leaves one of the old folders
    beside one of the new ones.

    The block writes into a staging folder; one rename then commits it, after
    which every old folder is moved aside before any new one comes in. A kill
    before the commit leaves the old folders; after it, the next call whose
    first name (of `names`, then `drop`) is the same finishes the killed one's
    replacement first (`remove_stale` for a single folder).

    Args:
        parent: the folder holding them (made if missing).
        names: the folder names to write.
        drop: folder names to delete (not in `names`).

    Yields:
        `{name: an empty folder to write parent/<name>'s files into}`.
    """
    parent = os.path.realpath(parent)
    key = os.path.join(parent, (list(names) + list(drop))[0])
    os.makedirs(parent, exist_ok=True)
    finish_stale(key)
    staging = _new_staging(_prefix(key, "tmp"), parent, parent)
    try:
        new = os.path.join(staging, "new")
        os.mkdir(new)
        folders = {}
        for name in names:
            folders[name] = os.path.join(new, name)
            os.mkdir(folders[name])
        for name in drop:
            open(os.path.join(new, name), "wb").close()  # a file: the name is deleted
        yield folders
        committed = os.path.join(parent, os.path.basename(staging).replace(
            _prefix(key, "tmp"), _prefix(key, "commit"), 1))
        os.rename(staging, committed)
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        failed = _write_error(err, os.path.join(staging, "new"), parent)
        if failed is not None:
            raise failed from err
        raise
    _roll_forward(committed)


def _roll_forward(committed):
    """Moves every old folder of a committed `staged_folders` into its `old/`,
    then its `new/` folders into their places; deletes it. Run again after a
    kill, it goes on where the kill left it."""
    parent = os.path.dirname(committed)
    new, old = os.path.join(committed, "new"), os.path.join(committed, "old")
    os.makedirs(old, exist_ok=True)
    names = sorted(os.listdir(new)) if os.path.isdir(new) else []
    for name in names:  # an entry still in new/: its final path holds the old one
        if os.path.lexists(os.path.join(parent, name)):
            os.rename(os.path.join(parent, name), os.path.join(old, name))
    for name in names:
        if os.path.isdir(os.path.join(new, name)):
            os.rename(os.path.join(new, name), os.path.join(parent, name))
    shutil.rmtree(committed, ignore_errors=True)


def finish_stale(key):
    """The leftovers of `staged_folders` calls keyed `key` (their parent
    folder and first name) that were killed: a staging folder is deleted, a
    committed one finished (the oldest first). A committed one of this
    process counts (one interrupted here: finished before the next call's,
    never after it).

    Args:
        key: the path `parent/<first name>`.

    Returns:
        The leftovers' names.
    """
    stale = _stale(key, ("tmp", "commit"), own=("commit",))
    for path in stale["tmp"]:
        shutil.rmtree(path, ignore_errors=True)
    for path in sorted(stale["commit"], key=lambda p: os.stat(p).st_mtime_ns):
        _roll_forward(path)
    return [os.path.basename(p) for p in stale["tmp"] + stale["commit"]]


def _new_staging(prefix, parent, output_dir):
    """A new empty folder `<parent>/<prefix>...` whose mode follows the umask
    as any new folder's does (mkdtemp's is 0700; a fixed 0755 ignored the
    umask); a read-only or full `parent` is a `WriteError` naming
    `output_dir`, not the hidden folder."""
    try:
        staging = tempfile.mkdtemp(prefix=prefix, dir=parent)
        os.rmdir(staging)
        os.mkdir(staging)
    except OSError as err:
        raise WriteError(output_dir, err.strerror or str(err), err.errno) from err
    return staging


def _write_error(err, staging, output_dir):
    """An `OSError` naming `output_dir` (not the staging folder, which is
    gone) for `err`, an error of writing into `staging`, whose files go to
    `output_dir` (a full disk, a file size limit, a read-only folder); None
    for any other error (a read's, a broken pipe)."""
    if isinstance(err, OSError):
        if not is_write_error(err):
            return None
        if err.filename is None:  # met at a write or a close, or numpy's short write
            return naming(err, output_dir)
        name = err.filename
        if isinstance(name, str) and err.strerror and \
                os.path.commonpath([os.path.abspath(name), staging]) == staging:
            final = os.path.join(output_dir, os.path.relpath(name, staging))
            return WriteError(final, err.strerror, err.errno)
        return None
    tf = sys.modules.get("tensorflow")  # not loaded: `err` is none of its errors
    message = getattr(err, "message", "")
    if tf is not None and isinstance(err, tf.errors.OpError) and staging in message:
        # TensorFlow's file-system errors read "<temporary path>; <cause>".
        cause = message.rsplit("; ", 1)[-1].strip() if "; " in message else message
        cause = cause.splitlines()[0].split(" [Op:")[0]  # the op's name: not the cause
        if cause in WRITE_CAUSES:  # not a read's error (a file not found)
            return WriteError(output_dir, cause)
    return None


def _prefix(output_dir, kind):
    """`.<name>.<kind>-<pid>-`: the owner's pid in the name tells a killed
    export's leftovers from a running one's."""
    return f".{os.path.basename(output_dir)}.{kind}-{os.getpid()}-"


def remove_stale(output_dir):
    """Deletes the staging and old folders of `output_dir` whose export is
    no longer running (it was killed); returns their names. An export killed
    between `swap_in`'s two renames left no `output_dir`, the previous export
    being its old folder: that folder is renamed back to `output_dir` (the
    newest, if several) instead."""
    parent, name = os.path.split(os.path.abspath(output_dir))
    stale = _stale(output_dir, ("tmp", "old"))
    if stale["old"] and not os.path.lexists(os.path.join(parent, name)):
        previous = max(stale["old"], key=lambda path: os.stat(path).st_ctime_ns)
        os.rename(previous, os.path.join(parent, name))
        stale["old"].remove(previous)
    removed = []
    for path in stale["tmp"] + stale["old"]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(os.path.basename(path))
    return removed


def _stale(output_dir, kinds, own=()):
    """`{kind: [path]}`: the `_prefix(output_dir, kind)` entries beside
    `output_dir` whose process is gone (or is this one, for the kinds in
    `own`)."""
    parent, name = os.path.split(os.path.abspath(output_dir))
    stale = {kind: [] for kind in kinds}
    for entry in os.listdir(parent) if os.path.isdir(parent) else ():
        for kind in stale:
            head = f".{name}.{kind}-"
            if not entry.startswith(head):
                continue
            pid = entry[len(head):].split("-", 1)[0]
            if not (pid.isascii() and pid.isdigit()) or not process_alive(int(pid)) or \
                    kind in own and int(pid) == os.getpid():
                stale[kind].append(os.path.join(parent, entry))
    return stale
