"""No timing figures in code comments or docstrings: speed is measured by
a benchmark in one run (benchmarks/results/), and a figure written beside
the code goes stale as the code changes. Say what was measured and where
(a commit, benchmarks/NOTES.md), not how long it took."""
import ast
import io
import os
import re
import subprocess
import tokenize

from repo_files import REPO, python_files

# Left out: the GPU check and its device scripts (another owner's), and this file.
SKIP = ("benchmarks/device/", "benchmarks/gpu_check.py", "tests/test_no_timing_comments.py")
# Made-up inputs of tests that describe them, not measurements: (file, figure).
MADE_UP = {("tests/test_gpu_check.py", "0.25 s a step"), ("tests/test_gpu_figures.py", "50 us"),
           ("tests/test_gpu_figures.py", "4 TB/s")}
UNIT = r"(?:ms|µs|us|ns|tok/s|tokens/s|steps/s|it/s|[GMT]B/s|s a (?:step|call|token))"
TIMING = re.compile(
    rf"\d[\d,.]*\s?{UNIT}(?![\w/])"                       # 25 ms, ~75 µs, 20.1 GB/s
    r"|\d[\d,.]*\s?(?:ms|µs|us|ns|s)/(?:step|call|token|batch)\b"  # 3 ms/step
    r"|\d[\d.]*\s?(?:[x×]|times)\s+(?:faster|slower|as fast)"  # 4x faster, 2 times slower
    r"|\d[\d.]*\s?[x×]\s+speed-?up|\d[\d.]*\s?%\s+(?:faster|slower)"  # 3x speedup, 20% faster
    r"|\b(?:took|takes|costs?) (?:about |~)?\d[\d,.]*\s?(?:s|seconds?|minutes?)\b")  # took 6 s


def comments_and_docstrings(source):
    """`(line, text)` of every comment and docstring of `source`."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                yield node.body[0].lineno, doc


def test_timing_pattern_finds_figures():
    for text in ("# costs ~75 µs", "12 ms a step", "10.9 against 20.1 GB/s", "4× faster",
                 "~10x slower on CPU", "0.9 s a call", "3 ms/step", "0.3 s/step", "10 steps/s",
                 "4 TB/s", "2.5 times faster", "3x speedup", "20% faster", "took 6 s",
                 "takes about 40 seconds"):
        assert TIMING.search(text), text
    for text in ("# mem_len 2,100", "1x and 3x the weights' size", "the 2nd step",
                 "seconds=3", "2x the bound (the target)", "timeout_s: seconds",
                 "(default 60 s)", "[-1, s, ...]"):
        assert not TIMING.search(text), text


def test_only_the_files_git_tracks_are_read(tmp_path):
    """A scratch file beside the code (untracked) is not the project's."""
    (tmp_path / "txl_tf").mkdir()
    (tmp_path / "txl_tf" / "kept.py").write_text("# kept\n")
    (tmp_path / "txl_tf" / "scratch.py").write_text("# 3 ms a step\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "txl_tf/kept.py"], check=True)
    assert list(python_files(str(tmp_path), SKIP)) == ["txl_tf/kept.py"]


def test_no_timing_figures_in_comments():
    found = []
    for path in python_files(skip=SKIP):
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            source = f.read()
        for line, text in comments_and_docstrings(source):
            for match in TIMING.finditer(text):
                if (path, match.group(0)) in MADE_UP:
                    continue
                found.append(f"{path}:{line}: {match.group(0)!r}")
    assert not found, "timing figures in comments or docstrings:\n" + "\n".join(found)
