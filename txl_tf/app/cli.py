"""The command-line layer shared by every job (train, evaluate, generate,
demo, export): absl flags in, one way to fail out.

    if __name__ == "__main__":
        cli.run(main, SPEC)

Bad input of any kind (a flag absl rejects, an unknown flag, any `TxlError`:
see `txl_tf.app.exits`) prints a single `error: ...` line to stderr and exits
with status 2: no usage dump, no traceback. Other exceptions are bugs and keep their traceback.
TensorFlow is imported without its C++ start-up noise (`txl_tf.app.tf_startup`).
"""
import codecs
import logging as std_logging
import sys

from absl import app, flags, logging

from txl_tf.app.exits import exit_on_error, fail, reader_gone
from txl_tf.app.flagspec import define
from txl_tf.app.progress import Progress
from txl_tf.app.tf_startup import quiet_tensorflow_import
from txl_tf.errors import TxlError

__all__ = ["Progress", "parse_flags", "quiet_tensorflow_import", "run"]


def parse_flags(argv):
    """absl's `flags_parser`: a flag error becomes one `error:` line, exit 2."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as err:
        fail(str(err).removeprefix("ERROR:: "))  # absl's prefix of a flagfile it cannot open
    except UnicodeDecodeError as err:  # absl reads a --flagfile as text
        fail(f"a --flagfile is not UTF-8 text: {err}")


def run(main, spec=None, doc=None):
    """Defines `spec`'s flags (if given) and runs `main(argv)` as an absl app
    with the shared exit path; extra positional arguments are an error.
    `doc`, the job module's docstring, heads `--help` where `__main__` has
    none (an installed command's script), as it does under `python -m`."""
    if spec is not None:
        define(spec)
    script = sys.modules.get("__main__")
    if doc and script is not None and not script.__doc__:
        script.__doc__ = doc  # absl's usage reads it

    def checked_main(argv):
        if len(argv) > 1:
            fail(f"unexpected arguments: {' '.join(argv[1:])}")
        logging.set_verbosity(logging.WARNING)  # TF's checkpoint INFO lines
        one_line_per_tensorflow_record()
        return exit_on_error(lambda: main(argv))

    lenient_stdout()
    name_stdout_in_its_errors()
    try:
        app.run(checked_main, flags_parser=parse_flags)
    except SystemExit:  # `--help`, still in the buffer: flushed here, not at exit
        exit_on_error(sys.stdout.flush)
        raise
    except BrokenPipeError:  # `--help | head -n 1`: absl prints the help while parsing
        reader_gone()


def one_line_per_tensorflow_record():
    """TensorFlow's logger got a stderr handler of its own when it was
    imported (the root logger had none yet); absl's app then puts one on the
    root, so each TensorFlow record would print twice. In a command it
    prints once, on TensorFlow's own handler.

    Returns:
        None.
    """
    tensorflow = std_logging.getLogger("tensorflow")
    if tensorflow.handlers:
        tensorflow.propagate = False


def lenient_stdout():
    """Characters that stdout's encoding cannot hold (generated text under a
    latin-1 locale, or on Windows into a file or pipe: cp1252) are written as
    backslash escapes (`\\uc0b5`), as Python writes them to stderr, instead of
    ending the job in a `UnicodeEncodeError` traceback. `surrogateescape` (the C
    locale's) keeps writing the bytes it stands for, and escapes the rest where the
    encoding is not UTF-8 (ASCII, with UTF-8 mode off); other handlers are left.

    Returns:
        None.
    """
    stream = sys.stdout
    errors = getattr(stream, "errors", None)
    try:
        utf8 = codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name == "utf-8"
    except LookupError:
        utf8 = False
    handler = {"strict": "backslashreplace",
               "surrogateescape": None if utf8 else _ESCAPE_OR_BYTE}.get(errors)
    if handler is not None and hasattr(stream, "reconfigure"):
        try:
            stream.reconfigure(errors=handler)
        except (ValueError, OSError, AttributeError):  # closed, or not a TextIOWrapper's
            pass


class StdoutError(OSError, TxlError):
    """Standard output could not be written (a full disk, an I/O error)."""


class _StdoutNamedInErrors:
    """A text stream whose failed writes and flushes say it is stdout (an
    `OSError` of a write has no file name: `[Errno 28] No space left on
    device` alone does not say which file filled the disk). A reader gone
    stays a `BrokenPipeError`. Anything else is the stream's own."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        return self._named(self._stream.write, text)

    def writelines(self, lines):
        return self._named(self._stream.writelines, lines)

    def flush(self):
        return self._named(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)

    @staticmethod
    def _named(method, *args):
        try:
            return method(*args)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise StdoutError(f"cannot write to stdout: {err.strerror or err}") from err


def name_stdout_in_its_errors():
    """A job's output that cannot be written (`txl-generate > file` on a full
    disk) is one `error: cannot write to stdout: ...` line, as
    `txl-configs` says it, not an `OSError` naming no file.

    Returns:
        None.
    """
    if sys.stdout is not None and not isinstance(sys.stdout, _StdoutNamedInErrors):
        sys.stdout = _StdoutNamedInErrors(sys.stdout)


def _escape_or_byte(err):
    """An encode error handler: `surrogateescape` for the bytes it stands for,
    `backslashreplace` for any other character."""
    if not isinstance(err, UnicodeEncodeError):
        raise err
    out = []
    for ch in err.object[err.start:err.end]:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(bytes([code - 0xDC00]))
        else:
            out.append(ch.encode("ascii", "backslashreplace"))
    return b"".join(out), err.end


_ESCAPE_OR_BYTE = "txl_tf.escape_or_byte"
codecs.register_error(_ESCAPE_OR_BYTE, _escape_or_byte)
