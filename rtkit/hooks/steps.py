# steps.py -- records every candidate step, decides which run signature is the training step, marks the allocator.
"""A *training step* is the run signature that recurs most (the dominant fetch/target set) for sessions, each
batch for Keras fit, and each rtkit.step() call for custom loops. Results go to RTKIT_RUN_DIR/steps-<pid>.json,
rewritten atomically every few seconds and at exit, so a killed job still leaves most of its steps."""
from __future__ import annotations

import ctypes
import os
import resource
import threading
import time
from typing import Dict, List, Optional

from rtkit import atomic

FLUSH_INTERVAL_S = 5.0
FLUSH_BUDGET = 0.02  # a periodic flush may take at most this share of the time between flushes
MAX_RECORDS = 200_000  # per signature; beyond it steps are counted but their records dropped
HOOK_RUN_PREFIX = "hook run: "
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes() -> Optional[int]:
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _find_step_mark():
    """rtkit_step_mark() of the preloaded allocator, looked up in the global namespace; None when absent."""
    try:
        fn = ctypes.CDLL(None).rtkit_step_mark
    except (AttributeError, OSError):
        return None
    fn.restype = None
    fn.argtypes = []
    return fn


class _Signature:
    __slots__ = ("name", "count", "total_ms", "records", "api", "candidate")

    def __init__(self, name: str, api: Optional[str] = None, candidate: bool = True):
        self.name = name
        self.api = api
        self.candidate = candidate   # False: runs known not to be training steps (a hook's own runs)
        self.count = 0
        self.total_ms = 0.0
        self.records: List[tuple] = []


def _beats(sig: "_Signature", best: "_Signature") -> bool:
    """Whether `sig` is the training step rather than `best`. The one that recurs most, except that a run with
    target ops (a train op) beats fetch-only runs that recur at most twice as often: MonitoredTrainingSession's
    hooks read global_step once per step and a few times more (at start, at checkpoints)."""
    if sig is best:
        return False
    mine, theirs = sig.name.startswith("targets="), best.name.startswith("targets=")
    if mine == theirs:
        return sig.count > best.count
    if mine:
        return sig.count * 2 >= best.count
    return sig.count > best.count * 2


class StepRecorder:
    def __init__(self):
        self.lock = threading.RLock()  # RLock: a signal handler may flush while this thread records
        self.sources: Dict[str, Dict[str, _Signature]] = {"session": {}, "keras": {}, "coordinator": {}, "manual": {}}
        self.best: Dict[str, Optional[_Signature]] = {"session": None, "keras": None, "coordinator": None, "manual": None}
        self.notes: List[str] = []
        self.hook = {"status": "no_tensorflow", "detail": "TensorFlow was not imported", "tensorflow_version": None}
        self.step_mark = _find_step_mark()
        self.run_dir = os.environ.get("RTKIT_RUN_DIR") or None
        self.last_flush = time.monotonic()
        self.flush_interval = FLUSH_INTERVAL_S
        self.last_manual = (time.time(), time.perf_counter(), minor_faults())
        # Keras fit: one record per epoch (wall seconds, train batches, whether validation ran)
        self.keras_epochs: List[tuple] = []

    # -- recording

    def record_epoch(self, seconds: float, batches: int, validation: bool) -> None:
        with self.lock:
            self.keras_epochs.append((round(seconds, 4), batches, validation))

    def record(self, source: str, signature: str, start_unix: float, step_ms: float, faults: int,
               api: Optional[str] = None, candidate: bool = True) -> None:
        """One run of `signature`. candidate=False: a run that can never be the training step, however often it
        recurs (a SessionRunHook's own session.run inside a MonitoredSession step); it is kept apart from the
        same fetches run as steps, and listed among the other signatures."""
        rss = _rss_bytes()
        if not candidate:
            signature = HOOK_RUN_PREFIX + signature
        with self.lock:
            table = self.sources[source]
            sig = table.get(signature)
            if sig is None:
                sig = table[signature] = _Signature(signature, api, candidate)
            sig.count += 1
            sig.total_ms += step_ms
            if len(sig.records) < MAX_RECORDS:
                sig.records.append((round(start_unix, 6), round(step_ms, 4), faults, rss))
            if api is not None:
                sig.api = api   # the latest: a signature first seen while a session was being set up keeps no stale name
            best = self.best[source]
            if sig.candidate and (best is None or _beats(sig, best)):
                self.best[source] = best = sig
            is_step = best is sig
        if is_step and self.step_mark is not None:
            self.step_mark()
        if time.monotonic() - self.last_flush > self.flush_interval:
            self.flush()

    def manual_step(self) -> None:
        now_unix, now, faults = time.time(), time.perf_counter(), minor_faults()
        prev_unix, prev, prev_faults = self.last_manual
        self.last_manual = (now_unix, now, faults)
        self.record("manual", "rtkit.step()", prev_unix, (now - prev) * 1000.0, faults - prev_faults, "rtkit.step()")

    # -- output

    def chosen(self):
        """(source, signature) that counts as the training step: explicit marks first, then Keras, then a TF2
        coordinator's scheduled steps, then sessions."""
        for source in ("manual", "keras", "coordinator", "session"):
            if self.best[source] is not None:
                return source, self.best[source]
        return "none", None

    def snapshot(self) -> dict:
        with self.lock:
            source, sig = self.chosen()
            others = [{"signature": s.name, "count": s.count, "total_ms": round(s.total_ms, 3), "source": src}
                      for src, table in self.sources.items() for s in table.values() if s is not sig]
            others.sort(key=lambda o: -o["count"])
            records = list(sig.records) if sig else []
            hook = dict(self.hook)
            if sig is not None and sig.api:   # the hooks that are installed matter less than the one that counted
                hook["detail"] = f"steps counted from {sig.api}" + (f"; {hook['detail']}" if hook.get("detail") else "")
            return {
                "api": sig.api if sig else None,
                "keras_epochs": [{"epoch_s": e[0], "train_batches": e[1], "validation": e[2]}
                                 for e in self.keras_epochs] if source == "keras" else [],
                "pid": os.getpid(),
                "source": source,
                "signature": sig.name if sig else None,
                "count": sig.count if sig else 0,
                "truncated_steps": (sig.count - len(records)) if sig else 0,
                "per_step": [{"t_unix": r[0], "step_ms": r[1], "minor_faults": r[2], "rss_bytes": r[3]} for r in records],
                "other_signatures": others[:20],
                "hook": hook,
                "allocator_step_mark": self.step_mark is not None,
                "notes": list(self.notes),
            }

    def flush(self) -> None:
        started = self.last_flush = time.monotonic()
        if not self.run_dir:
            return
        try:
            self._write()
        finally:
            # long jobs have long step lists: space the rewrites out so they stay a small share of the run
            self.flush_interval = max(FLUSH_INTERVAL_S, (time.monotonic() - started) / FLUSH_BUDGET)

    def _write(self) -> None:
        data = self.snapshot()
        if data["count"] == 0 and self.hook["status"] == "no_tensorflow":
            return  # a helper process that never touched TensorFlow: leave no file
        path = os.path.join(self.run_dir, f"steps-{os.getpid()}.json")
        try:
            atomic.write_json(path, data, indent=None)
        except OSError:
            pass  # an unwritable run dir was reported by the parent already

    def reset_after_fork(self) -> None:
        self.lock = threading.RLock()  # RLock: a signal handler may flush while this thread records
        for table in self.sources.values():
            table.clear()
        self.best = {k: None for k in self.best}
        self.keras_epochs = []
        self.last_manual = (time.time(), time.perf_counter(), minor_faults())


_recorder: Optional[StepRecorder] = None


def recorder() -> StepRecorder:
    global _recorder
    if _recorder is None:
        _recorder = StepRecorder()
        import atexit

        atexit.register(_recorder.flush)
        from rtkit.hooks import signal_flush

        signal_flush.install(_recorder.flush)   # SIGTERM/HUP/QUIT: flushed too, the exit status unchanged
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=lambda: _recorder and _recorder.reset_after_fork())
    return _recorder


def manual_step() -> None:
    recorder().manual_step()
