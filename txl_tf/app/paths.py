"""The jobs' output paths checked before any work: a file where a folder
must go (or a folder where a file must go) is named, instead of the
`[Errno 17] File exists` the first write would meet; a path that TensorFlow
and ONNX would write elsewhere (`utf8_path_problem`) is refused. Standard
library only."""
import codecs
import os
import sys


def link_out_of(folder):
    """`(path, target)` of the first entry under `folder` that is a symbolic
    link to a place outside it (a copy of the folder would copy that in:
    `vocab/notes.txt -> ~/.ssh/id_rsa` in a downloaded model), or None."""
    root = os.path.realpath(folder)
    for top, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            path = os.path.join(top, name)
            target = os.path.realpath(path)
            if os.path.islink(path) and os.path.commonpath([root, target]) != root:
                return path, target
    return None


def refuse_links_out_of(folder, what="the vocabulary folder"):
    """Raises `TxlError` naming a symbolic link under `folder` to a place
    outside it (see `link_out_of`)."""
    from txl_tf.errors import TxlError
    found = link_out_of(folder)
    if found:
        raise TxlError(f"{found[0]} is a symbolic link to {found[1]}, outside {what} "
                       f"{folder}: it is not copied into an export (copy the file there)")


def path_in_the_way(flag, path, kind="folder", utf8_paths=False):
    """The `error:` message for a `kind` ("folder" or "file") that cannot be
    written at `path`, given as `--flag`, or None.

    Args:
      flag: the flag's name, without dashes.
      path: the folder or file the job will write.
      kind: "folder" or "file".
      utf8_paths: whether libraries that take a path's UTF-8 bytes write
        under it (TensorFlow's checkpoints, TensorBoard logs and SavedModel;
        ONNX's checker and ONNX Runtime): see `utf8_path_problem`.

    Returns:
      A message naming the flag and the path in the way (see `what_is_in_the_way`),
      or None.
    """
    problem = what_is_in_the_way(path, kind) or (utf8_paths and utf8_path_problem(path))
    return f"--{flag}: {problem}; choose another --{flag}" if problem else None


def output_over_an_input(flag, path, inputs):
    """The `error:` message for an output file `path`, given as `--flag`,
    that is a file the job reads or lies in a folder it reads, or None: the
    job would write its result over its own input (the corpus, a model's
    config.json), at the end of its work.

    Args:
      flag: the output's flag name, without dashes.
      path: the file the job will write.
      inputs: `(what, path)` pairs, `what` naming the input for the message
        ("the corpus (--data_dir)", "the model's config.json"); a folder stands for every
        file under it; a path that is None or does not exist is skipped.

    Returns:
      A message naming the flag, the output and the input, or None.
    """
    real = os.path.realpath(path)  # through symbolic links, either side
    for what, given in inputs:
        if not given or not os.path.exists(given):
            continue
        held = os.path.realpath(given)
        if real == held or (os.path.isdir(held) and os.path.commonpath([real, held]) == held):
            place = "is" if real == held else f"lies in {given},"
            return f"--{flag}: {path} {place} {what}, which this job reads; choose another --{flag}"
    return None


def utf8_path_problem(path):
    """Why TensorFlow and ONNX would write under `path` elsewhere than
    Python, or None. Their C++ code takes a path's UTF-8 bytes, Python the
    file system encoding's: under a locale whose file names are not UTF-8
    (`LC_ALL=en_US.ISO-8859-1`) a non-ASCII path names two folders (a run's
    checkpoints in one, its config and vocabulary in the other; an export's
    `model.onnx` that ONNX's checker cannot find). Under a UTF-8 locale
    a name whose bytes are not UTF-8 (which Python keeps as surrogate
    escapes) is one they cannot take at all (a `UnicodeEncodeError`).

    Args:
      path: the folder or file they will write, as they are given it (a
        relative path resolves in the same folder for Python and for them).

    Returns:
      A phrase naming the path and the locale's encoding, or None.
    """
    path = os.fspath(path)
    if isinstance(path, bytes) or path.isascii():  # bytes: the same for Python and for them
        return None
    encoding = sys.getfilesystemencoding()
    if codecs.lookup(encoding).name != "utf-8":
        return (f"{path} is not ASCII and this locale's file names are {encoding}, not UTF-8: "
                "TensorFlow and ONNX would write their files under another folder (the path's "
                "UTF-8 bytes); use an ASCII path, or a UTF-8 locale (LC_ALL=C.UTF-8)")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return (f"{path} names bytes that are not UTF-8 (shown as \\udcXX): TensorFlow and "
                "ONNX cannot take it; use an ASCII path")
    return None


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
