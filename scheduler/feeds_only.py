# feeds_only.py -- tier mode with the scheduler off: the lookahead of fed ids alone, and its report.
"""A table past DRAM lives in the tier pool (the capacity profile), and a TF1 script that feeds its ids
(`sess.run(train, {ids: batch})`) gains from having each step's rows asked for together just before the step
(lookahead_feeds.py). That needs none of the rest of the scheduler, which the capacity profile leaves off
(sched=0). So with sched=0, a tier pool path and sched_lookahead not off, rtkit.hooks.install registers this
component instead of the Scheduler: a run wrapper that looks only at runs with feeds (Pipeline.wrap_fed_run), the
close and exit callbacks, and nothing else: no config filter (the sessions keep the script's ConfigProto and
TensorFlow's pools), no eager threading, no staging, tracing, tuning or pinning, no step subscription.
make_callable callables with a feed list and MonitoredTrainingSession runs reach it too: TensorFlow sends both
through Session.run. Its report is scheduler-<pid>.json with "lookahead_only": true and the lookahead's figures;
the keys of the scheduler's own report are there with null values (nothing of it ran)."""
from __future__ import annotations

import os
from typing import Any, Dict

from .report import write_report


def wanted(settings: Dict[str, Any]) -> bool:
    """Whether the lookahead runs alone: the scheduler off, tier mode (a pool path), the lookahead not off."""
    return not settings.get("sched") and bool(settings.get("tier_pool_path")) and \
        str(settings.get("sched_lookahead") or "auto") != "off"


class FedLookaheadOnly:
    """The component the hooks register in place of the Scheduler; `sched` is a Scheduler made lookahead_only."""

    def __init__(self, sched):
        self.sched = sched
        self._finished = False

    def wrap_run(self, session, run_next, fetches, feed_dict=None, options=None, run_metadata=None):
        return self.sched.wrap_fed_run(session, run_next, fetches, feed_dict, options, run_metadata)

    def on_close(self, session) -> None:
        self.sched.on_close(session)

    def report(self) -> Dict[str, Any]:
        s = self.sched
        return {
            "schema_version": 2,
            "pid": os.getpid(),
            "lookahead_only": True,
            "state": "off (sched=0): only its lookahead of fed ids ran (tier mode: tier_pool_path is set); no thread "
                     "pools, staging or tuning",
            "settings": {k: v for k, v in s.settings.items() if k.startswith("sched")},
            "stages": None, "chosen": None, "tuning": None, "speedup_over_first_x": None,
            "pipeline": {"enabled": False, "occupancy_mean_batches": None, "occupancy_samples_batches": [],
                         "lookahead": s.lookahead_report()},
            "errors": s.errors,
            "notes": s.notes,
        }

    def at_exit(self) -> None:
        if not self._finished and self.sched.run_dir:
            self._finished = True
            try:
                write_report(self.sched.run_dir, self.report(), None)
            except OSError as exc:
                self.sched.note(f"cannot write the lookahead's report: {exc}")
