# load.py -- reads a run directory's report.json for the renderers (one clear error line on failure) and fixes its shape.
from __future__ import annotations

import json
import os
from typing import Any, Dict, Tuple

from rtkit.errors import UserError
from rtkit.report.model import SCHEMA_VERSION


MAX_REPORT_BYTES = 64 << 20


class ReportError(UserError):
    """The one line shown to the user (exit code 2)."""


LIVE_FILE = "live.json"   # the snapshot `rtkit run` rewrites while the job runs (rtkit/live/snapshot.py)


def report_path(path: str) -> str:
    """RUN_DIR or a report.json path -> the report.json path; a running job's live.json while it has no report."""
    if not os.path.isdir(path):
        return path
    final, live = os.path.join(path, "report.json"), os.path.join(path, LIVE_FILE)
    return live if not os.path.isfile(final) and os.path.isfile(live) else final


def running_since(report: Dict[str, Any]) -> Any:
    """'<time>' when `report` is a running job's snapshot, else None."""
    run, live = report.get("run"), report.get("live")
    if isinstance(run, dict) and run.get("status") == "running" and isinstance(live, dict):
        return str(live.get("as_of") or "an unknown time")
    return None


def load(path: str) -> Tuple[Dict[str, Any], str]:
    """(report dict, run directory); any failure becomes a ReportError naming the path and the reason."""
    if not path:
        raise ReportError("rtkit: no run directory given")
    if not os.path.exists(path):
        raise ReportError(f"rtkit: run directory '{path}' does not exist")
    file = report_path(path)
    if not os.path.isfile(file):
        raise ReportError(f"rtkit: '{path}' has no report.json and no {LIVE_FILE} (not an rtkit run directory, or "
                          "its job has not started yet)")
    # Safety rule (docs/safety.md): a report is bounded before it is trusted: a regular file of at most
    # MAX_REPORT_BYTES, nesting and numbers that json can hold; anything else is one line.
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as fh:
            if os.fstat(fh.fileno()).st_size > MAX_REPORT_BYTES:
                raise ReportError(f"rtkit: '{file}' is larger than {MAX_REPORT_BYTES >> 20} MiB: not an rtkit report")
            data = json.loads(fh.read(MAX_REPORT_BYTES + 1).decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportError(f"rtkit: '{file}' is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise ReportError(f"rtkit: '{file}' is nested too deeply: not an rtkit report") from None
    except ValueError as exc:  # UnicodeDecodeError, an integer beyond Python's digit limit
        raise ReportError(f"rtkit: '{file}' cannot be read: {str(exc).splitlines()[0][:120]}") from None
    except OSError as exc:
        raise ReportError(f"rtkit: cannot read '{file}': {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(data, dict) or "run" not in data:
        raise ReportError(f"rtkit: '{file}' is not an rtkit report (no 'run' section)")
    version = data.get("schema_version")
    if isinstance(version, int) and version < SCHEMA_VERSION:
        # an older report has sections of another shape or figures under other keys: its own rtkit reads it, and
        # no reader here guesses the older names
        raise ReportError(f"rtkit: '{file}' is a report of schema_version {version}; this rtkit reads version "
                          f"{SCHEMA_VERSION}: read it with the rtkit that wrote it, or run the job again")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        # newer reports stay readable: keys are only ever added; say so once in the notes
        data.setdefault("notes", [])
        if isinstance(data["notes"], list):
            data["notes"].append(f"report schema_version {version} is newer than this renderer ({SCHEMA_VERSION})")
    return data, os.path.dirname(os.path.abspath(file))


# a report cut short, or hand-edited, must still render
_DICTS = {"run": ("settings", "versions", "host", "child_env"), "process": (), "steps": ("summary", "hook")}
_LISTS = {"process": ("samples",), "steps": ("per_step", "other_signatures")}


def normalize(report: Any) -> Dict[str, Any]:
    """A shallow-fixed copy: known sections and their known sub-tables have the right container
    types (wrong ones become empty), list items that are not records are dropped. Values keep
    their types; every formatter copes with a wrong scalar."""
    if not isinstance(report, dict):
        return {"run": {}, "process": {}, "steps": {}, "notes": []}
    out = dict(report)
    for name, subs in _DICTS.items():
        sec_ = out.get(name)
        sec_ = dict(sec_) if isinstance(sec_, dict) else {}
        for sub in subs:
            if sub in sec_ and not isinstance(sec_[sub], dict):
                sec_[sub] = {}
        for sub in _LISTS.get(name, ()):
            if sub in sec_:
                sec_[sub] = [x for x in sec_[sub] if isinstance(x, dict)] if isinstance(sec_[sub], list) else []
        out[name] = sec_
    settings = out["run"].get("settings")
    if isinstance(settings, dict):
        out["run"]["settings"] = {k: v for k, v in settings.items() if isinstance(v, dict)}
    for name in ("allocator", "pmem", "scheduler", "bounds"):
        if name in out and not isinstance(out[name], dict):
            out[name] = None
    notes = out.get("notes")
    out["notes"] = [str(n) for n in notes] if isinstance(notes, list) else ([] if notes is None else [str(notes)])
    return out
