# snapshot.py -- the parent's live loop: rebuilds the report every few seconds into live.json and feeds the exporters.
"""While the child runs, a thread of `rtkit run` assembles the report with the same code that writes
report.json (runner.assemble, handed in, over the parent's samples so far and the child's files as last
rewritten), marks it running with the time it describes, and writes it atomically to RUN_DIR/live.json.
Each snapshot also goes to the exporters. A snapshot's own cost is measured and kept in the final report (`live` section)."""
from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Dict, List, Optional

from rtkit import atomic, std_streams
from rtkit.report import model

LIVE_FILE = "live.json"
WINDOW_STEPS = 100      # `rtkit top`'s window: the latest steps the windowed figures are over
BUDGET = 0.02           # a snapshot may take at most this share of the time between snapshots (in CPU time)
# live.json keeps each per-step list's latest records only (the whole-run figures are computed before the cut, the
# exporters get the whole lists): rewritten whole with every record, it grew with the run (712 KB at 3,000 steps of
# wdl, every 2 s: 115-140 KiB/s of disk writes)
LIVE_RECORDS = 50
# and it is rewritten at a snapshot only when its rewrites average at most this many bytes a second (DCN's 32 KB file:
# every 4 s; the exporters get every snapshot)
LIVE_WRITE_BUDGET = 8 << 10
PER_STEP_KEYS = ("per_step", "samples", "timeline", "census", "per_step_census", "events")


def for_file(report: Dict[str, Any]) -> Dict[str, Any]:
    """The snapshot as live.json holds it: every section's per-step lists cut to their latest LIVE_RECORDS, and
    `live.records_cut` saying how many each list lost."""
    out, cut = dict(report), {}
    for name, sec in report.items():
        if not isinstance(sec, dict):
            continue
        for key in PER_STEP_KEYS:
            seq = sec.get(key)
            if isinstance(seq, list) and len(seq) > LIVE_RECORDS:
                if out[name] is sec:
                    out[name] = dict(sec)
                out[name][key] = seq[-LIVE_RECORDS:]
                cut[f"{name}.{key}"] = len(seq) - LIVE_RECORDS
    if isinstance(out.get("live"), dict):
        out["live"] = dict(out["live"], records_cut=cut)
    return out


def window(report: Dict[str, Any], steps: int = WINDOW_STEPS) -> Dict[str, Any]:
    """Step figures over the latest `steps` measured steps (past the warm-up)."""
    st = report.get("steps") or {}
    per = st.get("per_step") or []
    warm = st.get("warmup_steps") or 0
    recent = per[warm:][-steps:]
    times = [s["step_ms"] for s in recent if isinstance(s.get("step_ms"), (int, float))]
    faults = [s["minor_faults"] for s in recent if isinstance(s.get("minor_faults"), (int, float))]
    if not times:
        return {"steps": 0, "step_ms_median": None, "step_ms_p95": None, "steps_per_s": None,
                "minor_faults_per_step_median": None}
    med = statistics.median(times)
    return {"steps": len(times), "step_ms_median": round(med, 3),
            "step_ms_p95": round(model.percentile(times, 0.95), 3),
            "steps_per_s": round(1000.0 / med, 3) if med > 0 else None,
            "minor_faults_per_step_median": statistics.median(faults) if faults else None}


@dataclass
class _Running:
    """What runner.assemble reads of a finished child, for a child still running."""
    start: float
    end: float
    samples: List[dict]
    exit_code: Optional[int] = None
    signal_name: Optional[str] = None
    status: str = "running"
    error: Optional[str] = None
    rusage: Optional[dict] = None


@dataclass
class Live:
    command: List[str]
    resolved: Any
    run_dir: str
    child_env: Dict[str, str]
    base_env: Dict[str, str]
    notes: List[str]
    assemble: Callable[..., Dict[str, Any]]   # runner.assemble: the code that builds report.json
    exporters: List[Any] = field(default_factory=list)
    costs_ms: List[float] = field(default_factory=list)       # wall time of each snapshot
    cpu_costs_ms: List[float] = field(default_factory=list)   # CPU time of the thread for each (a loaded
    # machine stretches the wall time; the CPU time is what a snapshot takes from the job)
    waits_s: List[float] = field(default_factory=list)        # the time actually left between snapshots (grows with their cost)
    file_bytes: int = 0                                       # live.json's size when last written
    file_written: float = 0.0                                 # and when (time.monotonic())
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None
    _sampler: Any = None

    @property
    def interval_s(self) -> float:
        return self.resolved["live_interval_ms"] / 1000.0

    def start(self, sampler) -> "Live":
        """Called by launch.run_child once the child and its sampler run."""
        self._sampler = sampler
        if self.interval_s > 0 or self.exporters:
            self._thread = threading.Thread(target=self._loop, name="rtkit-live", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def build(self) -> Dict[str, Any]:
        """The report as of now, marked running."""
        now = time.time()
        result = _Running(self._sampler.start, now, list(self._sampler.samples))
        report = self.assemble(self.command, self.resolved, self.run_dir, self.child_env, self.base_env, result,
                                 list(self.notes))
        report["run"]["end_time"] = None
        report["live"] = {"as_of": datetime.fromtimestamp(now).astimezone().isoformat(timespec="seconds"),
                          "as_of_unix": round(now, 3), "start_unix": self._sampler.start, "window": window(report),
                          **self.cost()}
        return report

    def snapshot_once(self) -> Dict[str, Any]:
        t0, c0 = time.perf_counter(), time.thread_time()
        report = self.build()
        # live.json when its rewrites stay within their budget (the exporters get every snapshot)
        if self.interval_s > 0 and time.monotonic() - self.file_written >= self.file_bytes / LIVE_WRITE_BUDGET:
            try:
                path = os.path.join(self.run_dir, LIVE_FILE)
                atomic.write_json(path, for_file(report), indent=None)
                self.file_bytes, self.file_written = os.path.getsize(path), time.monotonic()
            except OSError:
                pass   # the run directory was reported unwritable already; report.json says the rest
        for exp in list(self.exporters):
            try:
                exp.update(report)
            except Exception as exc:   # an exporter that fails is dropped, once said; the job and the rest go on
                self.exporters.remove(exp)
                line = f"{exp.name}: stopped: {type(exc).__name__}: {exc}"
                std_streams.say(f"rtkit: {line}")
                self.notes.append(line)
        self.costs_ms.append((time.perf_counter() - t0) * 1000.0)
        self.cpu_costs_ms.append((time.thread_time() - c0) * 1000.0)
        return report

    def _loop(self) -> None:
        wait = self.interval_s or 2.0
        self.waits_s.append(wait)
        while not self._stop.wait(wait):
            try:
                self.snapshot_once()
            except Exception:  # a snapshot is a convenience: never let it end the run or its report
                continue
            # long jobs have long step lists: space snapshots so that they stay a small share of the CPU time
            # (the CPU time: on a loaded machine the wall time also counts the waits for a core)
            wait = max(self.interval_s or 2.0, self.cpu_costs_ms[-1] / 1000.0 / BUDGET)
            self.waits_s.append(wait)

    def cost(self) -> Dict[str, Any]:
        """What the snapshots cost, measured: count, median and max wall time each, median CPU time each, and
        the medians' shares of the interval."""
        c, cpu = self.costs_ms, self.cpu_costs_ms
        med = statistics.median(c) if c else None
        # the shares are of the time actually left between snapshots (it grew where snapshots cost more)
        spacing = statistics.median(self.waits_s) if self.waits_s else self.interval_s
        return {"interval_s": self.interval_s, "snapshots": len(c),
                "interval_s_median": round(spacing, 3),
                "snapshot_ms_median": round(med, 3) if med is not None else None,
                "snapshot_ms_max": round(max(c), 3) if c else None,
                "snapshot_cpu_ms_median": round(statistics.median(cpu), 3) if cpu else None,
                "share_of_interval": round(med / 1000.0 / spacing, 5)
                if med is not None and spacing > 0 else None,
                "cpu_share_of_interval": round(statistics.median(cpu) / 1000.0 / spacing, 5)
                if cpu and spacing > 0 else None}

    def final_section(self, report: Dict[str, Any]) -> Dict[str, Any]:
        """report.json's `live` section: the last window's figures and what the snapshots cost."""
        start = self._sampler.start if self._sampler is not None else None
        return {"start_unix": start, "window": window(report), **self.cost()}

    def finish(self, report: Dict[str, Any], keep_snapshot: bool = False) -> None:
        """After report.json is written: the exporters take the final figures; live.json goes (this run made
        it), unless report.json could not be written (then the last snapshot is all there is)."""
        for exp in self.exporters:
            try:
                exp.finish(report)
            except Exception as exc:
                std_streams.say(f"rtkit: {exp.name}: {exc}")
        if keep_snapshot:
            return
        try:
            os.unlink(os.path.join(self.run_dir, LIVE_FILE))
        except OSError:
            pass
