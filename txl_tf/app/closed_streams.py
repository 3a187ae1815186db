"""Standard streams a command was started without (`>&-`, `2>&-`, `<&-`).

With file descriptor 0, 1 or 2 closed, Python sets `sys.stdin`,
`sys.stdout` or `sys.stderr` to None, which the libraries that write to
them do not expect (`import tensorflow`'s start-up, absl, tqdm, a final
flush: tracebacks), and the next file the process opens takes the free
descriptor, so that a C++ log line written to it would land in that file
(a checkpoint, an export). `fill_closed_streams` puts the null device on
each closed descriptor and gives Python a stream there: what would have
gone to a closed stream goes nowhere, as the shell asked. Only the
standard library is imported here.
"""
import os
import sys

STREAMS = ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w"))


def fill_closed_streams():
    """Opens the null device on each standard descriptor that is closed and
    sets the matching `sys` stream (None there) to a stream on it. A
    descriptor open again by now (a file took it) is left to its file; its
    `sys` stream then writes to the null device."""
    for fd, name, mode in STREAMS:
        if getattr(sys, name) is not None:
            continue
        try:
            os.fstat(fd)
        except OSError:  # closed: the null device takes it
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            stream = open(fd, mode, encoding="utf-8", errors="replace", closefd=False)
        else:
            stream = open(os.devnull, mode, encoding="utf-8")
        setattr(sys, name, stream)
