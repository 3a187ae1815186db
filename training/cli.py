"""The command-line layer shared by every job (train, evaluate, generate,
demo, export): absl flags in, one way to fail out.

    if __name__ == "__main__":
        cli.run(main, SPEC)

Bad input of any kind (a flag absl rejects, an unknown flag, a `TrainingError`,
a library error meaning bad input: see `training.errors.bad_input_types`)
prints a single `error: ...` line to stderr and exits with status 2: no usage
dump, no traceback. Other exceptions are bugs and keep their traceback.
TensorFlow is imported without its C++ start-up noise (`training.tf_startup`).
"""
from absl import app, flags, logging

from training.errors import TrainingError, exit_on_error, fail
from training.flagspec import define
from training.progress import Progress
from training.tf_startup import quiet_tensorflow_import

__all__ = ["Progress", "parse_flags", "quiet_tensorflow_import", "run"]


def parse_flags(argv):
    """absl's `flags_parser`: a flag error becomes one `error:` line, exit 2."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as err:
        fail(err)


def run(main, spec=None):
    """Defines `spec`'s flags (if given) and runs `main(argv)` as an absl app
    with the shared exit path; extra positional arguments are an error."""
    if spec is not None:
        define(spec)

    def checked_main(argv):
        if len(argv) > 1:
            fail(f"unexpected arguments: {' '.join(argv[1:])}")
        logging.set_verbosity(logging.WARNING)  # TF's checkpoint INFO lines
        return exit_on_error(lambda: main(argv))

    app.run(checked_main, flags_parser=parse_flags)


def model_tokenizer(name, vocab_dir, config):
    """The tokenizer in a model's `vocab_dir`, checked against its `config`
    (size and vocabulary fingerprint); else a `TrainingError` naming `name`."""
    from txl_tf.model_dir import ModelDirError, load_vocab
    try:
        return load_vocab(vocab_dir, config)
    except ModelDirError as err:
        raise TrainingError(f"{name}: {err}") from None
