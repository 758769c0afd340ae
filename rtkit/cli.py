# cli.py -- the `rtkit` command: parses the sub-command and hands it to its module under rtkit/commands/.
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

# Sub-commands in the order `rtkit --help` lists them.
COMMANDS = ["run", "launch", "report", "top", "recommend", "compare", "config", "demo", "bench", "pmem"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line and exit code 2, as argparse, but with the fix
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    from rtkit import __version__

    parser = _Parser(prog="rtkit", description="Allocator and runtime tuning for TensorFlow sparse-model training on CPU.")
    parser.add_argument("--version", action="version", version=f"rtkit {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"rtkit.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"rtkit.commands.{name}":
                raise
            continue  # a component that is not installed
        module.register(subs)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    from rtkit import early_signals, std_streams

    std_streams.fill_closed()  # before rtkit opens a file: none of its own may take the number of a closed one
    early_signals.hold()  # first: building the parser imports every command, and a signal meanwhile must not kill
    try:                  # rtkit silently
        parser = build_parser()
        args = parser.parse_args(argv)
    except BaseException:
        early_signals.release()
        raise
    if getattr(getattr(args, "func", None), "__module__", None) != "rtkit.commands.run":
        # only `rtkit run` reports a signal that came while it started
        early_signals.release()
        return _dispatch(parser, args)
    try:
        return _dispatch(parser, args)
    finally:  # the report is written: rtkit exits with the job's code
        early_signals.release(deliver=False)


def _dispatch(parser: argparse.ArgumentParser, args) -> int:
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    from rtkit.config import ConfigError
    from rtkit.errors import UserError

    for stream in (sys.stdout, sys.stderr):  # a non-UTF-8 byte in a path or argv prints escaped, never raises
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at interpreter exit
        return code
    except (UserError, ConfigError) as exc:  # bad input: the one line the error carries
        print(str(exc), file=sys.stderr, flush=True)
        return getattr(exc, "exit_code", 2)
    except (RecursionError, OverflowError, UnicodeError) as exc:
        # Safety net (docs/safety.md): input that is too deep, too large or not text is bad input: one
        # line and exit 2, never a traceback; the commands catch the cases they know first
        print(f"rtkit {args.command}: error: bad input ({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})",
              file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `rtkit report X | head` is normal use: stop quietly, as a shell tool does
        from rtkit import std_streams

        std_streams.silence(sys.stdout)
        return 0 if args.command in ("report", "compare") else 141


if __name__ == "__main__":
    sys.exit(main())
