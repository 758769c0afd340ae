# measure.py -- the measuring side of the Scheduler: step times, traced stage costs, tuning, pinning and the report.
"""The hooks' step owner tells the Scheduler of every training step (on_step); the first steps after a warm-up are
traced for per-stage op time, then the tuner's candidates are timed one after another and the chosen one is kept
and written as a profile. report() is scheduler-<pid>.json; at_exit writes it with the trace."""
from __future__ import annotations

import os
import statistics
from typing import Any, Dict, List, Optional

from . import pools as _pools
from .report import now_iso, write_profile, write_report
from .stages import STAGES
from .trace import Trace
from .tuner import MIN_GAIN, READ_AHEAD, Tuner

TRACE_STEPS = 3          # step runs traced (SOFTWARE_TRACE: step stats without a profiler session, which FULL_TRACE would start and which two concurrent runs cannot share) to measure per-stage cost
WARM_RUNS = 3            # steps of the chosen signature before tracing starts
MAX_STEP_KEYS = 64       # run shapes remembered as the step's (for the decisions made before a run)
PROBE_STEPS = 3          # probe steps after the tracing: the put alone, then the staged compute alone (the bound)
READ_WAITS_CPU_PCT = 50  # a probe's put with less CPU time than this share of its wall time mostly waits (a read)
PROBE_WARM = 1           # the first probe is not kept: it makes the staged step's callable (an executor: seconds)


class Measurement:
    """Mixed into Scheduler: what was measured of the steps, and the tuner that acts on it. `st` is a session's
    staging state (pipeline.py)."""

    def _init_measurement(self) -> None:
        self.tuner = self._new_tuner()
        self.trace = Trace()
        self.step_signature: Optional[str] = None   # the step owner's name for the step (on_step)
        # this scheduler's run keys (sorted fetch names) of runs the step owner called steps: what is decided before
        # a run (tracing, the tuner's candidate) asks whether the run about to start is the step's
        self._step_keys: set = set()
        self.step_runs = 0
        self.step_ms: List[float] = []
        self._traced_steps = 0
        self._input_trace_left = 0
        self._traced_inputs = 0
        self.stage_cost_ms = {s: 0.0 for s in STAGES}
        self.input_run_cost_ms = 0.0
        self._read_ms: List[float] = []   # get_next's op time in each traced put: the read a reader would run ahead
        self.read_ahead_decision: Optional[str] = None
        self.pin_result: Optional[Dict] = None
        self._probe_reset()
        self.profile_written: List[str] = []
        self._finished = False

    def _new_tuner(self, read_ahead: bool = False) -> Optional[Tuner]:
        if not self.tune:
            return None
        options = ((False, True, READ_AHEAD) if read_ahead else (False, True)) if self.stage else (False,)
        return Tuner(self.plan.compute_sizes, self.plan.input_sizes, int(self.settings.get("sched_tune_steps") or 0),
                     stage_options=options)

    def _apply(self, cfg) -> None:
        c, i, stg = cfg
        self.active.update(compute=c, input=i, stage=bool(stg), read_ahead=stg == READ_AHEAD)

    # ------------------------------------------------------------------ the overlap bound
    def _probe_reset(self) -> None:
        self._probe_samples: List[List[float]] = []   # [step, put ms, put cpu ms, compute ms, step ms]
        self._probe_attempts = 0
        self._probe_warm = PROBE_WARM
        self._probe_closed = not self.stage
        self._staged_ms: List[float] = []             # staged steps at the configuration kept after tuning

    def _probe_open(self) -> bool:
        """The probe steps come after the traced steps and before the tuner's first trial: the put and the staged
        compute of the unstaged step, each alone, give the bound that staging can reach."""
        return not self._probe_closed and self._traced_steps >= TRACE_STEPS and \
            (self.tuner is not None or self.active["stage"])   # staging is on, or a trial may choose it

    def _probe_step(self, st, mode: str, t0: float, t1: float, ms: float) -> None:
        """After a step of the probe phase: keep its sample; the phase ends after PROBE_STEPS probes, at a step
        that does not read staged input (nothing to probe), or after the staged items of a running pipeline had
        time to drain (the runner is halted for the probes)."""
        probe = getattr(self._local, "probe", None)
        self._local.probe = None
        self._probe_attempts += 1
        if probe is not None and self._probe_warm > 0:
            self._probe_warm -= 1
        elif probe is not None:
            put_ms, cpu_ms = probe
            self._probe_samples.append([self.step_runs, round(put_ms, 3), round(cpu_ms, 3),
                                        round((t1 - t0) * 1000.0, 3), round(ms, 3)])
        if mode != "staged" or len(self._probe_samples) >= PROBE_STEPS or \
                self._probe_attempts >= PROBE_WARM + PROBE_STEPS + self.depth + 2:
            self._probe_closed = True
            self._after_probes(st)

    def _after_probes(self, st) -> None:
        """A put that mostly waits (a read's latency) and that a reader would shorten enough to shorten the staged
        step (read + decode > compute: the estimate of the bound): a reader may take batches ahead of the decode.
        The tuner gets it as one more candidate (kept only if faster); without a tuner it is applied. A staged
        step bound by its compute gains nothing from it: it is then no candidate, and the report says why."""
        b = self.bound_report()
        waits = b is not None and b["input_cpu_pct"] is not None and b["input_cpu_pct"] < READ_WAITS_CPU_PCT
        staged = self.last_staged
        if self.read_ahead <= 0 or staged is None or staged.read_put is None or b is None:
            return
        gain = b.get("read_ahead_gain_pct_est")
        if not waits:
            self.read_ahead_decision = (f"off: the put is not waiting (CPU {b['input_cpu_pct']}% of its wall time, "
                                        f"read-ahead needs under {READ_WAITS_CPU_PCT}%)")
            return
        if gain is None or gain <= 100.0 * MIN_GAIN:
            self.read_ahead_decision = (
                "off: the staged step would not be shorter with the read ahead (read "
                f"{b.get('read_ms')} ms, decode {b.get('decode_ms')} ms, compute {b['compute_ms']} ms: estimated "
                f"gain {gain if gain is not None else '-'}%, under {100.0 * MIN_GAIN:.0f}%)")
            return
        why = f"the put waits and the read ahead would shorten the staged step by {gain}% (estimate)"
        if self.tuner is None:
            self.active["read_ahead"] = bool(self.active["stage"])
            self.read_ahead_decision = "on: " + why
        elif self.tuner.steps_used == 0:
            self.tuner = self._new_tuner(read_ahead=True)
            self.read_ahead_decision = "a tuner candidate: " + why
        else:
            self.read_ahead_decision = "off: the tuner's trials had begun before the probes ended; " + why
            return
        ra = st.runner.read_ahead if st.runner is not None else None
        if ra is not None:
            try:  # its build is not a trial's cost
                ra.prepare()
            except Exception as exc:  # the decode builds it at its first run instead
                self._error(f"read-ahead decode not prepared ({type(exc).__name__}: {exc})")

    def bound_report(self) -> Optional[Dict[str, Any]]:
        """The overlap bound of the unstaged step, from the probe steps: input = the put alone, compute = the
        staged step's run alone (medians); bound = max(input, compute) / (input + compute), the step-time ratio a
        staged step reaches at best when one put is in flight; x of bound = the staged steps' median after tuning
        over max(input, compute) (1.00x: at the bound)."""
        if not self._probe_samples:
            return None
        put = statistics.median(x[1] for x in self._probe_samples)
        cpu = statistics.median(x[2] for x in self._probe_samples)
        comp = statistics.median(x[3] for x in self._probe_samples)
        total = put + comp
        staged = statistics.median(self._staged_ms) if self._staged_ms else None
        # with a reader ahead, the put's read and its decode overlap: the staged step is then at best the longest
        # of compute, read and decode (the read from the traced puts' get_next op time, the decode the rest)
        read = min(put, statistics.median(self._read_ms)) if self._read_ms else None
        ra_est = max(comp, read, put - read) if read is not None else None
        return {
            "method": "probe steps: the put alone in the step's thread on the compute pool, then the staged step's run "
                      "alone (serially and on the pool an unstaged step runs them on); medians",
            "probe_steps": len(self._probe_samples),
            "samples": self._probe_samples,
            "columns": ["step", "put_ms", "put_cpu_ms", "compute_ms", "step_ms"],
            "input_ms": round(put, 3), "compute_ms": round(comp, 3),
            "input_plus_compute_ms": round(total, 3),
            "probe_step_ms_median": statistics.median(x[4] for x in self._probe_samples),
            # the process's CPU time over the put's wall time: low when the put mostly waits (a read's latency)
            "input_cpu_pct": round(100.0 * cpu / put, 1) if put > 0 else None,
            "bound_x": round(max(put, comp) / total, 4) if total > 0 else None,
            "staged_steps_measured": len(self._staged_ms),
            "staged_step_ms_median": staged,
            "x_of_bound": round(staged / max(put, comp), 4) if staged and max(put, comp) > 0 else None,
            "read_ms": None if read is None else round(read, 3),
            "decode_ms": None if read is None else round(put - read, 3),
            "read_ahead_step_ms_est": None if ra_est is None else round(ra_est, 3),
            "read_ahead_gain_pct_est": (round(100.0 * (1.0 - ra_est / max(put, comp)), 1)
                                        if ra_est is not None and max(put, comp) > 0 else None),
            "read_ahead_decision": self.read_ahead_decision,
        }

    def _before_step_run(self, key: tuple) -> bool:
        """Before a run of run shape `key`: whether it is traced; a step run past the tracing (and the probe steps)
        gets the tuner's current candidate."""
        is_step = key in self._step_keys   # the step's run shape: known only after the step owner named it once
        tracing = is_step and self._traced_steps < TRACE_STEPS and self.step_runs > WARM_RUNS
        probing = is_step and not tracing and self._probe_open()
        self._local.probe_ok = probing
        if is_step and not tracing and not probing and self.tuner is not None and not self.tuner.done and \
                self._traced_steps >= TRACE_STEPS:
            self._apply(self.tuner.current())
        return tracing

    def on_step(self, signature: str, ms: float) -> None:
        """The step owner's word that a training step (of any API) just ended on this thread, `ms` long (what the
        script waited for, a staged batch's wait included). A change of step signature (the train op overtaking
        reads a hook made at session creation) discards what was measured on the earlier one."""
        switched_from = None
        with self._lock:
            if signature != self.step_signature:
                if self.step_signature is not None:
                    switched_from = (self.step_signature, self.step_runs)
                    self.step_ms = []
                    self._traced_steps = 0
                    self.stage_cost_ms = {k: 0.0 for k in self.stage_cost_ms}
                    self.tuner = self._new_tuner()
                    self._probe_reset()
                    self.active.update(compute=self.plan.compute_sizes[0], input=self.plan.input_sizes[0],
                                       stage=self.stage and self.tuner is None, read_ahead=False)
                self.step_signature = signature
                self.step_runs = 0
                self._step_keys = set()
            self.step_runs += 1
        self._local.step_ms = float(ms)
        if switched_from is not None and switched_from[1] >= WARM_RUNS:  # self.note takes the lock
            self.note(f"the step is the run of {signature[:120]}, not the earlier {switched_from[0][:80]} "
                      f"({switched_from[1]} runs: a hook's read)")

    def _after_run(self, st, key: tuple, mode: str, t0: float, t1: float, tracing: bool,
                   md) -> None:
        """After one of the runs this scheduler wraps: when the step owner called it the step (on_step on this
        thread, during the run), the step's part: t0..t1 is TF's run, the step's time is on_step's."""
        ms = getattr(self._local, "step_ms", None)
        self._local.step_ms = None
        if ms is None:
            return
        with self._lock:
            if len(self._step_keys) >= MAX_STEP_KEYS:
                self._step_keys.clear()
            self._step_keys.add(key)
        kind = getattr(self._local, "step_kind", None) if mode == "staged" else mode
        self.trace.add("steps", "step", t0 * 1e6, (t1 - t0) * 1e6, {"mode": kind or mode})
        if tracing:
            self._traced_steps += 1
            self._take_stats(md, st, "step")
            return
        self.step_ms.append(ms)
        if self._probe_open():
            self._probe_step(st, mode, t0, t1, ms)
            return
        # the staged steps of a configuration that stages (not the drained items after the tuner kept it off)
        if kind == "staged" and self.active["stage"] and (self.tuner is None or self.tuner.done) and \
                len(self._staged_ms) < 100000:
            self._staged_ms.append(ms)
        if self.tuner is not None and self._traced_steps >= TRACE_STEPS and not self.tuner.done:
            self.tuner.record(ms)
            if self.tuner.done:
                self._tuning_finished()
        if self.settings.get("sched_pin") and self.pin_result is None and \
                (self.tuner is None or self.tuner.done) and st.routed:
            total = sum(self.stage_cost_ms.values())
            share = self.stage_cost_ms["input"] / total if total else None
            self.pin_result = _pools.pin_pools(self.plan, {
                "compute": self.plan.index("compute", self.active["compute"]),
                "input": self.plan.index("input", self.active["input"])}, share)

    def _take_stats(self, md, st, label: str, input_run: bool = False, stage_of=None) -> None:
        if md is None or self.last_analysis is None:
            return
        cost = self.trace.add_step_stats(md.step_stats, stage_of or self.last_analysis.stage, label)
        with self._lock:
            for k, v in cost.items():
                self.stage_cost_ms[k] += v
            if input_run:
                self._traced_inputs += 1
                self.input_run_cost_ms += sum(cost.values())
        staged = self.last_staged
        if input_run and staged is not None and staged.read_source:
            read = sum((ns.op_end_rel_micros or ns.all_end_rel_micros) / 1000.0 for dev in md.step_stats.dev_stats
                       for ns in dev.node_stats if ns.node_name.split(":")[0] == staged.read_source)
            with self._lock:
                self._read_ms.append(read)

    def _tuning_finished(self) -> None:
        c, i, stg = self.tuner.chosen
        self._apply(self.tuner.chosen)
        values = {"sched": True, "sched_stage": bool(stg), "sched_stage_depth": self.depth,
                  "sched_stage_read_ahead": self.read_ahead if stg == READ_AHEAD else 0,
                  "sched_inter_op": c, "sched_intra_op": self.plan.intra_op, "sched_input_threads": i,
                  "sched_tune": False}
        desc = f"Tuned by the rtkit scheduler on {now_iso()} ({_pools.cpu_count()} CPUs)"
        targets = []
        if self.run_dir:
            targets.append(os.path.join(self.run_dir, "scheduler-profile.toml"))
        if self.settings.get("sched_save_profile"):
            targets.append(str(self.settings["sched_save_profile"]))
        for path in targets:
            err = write_profile(path, values, desc)
            if err:
                self.note(err)
            else:
                self.profile_written.append(path)

    def state_line(self) -> str:
        """What actually happened, in one line (the run summary shows it)."""
        c = self.counts
        parts = []
        if not self.stage:
            parts.append("staging off")
        elif c["rewrites"] == 0:
            parts.append("not staged" + (f" ({self.stage_reason})" if self.stage_reason else
                                         " (no session graph ran)"))
        elif c["staged_steps"] == 0 and c["inline_steps"]:
            parts.append(f"staging off: the script's own graph ran ({c['inline_steps']} steps), "
                         "0 extra runs per step")
        else:
            parts.append(f"in-graph staging: {c['staged_steps']} of {c['input_runs']} input-reading runs staged")
            if c["inline_steps"]:
                parts.append(f"{c['inline_steps']} unstaged: the script's own graph ran, 0 extra runs per step")
        if self.keras.get("datasets"):
            parts.append(f"stage options on {len(self.keras['datasets'])} tf.data input(s) (Keras fit or an eager loop)")
        if self.tuner is not None:
            t = self.tuner.report()
            if not t["done"]:
                parts.append(f"tuning not finished ({t['steps_used']} of {t['budget_steps']} steps)")
            else:
                parts.append("tuned: " + t["verdict"])
        if self.errors:
            parts.append(f"{len(self.errors)} error(s): {self.errors[0][:80]}")
        return "on, " + ", ".join(parts)

    def report(self) -> Dict[str, Any]:
        sm = self.last_analysis
        n_traced = max(1, self._traced_steps)
        stages = {}
        counts = sm.counts() if sm else {s: 0 for s in STAGES}
        total_ms = sum(self.stage_cost_ms.values()) or 0.0
        for s in STAGES:
            ms = self.stage_cost_ms[s] / n_traced if self._traced_steps else None
            stages[s] = {"ops": counts[s], "op_time_ms_per_step": ms,
                         "share_pct": (100.0 * self.stage_cost_ms[s] / total_ms) if total_ms else None}
        tuning = self.tuner.report() if self.tuner else None
        med = statistics.median(self.step_ms) if self.step_ms else None
        if tuning is not None:
            # what the slower trials cost, as a share of this job's step time (the report's steps, traced ones
            # left out, as the tuner never sees them)
            extra = tuning["overhead_vs_chosen_ms"]
            tuning["cost_pct_of_job"] = (round(100.0 * extra / sum(self.step_ms), 2)
                                         if self.step_ms and extra is not None else None)
        staged = self.last_staged
        depths = [d for _, d in self._depth]
        hidden = [o[3] for o in self._overlap]
        return {
            "schema_version": 2,
            "pid": os.getpid(),
            "state": self.state_line(),
            "settings": {k: v for k, v in self.settings.items() if k.startswith("sched")},
            "sessions": self.sessions_info,
            "keras": self.keras,
            "stages": stages,
            "stage_cost_source": f"RunMetadata step_stats of {self._traced_steps} traced step(s) and "
                                 f"{self._traced_inputs} traced put run(s); op time summed per stage",
            "input_share_pct": stages["input"]["share_pct"],
            "step_signature": self.step_signature,
            "steps_seen": self.step_runs,
            "step_ms_median": med,
            "chosen": {"compute_threads": self.active["compute"], "input_threads": self.active["input"],
                       "intra_op_threads": self.plan.intra_op, "stage_pipelined": self.active["stage"],
                       "stage_depth_steps": self.depth if self.active["stage"] else 0,
                       "stage_read_ahead_batches": self.read_ahead if self.active.get("read_ahead") else 0},
            "tuning": tuning,
            "speedup_over_first_x": tuning["speedup_over_first_x"] if tuning else None,
            "pipeline": {
                "enabled": self.stage,
                "mechanism": "in-graph StagingArea (put ahead on the input pool; a staged step reads the get "
                             "through CallableOptions.tensor_connection, the script's graph is not rewired)",
                "unstaged_step": "the script's own fetches on the script's own graph: one TF call, no put",
                "staged": staged is not None,
                "not_staged_reason": self.stage_reason,
                "cuttable": bool(sm and sm.cuttable),
                "depth_steps": self.depth,
                "boundary_tensors": list(staged.boundary) if staged else (list(sm.boundary) if sm else []),
                "connected_inputs": staged.connected if staged else 0,
                "pipelined_ops": len(sm.pipelined) if sm else 0,
                "pipelines_started": self.counts["runners_started"],
                "input_runs": self.counts["input_runs"],
                "staged_steps": self.counts["staged_steps"],
                "inline_steps": self.counts["inline_steps"],
                "unstaged_steps": self.counts["inline_steps"],
                "dropped_batches": self.counts["dropped_items"],
                "errors_delivered": self.counts["errors_delivered"],
                "direct_input_runs": self.counts["direct_input_runs"],
                "queue_depth_samples": self._depth,
                "occupancy_samples_batches": depths,
                "occupancy_mean_batches": (sum(depths) / len(depths)) if depths else None,
                "steps_waited_pct": (100.0 * sum(1 for d in depths if d == 0) / len(depths)) if depths else None,
                "overlap_samples": self._overlap,
                "overlap_columns": ["step", "put_ms", "wait_ms", "hidden_pct"],
                "input_hidden_pct_median": statistics.median(hidden) if hidden else None,
                "probe_steps": self.counts["probe_steps"],
                # batches a reader took from the iterator ahead of the cut's decode (sched_stage_read_ahead)
                "read_ahead_available": bool(staged is not None and staged.read_put is not None),
                "read_ahead_batches": self.counts["read_ahead_batches"],
                "overlap_bound": self.bound_report(),
                "lookahead": self.lookahead_report(),
            },
            "pinning": self.pin_result,
            "profiles_written": self.profile_written,
            "errors": self.errors,
            "notes": self.notes,
        }

    def at_exit(self) -> None:
        if self._finished:
            return
        self._finished = True
        # never hold the process: a runner blocked in a long input run is a daemon and is abandoned
        self.stop_all(timeout_s=1.0)
        if self.run_dir:
            try:
                write_report(self.run_dir, self.report(), self.trace.chrome())
            except OSError as exc:
                self.note(f"cannot write the scheduler report: {exc}")

