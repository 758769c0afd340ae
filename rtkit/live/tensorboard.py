# tensorboard.py -- the report's per-step figures as TensorBoard scalars, written by the parent with tensorboard's own writer.
"""Runs in the parent of `rtkit run`, fed by the live loop's snapshots (rtkit/live/snapshot.py): the child's
hot path never imports TensorFlow or TensorBoard for it, and a job killed hard still has every step the last
snapshot saw. Scalars go to TB_DIR/rtkit (TB_DIR/rtkit-<task> under `rtkit launch`), a run of their own beside
the script's. Each tag is named from the report's keys. Steps are the script's own global step where its
event files in TB_DIR show one (rtkit's step k + the offset between the two, fixed once seen; while the
script has an event file there but has flushed no step into it, rtkit waits), else rtkit's step index."""
from __future__ import annotations

import bisect
import glob
import os
import statistics
from typing import Any, Dict, List, Optional, Tuple

from rtkit.report import glossary as G
from rtkit.report import fmt
from rtkit.report.contract import Allocator as A, Pmem as PM, Scheduler as S

PREFIX = "rtkit/"
# per-step records of the steps section: tag -> key (the training process's own figures at each step's end)
TRUST_STEPS = 3   # steps of one signature before they are written (an initialiser's single run is not training)
STEP_TAGS = {"step_ms": "step_ms", "rss_bytes": "rss_bytes", "minor_faults": "minor_faults"}


class TensorBoardExporter:
    name = "tensorboard"

    def __init__(self, logdir: str, task_name: Optional[str] = None):
        from tensorboard.summary import Writer   # tensorboard's own event-file writer; no TensorFlow import

        self.logdir = logdir
        self.run_dir = os.path.join(logdir, f"rtkit-{task_name}" if task_name else "rtkit")
        os.makedirs(self.run_dir, exist_ok=True)
        probe = os.path.join(self.run_dir, f".rtkit-write-test-{os.getpid()}")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        os.unlink(probe)
        self._writer_class = Writer
        self.offset: Optional[int] = None
        self.signature: Optional[str] = None
        self._open()

    def _open(self) -> None:
        self.before = set(glob.glob(os.path.join(self.run_dir, "events.out.tfevents.*")))
        self.writer = self._writer_class(self.run_dir)
        self.steps_done = 0            # rtkit steps written
        self.alloc_last = -1           # the last allocator step written (its list keeps the latest records only)
        self.samples_done = 0          # parent samples written
        self.tier_last = -1.0          # t_s of the last tier sample written (its timeline is a ring)

    def _restart(self) -> None:
        """The training step turned out to be another signature than the one written so far: its records are
        other runs. This writer's own event files go (this run made them) and the figures start again."""
        self.writer.close()
        for path in set(glob.glob(os.path.join(self.run_dir, "events.out.tfevents.*"))) - self.before:
            try:
                os.unlink(path)
            except OSError:
                pass
        self._open()

    # -- the script's own global step

    def _script_offset(self, per_step: List[dict]) -> Tuple[Optional[int], bool]:
        """(global step - rtkit step, whether the script has event files in the TB dir), from the script's own
        events: each is matched with the rtkit step whose end is nearest its wall time (a script writes its
        summaries right after the step's run returns); the median difference. None before any such event."""
        ends = [(s["t_unix_end"], s["step"]) for s in per_step if "t_unix_end" in s]
        diffs, files = [], False
        ours = os.path.abspath(self.run_dir)
        for path in glob.glob(os.path.join(self.logdir, "**", "events.out.tfevents.*"), recursive=True):
            folder = os.path.dirname(os.path.abspath(path))
            if folder == ours or os.path.basename(folder).startswith("rtkit"):
                continue   # rtkit's own runs (of this task or of another task of the job)
            files = True
            for ev in _events(path) if ends else ():
                if ev.step > 0 and ev.HasField("summary"):
                    diffs.append(ev.step - min(ends, key=lambda e: abs(e[0] - ev.wall_time))[1])
        return (int(statistics.median(diffs)) if diffs else None), files

    def _step(self, k: int) -> int:
        return k + (self.offset or 0)

    # -- writing

    def _scalar(self, tag: str, value: Any, step: int, wall_time: Optional[float] = None) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self.writer.add_scalar(PREFIX + tag, value, step, wall_time=wall_time)

    def update(self, report: Dict[str, Any], final: bool = False) -> None:
        st = report.get("steps") or {}
        start = _start_unix(report)
        per = [dict(s) for s in (st.get("per_step") or []) if isinstance(s, dict)]
        for s in per:
            if start is not None and isinstance(s.get("t_s"), (int, float)):
                s["t_unix_end"] = start + s["t_s"] + (s.get("step_ms") or 0) / 1000.0
        if len(per) < TRUST_STEPS and not final:
            return   # the first runs of a job (initialisers) may still lose the "training step" to another
        if st.get("signature") != self.signature:
            if self.signature is not None:
                self._restart()
            self.signature = st.get("signature")
        if self.offset is None and per:
            offset, script_files = self._script_offset(per)
            if offset is None and script_files and not final:
                return   # the script writes here but has flushed no step yet: wait for it, to align the steps
            self.offset = offset or 0
        if self.offset is None:
            return
        for s in per[self.steps_done:]:
            for tag, key in STEP_TAGS.items():
                self._scalar(tag, s.get(key), self._step(s["step"]), s.get("t_unix_end"))
        self.steps_done = max(self.steps_done, len(per))
        self._samples(report, per)
        self._allocator(report)
        self._tier(report)
        if final:
            self._scheduler(report)
        self.writer.flush()

    @staticmethod
    def _step_at(ends: List[float], steps: List[int], t_unix: float) -> int:
        """The rtkit step that had ended by `t_unix` (0 before the first)."""
        i = bisect.bisect_right(ends, t_unix)
        return steps[i - 1] if i else 0

    def _samples(self, report: Dict[str, Any], per: List[dict]) -> None:
        """The parent's samples (the whole process tree): RSS and major faults so far, at the step then."""
        start = _start_unix(report)
        samples = (report.get("process") or {}).get("samples") or []
        if start is None:
            return
        timed = [s for s in per if "t_unix_end" in s]
        ends, steps = [s["t_unix_end"] for s in timed], [s["step"] for s in timed]
        for smp in samples[self.samples_done:]:
            t = start + smp.get("t_s", 0)
            k = self._step_at(ends, steps, t)
            if k:
                self._scalar("process/rss_bytes", smp.get("rss_bytes"), self._step(k), t)
                self._scalar("process/major_faults", smp.get("major_faults"), self._step(k), t)
        self.samples_done = len(samples)

    def _allocator(self, report: Dict[str, Any]) -> None:
        """Plan events: arena hits and fallbacks per allocator step, and whether the plan was in use."""
        a = report.get("allocator")
        if not isinstance(a, dict):
            return
        per = [r for r in (a.get(A.PER_STEP) or []) if isinstance(r, dict) and isinstance(r.get(A.STEP), int)]
        made = (a.get("plan") or {}).get("made_at_step")
        for r in (r for r in per if r[A.STEP] > self.alloc_last):
            # the allocator's step k is a training step of its own numbering (its step 0: start-up up to the
            # end of the step that first told it); the plan serves from its step made_at_step on
            step = G.training_step(report, r[A.STEP])
            k = self._step(step if step is not None else r[A.STEP])
            self._scalar("allocator/arena_hits", r.get(A.STEP_ARENA_HITS), k)
            self._scalar("allocator/fallbacks", r.get(A.STEP_FALLBACKS), k)
            self._scalar("allocator/plan_in_use", 1 if isinstance(made, int) and r[A.STEP] >= made else 0, k)
        self.alloc_last = max([self.alloc_last] + [r[A.STEP] for r in per])

    def _tier(self, report: Dict[str, Any]) -> None:
        p = report.get("pmem")
        if not isinstance(p, dict) or str(p.get(PM.STATE) or "off") in ("off", "disabled"):
            return
        tl = [x for x in (p.get(PM.TIMELINE) or []) if isinstance(x, dict) and isinstance(x.get("step"), int)]
        for x in (x for x in tl if _time_of(x.get("t_s")) > self.tier_last):
            # a sample after the allocator's k-th step mark: the training step that mark ended
            ended = G.training_step(report, x["step"] - 1) if x["step"] > 0 else 0
            k = self._step(ended if ended is not None else x["step"])
            self._scalar("tier/pool_resident_bytes", x.get("resident_bytes"), k)
            self._scalar("tier/major_faults", x.get("major_faults"), k)
            self._scalar("tier/tier_bytes", x.get("tier_bytes"), k)
        self.tier_last = max([self.tier_last] + [_time_of(x.get("t_s")) for x in tl])

    def _scheduler(self, report: Dict[str, Any]) -> None:
        """Staged-input figures (the scheduler writes them at exit): put and wait time, share of input hidden."""
        s = report.get("scheduler")
        samples = _get(s, S.OVERLAP_SAMPLES) if isinstance(s, dict) else None
        for row in samples or []:
            if isinstance(row, list) and len(row) >= 4 and isinstance(row[0], int):
                k = self._step(row[0])
                self._scalar("scheduler/input_put_ms", row[1], k)
                self._scalar("scheduler/input_wait_ms", row[2], k)
                self._scalar("scheduler/input_hidden_pct", row[3], k)

    def finish(self, report: Dict[str, Any]) -> None:
        self.update(report, final=True)
        self.writer.close()


def _time_of(v: Any) -> float:
    """A sample's time as a number (-1 when it has none: written once, first)."""
    return float(v) if fmt.is_num(v) else -1.0


MAX_EVENTS = 10_000   # of the script's own, per file: enough to see its step; bounded work on a long run's files


def _events(path: str):
    """The events of one of the script's event files, read with tensorboard's own record reader (its
    TensorFlow-free one: tensorboard's usual loader imports TensorFlow when it is installed, which the
    parent never does). A record being written ends the file early; the next snapshot reads it again."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

    try:
        reader = pywrap_tensorflow.PyRecordReader_New(os.fsencode(path))
        for _ in range(MAX_EVENTS):
            reader.GetNext()
            yield event_pb2.Event.FromString(reader.record())
    except Exception:   # end of file, a partial record, or not an event file
        return


def _get(d: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


def _start_unix(report: Dict[str, Any]) -> Optional[float]:
    from datetime import datetime

    exact = (report.get("live") or {}).get("start_unix")
    if isinstance(exact, (int, float)):
        return float(exact)
    t = ((report.get("run") or {}).get("start_time"))
    try:
        return datetime.fromisoformat(t).timestamp() if t else None
    except ValueError:
        return None
