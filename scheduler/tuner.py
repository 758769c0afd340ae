# tuner.py -- early-step tuning: interleave candidate pool configurations in short blocks, keep the fastest by median.
"""Trials switch configurations per run (RunOptions.inter_op_thread_pool picks among pre-created pools; the
pipeline is halted/drained or restarted), so a trial costs nothing but its own steps; all trials together
stay within `budget_steps` (default 60, 6% of a 1000-step job). The candidates run interleaved in blocks
(A B C A B C ...), not one after another: early steps drift (hash tables grow, caches warm), and a
sequential schedule would favour whichever candidate ran last. The first step of each block is not
measured (and `drain_steps` more after pipelining is switched off, while prefetched batches are served).
The intra-op pool is process-wide in stock TF, so it is not a trial dimension."""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Tuple

Config = Tuple[int, int, bool]  # (compute pool threads, input pool threads, input stage pipelined)


class Tuner:
    def __init__(self, compute_sizes: List[int], input_sizes: List[int], budget_steps: int,
                 stage_options: Tuple[bool, ...] = (False,), block_steps: int = 4, drain_steps: int = 2):
        c0, i0, s0 = compute_sizes[0], input_sizes[0], stage_options[0]
        cands: List[Config] = ([(c0, i0, s0)] + [(c, i0, s0) for c in compute_sizes[1:]]
                               + [(c0, i, s0) for i in input_sizes[1:]] + [(c0, i0, s) for s in stage_options[1:]])
        self.budget_steps = int(budget_steps)
        self.drain_steps = int(drain_steps)
        block = max(int(block_steps), 2 + self.drain_steps if len(set(stage_options)) > 1 else 2)
        rounds = self.budget_steps // (len(cands) * block)
        if rounds < 1:
            block = self.budget_steps // len(cands)
            rounds = 1
        if len(cands) < 2 or block < 2 + (self.drain_steps if len(set(stage_options)) > 1 else 0):
            cands, rounds, block = cands[:1], 0, 0  # too small a budget to compare anything
        self.candidates = cands
        self.block = block
        self.rounds = rounds
        self.schedule: List[Config] = [c for _ in range(rounds) for c in cands]
        self.times: Dict[Config, List[float]] = {c: [] for c in cands}
        self._b = 0
        self._n = 0
        self.done = not self.schedule
        self.chosen: Config = cands[0]
        self.steps_used = 0

    def current(self) -> Config:
        return self.chosen if self.done else self.schedule[self._b]

    def _skip(self) -> int:
        cfg = self.schedule[self._b]
        prev = self.schedule[self._b - 1] if self._b else None
        return 1 + (self.drain_steps if prev is not None and prev[2] and not cfg[2] else 0)

    def record(self, step_ms: float) -> None:
        if self.done:
            return
        cfg = self.schedule[self._b]
        if self._n >= self._skip():
            self.times[cfg].append(step_ms)
        self._n += 1
        self.steps_used += 1
        if self._n >= self.block:
            self._b += 1
            self._n = 0
            if self._b >= len(self.schedule):
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
                    overhead += max(0.0, m - best) * self.block * self.rounds
        return {"done": self.done, "budget_steps": self.budget_steps, "steps_used": self.steps_used,
                "schedule": "interleaved blocks", "steps_per_block": self.block, "rounds": self.rounds,
                "trials": trials,
                "chosen": {"compute_threads": self.chosen[0], "input_threads": self.chosen[1],
                           "stage_pipelined": self.chosen[2]},
                "first_step_ms_median": first, "chosen_step_ms_median": best,
                "speedup_over_first_x": (first / best) if first and best else None,
                "overhead_vs_chosen_ms": overhead}
