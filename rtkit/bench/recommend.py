# recommend.py -- `rtkit recommend` checked by running it: each rule's recommendation followed against not, interleaved.
"""`python -m rtkit.bench.recommend OUT [--cases input,plan,capacity,capacity-lazy,capacity-hashed,rows] [--rounds 3]`

Per case: one run of the bundled workload that shows the rule's condition (the "seed"), `rtkit recommend --json`
on its report, then `rounds` rounds of the seed's own command (not followed) and the recommended command as
printed (followed), in alternating order (A B, B A, ...), each into its own run directory. The figures the
rule's claim is about are read from each report; the table gives their medians, followed / not, and the spread
((max - min) / median) over the rounds. A rule that does not fire on its seed is recorded as such.
OUT/recommend-bench.json holds every run's figures and the commands."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from typing import Any, Dict, List, Optional

from rtkit.bench.stats import median

SMALL = ["--batch", "256", "--rows", "4096", "--no-progress"]
# name: (as-run rtkit flags, workload flags, recommend flags, figures the claim is about)
CASES: Dict[str, Any] = {
    "input": (["--set", "sched=on"],
              ["--input", "legacy", "--input-latency-ms", "20", "--capacity", "4096", "--steps", "60", *SMALL],
              [], ["step_ms_median", "peak_rss_bytes"]),
    "plan": ([], ["--steps", "30", "--rows", "16384", "--capacity", "16384", "--no-progress"], [],
             ["minor_faults", "hit_rate", "step_ms_median"]),
    # a modest job (1 GiB of tables and slots) on a machine said to have 4 GiB (filled at initialisation: peak
    # RSS 2.3 GiB) or 1.5 GiB available (filled row by row, as the capacity bench's EmbeddingVariable analogue)
    "capacity": ([], ["--table-gb", "1", "--steps", "40", *SMALL], ["--mem-available", "4G"],
                 ["peak_rss_bytes", "rss_anon_peak_bytes", "step_ms_median", "major_faults"]),
    "capacity-lazy": ([], ["--table-gb", "1", "--table-fill", "lazy", "--steps", "40", *SMALL],
                      ["--mem-available", "1536M"], ["peak_rss_bytes", "rss_anon_peak_bytes", "step_ms_median",
                                                    "major_faults"]),
    # the same tables with ids hashed over them: the rows used sit on ~47k pages (~180 MiB resident), so the
    # tables' resident share is what the DRAM head bound (from the 1.5 GiB planned for) decides
    "capacity-hashed": ([], ["--table-gb", "1", "--table-fill", "lazy", "--row-assign", "hashed", "--steps", "40",
                             *SMALL], ["--mem-available", "1536M"], ["peak_rss_bytes", "rss_anon_peak_bytes",
                                                                     "step_ms_median", "major_faults"]),
    "rows": ([], ["--table-fill", "lazy", "--row-assign", "hashed", "--capacity", "262144", "--steps", "40", *SMALL],
             [], ["row_pages", "peak_rss_bytes", "rss_growth_bytes", "minor_faults", "step_ms_median"]),
}


def figures(report: Dict[str, Any]) -> Dict[str, Optional[float]]:
    from rtkit.report import glossary as G

    pm = report.get("pmem") if isinstance(report.get("pmem"), dict) else {}
    rows = report.get("rows") if isinstance(report.get("rows"), dict) else {}
    out = {fid: G.value(report, fid) for fid in ("step_ms_median", "peak_rss_bytes", "minor_faults", "major_faults",
                                                 "hit_rate", "rss_growth_bytes")}
    # anonymous RSS: what tier mode moves out; sampled by the tier (pmem section) only, so only when tier mode ran
    out["rss_anon_peak_bytes"] = pm.get("process_rss_anon_peak_sampled_bytes")
    out["row_pages"] = rows.get("row_pages")
    return out


class Bench:
    def __init__(self, out: str, rounds: int):
        self.out, self.rounds = os.path.abspath(out), rounds
        self.rtkit = os.path.join(os.path.dirname(sys.executable), "rtkit")
        self.data = os.path.join(self.out, "data")

    def _run(self, argv: List[str], run_dir: str) -> Dict[str, Any]:
        """`rtkit run --run-dir RUN_DIR ARGS...` (argv: what follows `rtkit run`); its report."""
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        with open(run_dir + ".log", "w") as log:
            subprocess.run([self.rtkit, "run", "--run-dir", run_dir, *argv], stdout=log, stderr=subprocess.STDOUT,
                           env=env, check=True)
        with open(os.path.join(run_dir, "report.json")) as fh:
            return json.load(fh)

    def case(self, name: str) -> Dict[str, Any]:
        flags, workload, rec_flags, keys = CASES[name]
        root = os.path.join(self.out, name)
        os.makedirs(root, exist_ok=True)
        as_run = [*flags, "--", sys.executable, "-m", "rtkit.workloads", "wdl", *workload, "--data-dir", self.data]
        seed = os.path.join(root, "seed")
        self._run(as_run, seed)
        proc = subprocess.run([self.rtkit, "recommend", seed, "--json", *rec_flags], capture_output=True, text=True,
                              check=True)
        recs = {r["rule"]: r for r in json.loads(proc.stdout)}
        result: Dict[str, Any] = {"case": name, "not_followed": shlex.join(["rtkit", "run", *as_run]),
                                  "recommend": shlex.join(["rtkit", "recommend", seed, *rec_flags]),
                                  "rules_fired": sorted(recs)}
        rec = recs.get(name.split("-")[0])
        if rec is None or not rec.get("command"):
            result["fired"] = False
            return result
        argv = shlex.split(rec["command"])
        followed = argv[2:]   # after `rtkit run`
        result.update(fired=True, followed=rec["command"], reason=rec["reason"], expect=rec["expect"], runs=[])
        for k in range(self.rounds):
            order = [("not", as_run), ("followed", followed)]
            for which, args in (order if k % 2 == 0 else order[::-1]):
                report = self._run(args, os.path.join(root, f"{which}-{k}"))
                result["runs"].append({"round": k, "which": which, **figures(report)})
        result["table"] = {}
        for key in keys:
            a = [r[key] for r in result["runs"] if r["which"] == "not"]
            b = [r[key] for r in result["runs"] if r["which"] == "followed"]
            ma, mb = median(a), median(b)
            result["table"][key] = {"not": ma, "followed": mb, "ratio": mb / ma if ma and mb is not None else None,
                                    "spread_not": _spread(a), "spread_followed": _spread(b)}
        return result


def _spread(values: List[Optional[float]]) -> Optional[float]:
    got = [v for v in values if v is not None]
    m = median(got)
    return (max(got) - min(got)) / m if got and m else None


def markdown(results: List[Dict[str, Any]]) -> str:
    from rtkit.report import fmt

    lines = ["| rule | figure | not followed (median) | followed (median) | followed / not | spread (not / followed) |",
             "|---|---|---:|---:|---:|---:|"]
    for r in results:
        if not r.get("fired"):
            lines.append(f"| {r['case']} | did not fire (fired: {', '.join(r['rules_fired'])}) | | | | |")
            continue
        for key, t in r["table"].items():
            show = fmt.nbytes if key.endswith("bytes") else (fmt.pct if key == "hit_rate" else fmt.num)
            ratio = f"{t['ratio']:.2f}x" if t["ratio"] is not None else "-"
            spread = " / ".join(f"{s:.0%}" if s is not None else "-" for s in (t["spread_not"], t["spread_followed"]))
            lines.append(f"| {r['case']} | {key} | {show(t['not'])} | {show(t['followed'])} | {ratio} | {spread} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtkit.bench.recommend", description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"--cases: unknown {', '.join(unknown)}; expected {', '.join(CASES)}")
    bench = Bench(args.out, args.rounds)
    os.makedirs(bench.out, exist_ok=True)
    results = []
    for c in cases:
        results.append(bench.case(c))
        with open(os.path.join(bench.out, "recommend-bench.json"), "w") as fh:
            json.dump(results, fh, indent=1)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
