"""What the benchmarks share besides `throughput.py`: the running script's
flags as a dict, and comma-separated integer flags.

Every benchmark defines its flags with absl (`flags.DEFINE_*`) and runs as
`cli.run(main)` (`txl_tf.app.cli`), so `--help` and a bad flag behave as in
the project's jobs: a bad value is one `error:` line and exit status 2."""
import sys

from absl import flags


def flag_values():
    """`{name: value}` of the flags the running script defines."""
    return {f.name: f.value for f in flags.FLAGS.get_key_flags_for_module(sys.argv[0])}


def integer_list(text, flag, minimum, what):
    """The integers of a comma-separated flag value ("1,16"), each at least
    `minimum`; otherwise a `TxlError` saying `--flag must be <what>`."""
    from txl_tf.errors import TxlError
    try:
        numbers = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < minimum:
        raise TxlError(f"--{flag} must be {what}, got {text!r}")
    return numbers
