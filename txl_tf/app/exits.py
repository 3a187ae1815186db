"""How every job ends on bad input: one `error:` line, never a traceback.

Bad input is any `TxlError` (the project's one error family), a flag that
absl rejects, or an `OSError` (a path that cannot be read or written, a full
disk): it prints `error: <message>` on one line to stderr and exits with
status 2. Ctrl-C prints `interrupted` and exits with 130. Anything else is a
bug and keeps its traceback.
"""
import sys

from absl import app, flags

from txl_tf.errors import TxlError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # the shell's code for a job ended by SIGINT
BAD_INPUT = (TxlError, OSError, flags.Error, app.UsageError)


def one_line(message):
    """`message` with its lines joined by '; ' (an `error:` line stays one line)."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    return "; ".join(lines) or "unknown error"


def fail(message):
    """Prints `error: <message>` to stderr and exits with status 2."""
    sys.stdout.flush()
    print(f"error: {one_line(message)}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_INPUT)


def exit_on_error(function):
    """Runs `function()`; bad input (`BAD_INPUT`) prints one `error:` line to
    stderr and exits with status 2; Ctrl-C prints `interrupted` and exits
    with status 130. Other exceptions propagate."""
    try:
        return function()
    except BAD_INPUT as err:
        fail(err)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("interrupted", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
