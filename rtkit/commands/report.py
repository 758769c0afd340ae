# report.py -- `rtkit report RUN_DIR [--json | --html [PATH]]`: show a finished run's report.json.
from __future__ import annotations

import argparse
import json
import sys


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
    p.add_argument("--width", type=int, default=80, help=argparse.SUPPRESS)
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from rtkit.report.load import ReportError, load   # lazy: keeps `rtkit --help` light
    if args.run_dir is None:
        if args.html:          # `--html RUN_DIR`: argparse gave the run directory to --html
            args.run_dir, args.html = args.html, ""
        else:
            print("rtkit report: error: RUN_DIR is required (see `rtkit report --help`)", file=sys.stderr)
            return 2
    try:
        report, run_dir = load(args.run_dir)
    except ReportError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    try:
        if args.json:
            json.dump(report, sys.stdout, indent=2, sort_keys=False)
            sys.stdout.write("\n")
        elif args.html is not None:
            from rtkit.report import html
            path = args.html or html.default_path(run_dir)
            try:
                html.write(report, path)
            except OSError as exc:
                print(f"rtkit: cannot write '{path}': {exc.strerror or exc}", file=sys.stderr)
                return 2
            print(path)
        else:
            from rtkit.report import terminal
            sys.stdout.write(terminal.render(report, colour=terminal.use_colour(sys.stdout), width=args.width))
        sys.stdout.flush()
    except BrokenPipeError:       # `rtkit report X | head` is normal use, not an error
        _silence_stdout()
    return 0


def _silence_stdout() -> None:
    """After a closed pipe, point stdout at /dev/null so the interpreter's final flush stays quiet."""
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
