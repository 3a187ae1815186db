"""Runs many command lines of jobs as `python -m <module> ...` does, in one
interpreter: the libraries are imported once (each job's module on its first
case), then each command line runs in a forked child with its own argv,
flags, stdout and stderr (file descriptors, so the C++ libraries' output is
caught too) and exit status.

A command-line test of bad flags pays the start-up of TensorFlow once per
test module instead of once per case. What only a fresh interpreter shows
(the import's own log noise) stays with the tests that start one (`run_job`).

    python -m tests.cli_runner <timeout>
    stdin: one JSON line {"module": str, "args": [str, ...], "cwd": str or
    null} per case; stdout: one JSON line {"returncode": int, "stdout": str,
    "stderr": str} per case. The module "-c" runs `python -c args[0]`.

`ForkedJobs` is the tests' side: one runner, started on first use, each
case's result as `subprocess.CompletedProcess`.
"""
import importlib
import json
import os
import runpy
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def preload(module):
    """Imports what `module`'s command line imports, without running it (its
    flags are defined when it runs: `txl_tf.app.cli.run`)."""
    from txl_tf.app.tf_startup import quiet_tensorflow_import
    quiet_tensorflow_import()
    if module != "-c":
        importlib.import_module(module + ".job" if module == "export" else module)


def run_forked(module, args, timeout, cwd=None):
    """`{"returncode", "stdout", "stderr"}` of `python -m module *args` (or
    of `python -c args[0]` for the module "-c"), run in `cwd` (default: this
    process's) in a child of this process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            code = 0
            try:
                if cwd:
                    os.chdir(cwd)
                if module == "-c":
                    sys.argv = ["-c", *args[1:]]
                    exec(compile(args[0], "<string>", "exec"), {"__name__": "__main__"})
                else:
                    sys.argv = [module, *args]
                    if not hasattr(sys.modules.get(module), "__path__"):  # not a package:
                        sys.modules.pop(module, None)  # runpy warns on a loaded module
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else (0 if done.code is None
                                                                      else 1)
                if not isinstance(done.code, (int, type(None))):
                    print(done.code, file=sys.stderr)
            except BaseException:  # a bug: its traceback, as python -m would print it
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        status = _wait(pid, timeout)
        out.seek(0)
        err.seek(0)
        return {"returncode": status, "stdout": out.read().decode("utf-8", "replace"),
                "stderr": err.read().decode("utf-8", "replace")}


def _wait(pid, timeout):
    """The child's exit status (-9 if it ran past `timeout` seconds and was killed)."""
    import signal
    import time
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.02)


def main():
    timeout = float(sys.argv[1])
    replies = os.fdopen(os.dup(1), "w")  # the reply channel; anything printed goes to stderr
    os.dup2(2, 1)
    loaded = set()
    for line in sys.stdin:
        case = json.loads(line)
        if case["module"] not in loaded:
            loaded.add(case["module"])
            try:
                preload(case["module"])
            except Exception:  # noqa: BLE001 - the case's own run shows the error
                pass
            # The imports' objects out of every collection of the forked jobs
            # (a training job collects after each `fit`, an export after each
            # stage): each walked them all again.
            import gc
            gc.collect()
            gc.freeze()
        done = run_forked(case["module"], case["args"], timeout, case.get("cwd"))
        replies.write(json.dumps(done) + "\n")
        replies.flush()


class ForkedJobs:
    """One runner of job command lines (`python -m tests.cli_runner`), kept
    open until `close`."""

    def __init__(self, env, timeout=300):
        self.env, self.timeout, self.runner = env, timeout, None

    def run(self, module, args, check=False, cwd=None):
        """`subprocess.CompletedProcess` of `python -m module *args` (or of
        `python -c args[0]` for the module "-c"), run in `cwd` (default: the
        repository); with `check`, a non-zero exit raises an AssertionError
        showing the end of the output (as `job_helpers.run_job`)."""
        import subprocess
        if self.runner is None:
            self.runner = subprocess.Popen(
                [sys.executable, "-m", "tests.cli_runner", str(self.timeout)],
                cwd=REPO, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True)
        case = {"module": module, "args": list(args), "cwd": cwd and str(cwd)}
        self.runner.stdin.write(json.dumps(case) + "\n")
        self.runner.stdin.flush()
        line = self.runner.stdout.readline()
        if not line:
            raise RuntimeError(f"the job runner stopped (exit {self.runner.wait()})")
        done = json.loads(line)
        proc = subprocess.CompletedProcess([module, *args], done["returncode"], done["stdout"],
                                           done["stderr"])
        if check:
            from job_helpers import assert_exited_zero
            assert_exited_zero(proc, module, args)
        return proc

    def close(self):
        if self.runner is not None:
            self.runner.stdin.close()
            self.runner.wait(timeout=60)
            self.runner.stdout.close()
            self.runner = None


if __name__ == "__main__":
    main()
