"""What the benchmarks share besides `throughput.py`: their error and the
checks of their flag values.

Every benchmark declares its flags once, as a `SPEC` of
`txl_tf.app.flagspec` options, and runs as `cli.run(main, SPEC)`
(`txl_tf.app.cli`), like the project's jobs: `--help` lists its flags, and a
bad flag (one absl rejects, or one refused by these checks) is one `error:`
line and exit status 2."""
from txl_tf.errors import TxlError


class BenchmarkError(TxlError):
    """A benchmark cannot start: a bad flag value."""


def integer_list(text, flag, minimum, what):
    """The integers of a comma-separated flag value ("1,16"), each at least
    `minimum`; otherwise a `BenchmarkError` saying `--flag must be <what>`."""
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        numbers = [int(n) for n in items if str(n).strip()]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < minimum:
        shown = text if isinstance(text, str) else ",".join(map(str, text))
        raise BenchmarkError(f"--{flag} must be {what}, got {shown!r}")
    return numbers


def at_least(o, minimum, *names):
    """Raises `BenchmarkError` for the first flag of `names` whose value in
    the options `o` is below `minimum`."""
    for name in names:
        if o[name] < minimum:
            raise BenchmarkError(f"--{name} must be >= {minimum}, got {o[name]}")


def names_from(given, flag, known):
    """`given` (a list flag's items), each one of `known`; otherwise a
    `BenchmarkError` naming the unknown ones."""
    unknown = [name for name in given if name not in known]
    if not given or unknown:
        raise BenchmarkError(f"--{flag} takes a non-empty list of {', '.join(known)}; "
                             f"unknown: {', '.join(unknown) or '(none given)'}")
    return list(given)
