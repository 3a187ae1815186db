"""What the benchmarks share besides `throughput.py`: their error, the
checks of their flag values, and the one SPEC of a suite run in parts.

Every benchmark declares its flags once, as a `SPEC` of
`txl_tf.app.flagspec` options, and runs as `cli.run(main, SPEC)`
(`txl_tf.app.cli`), like the project's jobs: `--help` lists its flags, and a
bad flag (one absl rejects, or one refused by these checks) is one `error:`
line and exit status 2."""
import json
import os
import sys

from txl_tf.errors import TxlError


class BenchmarkError(TxlError):
    """A benchmark cannot start: a bad flag value."""


def peak_rss_bytes(usage=None):
    """The peak resident memory in bytes of a `resource.getrusage` or
    `os.wait4` result (`ru_maxrss`: KiB on Linux, bytes on macOS).

    Args:
        usage: the result (None: this process's).

    Returns:
        Bytes, or None where there is no `resource` module (Windows).
    """
    if usage is None:
        try:
            import resource
        except ImportError:
            return None
        usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def share_the_gpu():
    """Lets TensorFlow take GPU memory as it needs it, not all of it at its
    first op (`TF_FORCE_GPU_ALLOW_GROWTH=true`, unless the caller set it):
    so that another process (the paper's PyTorch worker) or onnxruntime-gpu
    in this one finds memory on the same GPU. Call it before TensorFlow
    first touches the GPU."""
    os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")


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


def suite_spec(parts):
    """One SPEC for a suite run in parts: `--part` (the first of `parts` by
    default) and every part's options. `parts` maps each part's name to its
    own spec. An option that parts declare with different defaults defaults
    to None here (`part_options` fills in the chosen part's own); where
    their helps or defaults differ, the help names each part's."""
    from txl_tf.app.flagspec import option
    merged = {}
    for part, spec in parts.items():
        for kind, name, default, help, choices in spec:
            known = merged.setdefault(name, (kind, choices, {}))
            if known[:2] != (kind, choices):
                raise ValueError(f"parts declare --{name} as different kinds")
            known[2][part] = (default, help)
    spec = [option("enum", "part", next(iter(parts)), "Which part of the suite to run: "
                   + ", ".join(parts) + ".", list(parts))]
    for name, (kind, choices, by_part) in merged.items():
        defaults = {repr(default) for default, _ in by_part.values()}
        helps = {help for _, help in by_part.values()}
        default, help = next(iter(by_part.values()))
        if len(defaults) > 1:
            default = None
            help = " ".join(f"{part}: {h} (default {d})" for part, (d, h) in by_part.items())
        elif len(helps) > 1:
            help = " ".join(f"{part}: {h}" for part, (_, h) in by_part.items())
        spec.append(option(kind, name, default, help, choices))
    return tuple(spec)


def part_options(spec, o):
    """The options of the part whose own spec is `spec`, from the suite's
    parsed values `o` (`suite_spec`): each at the part's default where the
    suite's is None; a flag given on the command line that the part does
    not take is a `BenchmarkError`."""
    from absl import flags
    own = {name: default for _, name, default, _, _ in spec}
    given = [name for name in o if name != "part" and name not in own
             and name in flags.FLAGS and flags.FLAGS[name].present]
    if given:
        raise BenchmarkError(f"--part={o['part']} takes no --{', --'.join(given)}")
    return {name: default if o[name] is None else o[name] for name, default in own.items()}


def run_part(parts, o):
    """Runs the part `o["part"]` names: `parts` maps each name to `(spec,
    run)`, and `run` is called with the part's own options."""
    spec, run = parts[o["part"]]
    return run(part_options(spec, o))


def write_json(path, result):
    """Writes `result` to `path` as indented JSON (its folder made if missing)
    and says so on stdout."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path}")
