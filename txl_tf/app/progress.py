"""Progress that suits both a terminal and a log file (standard library only,
so the jobs can use it before TensorFlow is imported).

A bar that rewrites its line with `\\r` is one frame per update in a log
(CI, `nohup`); off a terminal the jobs print a few plain lines instead
(training's per-step line is `training.callbacks.ProgressLine`).
"""
import functools
import math
import sys
import threading
import time


def interactive(stream=None):
    """Whether `stream` (default stdout) is a terminal."""
    stream = sys.stdout if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


def show_bar(progress, large, stream=None):
    """Whether a tqdm bar over some work shows by default.

    Args:
      progress: True / False to say so, or None for the default.
      large: whether the work is long enough to show a bar for.
      stream: where the bar goes (default stderr, tqdm's).

    Returns:
      `progress` when given, else whether the work is `large` and shown to a
      person: `stream` is a terminal, or this is a Jupyter kernel (whose
      stderr is no terminal, yet draws a bar). In a log a bar is a frame of
      control characters per update.
    """
    if progress is not None:
        return bool(progress)
    stream = sys.stderr if stream is None else stream
    return bool(large) and (interactive(stream) or "ipykernel" in sys.modules)


def log_lines(progress, large, stream=None):
    """Whether plain lines stand in for a bar that does not show by default
    (`show_bar`): `progress` None, the work `large`, and `stream` (default
    stderr) a log, where minutes of work would otherwise pass unseen."""
    return progress is None and bool(large) and not show_bar(None, large, stream)


class LineBar:
    """A tqdm bar's stand-in for a log (`tqdm_bar`'s `update`, `close`,
    iteration and `with`): `desc: 3/30 (10%)` at every ~10% of `total`
    (`Progress`'s lines; in MB with `unit="B"`)."""

    def __init__(self, iterable=None, total=None, desc="", unit="", stream=None):
        self.iterable, self.unit, self.n = iterable, unit, 0
        self.total = len(iterable) if total is None else total
        self.progress = Progress(desc, bar=False, stream=stream)

    def update(self, n=1):
        self.n += n
        if self.unit == "B":
            self.progress.report(self.n, self.total,
                                 f"{self.n / 1e6:,.1f}/{self.total / 1e6:,.1f} MB")
        else:
            self.progress(self.n, self.total)

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update()

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def progress_bar(progress, large, *args, **kwargs):
    """`tqdm_bar(*args, **kwargs)` where `show_bar(progress, large)` says
    so, a `LineBar` in a log (`log_lines`), else a disabled bar."""
    if log_lines(progress, large, kwargs.get("file")):
        return LineBar(*args, total=kwargs.get("total"), desc=kwargs.get("desc", ""),
                       unit=kwargs.get("unit", ""), stream=kwargs.get("file"))
    return tqdm_bar(*args, disable=not show_bar(progress, large, kwargs.get("file")), **kwargs)


# How to end the line of each other bar still drawn (`open_line`): Keras's
# `Progbar` under `txl-train` leaves its frame on stdout's line until done.
_OPEN_LINES = {}


def open_line(owner, end):
    """Notes that `owner`'s bar holds a line that `end()` ends, until
    `closed_line(owner)`: `close_bars` ends it before an error or
    `interrupted` is printed."""
    _OPEN_LINES[id(owner)] = end


def closed_line(owner):
    """`owner`'s bar ended its line (or never drew one)."""
    _OPEN_LINES.pop(id(owner), None)


def close_bars():
    """Closes the bars still drawn (an error or a Ctrl-C leaves a job's bar
    open: what is printed next would follow its frame on its line): the tqdm
    bars, and the lines `open_line` noted."""
    for end in list(_OPEN_LINES.values()):
        try:
            end()
        except (OSError, ValueError, AttributeError):  # its stream gone: nothing to end
            pass
    _OPEN_LINES.clear()
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        try:
            bar.close()
        except (OSError, ValueError, AttributeError):  # its stream gone: nothing to clear
            pass


class Heartbeat:
    """Calls `beat(seconds)` every `every` seconds from a daemon thread, from
    `start()` until `stop()` (`seconds`: since `start`): a sign of life
    through one long call that reports nothing itself (the train step's first
    call, tracing and compiling). `close_bars` stops it too, so that an
    error's line is the last. `stop()` returns after any beat under way. A
    beat whose stream is gone (a reader gone) ends the beats, with no
    traceback from the thread."""

    def __init__(self, every, beat):
        self.every, self.beat = float(every), beat
        self._stopped = self._thread = None

    def start(self):
        self.stop()
        stopped, began = threading.Event(), time.monotonic()

        def run():
            while not stopped.wait(self.every):
                try:
                    self.beat(time.monotonic() - began)
                except (OSError, ValueError) as err:
                    if not _stream_gone(err):  # a bug: its traceback, not silence
                        raise
                    return  # the job meets the gone stream at its next line
        self._stopped = stopped
        self._thread = threading.Thread(target=run, name="heartbeat", daemon=True)
        self._thread.start()
        open_line(self, self.stop)

    def stop(self):
        closed_line(self)
        if self._thread is not None:
            self._stopped.set()
            if self._thread is not threading.current_thread():
                self._thread.join()
            self._thread = None


def _stream_gone(err):
    """Whether a beat's `err` says its stream is gone: the pipe's reader went
    (an `OSError`: EPIPE) or the stream was closed (`ValueError: I/O
    operation on closed file`); any other `ValueError` is a bug of the beat."""
    return isinstance(err, OSError) or "closed file" in str(err)


@functools.cache
def _bar_class():
    from tqdm.auto import tqdm

    class Bar(tqdm):
        monitor_interval = 0  # no `tqdm_monitor` thread (it only tunes `miniters`)
    return Bar


def tqdm_bar(*args, **kwargs):
    """A `tqdm.auto` bar that starts no thread: tqdm's own starts a monitor
    thread with its first bar, shown or disabled, and leaves it running in
    the process for good.

    Args:
      *args, **kwargs: tqdm's.

    Returns:
      The bar.
    """
    return _bar_class()(*args, **kwargs)


class Progress:
    """A `progress(done, total)` callback for long loops.

    On a terminal (or with `bar=True`) a tqdm bar on `stream` (stderr);
    otherwise, or where tqdm is not installed (an ONNX serving box), when
    `lines` is true, a line at every ~10% (`desc: 3/30 (10%)`), never more
    than 11 lines, so logs stay short. `enabled=False` shows nothing.
    """

    def __init__(self, desc, enabled=True, lines=True, stream=None, bar=None):
        self.desc, self.stream = desc, stream or sys.stderr
        self.bar_mode = enabled and (interactive(self.stream) if bar is None else bar)
        self._lines_asked = enabled and lines
        self.lines = self._lines_asked and not self.bar_mode
        self._bar, self._next = None, 0

    def __call__(self, done, total):
        if not (self.bar_mode and self._update_bar(done, total)):
            self.report(done, total, f"{done}/{total}")

    def report(self, done, total, count):
        """The line of `done` of `total` (`desc: <count> (10%)`), when due."""
        if self.lines and total > 0 and (done >= self._next or done >= total):
            print(f"{self.desc}: {count} ({100 * done // total}%)", file=self.stream,
                  flush=True)
            step = max(1, math.ceil(total / 10))
            self._next = (done // step + 1) * step

    def _update_bar(self, done, total):
        """Draws the bar; False where tqdm is not installed (from then on: lines, if asked)."""
        if self._bar is None:
            try:
                self._bar = tqdm_bar(total=total, desc=self.desc, file=self.stream, leave=False)
            except ModuleNotFoundError as missing:
                if (missing.name or "").split(".")[0] != "tqdm":
                    raise
                self.bar_mode, self.lines = False, self._lines_asked
                return False
        self._bar.update(done - self._bar.n)
        if done >= total:
            self._bar.close()
            self._bar = None
        return True
