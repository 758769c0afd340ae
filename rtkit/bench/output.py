# output.py -- what the bench leaves behind: the medians/ratios table (terminal and Markdown), bench.json, machine facts.
from __future__ import annotations

import shlex
import os
import platform
import subprocess
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

from rtkit.bench.stats import METRICS

# Columns of the table: metric key, header, formatter, whether a ratio column follows.
_MIB = float(1 << 20)


def _fmt(key: str, value: Optional[float]) -> str:
    if value is None:
        return "-"
    if key in ("peak_rss_bytes", "rss_growth_bytes", "rss_over_live_bytes"):
        return f"{value / _MIB:.0f} MiB"
    if key == "allocator_hit_rate":
        return f"{value * 100:.1f}%"
    if key in ("minor_faults",):
        return f"{value:.0f}"
    if key == "minor_faults_per_step":
        return f"{value:.0f}" if value >= 100 else f"{value:.1f}"
    if key == "steps_per_s":
        return f"{value:.2f}"
    if key == "duration_s":
        return f"{value:.1f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _fmt_ratio(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _fmt_range(spread: Optional[Mapping[str, Any]], med: Optional[float]) -> str:
    """(max - min) / median over the rounds: how much to trust a ratio near 1.0."""
    if not spread or not med or spread.get("n", 0) < 2:
        return "-"
    return f"{(spread['max'] - spread['min']) / med * 100:.0f}%"


# Metrics shown with a ratio column; the others are shown alone.
_WITH_RATIO = ("step_ms_median", "steps_per_s", "peak_rss_bytes", "minor_faults_per_step", "minor_faults")


def table_rows(bench: Mapping[str, Any]) -> List[List[str]]:
    """Header + one row per configuration (skipped ones included), as strings."""
    baseline = bench.get("baseline")
    header = ["config", "runs ok"]
    for key, label, _unit, _low in METRICS:
        header.append(label)
        if key in _WITH_RATIO:
            header.append("x " + (baseline or "base"))
        if key == "step_ms_median":
            header.append("step range")
    rows = [header]
    for name in bench.get("configs_run", []):
        counts = bench["counts"][name]
        med = bench["medians"][name]
        rat = bench["ratios"][name]
        label = name + (" (baseline)" if name == baseline else "")
        ok = f"{counts['ok']}/{counts['runs']}"
        if counts["failed"]:
            ok += f" ({counts['failed']} FAILED)"
        row = [label, ok]
        for key, _label, _unit, _low in METRICS:
            row.append(_fmt(key, med.get(key)))
            if key in _WITH_RATIO:
                row.append(_fmt_ratio(rat.get(key)))
            if key == "step_ms_median":
                row.append(_fmt_range(bench.get("spread", {}).get(name, {}).get(key), med.get(key)))
        rows.append(row)
    for skip in bench.get("skipped", []):
        rows.append([skip["config"], "skipped"] + ["-"] * (len(header) - 2))
    return rows


def render_text(bench: Mapping[str, Any]) -> str:
    rows = table_rows(bench)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(bench: Mapping[str, Any]) -> str:
    rows = table_rows(bench)
    out = [f"# rtkit bench: {bench.get('title', '')}".rstrip(), ""]
    out.append(f"- command: `{shlex.join(bench.get('workload_command', []))}`")
    out.append(f"- rounds: {bench.get('rounds')} (interleaved, rotated each round); "
               f"medians over successful runs; ratios = config median / {bench.get('baseline')} median")
    m = bench.get("machine", {})
    out.append(f"- machine: {m.get('cpu_model', '?')}, {m.get('cpus', '?')} CPUs, "
               f"{(m.get('memory_bytes') or 0) / (1 << 30):.1f} GiB, {m.get('platform', '')}")
    out.append(f"- started {bench.get('start_time')}, took {bench.get('duration_s', 0):.0f} s")
    out.append("")
    out.append("| " + " | ".join(_md_escape(c) for c in rows[0]) + " |")
    out.append("|" + "|".join(["---"] + ["---:"] * (len(rows[0]) - 1)) + "|")
    for row in rows[1:]:
        out.append("| " + " | ".join(_md_escape(c) for c in row) + " |")
    notes = list(bench.get("notes", []))
    failed = [r for r in bench.get("runs", []) if r.get("status") != "ok"]
    if notes or failed:
        out.append("")
        out.append("Notes:")
        for note in notes:
            out.append(f"- {_md_escape(note)}")
        for r in failed:
            out.append(f"- {r['config']} round {r['round']}: {r['status']}"
                       f" (exit {r.get('exit_code')}){': ' + r['error'] if r.get('error') else ''}; log {r.get('log')}")
    out.append("")
    out.append("Columns: step ms = median step time after warm-up (report steps.summary.step_ms_median); "
               "step range = (max - min) / median of step ms over the rounds; "
               "faults/step = median minor faults per step after warm-up; minor faults = whole process; "
               "wall s = run duration; alloc hit rate = allocator's own figure when it reports one.")
    return "\n".join(out) + "\n"


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _dist_version(*names: str) -> Optional[str]:
    from importlib import metadata
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _debian_versions(packages: Sequence[str]) -> Dict[str, str]:
    try:
        proc = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", *packages],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            found[parts[0]] = parts[1]
    return found


def machine_info() -> Dict[str, Any]:
    """Facts that decide whether two bench results are comparable."""
    try:
        import psutil
        memory = psutil.virtual_memory().total
    except Exception:  # psutil is a dependency, but the bench must still write its file
        memory = None
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    thp = _read("/sys/kernel/mm/transparent_hugepage/enabled").strip()
    from rtkit.bench.peers import DEBIAN_PACKAGES
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": affinity,
        "memory_bytes": memory,
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "transparent_hugepage": thp or None,
        "python": sys.version.split()[0],
        "rtkit": _dist_version("rtkit"),
        "tensorflow": _dist_version("tensorflow-cpu", "tensorflow"),
        "peer_packages": _debian_versions(sorted(DEBIAN_PACKAGES.values())),
    }
