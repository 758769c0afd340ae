# lookahead_feeds.py -- the lookahead of a script that feeds its ids: a step's rows come from its own feed_dict.
"""A TF1 script that feeds its batch (`sess.run(train, {ids: batch})`) has no staged batch to look ahead of, but
its step's rows are known when the run is called: they are the fed ids (an `embedding_lookup` on a placeholder)
or a read-only computation of them (a hash, a modulo: lookahead_graph.plan_feeds copies it). Just before such a
run, Lookahead.on_feed asks for the pages of those rows at once (all reads in flight together), so the step
waits for reads already under way instead of faulting its rows in one page at a time."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, List, Optional

import numpy as np

from .lookahead import BackOff

# Backing off when the steps' pages are in DRAM already (lookahead.BackOff): the lookahead costs a step its own time
# (0.5-1 ms on word2vec_basic.py, where 95% of the pages were resident) and saves about a page read per page it reads
# ahead (0.1-0.3 ms on this disk).


def fed_values(graph, feed_dict) -> Dict[str, Any]:
    """Tensor name -> fed value (a SparseTensor's parts are not rows: left out)."""
    out: Dict[str, Any] = {}
    for key, value in (feed_dict or {}).items():
        if hasattr(key, "dense_shape"):
            continue
        try:
            t = graph.as_graph_element(key, allow_tensor=True, allow_operation=False)
        except (TypeError, ValueError, KeyError):
            continue
        out[t.name] = value
    return out


class FedLookahead:
    """Per session: which of a plan's index tensors a run can compute from its feeds, and the lookahead they go to."""

    def __init__(self, plan, lookahead, run_feed: Callable[[List[Any], Dict[str, Any]], List[Any]]):
        self.plan = plan
        self.lookahead = lookahead
        self._run_feed = run_feed                  # (tensors, {name: value}) -> their values: rtkit's own run
        self._applies: Dict[Any, List[int]] = {}   # run shape -> the plan's index tensors it computes
        self._back_off = BackOff()

    def applies(self, key, fed: Iterable[str], reach: Callable[[], set]) -> List[int]:
        """The index tensors whose gather the run executes and whose placeholders it feeds (cached per shape)."""
        hit = self._applies.get(key)
        if hit is None:
            fed = set(fed)
            ran = reach()
            hit = [i for i, g in enumerate(self.plan.gather_ops)
                   if g in ran and all(n in fed for n in self.plan.fed_inputs[i])]
            self._applies[key] = hit
        return hit

    def before_step(self, which: List[int], values: Dict[str, Any]) -> None:
        """The run's rows, from its feeds (a fed index tensor as it is, a computed one by one run of its copy), to
        the lookahead; index tensors the run does not compute count as no rows. Its wall time is counted: the
        step waits for all of it (before_s). Steps skipped while backing off are counted (skipped_steps)."""
        if not self._back_off.looks():
            self.lookahead.add_skipped()
            return
        t0 = time.perf_counter()
        read0 = self.lookahead.counts["pages_read_ahead"]
        try:
            self._before_step(which, values)
        finally:
            self.lookahead.add_before(time.perf_counter() - t0)
        if self.lookahead.mode == "on":
            self._back_off.read(self.lookahead.counts["pages_read_ahead"] - read0)

    def _before_step(self, which: List[int], values: Dict[str, Any]) -> None:
        out: List[Optional[np.ndarray]] = [None] * len(self.plan.index_tensors)
        computed = []
        for i in which:
            t = self.plan.index_tensors[i]
            if t.name in values:
                out[i] = np.asarray(values[t.name])
            else:
                computed.append(i)
        if computed:
            feed = {n: values[n] for i in computed for n in self.plan.fed_inputs[i]}
            for i, v in zip(computed, self._run_feed([self.plan.index_tensors[i] for i in computed], feed)):
                out[i] = np.asarray(v)
        empty = np.zeros(0, dtype=np.int64)
        self.lookahead.on_feed([empty if v is None else v for v in out])
