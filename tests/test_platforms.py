"""What differs off a Linux box with a UTF-8 locale, simulated here: a
non-UTF-8 stdout (a latin-1 locale; Windows writing into a file, cp1252),
and text files opened in the locale's encoding (cp1252 on Windows)."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Calls that open a file in the locale's encoding unless given one.
OPENERS = {"open", "fdopen", "TextIOWrapper", "read_text", "write_text"}


def test_a_command_writes_what_stdouts_encoding_cannot_hold_as_escapes(jobs):
    """Generated text under a latin-1 locale (`txl-generate` of a byte-level
    model: U+C0B5) ended the job in a `UnicodeEncodeError` traceback."""
    code = ("import io, sys\n"
            "sys.stdout = io.TextIOWrapper(io.FileIO(1, 'w', closefd=False), "
            "encoding='latin-1')\n"
            "from txl_tf.app import cli\n"
            "cli.run(lambda argv: print('caf\\u00e9 \\uc0b5'))\n")
    done = jobs.run("-c", [code])
    assert (done.returncode, done.stdout, done.stderr) == (0, "caf\ufffd \\uc0b5\n", "")


def _text_opens_without_encoding(path):
    """`(line, call)` of each call in `path` that opens a file as text in the
    locale's encoding (no `encoding=`, not a binary mode)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name not in OPENERS or any(k.arg == "encoding" for k in node.keywords):
            continue
        if name == "open" and isinstance(node.func, ast.Attribute) and \
                getattr(node.func.value, "id", None) != "io":
            continue  # a zip member's, a session table's
        mode = [k.value for k in node.keywords if k.arg == "mode"] + node.args[1:2]
        if name in ("open", "fdopen") and mode and isinstance(mode[0], ast.Constant) and \
                "b" in str(mode[0].value):
            continue
        found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_no_text_file_is_opened_in_the_locales_encoding():
    """Corpora, vocabularies, configs and reports are UTF-8 on every
    platform: a text file opened without `encoding=` reads and writes cp1252
    on Windows (and latin-1 under such a locale)."""
    found = {str(path.relative_to(REPO)): calls
             for package in ("txl_tf", "training", "export", "benchmarks")
             for path in sorted((REPO / package).rglob("*.py"))
             if (calls := _text_opens_without_encoding(path))}
    assert found == {}
