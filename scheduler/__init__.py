# rtkit.scheduler -- stage-aware thread-pool scheduler for TensorFlow sessions (installed as rtkit.scheduler).
"""activate(tf, settings, run_dir) builds the process's one Scheduler. The scheduler knows nothing of rtkit's
hooks: rtkit.hooks.install calls activate() right after TensorFlow is imported (when RTKIT_SCHED is on) and
registers the Scheduler's methods at its own extension points: filter_config (each session's ConfigProto and
per-stage pools), wrap_run (routing, in-graph SmartStage staging, tracing, tuning), wrap_callable
(make_callable), filter_dataset (Keras fit's tf.data input), on_close (stop the session's staging runner),
on_step (subscribed to the hooks' step owner: the scheduler never decides what a step is) and at_exit (write scheduler-<pid>.json and trace-<pid>.json into the run directory). The hooks
also pass `internal`, the context in which the scheduler's own session runs are not counted as steps,
`before_run(ms)`, which adds the scheduler's time before a run (the wait for a staged batch) to that run's step
time, and `timed_run`, which times and records a staged step (a callable that bypasses Session.run's path) as the
step it stands for."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Dict, Optional

from .core import Scheduler

_active: Optional[Scheduler] = None


def activate(tf, settings: Dict[str, Any], run_dir: Optional[str],
             internal: Callable[[], ContextManager] = contextlib.nullcontext,
             before_run: Optional[Callable[[float], None]] = None,
             timed_run: Optional[Callable[..., Any]] = None, lookahead_only: bool = False) -> Scheduler:
    """The process's Scheduler, created on the first call (later calls return the same one). lookahead_only: the
    scheduler is off and only its lookahead of fed ids runs (feeds_only.py): TensorFlow's threading is not touched."""
    global _active
    if _active is None:
        sched = Scheduler(tf, settings, run_dir, internal=internal, before_run=before_run, timed_run=timed_run,
                          lookahead_only=lookahead_only)
        if not lookahead_only:
            sched.configure_eager()
        _active = sched
    return _active


def active() -> Optional[Scheduler]:
    return _active


__all__ = ["activate", "active", "Scheduler"]
