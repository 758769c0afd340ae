# trace.py -- collect timeline events (from RunMetadata step stats and the pipeline) and write Chrome trace JSON.
"""One track (tid) per stage plus tracks for the step runs and the pipeline, so the trace opens in Perfetto or
chrome://tracing with the overlap of input and compute visible. Timestamps are microseconds since the epoch."""
from __future__ import annotations

import os
import threading
from typing import Dict, List, Optional

from .stages import STAGES

TRACKS = list(STAGES) + ["steps", "stage-put", "stage-wait"]
MAX_EVENTS = 200_000


class Trace:
    def __init__(self):
        self.events: List[Dict] = []
        self.dropped = 0
        self._lock = threading.Lock()

    def add(self, track: str, name: str, start_us: float, dur_us: float, args: Optional[Dict] = None) -> None:
        with self._lock:
            if len(self.events) >= MAX_EVENTS:
                self.dropped += 1
                return
            self.events.append({"name": name, "ph": "X", "ts": float(start_us), "dur": max(0.0, float(dur_us)),
                                "pid": os.getpid(), "tid": TRACKS.index(track) if track in TRACKS else len(TRACKS),
                                "cat": track, "args": args or {}})

    def add_step_stats(self, step_stats, stage_of: Dict[str, str], label: str) -> Dict[str, float]:
        """Add every op of a traced run; return op time per stage in ms (summed over ops)."""
        cost = {s: 0.0 for s in STAGES}
        for dev in step_stats.dev_stats:
            for ns in dev.node_stats:
                name = ns.node_name.split(":")[0]
                if name in ("_SOURCE", "_SINK"):
                    continue
                stage = stage_of.get(name, "other")
                dur = ns.op_end_rel_micros or ns.all_end_rel_micros
                cost[stage] += dur / 1000.0
                self.add(stage, name, ns.all_start_micros, dur,
                         {"run": label, "op": ns.timeline_label.split("=")[-1].strip() if ns.timeline_label else "",
                          "thread_id": ns.thread_id})
        return cost

    def chrome(self) -> Dict:
        pid = os.getpid()
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": "rtkit scheduler"}}]
        for i, t in enumerate(TRACKS):
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": i, "args": {"name": t}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": i, "args": {"sort_index": i}})
        with self._lock:
            events = list(self.events)
        return {"traceEvents": meta + events, "displayTimeUnit": "ms",
                "otherData": {"dropped_events": self.dropped, "time_unit": "us"}}
