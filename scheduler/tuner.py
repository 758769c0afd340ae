# tuner.py -- early-step tuning: run candidate pool configurations for a few steps each, keep the fastest by median.
"""Trials switch configurations per run (RunOptions.inter_op_thread_pool picks among pre-created pools), so a
trial costs nothing but its own steps; all trials together stay within `budget_steps` (default 60, 6% of a
1000-step job). The intra-op pool is process-wide in stock TF, so it is not a trial dimension."""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Tuple

Config = Tuple[int, int, bool]  # (compute pool threads, input pool threads, input stage pipelined)


class Tuner:
    def __init__(self, compute_sizes: List[int], input_sizes: List[int], budget_steps: int, skip_steps: int = 2,
                 stage_options: Tuple[bool, ...] = (False,)):
        c0, i0, s0 = compute_sizes[0], input_sizes[0], stage_options[0]
        cands: List[Config] = ([(c0, i0, s0)] + [(c, i0, s0) for c in compute_sizes[1:]]
                               + [(c0, i, s0) for i in input_sizes[1:]] + [(c0, i0, s) for s in stage_options[1:]])
        self.budget_steps = int(budget_steps)
        per = self.budget_steps // max(1, len(cands))
        self.skip = skip_steps if per > skip_steps + 2 else 0
        self.per_trial = per
        if per < 3:  # too small a budget for more than the first configuration
            cands = cands[:1]
            self.per_trial = 0
        self.candidates = cands
        self.times: Dict[Config, List[float]] = {c: [] for c in cands}
        self._i = 0
        self._n = 0
        self.done = self.per_trial == 0
        self.chosen: Config = cands[0]
        self.steps_used = 0

    def current(self) -> Config:
        return self.chosen if self.done else self.candidates[self._i]

    def record(self, step_ms: float) -> None:
        if self.done:
            return
        cfg = self.candidates[self._i]
        if self._n >= self.skip:
            self.times[cfg].append(step_ms)
        self._n += 1
        self.steps_used += 1
        if self._n >= self.per_trial:
            self._i += 1
            self._n = 0
            if self._i >= len(self.candidates):
                self._finish()

    def _median(self, cfg: Config) -> Optional[float]:
        t = self.times.get(cfg) or []
        return statistics.median(t) if t else None

    def _finish(self) -> None:
        self.done = True
        meds = {c: self._median(c) for c in self.candidates if self._median(c) is not None}
        if meds:
            self.chosen = min(meds, key=meds.get)

    def report(self) -> Dict:
        first = self._median(self.candidates[0])
        best = self._median(self.chosen)
        trials = [{"compute_threads": c, "input_threads": i, "stage_pipelined": st,
                   "steps": len(self.times[(c, i, st)]), "step_ms_median": self._median((c, i, st))}
                  for c, i, st in self.candidates]
        overhead = 0.0
        if best:
            for c in self.candidates:
                m = self._median(c)
                if m is not None:
                    overhead += max(0.0, m - best) * self.per_trial
        return {"done": self.done, "budget_steps": self.budget_steps, "steps_used": self.steps_used,
                "steps_per_trial": self.per_trial, "skipped_steps_per_trial": self.skip, "trials": trials,
                "chosen": {"compute_threads": self.chosen[0], "input_threads": self.chosen[1],
                           "stage_pipelined": self.chosen[2]},
                "first_step_ms_median": first, "chosen_step_ms_median": best,
                "speedup_over_first_x": (first / best) if first and best else None,
                "overhead_vs_chosen_ms": overhead}
