# rtkit.scheduler -- stage-aware thread-pool scheduler for TensorFlow sessions (installed as rtkit.scheduler).
"""activate(tf, settings, run_dir) is called by rtkit's bootstrap right after TensorFlow is imported when
RTKIT_SCHED is on. It builds one Scheduler and registers it with the hook extension points:
config_filters (thread config and per-stage pools), run_wrappers (routing, SmartStage pipelining, tracing,
tuning), close_callbacks (stop the session's pipeline) and exit_callbacks (write scheduler-<pid>.json and
trace-<pid>.json into the run directory)."""
from __future__ import annotations

from typing import Any, Dict, Optional

from .core import Scheduler

_active: Optional[Scheduler] = None


def activate(tf, settings: Dict[str, Any], run_dir: Optional[str]) -> Scheduler:
    global _active
    if _active is not None:
        return _active
    from rtkit.hooks import registry  # the lead's extension points

    sched = Scheduler(tf, settings, run_dir)
    sched.configure_eager()
    registry.config_filters.append(sched.filter_config)
    registry.run_wrappers.append(sched.wrap_run)
    registry.close_callbacks.append(sched.on_close)
    registry.exit_callbacks.append(sched.at_exit)
    _active = sched
    return sched


def active() -> Optional[Scheduler]:
    return _active


__all__ = ["activate", "active", "Scheduler"]
