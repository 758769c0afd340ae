# registry.py -- extension points through which components (the scheduler) join the session hooks.
"""See docs/report.md and /work notes: config_filters, run_wrappers, close_callbacks, exit_callbacks."""
import contextlib
import threading
from typing import Callable, List

config_filters: List[Callable] = []     # fn(config) -> config, at BaseSession.__init__
run_wrappers: List[Callable] = []       # fn(session, run_next, fetches, feed_dict, options, run_metadata)
close_callbacks: List[Callable] = []    # fn(session), before BaseSession.close
exit_callbacks: List[Callable] = []     # fn(), at interpreter exit

_local = threading.local()


@contextlib.contextmanager
def internal():
    """Session runs made by rtkit itself (e.g. a pipelined input stage) inside this block are not steps."""
    previous = getattr(_local, "internal", False)
    _local.internal = True
    try:
        yield
    finally:
        _local.internal = previous


def is_internal() -> bool:
    return getattr(_local, "internal", False)
