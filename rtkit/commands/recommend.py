# recommend.py -- `rtkit recommend RUN_DIR`: the settings or profile to try next, with the measured reason and the command.
from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "recommend", help="what to try next for a run: a profile or settings, the measured reason, the command",
        description="Read a run's report (a finished run, or a running job's live snapshot) and name the "
                    "settings or profile to try next, each with the figure that calls for it, the effect to "
                    "expect and the exact `rtkit run` command; or say that there is nothing to gain.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory (or its report.json)")
    p.add_argument("--mem-available", metavar="SIZE",
                   help="memory the job may use, e.g. 64G (default: MemAvailable on this machine now)")
    p.add_argument("--json", action="store_true", help="print the recommendations as JSON")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from rtkit.config import parse_size
    from rtkit.errors import UserError
    from rtkit.report import recommend as R
    from rtkit.report.load import load

    available = None
    if args.mem_available is not None:
        try:
            available = parse_size(args.mem_available)
        except ValueError as exc:
            raise UserError(f"rtkit recommend: error: --mem-available {args.mem_available!r}: expected {exc}") from None
        if available <= 0:
            raise UserError("rtkit recommend: error: --mem-available must be more than 0")
    report, run_dir = load(args.run_dir)
    if available is None:
        from rtkit.pool_room import mem_available

        recs = R.recommend(report, run_dir, mem_available(), "MemAvailable on this machine now")
    else:
        recs = R.recommend(report, run_dir, available, "as given")
    if args.json:
        json.dump(R.as_json(recs), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n".join(R.lines(report, recs)) + "\n")
    return 0
