"""What a user sees when they stop a command or pipe it: Ctrl-C while the
command's modules still import prints `interrupted` (exit by SIGINT, no
traceback); a reader that goes away (`| head -n 1`) ends the command quietly
with status 141, from `--help` (absl prints it while parsing flags) and from
a job's own output alike; a Ctrl-C in a `__del__` is not lost; a second
signal during `txl-train`'s graceful stop ends it at once; progress bars
stay off log files. (Ctrl-C during training: test_training_resume.)"""
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from job_helpers import REPO, job_command, job_env
from txl_tf.app import exits

# Sends a signal to the process itself when a module is first imported: the
# interrupt lands at a known moment of the start-up.
SITECUSTOMIZE = textwrap.dedent("""
    import os, signal, sys
    class SignalAtImport:
        def find_spec(self, name, path=None, target=None):
            if name == os.environ["SIGNAL_AT_IMPORT"]:
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)
            return None
    sys.meta_path.insert(0, SignalAtImport())
""")


# Ctrl-C while Python runs a `__del__` (TensorFlow collects its functions all
# the time), once the command's modules are imported.
SITECUSTOMIZE_DEL = textwrap.dedent("""
    import os, signal, sys
    class Collected:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))  # a few bytecodes: the handler runs here
    class AfterImport:
        def find_spec(self, name, path=None, target=None):
            if name == "txl_tf.app.cli":  # once txl_tf and TensorFlow are imported
                sys.meta_path.remove(self)
                Collected()
            return None
    sys.meta_path.insert(0, AfterImport())
""")


def _interrupted_at_import(tmp_path, command, module="tensorflow"):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = job_env(SIGNAL_AT_IMPORT=module)
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def test_ctrl_c_while_a_command_imports_is_one_line(tmp_path):
    proc = _interrupted_at_import(tmp_path, job_command("training.generate", ["--help"]))
    assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stderr)
    assert proc.stderr.strip() == "interrupted", proc.stderr  # was a traceback
    assert proc.stdout == ""


def test_ctrl_c_in_a_del_ends_a_command(tmp_path):
    """Python prints a `KeyboardInterrupt` raised in a `__del__` as
    `Exception ignored ...` and goes on: the Ctrl-C was lost (here the help
    was printed, exit 0)."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE_DEL)
    env = job_env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    proc = subprocess.run(job_command("training.generate", ["--help"]), env=env,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "interrupted\n")


@pytest.mark.parametrize("module", ["txl_tf.convert", "txl_tf.weights.convert"])
def test_the_convert_modules_are_commands_too(tmp_path, module):
    """`python -m txl_tf.convert` (docs/weights.md) and `python -m
    txl_tf.weights.convert`, as `txl-convert`: a Ctrl-C while runpy imports
    the `txl_tf` package (TensorFlow) was a traceback."""
    proc = _interrupted_at_import(tmp_path, job_command(module, ["--help"]))
    assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stderr)
    assert proc.stderr.strip() == "interrupted", proc.stderr


def test_a_command_run_with_the_module_joined_to_dash_m_is_one_too(tmp_path):
    """`python -mtxl_tf.convert` (the module in the option's own argument)
    is the same command: its Ctrl-C while runpy imports was a traceback."""
    proc = _interrupted_at_import(tmp_path, [sys.executable, "-mtxl_tf.convert", "--help"])
    assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stderr)
    assert proc.stderr.strip() == "interrupted", proc.stderr


def test_ctrl_c_while_a_library_user_imports_keeps_the_traceback(tmp_path):
    proc = _interrupted_at_import(tmp_path, [sys.executable, "-c", "import txl_tf"])
    assert proc.returncode == -signal.SIGINT
    assert "Traceback" in proc.stderr and "KeyboardInterrupt" in proc.stderr


def test_a_users_own_training_package_keeps_pythons_behaviour(tmp_path):
    """`python -m training.run` of a user's package that imports txl_tf is
    not one of the commands: its Ctrl-C in a `__del__` is Python's warning
    and its `finally` runs (it ended at once with 130, skipping both)."""
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "__init__.py").write_text("")
    (tmp_path / "training" / "run.py").write_text(textwrap.dedent("""
        import os, signal
        import txl_tf
        class Collected:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                sum(range(1000))  # a few bytecodes: the handler runs here
        try:
            Collected()
        finally:
            print("finally", flush=True)
    """))
    proc = subprocess.run([sys.executable, "-m", "training.run"], cwd=tmp_path, env=job_env(),
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, "finally\n"), (proc.returncode, proc.stderr)
    assert "KeyboardInterrupt" in proc.stderr


def test_only_the_installed_scripts_are_commands(monkeypatch):
    """A user's own `txl-notes.py` that imports txl_tf is no command: a Ctrl-C
    in one of its `__del__` is Python's warning (it ended the script)."""
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    for argv0, command in (("/usr/local/bin/txl-train", True), ("txl-export", True),
                           ("txl-notes.py", False), ("/home/me/txl-train.py", False),
                           ("txl-", False)):
        monkeypatch.setattr(sys, "argv", [argv0])
        assert exits.running_a_command() is command, argv0
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as setup:
        scripts = re.findall(r'"(txl-[\w-]+) = ', setup.read())
    assert sorted(exits.COMMANDS) == sorted(scripts)


def _buffered_env(buffered):
    """`job_env()` with stdout block-buffered, as in a user's shell, or not
    (`PYTHONUNBUFFERED`, which a CI machine may set)."""
    env = job_env()
    env.pop("PYTHONUNBUFFERED", None)
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    return env


def _to_a_closed_pipe(command, buffered=True):
    """`command` with its stdout a pipe whose reader has gone."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(command, stdout=write, stderr=subprocess.PIPE,
                              env=_buffered_env(buffered), text=True, timeout=120)
    finally:
        os.close(write)


def test_help_into_a_closed_pipe_exits_quietly():
    proc = _to_a_closed_pipe(job_command("training.generate", ["--help"]))
    assert proc.returncode == 141 and proc.stderr == "", (proc.returncode, proc.stderr)


@pytest.mark.parametrize("buffered", [True, False])
def test_a_jobs_output_into_a_closed_pipe_exits_quietly(buffered):
    # A job's print that fails (was `error: [Errno 32] Broken pipe`, exit 2) and
    # one left in the buffer until the end (a warning at exit, status 120).
    for body in ("print('x' * 100_000, flush=True)", "print('x')"):
        code = f"from txl_tf.app.exits import exit_on_error; exit_on_error(lambda: {body})"
        proc = _to_a_closed_pipe([sys.executable, "-c", code], buffered)
        assert proc.returncode == 141 and proc.stderr == "", (body, proc.returncode,
                                                              proc.stderr)


def _onto_a_full_disk(code, buffered):
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-c", code], env=_buffered_env(buffered),
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("lines", [1, 5000])
def test_a_jobs_output_onto_a_full_disk_says_it_is_stdout(lines, buffered):
    """`txl-generate > out.txt` on a full disk said `error: [Errno 28] No space
    left on device`, naming no file. A short output fails at the job's last
    flush (block-buffered stdout: the failed flush kept its bytes, so the
    error line's own flush and the interpreter's last one failed again, in
    tracebacks and status 120), a long one in a print."""
    code = ("import sys; from txl_tf.app import cli\n"
            f"cli.run(lambda argv: [print('x' * 99) for _ in range({lines})] and None)")
    proc = _onto_a_full_disk(code, buffered)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "error: cannot write to stdout: No space left on device\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("ending, status, line", [
    ("raise TxlError('no such model')", 2, "error: no such model"),
    ("raise KeyboardInterrupt", 130, "interrupted")])
def test_a_job_that_ends_with_its_output_unwritten_prints_one_line(ending, status, line):
    """A job that fails or is interrupted with its printed output still in a
    full disk's buffer: its own line, once (not the flush's traceback)."""
    code = ("from txl_tf.app import cli; from txl_tf.errors import TxlError\n"
            "def main(argv):\n"
            f"    print('x' * 99)\n    {ending}\n"
            "cli.run(main)")
    proc = _onto_a_full_disk(code, buffered=True)
    assert (proc.returncode, proc.stderr) == (status, line + "\n")


@pytest.mark.parametrize("args", [["training.configs"], ["training.configs", "wt103_base"],
                                  ["training.configs", "--help"],
                                  ["txl_tf.text.pickled_vocab", "--help"]])
def test_the_small_commands_into_a_closed_pipe_exit_quietly(args):
    """`python -m training.configs | head -n 1` (docs/training.md's listing)
    ended in a `BrokenPipeError` traceback, exit 1."""
    proc = _to_a_closed_pipe(job_command(args[0], args[1:]))
    assert proc.returncode == 141 and proc.stderr == "", (args, proc.returncode, proc.stderr)


def test_a_second_signal_during_the_graceful_stop_ends_the_job_at_once():
    """`txl-train`'s second Ctrl-C raised `KeyboardInterrupt` in its signal
    handler, wherever Python was: in a `__del__` (TensorFlow's functions are
    collected all the time) it printed `Exception ignored ... Traceback ...
    KeyboardInterrupt` and the job went on. It now ends the process there."""
    code = textwrap.dedent("""
        import os, signal, sys
        sys.argv[0] = os.path.join(os.path.dirname(sys.executable), "txl-train")  # the command
        import txl_tf  # TensorFlow without its start-up lines
        from training.callbacks import StopOnSignal
        class Collected:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C
                sum(range(1000))  # a few bytecodes: the handler runs here
        stop = StopOnSignal()
        with stop.installed():
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.received == signal.SIGINT  # the first: stop after the step
            Collected()
            print("went on", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=job_env(), capture_output=True,
                          text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", STOPPING + "interrupted\n")


def test_a_second_interrupt_in_a_notebook_raises_keyboard_interrupt(monkeypatch, capfd):
    """`training.train.run` in a Jupyter kernel: a second interrupt during
    the graceful stop ended the process (`os._exit(130)`), the kernel with
    it and everything it held. Outside the commands it is Python's
    `KeyboardInterrupt`; a second SIGTERM still ends the process."""
    from training import callbacks
    ended = []

    def stop_now(signum, **options):
        ended.append(signum)
    monkeypatch.setattr(callbacks, "stop_now", stop_now)
    monkeypatch.setattr(callbacks, "running_a_command", lambda: False)
    stop = callbacks.StopOnSignal()
    stop._handle(signal.SIGINT, None)
    assert stop.received == signal.SIGINT and capfd.readouterr().err == STOPPING
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGINT, None)

    class Collected:
        def __del__(self):
            stop._handle(signal.SIGINT, sys._getframe())  # as the handler gets it here
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    Collected()  # nothing raised in the __del__ (Python would print and drop it)
    assert dropped == []
    stop._handle(signal.SIGTERM, None)
    assert ended == [signal.SIGTERM]
    monkeypatch.setattr(callbacks, "running_a_command", lambda: True)  # txl-train
    stop._handle(signal.SIGINT, None)
    assert ended == [signal.SIGTERM, signal.SIGINT]


STOPPING = ("SIGINT: stopping after the step in flight, which is then saved (another SIGINT "
            "ends the job without saving it)\n")


def test_the_first_signal_is_announced_while_python_waits_on_a_long_call():
    """The first Ctrl-C printed nothing until the step in flight ended (a
    first XLA compile: minutes); Python runs its handlers only between
    bytecodes. The main thread here is in a sleep that the signal does not
    interrupt (it is blocked there, as in a long call into TensorFlow): the
    line comes before a thread's "later", written while the sleep goes on."""
    code = textwrap.dedent("""
        import os, signal, threading, time
        import txl_tf  # TensorFlow without its start-up lines
        from training.callbacks import StopOnSignal
        stop = StopOnSignal()
        with stop.installed():
            def later():
                time.sleep(1.0)
                os.write(2, b"later\\n")
            helper = threading.Thread(target=later)
            helper.start()  # before the mask: the signal is delivered to a thread
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2.0)  # no handler runs until it returns
            helper.join()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
            assert stop.received == signal.SIGINT
        os.write(2, b"done\\n")
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=job_env(), capture_output=True,
                          text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", STOPPING + "later\ndone\n")


@pytest.mark.parametrize("argv0, ending", [
    ("txl-train", (130, STOPPING + "interrupted\n")),
    ("notebook", (0, STOPPING + "later\nKeyboardInterrupt\nnot ended\n"))])
def test_a_second_signal_ends_the_job_while_python_waits_on_a_long_call(argv0, ending):
    """The second Ctrl-C waited for the long call too (the handler that ends
    the process runs between bytecodes): in a command it ends the process at
    once, before the thread's "later", with `interrupted` and status 130. In
    a notebook's kernel (not a command) the process goes on: the handler's
    `KeyboardInterrupt` is the one a second interrupt gets there, once the
    call returns (Python ran its handler once for both: it was lost)."""
    code = textwrap.dedent(f"""
        import os, signal, sys, threading, time
        sys.argv[0] = {argv0!r}
        import txl_tf  # TensorFlow without its start-up lines
        from training.callbacks import StopOnSignal
        stop = StopOnSignal()
        with stop.installed():
            def twice_then_later():
                time.sleep(0.3)  # the main thread is in its sleep by then
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.3)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1.5)
                os.write(2, b"later\\n")
            helper = threading.Thread(target=twice_then_later, daemon=True)
            helper.start()  # before the mask: the signals are delivered to a thread
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
            try:
                time.sleep(4.0)  # no handler runs until it returns (then once, for both)
            except KeyboardInterrupt:
                os.write(2, b"KeyboardInterrupt\\n")
        os.write(2, b"not ended\\n")
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=job_env(), capture_output=True,
                          text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == ending and proc.stdout == ""


def test_a_signal_while_stop_now_flushes_into_a_stalled_reader_ends_the_job():
    """`stop_now`'s lock (one caller ends the process) was not reentrant: a
    second stop whose flush blocked (stdout a pipe whose reader stalled,
    `txl-train | less`) and a next Ctrl-C, whose handler called `stop_now`
    again in that thread, waited on itself for ever (only a kill ended it)."""
    code = textwrap.dedent("""
        import fcntl, os, signal, sys
        import txl_tf  # TensorFlow without its start-up lines
        from txl_tf.app.exits import stop_now
        signal.signal(signal.SIGINT, lambda signum, frame: stop_now(signum))
        flags = fcntl.fcntl(1, fcntl.F_GETFL)
        fcntl.fcntl(1, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        try:
            while True:  # the pipe full: its reader does not read
                os.write(1, b"x" * 4096)
        except BlockingIOError:
            pass
        fcntl.fcntl(1, fcntl.F_SETFL, flags)
        sys.stdout.write("held\\n")  # in the buffer: the flush blocks
        os.write(2, b"ready\\n")
        stop_now(signal.SIGTERM)
    """)
    env = job_env()
    env.pop("PYTHONUNBUFFERED", None)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        while proc.stderr.readline() not in (b"ready\n", b""):
            pass
        for _ in range(20):  # one lands in the blocked flush (the first may come before it)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                pass
        assert proc.poll() == 130
        assert proc.stderr.read() == b"interrupted\n"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_reading_a_large_corpus_shows_a_bar_only_to_a_person(tmp_path, monkeypatch, capsys):
    """A large corpus or classification file (32 MiB, made small here) wrote
    tqdm's frames (`\\r`, block characters) into a log file too. The bar
    shows on a terminal, and in Jupyter (whose stderr is no terminal); a
    corpus in a log gets a line at every 10%."""
    from txl_tf.classification import data as classification_data
    from txl_tf.data import corpora
    monkeypatch.setattr(corpora, "PROGRESS_MIN_BYTES", 10)
    monkeypatch.setattr(classification_data, "PROGRESS_MIN_BYTES", 10)
    text, table = tmp_path / "text.txt", tmp_path / "table.tsv"
    text.write_text("a b c .\n" * 50)
    table.write_text("x\ta b\ny\tc d\n" * 20)

    def read():
        list(corpora.iter_text_chunks(text, chunk_bytes=40))
        classification_data.read_tsv(table)
        return capsys.readouterr().err

    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    # stderr is not a terminal here: a log, which got nothing at all (building
    # WikiText-103's cache: minutes of silence under nohup), now a few lines.
    logged = read().splitlines()
    assert "\r" not in "".join(logged) and 2 <= len(logged) <= 11, logged
    assert logged[-1].startswith("text.txt: ") and logged[-1].endswith("(100%)"), logged
    monkeypatch.setitem(sys.modules, "ipykernel", sys)  # a Jupyter kernel
    shown = read()
    assert "text.txt" in shown and "table.tsv" in shown and "\r" in shown
    monkeypatch.delitem(sys.modules, "ipykernel")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    shown = read()
    assert "text.txt" in shown and "table.tsv" in shown and "\r" in shown


def test_ctrl_c_under_a_progress_bar_says_interrupted_on_a_line_of_its_own(monkeypatch):
    """`txl-evaluate` interrupted on a terminal wrote `interrupted` after the
    bar's last frame, on its line (`...it/s]interrupted`), and the bar
    then cleared the empty line below. The bar is cleared first."""
    import io
    from txl_tf.app.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    progress = Progress("evaluating valid")
    progress(3, 10)
    with pytest.raises(SystemExit):
        exits.interrupted()
    before, after = terminal.getvalue().split("interrupted")
    assert "evaluating valid" in before and before.endswith("\r") and after == "\n", repr(before)


def test_a_stop_under_the_terminal_bar_is_said_on_lines_of_its_own(monkeypatch, capfd):
    """`txl-train` on a terminal: Ctrl-C's `SIGINT: stopping ...` was written
    after the Keras bar's frame on its line, which the next frame then drew
    over, and `stopped by SIGINT at step N` followed the last frame on its
    line too (the bar ends its line only at --train_steps)."""
    from training import callbacks
    from txl_tf.app import progress
    monkeypatch.setattr(progress, "interactive", lambda stream=None: True)
    stop = callbacks.StopOnSignal()
    stop._handle(signal.SIGINT, None)
    assert capfd.readouterr().err == "\n" + STOPPING
    bar = _bar_after_one_step()
    bar.on_train_end()
    assert capfd.readouterr().out.endswith("\n")  # stopped at step 1 of 10


def _bar_after_one_step():
    """`txl-train`'s terminal bar (`callbacks.ProgressBar`) of 10 steps after its first."""
    from types import SimpleNamespace

    import tensorflow as tf
    from training import callbacks
    bar = callbacks.ProgressBar(10)
    bar.set_model(SimpleNamespace(optimizer=SimpleNamespace(iterations=tf.constant(0))))
    bar.on_train_begin()
    bar.on_train_batch_begin(0)
    bar.on_train_batch_end(0, {"loss": 1.0})
    return bar


def test_an_error_under_the_terminal_bar_is_on_a_line_of_its_own(monkeypatch, capfd):
    """`txl-train` on a terminal: an error during `fit` (no `on_train_end`)
    printed its `error:` line after the Keras bar's frame, on its line."""
    from txl_tf.app import exits
    _bar_after_one_step()
    capfd.readouterr()
    with pytest.raises(SystemExit):
        exits.fail("the disk is full")
    out, err = capfd.readouterr()
    assert out == "\n" and err == "error: the disk is full\n", (out, err)
    with pytest.raises(SystemExit):  # the line is ended once
        exits.fail("again")
    assert capfd.readouterr().out == ""


@pytest.mark.parametrize("terminals,after_bar", [("stdout", None), ("both", False)])
def test_the_stop_starts_no_empty_line_where_no_bar_holds_it(monkeypatch, capfd, terminals,
                                                             after_bar):
    """The announcement's leading newline (for the bar's frame on the same
    terminal) went into a log as an empty line (`txl-train 2> err.log` on a
    terminal), and onto a terminal with no bar (`--verbose=0` or `2`)."""
    from training import callbacks
    from txl_tf.app import progress
    monkeypatch.setattr(progress, "interactive",
                        lambda stream=None: terminals == "both" or stream is None)
    stop = callbacks.StopOnSignal(after_bar=after_bar)
    stop._handle(signal.SIGINT, None)
    assert capfd.readouterr().err == STOPPING


def test_a_second_ctrl_c_under_the_terminal_bar_says_interrupted_on_a_line_of_its_own(
        monkeypatch, capfd):
    """`txl-train` on a terminal: the bar draws on after the first Ctrl-C's
    line, and the second's `interrupted` followed its frame on its line."""
    from training import callbacks
    from txl_tf.app import progress
    monkeypatch.setattr(progress, "interactive", lambda stream=None: True)
    monkeypatch.setattr(callbacks, "running_a_command", lambda: True)  # txl-train

    def exit_now(status):
        raise SystemExit(status)
    monkeypatch.setattr(os, "_exit", exit_now)
    stop = callbacks.StopOnSignal()
    stop._handle(signal.SIGINT, None)
    capfd.readouterr()
    try:
        with pytest.raises(SystemExit, match="130"):
            stop._handle(signal.SIGINT, None)
    finally:
        exits._ending.release()
    assert capfd.readouterr().err == "\ninterrupted\n"
