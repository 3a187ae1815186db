"""How every job ends on bad input: one `error:` line, never a traceback.

Bad input is any `TxlError` (the project's one error family), a flag that
absl rejects, or an `OSError` (a path that cannot be read or written, a full
disk): it prints `error: <message>` on one line to stderr and exits with
status 2. Ctrl-C prints `interrupted` and exits with 130, also while the
job's modules are still importing, or in a `__del__` (`quiet_interrupts`). A reader
that goes away (`txl-generate ... | head -n 1`) ends the job quietly with
141, as SIGPIPE ends a Unix tool. Anything else is a bug and keeps its
traceback.
"""
import importlib.util
import os
import signal
import sys
import threading

from absl import app, flags

from txl_tf.app.progress import close_bars
from txl_tf.errors import TxlError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # the shell's code for a job ended by SIGINT
EXIT_BROKEN_PIPE = 141  # the shell's code for a job ended by SIGPIPE
BAD_INPUT = (TxlError, OSError, flags.Error, app.UsageError)


def one_line(message):
    """`message` with its lines joined by '; ' (an `error:` line stays one line)."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    return "; ".join(lines) or "unknown error"


def fail(message):
    """Prints `error: <message>` to stderr and exits with status 2."""
    try:
        flush_stdout()
        close_bars()  # the line on a line of its own, not after a bar's frame
        print(f"error: {one_line(message)}", file=sys.stderr, flush=True)
    except BrokenPipeError:
        reader_gone()
    sys.exit(EXIT_BAD_INPUT)


def interrupted():
    """Prints `interrupted` to stderr and exits with status 130.

    Returns:
        Never: raises `SystemExit` (141 where stderr's reader is gone).
    """
    try:
        flush_stdout()
        close_bars()  # `interrupted` on a line of its own, not after a bar's frame
        print("interrupted", file=sys.stderr, flush=True)
    except BrokenPipeError:
        reader_gone()
    sys.exit(EXIT_INTERRUPTED)


# Held by the one call of `stop_now` that ends the process; reentrant: a
# signal's handler that calls it again in the thread holding it (whose flush
# blocks on a reader that stalled) ends the process instead of waiting on itself.
_ending = threading.RLock()


def stop_now(signum, flush=True, new_line=False):
    """Ends the process at once, for a second Ctrl-C or SIGTERM during a
    graceful stop: `interrupted` on stderr, exit status 128 + `signum`, and
    no Python code after it (no `finally`, no `atexit`), as a kill: what was
    being written stays staged, never half in place. Safe in a signal handler
    (raising `KeyboardInterrupt` there could land in a `__del__`, which
    prints `Exception ignored ...` and goes on) and in another thread (the
    first caller ends the process; a second waits for it).

    Args:
        signum: the signal's number (`signal.SIGINT`: status 130).
        flush: write out what `sys.stdout` holds first (not from a thread
            other than the main one: the main thread may hold its lock).
        new_line: start `interrupted` on a line of its own (a bar's frame
            holds the terminal's line).

    Returns:
        Never: the process ends (`os._exit`).
    """
    _ending.acquire()  # another thread that holds it is ending the process
    if flush:
        try:
            sys.stdout.flush()
        except (OSError, ValueError, RuntimeError, AttributeError):  # gone, or mid-write
            pass
    try:
        os.write(2, b"\ninterrupted\n" if new_line else b"interrupted\n")
    except OSError:
        pass
    os._exit(128 + int(signum))


def reader_gone():
    """Exits with status 141 and no message: the reader of stdout or stderr
    went away (`| head -n 1`). Both streams are pointed at /dev/null first, so
    that the interpreter's last flush has nothing to report.

    Returns:
        Never: raises `SystemExit` (status 141).
    """
    for stream in (sys.stdout, sys.stderr):
        _point_at_devnull(stream)
    sys.exit(EXIT_BROKEN_PIPE)


def flush_stdout():
    """Writes out what `sys.stdout` holds before a job's last line. A stdout
    that cannot be written (a full disk) keeps its bytes after a failed
    flush, so each later flush, the interpreter's last one too, would fail
    again: it is pointed at /dev/null and its bytes dropped (the job's error
    line says what failed).

    Returns:
        None: a reader gone still raises `BrokenPipeError`.
    """
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError:
        _point_at_devnull(sys.stdout)
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass


def _point_at_devnull(stream):
    """Points `stream`'s file descriptor at /dev/null (none: nothing to do)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no such stream, or no fd
        pass


def exit_on_error(function):
    """Runs `function()`; bad input (`BAD_INPUT`) prints one `error:` line to
    stderr and exits with status 2; Ctrl-C prints `interrupted` and exits
    with status 130; a reader gone (`BrokenPipeError`) exits quietly with
    status 141. Other exceptions propagate."""
    try:
        result = function()
        sys.stdout.flush()  # here, not at exit, where a reader gone is a warning
        return result
    except BrokenPipeError:  # an OSError, but not the user's input
        reader_gone()
    except BAD_INPUT as err:
        fail(err)
    except KeyboardInterrupt:
        interrupted()


JOB_PACKAGES = ("training", "export", "benchmarks")  # `python -m <package>.<job>`
# The installed scripts (setup.py's console_scripts), by name: a user's own
# `txl-notes.py` that imports txl_tf is not one of them.
COMMANDS = ("txl-train", "txl-train-lstm", "txl-evaluate", "txl-generate", "txl-classify",
            "txl-demo", "txl-attention", "txl-recl", "txl-export", "txl-convert",
            "txl-configs")
# Where `txl_tf` and `JOB_PACKAGES` are (the checkout, or site-packages).
PACKAGES_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def running_a_command():
    """Whether this process is one of the project's commands: an installed
    script (`COMMANDS`), or `python -m` of a job in `JOB_PACKAGES` or of
    `txl_tf.weights.convert` (the project's, not a user's own `training`
    package).

    Returns:
        True or False.
    """
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name, origin = getattr(spec, "name", None) or "", getattr(spec, "origin", None)
    if not name and sys.argv[:1] == ["-m"]:  # runpy still imports the module's packages
        name = _module_run_by_dash_m()
        origin = _package_origin(name.split(".")[0])
    if name.split(".")[0] in JOB_PACKAGES or name in ("txl_tf.weights.convert",
                                                      "txl_tf.convert"):
        return os.path.realpath(origin or os.sep).startswith(PACKAGES_ROOT + os.sep)
    return bool(sys.argv) and os.path.basename(sys.argv[0]).removesuffix(".exe") in COMMANDS


def _package_origin(package):
    """Where the top-level `package` is found (its `__init__.py`), or None;
    not imported (a failed import has left `sys.modules`)."""
    try:
        spec = importlib.util.find_spec(package) if package else None
    except (ImportError, ValueError):
        return None
    return getattr(spec, "origin", None)


def _module_run_by_dash_m():
    """The MODULE of `python -m MODULE` (or `-mMODULE`) from the
    interpreter's own command line (`sys.orig_argv`), or ""."""
    argv = getattr(sys, "orig_argv", [])
    for i, arg in enumerate(argv[1:], 1):
        if arg == "-m":
            return argv[i + 1] if i + 1 < len(argv) else ""
        if arg.startswith("-m"):
            return arg[2:]
    return ""


def quiet_interrupts():
    """In the project's commands only (`running_a_command`; elsewhere the
    previous hooks run):

    - a Ctrl-C that no job caught (one while the job's modules import, before
      `exit_on_error` runs) prints `interrupted` instead of a traceback
      (`sys.excepthook`; Python still exits with status 130);
    - a Ctrl-C that Python would print as `Exception ignored ...
      KeyboardInterrupt` and go on from (it landed in a `__del__`, such as
      TensorFlow's when it collects a function, or in an `atexit` function)
      ends the job at once (`sys.unraisablehook`, `stop_now`).

    Installing them twice is a no-op.

    Returns:
        None.
    """
    previous = sys.excepthook
    if getattr(previous, "txl_interrupt_hook", False):
        return

    def excepthook(kind, value, traceback):
        if issubclass(kind, KeyboardInterrupt) and running_a_command():
            try:
                print("interrupted", file=sys.stderr, flush=True)
            except (OSError, ValueError, AttributeError):  # stderr gone
                pass
            return
        previous(kind, value, traceback)

    previous_unraisable = sys.unraisablehook

    def unraisablehook(unraisable):
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and running_a_command():
            stop_now(signal.SIGINT)
        previous_unraisable(unraisable)

    excepthook.txl_interrupt_hook = True
    sys.excepthook = excepthook
    sys.unraisablehook = unraisablehook
