# core.py -- the Scheduler the hooks register: its settings, notes and errors, and the concerns it is made of.
"""rtkit's hooks register these methods at their extension points: filter_config (config_filters),
wrap_run (run_wrappers), wrap_callable (callable_wrappers), filter_dataset (dataset_filters), on_close
(close_callbacks), at_exit (exit_callbacks), and on_step as a subscriber of the hooks' step owner, which alone
decides what a training step is: the scheduler never counts run signatures itself. Each method is also callable
directly, which is how the tests drive it before/without the hooks.

The concerns live in their own modules: threads.py (ConfigProtos, pools, dataset options), pipeline.py (analysis,
rewrite, staged runs) and measure.py (step times, tracing, tuning, the report)."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, ContextManager, Dict, List, Optional

from .measure import Measurement
from .pipeline import Pipeline
from .threads import ThreadConfig

MAX_NOTES = 50


class Scheduler(ThreadConfig, Pipeline, Measurement):
    def __init__(self, tf, settings: Dict[str, Any], run_dir: Optional[str],
                 internal: Callable[[], ContextManager] = contextlib.nullcontext,
                 before_run: Optional[Callable[[float], None]] = None,
                 timed_run: Optional[Callable[..., Any]] = None, lookahead_only: bool = False):
        self.tf = tf
        # feeds_only.py: the scheduler off (sched=0) in tier mode, only the lookahead of fed ids runs; nothing that
        # stages, tunes or pins is made, whatever those settings say
        self.lookahead_only = lookahead_only
        if lookahead_only:
            settings = dict(settings, sched_stage=False, sched_tune=False, sched_pin=False, sched_stage_read_ahead=0)
        self._internal = internal  # the hooks' "not a step" context for rtkit's own session runs
        # tells the hooks' step timing how long a run spent here before TF (the wait for a staged batch): the
        # script waited for it, so it is part of the step
        self._before_run = before_run
        # a staged step reaches TF through a callable, not Session.run's path: the hooks time and record it as
        # the step it replaces (fn(session, fetch names, target names, call) -> call())
        self._timed_run = timed_run or (lambda session, fetch_names, target_names, call: call())
        self.settings = dict(settings)
        self.run_dir = run_dir
        self.tune = bool(settings.get("sched_tune"))
        self.notes: List[str] = []
        self.errors: List[str] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self._init_pipeline(settings)
        self._init_threads(settings)
        self._init_measurement()
        # the candidate applied now, read by the threads and the pipeline and set by the tuner; the first is the job
        # as the script made it (TF-sized pool, the input stage run inline)
        self.active = {"compute": self.plan.compute_sizes[0], "input": self.plan.input_sizes[0],
                       "stage": self.stage and self.tuner is None, "read_ahead": False}

    def note(self, text: str) -> None:
        with self._lock:
            if text not in self.notes and len(self.notes) < MAX_NOTES:
                self.notes.append(text)

    def _error(self, text: str) -> None:
        self.note(text)
        with self._lock:
            if text not in self.errors and len(self.errors) < MAX_NOTES:
                self.errors.append(text)
