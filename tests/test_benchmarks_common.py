"""`benchmarks.common.integer_list`, the parsing of the benchmarks'
comma-separated integer flags: good values are their integers, bad ones a
`BenchmarkError` naming the flag, what it takes and the value given."""
import pytest

from benchmarks.common import BenchmarkError, integer_list


@pytest.mark.parametrize("text, minimum, numbers", [
    ("1,16", 1, [1, 16]),
    ("0", 0, [0]),
    (" 2, 8 ,", 2, [2, 8]),  # spaces and a trailing comma
    (["3", "4"], 1, [3, 4]),  # absl's list flag: already split
])
def test_good_values_are_their_integers(text, minimum, numbers):
    assert integer_list(text, "batch_sizes", minimum, "positive integers") == numbers


@pytest.mark.parametrize("text", ["", ",", "1,x", "2.5", "1,,0", "-1", []])
def test_bad_values_are_an_error_naming_the_flag(text):
    shown = text if isinstance(text, str) else ""
    with pytest.raises(BenchmarkError) as raised:
        integer_list(text, "mem_lens", 1, "comma-separated integers >= 1")
    assert str(raised.value) == f"--mem_lens must be comma-separated integers >= 1, got {shown!r}"
