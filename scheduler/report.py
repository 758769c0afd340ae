# report.py -- the scheduler's files in the run directory: its report, its trace and the tuned profile.
from __future__ import annotations

import os
import time
from typing import Dict, Optional

from rtkit import atomic
from rtkit import config


def write_profile(path: str, values: Dict, description: str) -> Optional[str]:
    """Write the tuned configuration as a profile (config.profile_text is the one profile format); returns
    an error note, or None."""
    try:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        atomic.write_text(path, config.profile_text(values, description))
        return None
    except OSError as exc:
        return f"cannot write profile {path}: {exc}"


def write_report(run_dir: str, report: Dict, chrome: Optional[Dict]) -> None:
    """scheduler-<pid>.json, and trace-<pid>.json unless there is no trace (the lookahead alone keeps none)."""
    pid = os.getpid()
    atomic.write_json(os.path.join(run_dir, f"scheduler-{pid}.json"), report)
    if chrome is not None:
        atomic.write_json(os.path.join(run_dir, f"trace-{pid}.json"), chrome)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
