# report.py -- `rtkit report RUN_DIR [--json | --html [PATH]]`: show a finished run's report.json.
from __future__ import annotations

import argparse
import json
import sys

from rtkit.errors import UserError


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report", help="show a run's report (terminal tables, --json, or a self-contained --html file)",
        description="Show the report of a finished `rtkit run`: terminal tables by default, the raw JSON with "
                    "--json, or one self-contained HTML file with plots with --html.")
    # optional only so that `rtkit report --html RUN_DIR` (PATH omitted) works: see main()
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="run directory (or its report.json)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="print report.json")
    group.add_argument("--html", nargs="?", const="", default=None, metavar="PATH",
                       help="write an HTML report (default RUN_DIR/report.html) and print its path")
    p.add_argument("--width", type=int, default=None,
                   help="columns to fit the text in (default: the terminal's width on a terminal, else 80; COLUMNS "
                        "is honoured)")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from rtkit.report.load import load   # lazy: keeps `rtkit --help` light
    if args.run_dir is None:
        if not args.html:
            raise UserError("rtkit report: error: RUN_DIR is required (see `rtkit report --help`)")
        args.run_dir, args.html = args.html, ""   # `--html RUN_DIR`: argparse gave the run directory to --html
    from rtkit.cluster import merge
    if merge.is_cluster_dir(args.run_dir):   # a folder of cluster task runs: one merged report
        from rtkit.cluster import show
        return show.report(args)
    report, run_dir = load(args.run_dir)
    from rtkit.report.load import running_since
    as_of = running_since(report)
    if as_of and not args.json:   # a snapshot of a job still running: its figures cover the time until then
        print(f"rtkit: running, as of {as_of} (live snapshot; the full report is written when the job ends)")
    if args.json:
        json.dump(report, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    elif args.html is not None:
        from rtkit.report import html
        print(html.write_for_user(html.write, report, args.html or html.default_path(run_dir)))
    else:
        from rtkit.report import terminal
        sys.stdout.write(terminal.render(report, colour=terminal.use_colour(sys.stdout),
                                         width=terminal.width_for(sys.stdout, args.width)))
    return 0
