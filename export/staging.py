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
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.tmp-", dir=parent)
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
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.old-",
                           dir=os.path.dirname(output_dir))
    os.rmdir(old)
    os.rename(output_dir, old)
    try:
        os.rename(staging, output_dir)
    except BaseException:
        os.rename(old, output_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)
