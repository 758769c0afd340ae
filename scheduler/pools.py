# pools.py -- per-stage inter-op pools in a ConfigProto, run routing, and finding/pinning pool threads by name.
"""Every candidate pool (a stage and a thread count) is one entry of ConfigProto.session_inter_op_thread_pool
with a global name, so sessions share the threads and a tuning trial switches pools per run with
RunOptions.inter_op_thread_pool instead of building new sessions. TF names a pool's threads
"tf_Compute<index>" after its index in the first session that created it; we always add the pools in the
same order, so the index names the pool in /proc/self/task/*/comm."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass
class PoolPlan:
    compute_sizes: List[int]            # candidate inter-op sizes for the step's own run
    input_sizes: List[int]              # candidate sizes for the pipelined input run
    intra_op: int
    inter_op: int                       # the session-wide inter_op_parallelism_threads
    pools: List[Tuple[str, int]] = field(default_factory=list)  # (stage, threads) by pool index

    def __post_init__(self):
        self.pools = [("compute", n) for n in self.compute_sizes] + [("input", n) for n in self.input_sizes]

    def index(self, stage: str, threads: int) -> int:
        return self.pools.index((stage, threads))

    def global_name(self, stage: str, threads: int) -> str:
        return f"rtkit_{stage}_t{threads}"

    def apply(self, config):
        """Add the pools and sizes to `config` (a ConfigProto, modified in place)."""
        config.inter_op_parallelism_threads = self.inter_op
        config.intra_op_parallelism_threads = self.intra_op
        del config.session_inter_op_thread_pool[:]
        for stage, n in self.pools:
            p = config.session_inter_op_thread_pool.add()
            p.num_threads = n
            p.global_name = self.global_name(stage, n)
        return config


def make_plan(settings: Dict, tune: bool) -> PoolPlan:
    ncpu = cpu_count()
    inter = int(settings.get("sched_inter_op") or 0)
    intra = int(settings.get("sched_intra_op") or 0) or ncpu
    inp = int(settings.get("sched_input_threads") or 0)
    if inter:
        compute = [inter]
    elif tune:
        compute = sorted({ncpu, max(1, ncpu // 2), 2 * ncpu})
        compute.remove(ncpu)
        compute.insert(0, ncpu)  # the first trial is the plain default size
    else:
        compute = [ncpu]
    if inp:
        inputs = [inp]
    elif tune:
        inputs = [max(1, ncpu // 2)] + ([ncpu] if ncpu > 1 else [])
    else:
        inputs = [max(1, ncpu // 2)]
    return PoolPlan(compute_sizes=compute, input_sizes=inputs, intra_op=intra, inter_op=compute[0])


def user_thread_settings(config) -> Dict[str, int]:
    """The thread settings the script set explicitly in its ConfigProto (empty when none)."""
    out: Dict[str, int] = {}
    if config is None:
        return out
    if config.inter_op_parallelism_threads:
        out["inter_op_parallelism_threads"] = config.inter_op_parallelism_threads
    if config.intra_op_parallelism_threads:
        out["intra_op_parallelism_threads"] = config.intra_op_parallelism_threads
    if len(config.session_inter_op_thread_pool):
        out["session_inter_op_thread_pool"] = len(config.session_inter_op_thread_pool)
    if config.use_per_session_threads:
        out["use_per_session_threads"] = 1
    return out


def thread_names() -> Dict[int, str]:
    """native thread id -> comm name of every thread of this process."""
    out: Dict[int, str] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for t in tids:
        try:
            with open(f"/proc/self/task/{t}/comm") as fh:
                out[int(t)] = fh.read().strip()
        except OSError:
            pass
    return out


def pool_threads(index: int) -> List[int]:
    """Native thread ids of the inter-op pool at `index` (TF names them tf_Compute<index>)."""
    want = f"tf_Compute{index}"
    return sorted(t for t, n in thread_names().items() if n == want)


def pin_pools(plan: PoolPlan, active: Dict[str, int], input_share: Optional[float] = None) -> Dict[str, object]:
    """Pin each active pool's threads to its own share of this process's CPUs: the input pool gets CPUs in
    proportion to the input stage's measured share of op time (a quarter when unmeasured), at least one,
    and the compute pool the rest. Only the inter-op pools are pinned: the intra-op pool is TF's own."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError) as exc:
        return {"pinned": False, "detail": f"no sched_getaffinity: {exc}"}
    if len(cpus) < 2:
        return {"pinned": False, "detail": "fewer than 2 CPUs: nothing to split"}
    if input_share is not None:
        n_input = max(1, min(len(cpus) - 1, round(len(cpus) * input_share)))
    else:
        n_input = max(1, len(cpus) // 4)
    sets = {"input": cpus[:n_input], "compute": cpus[n_input:]}
    result: Dict[str, object] = {"pinned": True, "input_share": input_share, "cpus": {}}
    for stage, idx in active.items():
        tids = pool_threads(idx)
        done = 0
        for tid in tids:
            try:
                os.sched_setaffinity(tid, sets[stage])
                done += 1
            except OSError:
                pass
        result["cpus"][stage] = {"cpus": sets[stage], "threads": done}
    return result
