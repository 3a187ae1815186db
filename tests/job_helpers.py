"""Helpers for tests that run the jobs: a small text corpus,
subprocess launching with readable failures, free ports."""
import os
import random
import socket
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the of and to in is was that for on with as by at from his her it an were which "
         "are this be or has had not but one their new first also after who they two been "
         "its more other all time into when there some can would only over most such then "
         "river city music about between under years state world during place king house "
         "water light song ship night stone field voice spring winter summer garden road").split()


def write_text_corpus(path, num_bytes=60_000, seed=0):
    """Writes deterministic English-like text (lines of random words)."""
    rng = random.Random(seed)
    lines, size = [], 0
    while size < num_bytes:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) + " .\n"
        lines.append(line)
        size += len(line)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(lines)[:num_bytes])
    return path


def job_env(**extra):
    """Environment for a job subprocess: TF backend, quiet logs, repo on the path."""
    env = dict(os.environ)
    env.update({"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2",
                "PYTHONPATH": REPO + os.pathsep + env.get("PYTHONPATH", ""),
                "CUDA_VISIBLE_DEVICES": ""})
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def job_command(module, args):
    return [sys.executable, "-m", module, *args]


def run_job(module, args, timeout=300, env=None, check=True):
    """Runs `python -m module args`; with `check`, a non-zero exit raises an
    AssertionError showing the end of the output."""
    proc = subprocess.run(job_command(module, args), cwd=REPO, env=env or job_env(),
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert_exited_zero(proc, module, args)
    return proc


def assert_exited_zero(proc, module, args):
    """Raises an AssertionError showing the end of the output of a job that
    exited with a non-zero status."""
    if proc.returncode != 0:
        raise AssertionError(f"{module} {' '.join(args)} exited with {proc.returncode}:\n"
                             f"{tail(proc.stdout)}\n--- stderr ---\n{tail(proc.stderr)}")


def tail(text, lines=40):
    return "\n".join((text or "").splitlines()[-lines:])


def free_port():
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]
