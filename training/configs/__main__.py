"""`python -m training.configs [NAME]`: the configurations, or one's flagfile path."""
import os
import sys

from training.configs import names, path


USAGE = """usage: python -m training.configs [NAME]

Without NAME: the names of the paper's training configurations. With one:
the path of its flagfile, for --flagfile="$(python -m training.configs NAME)"."""


def main(argv):
    if argv[1:] in (["--help"], ["-h"]):
        print(USAGE)
        return 0
    if len(argv) > 2:
        print("error: usage: python -m training.configs [NAME]", file=sys.stderr)
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


def _reader_gone():
    """Status 141 and no message, as the jobs (`| head -n 1`): stdout points
    at /dev/null first, so that the interpreter's last flush has nothing to
    report. Standard library only (importing txl_tf imports TensorFlow)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


try:
    status = main(sys.argv)
    sys.stdout.flush()
except BrokenPipeError:
    status = _reader_gone()
sys.exit(status)
