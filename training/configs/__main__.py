"""`txl-configs [NAME]` (`python -m training.configs [NAME]`): the paper's
training configurations' names, or one's flagfile path. Standard library only
(importing txl_tf imports TensorFlow)."""
import os
import sys

from training.configs import names, path


USAGE = """usage: txl-configs [NAME]   (or: python -m training.configs [NAME])

Without NAME: the names of the paper's training configurations. With one:
the path of its flagfile, for --flagfile="$(txl-configs NAME)"."""


def main(argv):
    """Prints the names, a flagfile's path or the usage; returns the exit status."""
    if argv[1:] in (["--help"], ["-h"]):
        print(USAGE)
        return 0
    if len(argv) > 2:
        print("error: usage: txl-configs [NAME]", file=sys.stderr)
        return 2
    if len(argv) == 1:
        print("\n".join(names()))
        return 0
    try:
        print(path(argv[1]))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _drop_stdout():
    """Points stdout at /dev/null, so that the interpreter's last flush has
    nothing to report. Standard library only (importing txl_tf imports
    TensorFlow)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def console():
    """The installed command (see setup.py's console scripts): a reader gone
    (`| head -n 1`) is status 141 and no message, a stdout that cannot be
    written (a full disk) one `error:` line and status 2, as the jobs; a
    stream the shell closed (`>&-`) takes nothing, as the jobs' (which
    `txl_tf.app.closed_streams` fills; this opens no file that could take
    the free descriptor)."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:  # Python's for a closed descriptor
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))
    try:
        status = main(sys.argv)
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()
        status = 141
    except OSError as err:
        _drop_stdout()
        print(f"error: cannot write to stdout: {err.strerror or err}", file=sys.stderr)
        status = 2
    sys.exit(status)


if __name__ == "__main__":
    console()
