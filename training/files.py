"""Small file helpers of the jobs."""
import os
import shutil


def write_atomically(path, text):
    """Writes `text` to `path` through a temporary file and a rename, so a
    reader (or a kill) never sees half a file; creates the parent folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def save_vocab(tokenizer, directory):
    """Saves `tokenizer` into `directory` through a staging folder and a
    rename (replacing what was there), so a kill never leaves half of one."""
    staging = directory + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    tokenizer.save(staging)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(staging, directory)
