"""Job options declared once: absl flags for the command line, a defaults
dict for calling the job from Python (several jobs in one process would
otherwise define the same absl flags twice)."""
import sys

from absl import flags

_DEFINE = {"string": flags.DEFINE_string, "integer": flags.DEFINE_integer,
           "float": flags.DEFINE_float, "bool": flags.DEFINE_bool,
           "list": flags.DEFINE_list, "multi_string": flags.DEFINE_multi_string}
_LISTS = ("list", "multi_string")


def option(kind, name, default, help, choices=None):
    """One option: `kind` is string, integer, float, bool, enum, list
    (`--name=a,b`) or multi_string (`--name=a --name=b`)."""
    return (kind, name, default, help, choices)


def defaults(spec):
    """`{name: default}` of a spec."""
    return {name: (list(default) if kind in _LISTS and default is not None else default)
            for kind, name, default, _, _ in spec}


def define(spec, flag_values=None):
    """Defines the spec's absl flags (in `flag_values`, default the global
    `absl.flags.FLAGS`); names already defined are skipped. They are the
    main program's key flags, so its `--help` lists them."""
    flag_values = flags.FLAGS if flag_values is None else flag_values
    for kind, name, default, help, choices in spec:
        if name not in flag_values:
            if kind == "enum":
                flags.DEFINE_enum(name, default, choices, help, flag_values=flag_values)
            else:
                _DEFINE[kind](name, default, help, flag_values=flag_values)
        flag_values.register_key_flag_for_module(sys.argv[0], flag_values[name])


def values(spec, flag_values=None):
    """The parsed flag values of a spec, by name."""
    flag_values = flags.FLAGS if flag_values is None else flag_values
    return {name: flag_values[name].value for _, name, _, _, _ in spec}


def merge(spec, options):
    """Defaults updated with `options`; unknown names are a TypeError."""
    merged = defaults(spec)
    unknown = sorted(set(options) - set(merged))
    if unknown:
        raise TypeError(f"unknown options {unknown}; known: {sorted(merged)}")
    merged.update(options)
    return merged

