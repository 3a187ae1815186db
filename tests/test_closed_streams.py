"""A command started with a standard stream closed (`2>&-`, `>&-`, `<&-`):
`import txl_tf` puts the null device there (`txl_tf.app.closed_streams`), so
the job runs, writes nothing where the shell closed the stream, and no file
the process opens takes that descriptor."""
import json
import os
import subprocess
import sys

import pytest

from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.weights import save_pretrained

PROBE = r"""
import os, sys
import txl_tf
fd = os.open(os.path.join(sys.argv[1], "data.bin"), os.O_CREAT | os.O_WRONLY)
os.write(2, b"to stderr\n")  # a C++ log line's way: fd 2, not into data.bin
os.write(1, b"to stdout\n")
print(fd, file=sys.stderr)  # Python's streams exist: no AttributeError
print(fd)
sys.stdout.flush()
"""


def _run(args, closed, **kwargs):
    """`args` in a fresh interpreter whose descriptor `closed` is closed."""
    env = dict(os.environ, PYTHONPATH=os.getcwd(), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          preexec_fn=lambda: os.close(closed), timeout=600, **kwargs)


@pytest.mark.parametrize("closed", [0, 1, 2])
def test_importing_fills_a_closed_standard_descriptor(closed, tmp_path):
    done = _run(["-c", PROBE, str(tmp_path)], closed)
    assert done.returncode == 0, done.stderr[-2000:]
    data = (tmp_path / "data.bin").read_bytes()
    assert data == b"", data  # nothing meant for a standard stream went into the file
    opened = [int(line) for line in (done.stdout + done.stderr).split() if line.isdigit()]
    assert opened and all(fd > 2 for fd in opened), (done.stdout, done.stderr)
    if closed == 2:
        assert done.stderr == "" and done.stdout.startswith("to stdout")
    if closed == 1:
        assert done.stdout == "" and "to stderr" in done.stderr


def test_an_export_with_stderr_closed_prints_its_json_line_alone(tmp_path):
    config = TransformerXLConfig.preset("tiny", mem_len=4)
    save_pretrained(TransformerXL(config), tmp_path / "model")
    done = _run(["-m", "export", f"--model_dir={tmp_path / 'model'}",
                 f"--output_dir={tmp_path / 'out'}", "--formats=onnx"], closed=2)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    [line] = done.stdout.splitlines()  # no stage lines: they went where stderr went
    assert set(json.loads(line)) == {"seconds", "parity"}
    assert (tmp_path / "out" / "model.onnx").is_file()
