"""The jobs' output paths checked before any work: a file where a folder
must go (or a folder where a file must go) is named, instead of the
`[Errno 17] File exists` the first write would meet. Standard library only."""
import os


def path_in_the_way(flag, path, kind="folder"):
    """The `error:` message for a `kind` ("folder" or "file") that cannot be
    written at `path`, given as `--flag`, or None.

    Args:
      flag: the flag's name, without dashes.
      path: the folder or file the job will write.
      kind: "folder" or "file".

    Returns:
      A message naming the flag and the path in the way (see `what_is_in_the_way`),
      or None.
    """
    problem = what_is_in_the_way(path, kind)
    return f"--{flag}: {problem}; choose another --{flag}" if problem else None


def what_is_in_the_way(path, kind="folder"):
    """Why a `kind` ("folder" or "file") cannot be written at `path`, or None.

    Args:
      path: the folder or file to be written.
      kind: "folder" or "file".

    Returns:
      A phrase naming the path in the way (`path` itself, or the nearest
      existing path above it, which is not a folder), or None.
    """
    path = os.path.abspath(path)
    problem = None
    if os.path.lexists(path):
        if kind == "folder" and not os.path.isdir(path):
            problem = f"{path} exists and is not a folder"
        elif kind == "file" and os.path.isdir(path):
            problem = f"{path} is a folder, not a file"
    else:
        above = os.path.dirname(path)
        while not os.path.lexists(above):
            above = os.path.dirname(above)
        if not os.path.isdir(above):
            problem = f"{above} is not a folder, so it cannot hold {path}"
    return problem
