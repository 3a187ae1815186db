"""One declaration of a job's options gives its absl flags and the defaults
of its Python entry (`txl_tf.app.flagspec`)."""
import pytest
from absl import flags

from txl_tf.app.flagspec import define, defaults, merge, option, values

SPEC = (
    option("list", "formats", ["a", "b"], "Comma-separated names."),
    option("multi_string", "tag", [], "Repeatable."),
    option("enum", "mode", "x", "One of x, y.", ["x", "y"]),
    option("integer", "size", None, "A size."),
)


def parse(*argv):
    fv = flags.FlagValues()
    define(SPEC, fv)
    fv(["job", *argv])
    return values(SPEC, fv)


def test_a_list_flag_is_split_on_commas():
    assert parse("--formats=c,d,e")["formats"] == ["c", "d", "e"]
    assert parse("--formats=")["formats"] == []
    assert parse("--tag=a,b", "--tag=c")["tag"] == ["a,b", "c"]


def test_the_defaults_parse_as_the_python_defaults():
    assert parse() == defaults(SPEC) == {"formats": ["a", "b"], "tag": [], "mode": "x",
                                         "size": None}


def test_list_defaults_are_copies():
    first = defaults(SPEC)
    first["formats"].append("c")
    assert defaults(SPEC)["formats"] == ["a", "b"] and SPEC[0][2] == ["a", "b"]


def test_merge_refuses_unknown_names_and_keeps_given_values():
    assert merge(SPEC, {"size": 3})["size"] == 3
    with pytest.raises(TypeError, match=r"unknown options \['sise'\]; known: \['formats'"):
        merge(SPEC, {"sise": 3})


def test_a_bad_value_is_a_flag_error():
    with pytest.raises(flags.IllegalFlagValueError, match="mode"):
        parse("--mode=z")
    with pytest.raises(flags.IllegalFlagValueError, match="size"):
        parse("--size=big")
