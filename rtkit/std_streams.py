# std_streams.py -- rtkit's own stdin, stdout and stderr: closed, they never change the job or its exit code.
"""A caller may start rtkit with a standard stream closed (`<&-`, `2>&-`, a daemon's launcher). The first files
rtkit opens would then take the free numbers 0, 1 or 2, which the command inherits as its own streams (the tree
guard's pipe as its stdin; the guard itself points 0-2 at /dev/null, which closes its end there, and the command
then dies of SIGPIPE before its exec). fill_closed(), first thing, holds each closed one with /dev/null,
close-on-exec: rtkit's own files get higher numbers, and every command rtkit starts gets them closed, as it would
without rtkit. Python made no stream object for them: rtkit's lines go to /dev/null, never to stdout in stderr's
place."""
from __future__ import annotations

import os
import sys

_NAMES = ("stdin", "stdout", "stderr")


def fill_closed() -> None:
    for fd, name in enumerate(_NAMES):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        try:
            held = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return
        if held != fd:   # the lowest free number, fd itself unless another thread took it meanwhile
            os.dup2(held, fd, inheritable=False)
            os.close(held)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))

