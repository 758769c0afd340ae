# std_streams.py -- rtkit's own stdin, stdout and stderr: closed or unread, they never change the job or its exit code.
"""A caller may start rtkit with a standard stream closed (`<&-`, `2>&-`, a daemon's launcher), or read its output
through a pipe that stops reading (`rtkit run ... 2>&1 | head`).

* Closed: the first files rtkit opens would take the free numbers 0, 1 or 2, which the command inherits as its own
  streams (the tree guard's pipe as its stdin; the guard itself points 0-2 at /dev/null, which closes its end
  there, and the command then dies of SIGPIPE before its exec). fill_closed(), first thing, holds each closed one
  with /dev/null, close-on-exec: rtkit's own files get higher numbers, and every command rtkit starts gets them
  closed, as it would without rtkit. Python made no stream object for them: rtkit's lines go to /dev/null, never
  to stdout in stderr's place.
* Unread: say() writes one line of rtkit's own to stderr; once the reader is gone, that line and the later ones go
  nowhere, and the job runs on and ends with its own exit code. fd 2 itself is left as it is: a command started
  later still gets it."""
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


def say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except BrokenPipeError:
        sys.stderr = open(os.devnull, "w")


def silence(stream) -> None:
    """What `stream` still holds and what comes to it go to /dev/null, with no error then or at exit. For a stream
    that no command started from now on inherits: `rtkit run`'s fd 2 is the command's too (say() leaves it)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.dup2(null, stream.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(null)
