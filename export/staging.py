"""The output folder of an export, written whole or not at all: a staging
folder beside it that replaces it in two renames when the writing succeeds
(`staged_folder`), and the leftovers of a killed export cleared at the next
(`remove_stale`, which puts back the previous export where a kill between the
two renames left it under its old folder's name). The export job, the
classifier's export and the Triton repository's model folders write through
it."""
import contextlib
import os
import shutil
import tempfile

from txl_tf.app.files import process_alive


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
    staging = tempfile.mkdtemp(prefix=_prefix(output_dir, "tmp"), dir=parent)
    # Made again by mkdir, whose mode follows the umask as any new folder's
    # does (mkdtemp's is 0700; a fixed 0755 ignored the umask).
    os.rmdir(staging)
    os.mkdir(staging)
    try:
        yield staging
        swap_in(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
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
    stale = {"tmp": [], "old": []}
    for entry in os.listdir(parent) if os.path.isdir(parent) else ():
        for kind in stale:
            head = f".{name}.{kind}-"
            if not entry.startswith(head):
                continue
            pid = entry[len(head):].split("-", 1)[0]
            if not pid.isdigit() or not process_alive(int(pid)):
                stale[kind].append(os.path.join(parent, entry))
    if stale["old"] and not os.path.lexists(os.path.join(parent, name)):
        previous = max(stale["old"], key=lambda path: os.stat(path).st_ctime_ns)
        os.rename(previous, os.path.join(parent, name))
        stale["old"].remove(previous)
    removed = []
    for path in stale["tmp"] + stale["old"]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(os.path.basename(path))
    return removed

