# tuner.py -- early-step tuning: interleave candidate configurations in short blocks; keep the script's unless one is faster beyond noise.
"""Trials switch configurations per run (RunOptions.inter_op_thread_pool picks among pre-created pools; the
staging runner is halted (staged items are served first) or started), so a trial costs nothing but its own
steps. The first candidate is the job as the script made it (TF-sized pool, input stage run inline, no
staging ahead). The candidates run interleaved in blocks (A B C C B A A B C ...), not one after another: early
steps drift (hash tables grow, caches warm) and the machine's load changes, and a sequential schedule would
favour whichever ran last. The first step of each block is not measured (the first two when it switches staging
on: the queue fills), and `drain_steps` more after
staging is switched off, while staged items are served).

Do no harm: each round gives every candidate's block median as a ratio to the baseline's block median of
the same round. A candidate replaces the baseline only if it was faster in every round and its median
gain exceeds both MIN_GAIN and the spread of its ratios (the measured noise); otherwise the script's own
configuration is kept. The intra-op pool is process-wide in stock TF, so it is not a trial dimension.

Stopping early changes no outcome: a candidate slower than the baseline in any finished round can no longer win
every round, so its remaining blocks are dropped; when no candidate is left, tuning ends at that round."""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Tuple

# (compute pool threads, input pool threads, input stage staged ahead: False, True or READ_AHEAD)
Config = Tuple[int, int, object]
READ_AHEAD = "read-ahead"   # staged, with a reader taking the iterator's batches ahead of the cut's decode
MIN_GAIN = 0.03
MIN_ROUNDS = 3      # a candidate must win every round: with 3, chance alone picks one of 3 others ~1 time in 3
MAX_ROUNDS = 6
JOB_STEPS = 1000    # the job length the tuning cost is stated for (tuning must cost <= 5% of a 1000-step job)


class Tuner:
    def __init__(self, compute_sizes: List[int], input_sizes: List[int], budget_steps: int,
                 stage_options: Tuple[bool, ...] = (False,), block_steps: int = 4, drain_steps: int = 3):
        c0, i0, s0 = compute_sizes[0], input_sizes[0], stage_options[0]
        # a larger compute pool than the CPUs rarely helps: left out, so that three rounds fit the budget
        cands: List[Config] = [(c0, i0, s0)] + [(c, i0, s0) for c in compute_sizes[1:] if c <= c0]
        for s in stage_options[1:]:
            # with read-ahead among them, the staged candidates keep the first input pool: three rounds of five
            # candidates would not fit the budget, and a put that mostly waits gains little from more threads
            cands += [(c0, i, s) for i in (input_sizes[:1] if READ_AHEAD in stage_options else input_sizes)]
        if not any(stage_options):  # input pool sizes matter only while the input stage runs ahead
            cands = cands[:1] + [c for c in cands[1:] if c[1] == i0]
        self.budget_steps = int(budget_steps)
        self.drain_steps = int(drain_steps)
        switching = len(set(stage_options)) > 1
        block = max(int(block_steps), 2 + (self.drain_steps if switching else 0))
        rounds = min(MAX_ROUNDS, self.budget_steps // (len(cands) * block)) if cands else 0
        if rounds < MIN_ROUNDS:  # enough rounds to measure the noise: shorter blocks
            block = self.budget_steps // (MIN_ROUNDS * len(cands)) if cands else 0
            rounds = MIN_ROUNDS
        if len(cands) < 2 or block < 2 + (self.drain_steps if switching else 0):
            cands, rounds, block = cands[:1], 0, 0  # too small a budget to compare anything
        self.candidates = cands
        self.block = block
        self.rounds = rounds
        # odd rounds run in reverse order (A B C, C B A, ...): a steady drift then favours no candidate
        self.schedule: List[Config] = [c for r in range(rounds) for c in (cands if r % 2 == 0 else cands[::-1])]
        self.blocks: Dict[Config, List[List[float]]] = {c: [] for c in cands}
        self.alive: List[Config] = list(cands)       # the baseline and the candidates that can still win
        self.dropped: Dict[Config, int] = {}         # candidate -> the round after which it was dropped
        self.rounds_run = 0
        self._round_end = len(cands)                 # schedule index where the current round ends
        self._b = 0
        self._n = 0
        self.done = not self.schedule
        self.chosen: Config = cands[0]
        self.steps_used = 0
        self.trial_ms: List[float] = []   # every step run under a trial, measured or not (the tuning's cost)
        self.verdict = "nothing to compare" if self.done else "not finished"
        self.gain: Optional[float] = None
        self.confidence: Optional[str] = None

    def current(self) -> Config:
        return self.chosen if self.done else self.schedule[self._b]

    def _skip(self) -> int:
        cfg = self.schedule[self._b]
        prev = self.schedule[self._b - 1] if self._b else None
        if prev is not None and prev[2] and not cfg[2]:
            return 1 + self.drain_steps
        # staging switched on: the first step waits for the first put and the next one for the queue to fill, a
        # one-off of the switch that a job staged throughout never pays
        return 2 if cfg[2] and (prev is None or not prev[2]) else 1

    def record(self, step_ms: float) -> None:
        if self.done:
            return
        cfg = self.schedule[self._b]
        if self._n == 0:
            self.blocks[cfg].append([])
        if self._n >= self._skip():
            self.blocks[cfg][-1].append(step_ms)
        self._n += 1
        self.steps_used += 1
        self.trial_ms.append(float(step_ms))
        if self._n >= self.block:
            self._b += 1
            self._n = 0
            if self._b >= self._round_end:
                self._end_round()
            if self._b >= len(self.schedule):
                self._finish()

    def _end_round(self) -> None:
        """After each round: drop the candidates that were slower than the baseline in a round (they cannot win
        every round) and lay out the remaining rounds with those still in play."""
        self.rounds_run += 1
        for c in self.alive[1:]:
            r = self.ratios(c)
            if r and max(r) >= 1.0:
                self.dropped[c] = self.rounds_run
        self.alive = [c for c in self.alive if c not in self.dropped]
        if len(self.alive) < 2:  # nothing can beat the script's configuration any more
            del self.schedule[self._b:]
            return
        rest = [c for r in range(self.rounds_run, self.rounds)
                for c in (self.alive if r % 2 == 0 else self.alive[::-1])]
        self.schedule[self._b:] = rest
        self._round_end = self._b + len(self.alive)

    def _median(self, cfg: Config) -> Optional[float]:
        t = [x for b in self.blocks.get(cfg, []) for x in b]
        return statistics.median(t) if t else None

    def ratios(self, cfg: Config) -> List[float]:
        """Per round: the candidate's block median over the baseline's block median."""
        base = self.blocks[self.candidates[0]]
        out = []
        for b0, b1 in zip(base, self.blocks.get(cfg, [])):
            if b0 and b1:
                out.append(statistics.median(b1) / statistics.median(b0))
        return out

    def _finish(self) -> None:
        self.done = True
        best, best_gain, best_conf = None, 0.0, None
        for c in self.candidates[1:]:
            r = self.ratios(c)
            if len(r) < 2:
                continue
            gain = 1.0 - statistics.median(r)
            noise = (max(r) - min(r)) / 2.0
            if max(r) < 1.0 and gain > max(MIN_GAIN, noise) and gain > best_gain:
                best, best_gain = c, gain
                best_conf = (f"faster in {len(r)} of {len(r)} rounds; per-round ratio "
                             f"{min(r):.3f}..{max(r):.3f} (noise +-{noise:.3f})")
        if best is None:
            self.chosen = self.candidates[0]
            r0 = [x for c in self.candidates[1:] for x in self.ratios(c)]
            spread = f"; per-round ratios of the others {min(r0):.3f}..{max(r0):.3f}" if r0 else ""
            self.verdict = "kept the script's configuration: no candidate faster beyond the noise"
            if self.rounds_run < self.rounds:
                self.verdict += (f" (stopped after round {self.rounds_run} of {self.rounds}: every candidate was "
                                 "slower than the script's configuration in a round)")
            self.confidence = f"{self.rounds_run} interleaved rounds{spread}"
            self.gain = 0.0
        else:
            self.chosen = best
            self.gain = best_gain
            self.confidence = best_conf
            self.verdict = (f"compute {best[0]}, input {best[1]}, staged {best[2]}: "
                            f"{100 * best_gain:.1f}% faster than the script's configuration")

    def report(self) -> Dict:
        first = self._median(self.candidates[0])
        best = self._median(self.chosen)
        trials = []
        for c, i, st in self.candidates:
            r = self.ratios((c, i, st))
            trials.append({"compute_threads": c, "input_threads": i, "stage_pipelined": bool(st),
                           "stage_read_ahead": st == READ_AHEAD,
                           "steps": sum(len(b) for b in self.blocks[(c, i, st)]),
                           "dropped_after_round": self.dropped.get((c, i, st)),
                           "step_ms_median": self._median((c, i, st)),
                           "ratio_to_script_per_round": [round(x, 4) for x in r]})
        cost = self.cost(best)
        return {"done": self.done, "budget_steps": self.budget_steps, "steps_used": self.steps_used,
                "schedule": "interleaved blocks", "steps_per_block": self.block, "rounds": self.rounds,
                "rounds_run": self.rounds_run,
                "trials": trials,
                "chosen": {"compute_threads": self.chosen[0], "input_threads": self.chosen[1],
                           "stage_pipelined": bool(self.chosen[2]), "stage_read_ahead": self.chosen[2] == READ_AHEAD},
                "verdict": self.verdict, "gain_pct": None if self.gain is None else round(100 * self.gain, 2),
                "confidence": self.confidence,
                "first_step_ms_median": first, "chosen_step_ms_median": best,
                "speedup_over_first_x": (first / best) if first and best else None,
                "overhead_vs_chosen_ms": cost["extra_ms"],
                "trial_steps_ms": cost["trial_ms"],
                "cost_pct_of_1000_step_job": cost["pct_of_1000_steps"]}

    def cost(self, chosen_ms: Optional[float]) -> Dict[str, Optional[float]]:
        """What tuning cost: every step run under a trial (the unmeasured first steps of blocks and the
        drained ones included) against the same number of steps at the chosen configuration's median, 0 when
        the trials were no slower; and that extra time as a share of a 1000-step job run at the chosen
        configuration (the trials are a fixed number of steps, so a longer job pays a smaller share)."""
        total = sum(self.trial_ms)
        if not chosen_ms or not self.trial_ms:
            return {"trial_ms": round(total, 3), "extra_ms": 0.0 if not self.trial_ms else None,
                    "pct_of_1000_steps": 0.0 if not self.trial_ms else None}
        extra = max(0.0, total - len(self.trial_ms) * chosen_ms)
        return {"trial_ms": round(total, 3), "extra_ms": round(extra, 3),
                "pct_of_1000_steps": round(100.0 * extra / (JOB_STEPS * chosen_ms), 3)}
