# config.py -- `rtkit config`: the resolved settings with where each came from, the settings table, the profiles.
from __future__ import annotations

import json
import sys

from rtkit import config as cfg


def register(subparsers) -> None:
    p = subparsers.add_parser("config", help="show resolved settings, the settings table or the profiles",
                              description="Print every setting's resolved value and its source "
                                          "(cli > env > profile > default).")
    p.add_argument("--profile", help="resolve with this profile")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a CLI value to resolve with")
    p.add_argument("--list", action="store_true", help="list every setting with type, default and doc")
    p.add_argument("--profiles", action="store_true", help="list the available profiles")
    p.add_argument("--markdown", action="store_true", help="the settings table as Markdown (for docs)")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=main)


def main(args) -> int:
    if args.markdown:
        print(cfg.doc_table())
        return 0
    if args.list:
        return _list(args.json)
    if args.profiles:
        return _profiles(args.json)
    resolved = cfg.resolve(cli=cfg.parse_assignments(args.set), profile=args.profile)  # ConfigError: cli.main
    for line in resolved.errors:
        print(line, file=sys.stderr)
    if args.json:
        print(json.dumps({"profile": resolved.profile, "settings": resolved.as_report()}, indent=1))
        return 0
    width = max(len(s.env) for s in cfg.SETTINGS)
    print(f"profile: {resolved.profile or '(none)'}")
    for s in cfg.SETTINGS:
        value = resolved.values[s.key]
        shown = cfg.format_size(value) if s.kind == "size" else s.to_env(value)
        print(f"{s.env:<{width}}  {shown!s:<12} {resolved.sources[s.key]}")
    return 0


def _list(as_json: bool) -> int:
    if as_json:
        print(json.dumps([{"key": s.key, "env": s.env, "type": s.kind, "default": s.default, "unit": s.unit,
                           "doc": s.doc, "accepted": s.accepted()} for s in cfg.SETTINGS], indent=1))
        return 0
    for s in cfg.SETTINGS:
        default = cfg.format_size(s.default) if s.kind == "size" else s.to_env(s.default)
        print(f"{s.env}  ({s.kind}, default {default!r}{' ' + s.unit if s.unit else ''})\n    {s.doc}")
    return 0


def _profiles(as_json: bool) -> int:
    rows = []
    for name, path in cfg.available_profiles().items():
        try:
            prof = cfg.load_profile(path)
            rows.append({"name": name, "path": path, "description": prof.description, "error": None})
        except cfg.ConfigError as exc:
            rows.append({"name": name, "path": path, "description": "", "error": str(exc)})
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    for row in rows:
        print(f"{row['name']:<12} {row['error'] or row['description']}")
    return 0
