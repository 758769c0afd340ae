# early_signals.py -- holds the stop signals that reach `rtkit` while it starts, so none kills it before its own handlers.
"""Installed first thing by the CLI's main (before the slow imports): a SIGTERM, SIGHUP, SIGQUIT or SIGINT that arrives
while rtkit starts is kept as `pending()`. `rtkit run` then leaves a report saying the command was never
started; every other command gets the signal back, with its usual effect, once it is parsed (release()). Signals
that the caller blocked are unblocked in rtkit only: the command still starts with the caller's mask
(child_mask()). Imports nothing of rtkit: it must stay cheap."""
from __future__ import annotations

import os
import signal
import threading
from typing import Dict, Optional

SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGINT)
_pending: Optional[int] = None
_previous: Dict[int, object] = {}
_caller_mask: Optional[set] = None


def _hold(signum, frame) -> None:
    global _pending
    if _pending is None:
        _pending = signum


def hold() -> None:
    global _caller_mask
    if threading.current_thread() is not threading.main_thread() or _previous:
        return
    for sig in SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue  # ignored by the caller (nohup): stays ignored
        _previous[sig] = signal.signal(sig, _hold)
    _caller_mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, list(_previous))


def handler():
    """The holding handler: what later handlers put back when they are done."""
    return _hold


def pending() -> Optional[int]:
    return _pending


def child_mask() -> Optional[set]:
    """The signal mask rtkit was started with (None: unchanged), for the command it starts."""
    return _caller_mask if _caller_mask else None


def release(deliver: bool = True) -> None:
    """Back to the usual dispositions and mask; a signal held meanwhile is delivered now (deliver)."""
    global _pending
    for sig, prev in _previous.items():
        signal.signal(sig, prev)
    _previous.clear()
    if _caller_mask:
        signal.pthread_sigmask(signal.SIG_SETMASK, _caller_mask)
    sig, _pending = _pending, None
    if sig is not None and deliver:
        os.kill(os.getpid(), sig)
