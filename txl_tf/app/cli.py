"""The command-line layer shared by every job (train, evaluate, generate,
demo, export): absl flags in, one way to fail out.

    if __name__ == "__main__":
        cli.run(main, SPEC)

Bad input of any kind (a flag absl rejects, an unknown flag, any `TxlError`:
see `txl_tf.app.exits`) prints a single `error: ...` line to stderr and exits
with status 2: no usage dump, no traceback. Other exceptions are bugs and keep their traceback.
TensorFlow is imported without its C++ start-up noise (`txl_tf.app.tf_startup`).
"""
import logging as std_logging
import sys

from absl import app, flags, logging

from txl_tf.app.exits import exit_on_error, fail, reader_gone
from txl_tf.app.flagspec import define
from txl_tf.app.progress import Progress
from txl_tf.app.tf_startup import quiet_tensorflow_import

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
    try:
        app.run(checked_main, flags_parser=parse_flags)
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
    ending the job in a `UnicodeEncodeError` traceback. A stream whose errors handler is
    not `strict` (`surrogateescape` under the C locale) is left as it is.

    Returns:
        None.
    """
    stream = sys.stdout
    if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (ValueError, OSError, AttributeError):  # closed, or not a TextIOWrapper's
            pass
