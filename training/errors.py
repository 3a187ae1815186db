"""User-facing errors of the jobs: one clear line, never a deep traceback."""
import sys


class TrainingError(Exception):
    """A bad flag, missing or empty data, or a model that does not fit the data."""


def exit_on_error(function):
    """Runs `function()`; a `TrainingError` prints `error: <message>` to stderr
    and exits with status 2."""
    try:
        return function()
    except TrainingError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
