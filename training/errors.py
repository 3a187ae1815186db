"""User-facing errors of the jobs: one clear line, never a deep traceback.

`TrainingError` is the one error type of the command-line layer: every job
raises it for bad input. Library errors that also mean bad input (see
`bad_input_types`) end the same way; anything else is a bug and keeps its
traceback.
"""
import sys

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # the shell's code for a job ended by SIGINT

# (module, class) of library errors meaning "bad input"; looked up lazily, so
# this module imports neither TensorFlow nor the library.
_LIBRARY_ERRORS = (
    ("txl_tf.validation", "InputError"),          # includes export.RuntimeInputError
    ("txl_tf.config", "ConfigError"),
    ("txl_tf.model_dir", "ModelDirError"),        # is export.ModelDirError
    ("txl_tf.data", "CorpusNotFoundError"),
    ("txl_tf.data", "EmptyCorpusError"),
    ("txl_tf.state_dict", "StateDictError"),      # includes PytorchImportError
    ("txl_tf.text.pickled_vocab", "PickledVocabError"),
    ("txl_tf.convert", "ConvertError"),
    ("export.job", "ExportError"),                # output folder in the way
    ("export.parity", "ParityError"),             # --verify found a difference
    ("absl.flags", "Error"),                      # bad flags, validators
    ("absl.app", "UsageError"),
)


class TrainingError(Exception):
    """A bad flag, missing or empty data, or a model that does not fit the data."""


def bad_input_types():
    """The exception classes that mean bad input (those already imported),
    and `OSError`: a path that cannot be read or written, a full disk."""
    types = [TrainingError, OSError]
    for module, name in _LIBRARY_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            types.append(cls)
    return tuple(types)


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
    """Runs `function()`; bad input (`bad_input_types`) prints one `error:`
    line to stderr and exits with status 2; Ctrl-C prints `interrupted` and
    exits with status 130. Other exceptions propagate."""
    try:
        return function()
    except bad_input_types() as err:
        fail(err)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("interrupted", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
