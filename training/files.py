"""Small file helpers of the jobs."""
import os


def write_atomically(path, text):
    """Writes `text` to `path` through a temporary file and a rename, so a
    reader (or a kill) never sees half a file; creates the parent folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
