# cpuwatch.py -- the cluster bench's CPU accounting: user+sys seconds of every process of a cluster, per training step.
"""Wall-clock throughput is noise on a shared machine; CPU time spent per training step is not (much). A
watcher thread samples /proc/PID/stat of every process under the bench's own children (the bare tasks,
or `rtkit launch` with its `rtkit run` wrappers and their tasks) every INTERVAL_S, and classifies each
once: which task (TF_CONFIG in its environment) and what it is (the task's own process, its `rtkit run`
wrapper, or the launcher). cpu_in() then gives each kind's CPU seconds inside a wall window (the
workers' training loops), interpolated between samples."""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Dict, List, Optional, Tuple

INTERVAL_S = 0.05
CLASSIFY_LOOKS = 20
_CLK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLK


def _children(pid: int) -> List[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                out += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return out


def _kind(pid: int) -> Optional[str]:
    """'ps-0 task', 'worker-1 rtkit-run', 'launcher', ... or None for a process of no interest."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = dict(x.split(b"=", 1) for x in fh.read().split(b"\0") if b"=" in x)
    except OSError:
        return None
    text = b" ".join(argv).decode("utf-8", "replace")
    if " -m rtkit launch" in text:
        return "launcher"
    task = ""
    if b"TF_CONFIG" in env:
        try:
            t = json.loads(env[b"TF_CONFIG"])["task"]
            task = f"{t['type']}-{t['index']}"
        except (ValueError, KeyError, TypeError):
            task = "?"
    if " -m rtkit run" in text:
        return f"{task} rtkit-run"
    if "rtkit.workloads" in text:
        return f"{task} task"
    return f"{task} other" if task else "other"


class Watcher:
    """Samples the CPU of every descendant of this process while running (start(), stop())."""

    def __init__(self, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self.series: Dict[int, List[Tuple[float, float]]] = {}
        self.kinds: Dict[int, str] = {}
        self._looks: Dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _sample(self) -> None:
        now = time.time()
        todo, seen = _children(os.getpid()), set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            todo += _children(pid)
            cpu = _cpu_s(pid)
            if cpu is None:
                continue
            looks = self._looks.get(pid, 0)
            if looks < CLASSIFY_LOOKS:   # a process seen between fork and exec still shows its parent's command
                self._looks[pid] = looks + 1
                self.kinds[pid] = _kind(pid) or "other"
            self.series.setdefault(pid, []).append((now, cpu))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def start(self) -> "Watcher":
        self._thread = threading.Thread(target=self._loop, name="cpuwatch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def cpu_in(self, t0: float, t1: float) -> Dict[str, float]:
        """CPU seconds of each kind of process between wall times t0 and t1 (a process's CPU before its first
        sample is unknown: its series starts at its first sample, which is near its start at 50 ms)."""
        out: Dict[str, float] = {}
        for pid, series in self.series.items():
            spent = _at(series, t1) - _at(series, t0)
            out[self.kinds[pid]] = out.get(self.kinds[pid], 0.0) + spent
        return out


def _at(series: List[Tuple[float, float]], t: float) -> float:
    """CPU seconds at wall time t, linear between samples (0 before the first, the last after the last)."""
    if t <= series[0][0]:
        return 0.0 if t < series[0][0] else series[0][1]
    for (ta, ca), (tb, cb) in zip(series, series[1:]):
        if ta <= t <= tb:
            return ca + (cb - ca) * (t - ta) / (tb - ta) if tb > ta else cb
    return series[-1][1]
