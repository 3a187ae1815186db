"""What differs off a Linux box with a UTF-8 locale, simulated here: a
non-UTF-8 stdout (a latin-1 locale; Windows writing into a file, cp1252)."""


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
