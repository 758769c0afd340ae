# signal_flush.py -- the child writes its step records when SIGTERM, SIGHUP or SIGQUIT ends it, then dies by that signal.
"""Installed by the main thread: in the command's own process at its start (the bootstrap), in any other once it
records steps (at its own first step when another thread made the process's first); only for signals still at
their default action (a handler or an ignore the program set, in Python or in C such as faulthandler.register's,
is left alone; a handler it sets later replaces this one, and its own exit then flushes through atexit). The
handler flushes, puts the default action back and sends the signal again, so the process ends exactly as it would
without rtkit (killed by the signal: exit status 128+N).

A Python handler runs only when the main thread is back in the interpreter; TensorFlow blocks it in C for
minutes (`server.join()`, a long `Session.run`). So the signal's wake-up byte also reaches a small watcher
thread (signal.set_wakeup_fd), which does the same at once when the handler is still this one.

A program may close that pipe behind rtkit's back (a daemon's os.closerange after its fork); Python would then write
each handled signal's byte to a closed descriptor ("Exception ignored ... Bad file descriptor" on the program's
stderr, each time) or into whatever file took the number next. os.closerange from the main thread drops the wake-up fd
first when it is among those it closes; for any other close (os.close one by one, C code) the watcher, which sees the
pipe's end, has the main thread drop it at its next bytecode (Py_AddPendingCall) once it is no longer this pipe
(os.fstat: another file, or none). The process then has no watcher: the handler flushes when the main thread runs.

Across os.fork the forking thread holds these signals blocked: until the child has let go of the parent's wake-up
pipe and reset what the parent's threads may have held, a signal sent to the child waits. Otherwise its wake-up
byte would reach the parent's watcher, which would end the parent."""
from __future__ import annotations

import ctypes
import os
import signal
import threading
from typing import Callable, Optional

SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_flush: Optional[Callable[[], None]] = None
_lock = threading.RLock()  # a second signal may land inside the first one's handler
_fork_mask = threading.local()  # the signals that the forking thread's fork hook blocked
# sent to the thread that faulted: never blocked in rtkit's thread (a fault there would end the process unseen)
_FAULTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS, signal.SIGABRT}
_wakeup: Optional[tuple] = None   # (fd, st_dev, st_ino) of the wake-up pipe's write end this process set


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


def _default_action(signum: int) -> bool:
    """Whether the kernel has the signal at its default action. Python's own table (signal.getsignal) misses a
    handler set in C: faulthandler.register's, a native library's."""
    action = ctypes.create_string_buffer(256)   # a struct sigaction: its first member is the handler (glibc, Linux)
    if ctypes.CDLL(None).sigaction(signum, None, action) != 0:
        return False
    return ctypes.c_void_p.from_buffer(action).value is None   # SIG_DFL is 0


def _handler(signum, frame) -> None:
    _die_by(signum)


def _wakeup_gone() -> bool:
    """Whether the wake-up fd rtkit set is no longer its pipe: closed, or its number now another file's."""
    if _wakeup is None:
        return False
    fd, dev, ino = _wakeup
    try:
        st = os.fstat(fd)
    except OSError:
        return True
    return (st.st_dev, st.st_ino) != (dev, ino)


def _drop_wakeup_fd(closing: bool = False) -> None:
    """Main thread only (set_wakeup_fd): no more signal bytes to rtkit's wake-up fd once it is gone (or, closing,
    about to be closed)."""
    global _wakeup
    if _wakeup is None or not (closing or _wakeup_gone()):
        return
    try:
        current = signal.set_wakeup_fd(-1)
    except ValueError:   # not the main thread
        return
    if current != _wakeup[0]:   # the program set its own since (asyncio): it stays
        signal.set_wakeup_fd(current)
    _wakeup = None


def _drop_in_main_thread(_arg) -> int:
    try:
        _drop_wakeup_fd()
    except Exception:
        pass
    return 0


_pending_call = None   # the C callback of _drop_in_main_thread, made when first needed and kept while it may run


def _ask_main_thread_to_drop() -> None:
    """_drop_wakeup_fd run by the main thread at its next bytecode (Py_AddPendingCall): set_wakeup_fd is for the main
    thread alone, and this thread cannot wait for a call into rtkit that may never come."""
    global _pending_call
    try:
        kind = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
        if _pending_call is None:
            _pending_call = kind(_drop_in_main_thread)
        api = ctypes.PyDLL(None)
        api.Py_AddPendingCall.argtypes = [kind, ctypes.c_void_p]
        api.Py_AddPendingCall(_pending_call, None)
    except Exception:   # no callback or no symbol here: Python writes on to the closed descriptor, as before
        pass


_os_closerange = os.closerange


def _closerange(fd_low: int, fd_high: int) -> None:
    """os.closerange, rtkit's wake-up fd dropped first when it is among the descriptors closed."""
    if _wakeup is not None and fd_low <= _wakeup[0] < fd_high and threading.current_thread() is threading.main_thread():
        _drop_wakeup_fd(closing=True)
    _os_closerange(fd_low, fd_high)


_closerange.__doc__ = _os_closerange.__doc__


def _watch(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:
            break
        for signum in data:
            if signum in SIGNALS and signal.getsignal(signum) is _handler:
                _die_by(signum)
    # every write end is closed: the program closed rtkit's (a daemon's closerange), which Python still writes to
    if _wakeup_gone():
        _ask_main_thread_to_drop()


def _above_standard_streams(fd: int) -> int:
    """fd itself, or a copy numbered 3 or more: a standard stream the process was started with closed (`2>&-`)
    stays closed, never rtkit's pipe in its place (rtkit/std_streams.py)."""
    if fd > 2:
        return fd
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


def _start_watcher() -> None:
    global _wakeup
    read_fd, write_fd = (_above_standard_streams(fd) for fd in os.pipe())
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
    st = os.fstat(write_fd)
    _wakeup = (write_fd, st.st_dev, st.st_ino)
    os.closerange = _closerange   # same behaviour; rtkit's wake-up fd is dropped before it closes it
    # the watcher takes no signal itself: one that the program blocks in its threads (around a critical section, or
    # to sigwait for it) stays pending for them, as without rtkit; a thread inherits its creator's mask
    creators_mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - _FAULTS)
    try:
        threading.Thread(target=_watch, args=(read_fd,), name="rtkit-signal-flush", daemon=True).start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, creators_mask)


def _before_fork() -> None:
    _fork_mask.blocked = set(SIGNALS) - signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


def _unblock_after_fork() -> None:
    # only what _before_fork blocked: the program's own fork hooks may have changed the mask since, and keep it so
    blocked = getattr(_fork_mask, "blocked", None)
    if blocked:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    _fork_mask.blocked = None


def _after_fork_in_child() -> None:
    global _lock, _wakeup
    try:
        _lock = threading.RLock()  # the parent's watcher may have held it at the fork
        # the pipe is the parent's: a signal of this child must never wake the parent's watcher
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            return
        _wakeup = None
        if any(signal.getsignal(s) is _handler for s in SIGNALS):
            _start_watcher()
    finally:
        _unblock_after_fork()


def install(flush: Callable[[], None]) -> bool:
    """flush at SIGTERM/SIGHUP/SIGQUIT; only from the main thread (a Python handler is set nowhere else). The caller
    resets what flush writes in a forked child with an at-fork hook registered before this call: hooks run in that
    order, and the forking thread holds these signals blocked until this module's hook ends, so none reaches flush
    with the parent's state. False: none of them is this module's (or not the main thread, or installed already)."""
    global _flush
    if _flush is not None or threading.current_thread() is not threading.main_thread():
        return False
    _flush = flush
    mine = False
    for sig in SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL and _default_action(sig):
            signal.signal(sig, _handler)
            mine = True
    if mine:
        _start_watcher()
        os.register_at_fork(before=_before_fork, after_in_parent=_unblock_after_fork,
                            after_in_child=_after_fork_in_child)
    return mine
