# signal_flush.py -- the child writes its step records when SIGTERM, SIGHUP or SIGQUIT ends it, then dies by that signal.
"""Installed once a process records steps, only for signals still at their default action (a handler or an
ignore the program set is left alone; a handler it sets later replaces this one, and its own exit then flushes
through atexit). The handler flushes, puts the default action back and sends the signal again, so the process
ends exactly as it would without rtkit (killed by the signal: exit status 128+N).

A Python handler runs only when the main thread is back in the interpreter; TensorFlow blocks it in C for
minutes (`server.join()`, a long `Session.run`). So the signal's wake-up byte also reaches a small watcher
thread (signal.set_wakeup_fd), which does the same at once when the handler is still this one."""
from __future__ import annotations

import ctypes
import os
import signal
import threading
from typing import Callable, Optional

SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_flush: Optional[Callable[[], None]] = None
_lock = threading.RLock()  # a second signal may land inside the first one's handler


def _die_by(signum: int) -> None:
    with _lock:  # the handler and the watcher may both get here: one flush
        try:
            if _flush is not None:
                _flush()
        except Exception:
            pass
        # the default action back (libc's, callable from any thread), then the same signal again
        ctypes.CDLL(None).signal(signum, ctypes.c_void_p(0))
        os.kill(os.getpid(), signum)


def _handler(signum, frame) -> None:
    _die_by(signum)


def _watch(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum in SIGNALS and signal.getsignal(signum) is _handler:
                _die_by(signum)


def _start_watcher() -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        old = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        old = None
    if old != -1:  # the program (asyncio) has its own wake-up fd: leave it; the handler still flushes
        if old is not None:
            signal.set_wakeup_fd(old)
        os.close(read_fd)
        os.close(write_fd)
        return
    threading.Thread(target=_watch, args=(read_fd,), name="rtkit-signal-flush", daemon=True).start()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # the parent's watcher may have held it at the fork
    # the pipe is the parent's: a signal of this child must never wake the parent's watcher
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        return
    if any(signal.getsignal(s) is _handler for s in SIGNALS):
        _start_watcher()


def install(flush: Callable[[], None]) -> None:
    global _flush
    if _flush is not None or threading.current_thread() is not threading.main_thread():
        return
    _flush = flush
    mine = False
    for sig in SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _handler)
            mine = True
    if mine:
        _start_watcher()
        os.register_at_fork(after_in_child=_after_fork_in_child)
