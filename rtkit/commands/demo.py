# demo.py -- `rtkit demo`: the bundled Wide&Deep workload under the run pipeline, with summary and HTML report.
from __future__ import annotations

import os
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run the bundled Wide&Deep workload under rtkit and write the report",
                              description="Generate the synthetic Criteo data (once), train Wide&Deep under "
                                          "`rtkit run`, print the summary and write report.json and report.html.")
    p.add_argument("--model", default="wdl", choices=["wdl", "dlrm"])
    p.add_argument("--api", default="session", choices=["session", "monitored", "keras"])
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the workload's)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: the workload's)")
    p.add_argument("--profile", help="tuning profile to run with")
    p.add_argument("--out", help="folder for the run directory (default: rtkit-runs)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(func=main)


def main(args) -> int:
    from rtkit import runner

    command = [sys.executable, "-m", "rtkit.workloads", args.model, "--api", args.api]
    if args.steps:
        command += ["--steps", str(args.steps)]
    if args.batch:
        command += ["--batch", str(args.batch)]
    resolved = runner.resolve(args.set, profile=args.profile, options={"out": args.out},
                              defaults={"name": f"demo-{args.model}"}, who="rtkit demo")
    # The demo is ours, so TensorFlow's start-up log lines are trimmed unless the user asked for them.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    code, _ = runner.execute(command, resolved, html=True)
    return code
