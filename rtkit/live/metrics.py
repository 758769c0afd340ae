# metrics.py -- the live figures as OpenMetrics (Prometheus) on a local HTTP port, served with prometheus_client.
"""The parent of `rtkit run` serves the latest live snapshot's figures (rtkit/live/snapshot.py) with
prometheus_client's own exposition and HTTP server: one gauge per glossary figure, named rtkit_<figure id>,
its help the glossary's words, labelled with the run's name and, under `rtkit launch`, its task's role and
index. Under `rtkit launch` every task serves its own endpoint on metrics_port + the task's position in the
cluster (chief, workers, then parameter servers: the order of `rtkit launch --ports`)."""
from __future__ import annotations

from typing import Any, Dict, Optional

from rtkit.report import glossary as G

# glossary ids served (numbers only; the allocator's state is served as an info-style gauge)
FIGURES = ("steps", "measured_steps", "step_ms_median", "step_ms_p95", "steps_per_s", "live_steps_per_s",
           "live_step_ms_median", "live_step_ms_p95", "live_faults_per_step", "rss_now_bytes", "peak_rss_bytes",
           "major_faults_now", "hit_rate", "hit_rate_after_plan", "faults_before_plan", "faults_after_plan",
           "reserved_bytes", "tier_bytes", "tier_peak_bytes", "pool_resident_now_bytes", "tier_fallbacks",
           "pipelined_steps", "occupancy_mean", "tuning_gain_pct")
ROLE_ORDER = ("chief", "worker", "ps", "evaluator")
# while the job runs, these figures are described by their running twin's words ("so far", not "whole run")
WORDS_WHILE_RUNNING = {"hit_rate": "hit_rate_now"}


def task_port(base: int, task: Any) -> int:
    """A task's port under `rtkit launch`: base + its position among the cluster's tasks."""
    cluster = getattr(task, "cluster", None) or {}
    roles = [r for r in ROLE_ORDER if r in cluster] + sorted(r for r in cluster if r not in ROLE_ORDER)
    pos = 0
    for r in roles:
        if r == task.role:
            return base + pos + task.index
        pos += len(cluster[r])
    return base + task.index


class _Collector:
    """Yields the latest snapshot's figures at each scrape (prometheus_client calls collect())."""

    def __init__(self, labels: Dict[str, str]):
        self.labels = labels
        self.report: Optional[Dict[str, Any]] = None

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        r = self.report
        if r is None:
            return
        names, values = list(self.labels), list(self.labels.values())
        running = GaugeMetricFamily("rtkit_running", "1 while the job runs, 0 once its report is written",
                                    labels=names)
        is_running = (r.get("run") or {}).get("status") == "running"
        running.add_metric(values, 1.0 if is_running else 0.0)
        yield running
        for fid in FIGURES:
            v = G.value(r, fid)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                f = G.FIGURES[WORDS_WHILE_RUNNING.get(fid, fid) if is_running else fid]
                g = GaugeMetricFamily(f"rtkit_{fid}", f"{f.name}: {f.meaning}", labels=names)
                g.add_metric(values, float(v))
                yield g
        state = G.value(r, "allocator_state")
        if state:
            g = GaugeMetricFamily("rtkit_allocator_state", G.FIGURES["allocator_state"].meaning + " (1 = current)",
                                  labels=names + ["state"])
            g.add_metric(values + [str(state)], 1.0)
            yield g


class MetricsExporter:
    name = "metrics"

    def __init__(self, port: int, host: str, run_name: str, task: Any = None):
        from prometheus_client import CollectorRegistry, start_http_server

        labels = {"run": run_name, "role": getattr(task, "role", "") or "",
                  "index": str(task.index) if task is not None else ""}
        self.port = port   # under `rtkit launch`, already this task's own (task_port)
        self.collector = _Collector(labels)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.server, self.thread = start_http_server(self.port, addr=host, registry=self.registry)

    def update(self, report: Dict[str, Any]) -> None:
        self.collector.report = report

    def finish(self, report: Dict[str, Any]) -> None:
        self.collector.report = report
        self.server.shutdown()
        self.server.server_close()
