"""The project's own Python files (and shell scripts), for the tests that read
the code as text (`test_no_timing_comments`, `test_line_length`): those of its
folders and those at its top (`setup.py`)."""
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("txl_tf", "export", "training", "benchmarks", "tests")
# The files at the repository's top (git's pathspec: `*` matches no `/`), setup.py among them.
TOP = ":(glob)*.py"


def python_files(root=REPO, skip=(), suffixes=(".py",)):
    """The `.py` files (`suffixes`) of `FOLDERS` and of `root` itself that git tracks in
    `root` (a scratch file beside the code is not the project's), relative,
    with `/`; every one there where `root` is no git checkout (an unpacked
    source archive).

    Args:
        root: the repository's folder.
        skip: path prefixes left out.
        suffixes: the endings of the files read (`.sh` too: the shell scripts
            of `FOLDERS`).

    Returns:
        An iterator over the paths, sorted.
    """
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-z", "--", *FOLDERS, TOP],
                                capture_output=True, check=True).stdout.decode("utf-8")
        paths = [p for p in listed.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/")
                 for folder in FOLDERS for d, _, names in os.walk(os.path.join(root, folder))
                 for name in names] + os.listdir(root)
    for path in sorted(paths):
        if path.endswith(tuple(suffixes)) and not path.startswith(tuple(skip)) and \
                os.path.isfile(os.path.join(root, path)):
            yield path
