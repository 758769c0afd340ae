# load.py -- reads a run directory's report.json for the renderers, with one clear error line on failure.
from __future__ import annotations

import json
import os
from typing import Any, Dict, Tuple

from rtkit.errors import UserError


class ReportError(UserError):
    """The one line shown to the user (exit code 2)."""


def report_path(path: str) -> str:
    """RUN_DIR or a report.json path -> the report.json path."""
    return os.path.join(path, "report.json") if os.path.isdir(path) else path


def load(path: str) -> Tuple[Dict[str, Any], str]:
    """(report dict, run directory); any failure becomes a ReportError naming the path and the reason."""
    if not path:
        raise ReportError("rtkit: no run directory given")
    if not os.path.exists(path):
        raise ReportError(f"rtkit: run directory '{path}' does not exist")
    file = report_path(path)
    if not os.path.isfile(file):
        raise ReportError(f"rtkit: '{path}' has no report.json (not a run directory, or the run has not finished)")
    try:
        with open(file, encoding="utf-8") as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise ReportError(f"rtkit: '{file}' is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"rtkit: cannot read '{file}': {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(data, dict) or "run" not in data:
        raise ReportError(f"rtkit: '{file}' is not an rtkit report (no 'run' section)")
    version = data.get("schema_version")
    if isinstance(version, int) and version > 1:
        # newer reports stay readable: keys are only ever added; say so once in the notes
        data.setdefault("notes", [])
        if isinstance(data["notes"], list):
            data["notes"].append(f"report schema_version {version} is newer than this renderer (1)")
    return data, os.path.dirname(os.path.abspath(file))
