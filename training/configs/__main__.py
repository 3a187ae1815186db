"""`python -m training.configs [NAME]`: the configurations, or one's flagfile path."""
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


sys.exit(main(sys.argv))
