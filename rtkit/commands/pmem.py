# pmem.py -- `rtkit pmem check|info|create PATH`: verify, describe or make a PMEM pool file.
from __future__ import annotations

import argparse
import json
import sys

from rtkit.errors import UserError


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "pmem", help="check, describe or create a PMEM pool file",
        description="Tools for rtkit's persistent segment-allocator pools. `check` reads every record "
                    "header (the pool must be closed) and exits 1 on corruption; `info` shows the layout.")
    sub = p.add_subparsers(dest="pmem_command", metavar="ACTION")
    chk = sub.add_parser("check", help="verify a pool and print its statistics (exit 1 on corruption)")
    chk.add_argument("path", metavar="PATH")
    chk.add_argument("--json", action="store_true", help="print the report as JSON")
    inf = sub.add_parser("info", help="show a pool's layout (header and segment table)")
    inf.add_argument("path", metavar="PATH")
    inf.add_argument("--json", action="store_true", help="print the layout as JSON")
    cre = sub.add_parser("create", help="create an empty pool file")
    cre.add_argument("path", metavar="PATH")
    cre.add_argument("--size", required=True, help="pool size (64K, 1M, 2G ...)")
    cre.add_argument("--segment-size", default=None, help="segment size (default RTKIT_PMEM_SEGMENT_SIZE or 1M)")
    cre.add_argument("--block-size", default=None, help="block size, a power of two >= 8 (default 64)")
    cre.add_argument("--max-record", default=None, help="largest record served by classes (default 4K)")
    p.set_defaults(func=main, _pmem_parser=p)
    return p


def _size(text, limit=(1 << 64) - 1):
    """A size from the command line, bounded as the C library's type holds it (uint64, or uint32)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = str(text).strip().upper().rstrip("B")
    unit = t[-1:] if t[-1:] in units and t[-1:] else ""
    number = t[:-1] if unit else t
    try:
        value = int(number) * units[unit]
    except ValueError:
        raise ValueError(f"'{text}' is not a size (like 4096, 64K, 1M, 2G)") from None
    if value <= 0:
        raise ValueError(f"'{text}' is not a positive size")
    if value > limit:
        raise ValueError(f"'{text}' is larger than {limit} bytes")
    return value


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0


def _print_layout(r, out):
    out.write(f"pool            {r['path']}\n")
    out.write(f"format version  {r['version']}\n")
    out.write(f"size            {r['pool_size']} ({_human(r['pool_size'])})\n")
    out.write(f"segment size    {r['segment_size']} ({_human(r['segment_size'])}), {r['nsegments']} segments "
              f"from offset {r['data_offset']}\n")
    out.write(f"block size      {r['block_size']}\n")
    out.write(f"max record      {r['max_record']} ({r['nclasses']} classes)\n")
    out.write(f"segments        {r['segments_class']} records, {r['segments_extent']} extents, "
              f"{r['segments_free']} free\n")
    out.write(f"last close      {'clean' if r['clean'] else 'not clean (crash or still open)'}, "
              f"opened {r['open_count']} times\n")


def main(args: argparse.Namespace) -> int:
    from rtkit.allocators import pmem
    action = getattr(args, "pmem_command", None)
    if not action:
        args._pmem_parser.print_help(sys.stderr)
        return 2  # as `rtkit` without a command: the help is the message
    try:
        if action == "create":
            opts = {}
            for key in ("segment_size", "block_size", "max_record"):
                if getattr(args, key):
                    opts[key] = _size(getattr(args, key), limit=(1 << 32) - 1 if key != "segment_size" else (1 << 64) - 1)
            with pmem.Pool.create(args.path, _size(args.size), rebalance_ms=0, **opts) as pool:
                st = pool.stats()
            print(f"created {args.path}: {st['nsegments']} segments of {_human(st['segment_size'])}")
            return 0
        report = pmem.check(args.path) if action == "check" else pmem.info(args.path)
    except pmem.PmemError as exc:
        raise UserError(f"rtkit pmem {action}: {exc}", 1 if isinstance(exc, pmem.CorruptPoolError) else 2) from None
    except (ValueError, OverflowError) as exc:
        raise UserError(f"rtkit pmem {action}: {exc}") from None
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_layout(report, sys.stdout)
        if action == "check":
            sys.stdout.write(f"records         {report['records_allocated']} allocated "
                             f"({_human(report['bytes_allocated'])}, {_human(report['requested_bytes'])} requested), "
                             f"{report['records_free']} free slots, {report['extents']} extents "
                             f"({_human(report['extent_bytes'])})\n")
            if report["records_torn"] and not report["clean"]:
                sys.stdout.write(f"torn headers    {report['records_torn']} (allocations or frees cut short by a "
                                 "crash; they count as free)\n")
            elif report["records_torn"]:  # closed cleanly: no crash cut anything short, something changed them
                sys.stdout.write(f"changed headers {report['records_torn']} of free slots (changed after the clean "
                                 "close; no live record among them, they stay free)\n")
            sys.stdout.write(f"result          {'ok' if report['ok'] else 'CORRUPT: ' + report['first_error']}\n")
    if not report["ok"]:
        print(f"rtkit pmem {action}: {args.path}: {report['first_error']}", file=sys.stderr)
        return 1
    return 0
