"""An output folder written whole or not at all: a staging sibling swapped in on success."""
import contextlib
import os
import shutil
import tempfile


@contextlib.contextmanager
def staged_folder(output_dir):
    """Yields a fresh, empty sibling folder of `output_dir` to write into. If
    the block succeeds the staging folder replaces `output_dir` whole
    (`swap_in`); if it raises, the staging folder is removed and `output_dir`
    is left as it was."""
    output_dir = os.path.abspath(output_dir)
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    remove_stale(output_dir)
    staging = tempfile.mkdtemp(prefix=_prefix(output_dir, "tmp"), dir=parent)
    os.chmod(staging, 0o755)  # mkdtemp's 0700 would become the output folder's mode
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
    no longer running (it was killed); returns their names."""
    parent, name = os.path.split(os.path.abspath(output_dir))
    removed = []
    for entry in os.listdir(parent) if os.path.isdir(parent) else ():
        for kind in ("tmp", "old"):
            head = f".{name}.{kind}-"
            if not entry.startswith(head):
                continue
            pid = entry[len(head):].split("-", 1)[0]
            if not pid.isdigit() or not _alive(int(pid)):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
                removed.append(entry)
    return removed


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
