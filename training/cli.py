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
import math
import sys

from absl import app, flags, logging

from training.errors import exit_on_error, fail
from training.flagspec import define
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


class Progress:
    """A `progress(done, total)` callback for long loops.

    On a terminal (or with `bar=True`) a tqdm bar on `stream` (stderr);
    otherwise, when `lines` is true, a line at every ~10% (`desc: 3/30 (10%)`),
    never more than 11 lines, so logs stay short. `enabled=False` shows nothing.
    """

    def __init__(self, desc, enabled=True, lines=True, stream=None, bar=None):
        self.desc, self.stream = desc, stream or sys.stderr
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.bar_mode = enabled and (tty if bar is None else bar)
        self.lines = enabled and lines and not self.bar_mode
        self._bar, self._next = None, 0

    def __call__(self, done, total):
        if self.bar_mode:
            self._update_bar(done, total)
        elif self.lines and total > 0 and (done >= self._next or done >= total):
            print(f"{self.desc}: {done}/{total} ({100 * done // total}%)", file=self.stream,
                  flush=True)
            step = max(1, math.ceil(total / 10))
            self._next = (done // step + 1) * step

    def _update_bar(self, done, total):
        if self._bar is None:
            from tqdm.auto import tqdm
            self._bar = tqdm(total=total, desc=self.desc, file=self.stream, leave=False)
        self._bar.update(done - self._bar.n)
        if done >= total:
            self._bar.close()
            self._bar = None
