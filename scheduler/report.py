# report.py -- the scheduler's report file and the tuned-configuration profile TOML.
from __future__ import annotations

import os
import time
from typing import Dict, Optional

from .trace import write_json_atomic


def profile_toml(values: Dict, description: str) -> str:
    """A profile in profiles/*.toml format; keys are rtkit.config keys."""
    lines = [f'description = "{description}"', "", "[settings]"]
    for key, value in values.items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, int):
            lines.append(f"{key} = {value}")
        else:
            lines.append(f'{key} = "{value}"')
    return "\n".join(lines) + "\n"


def write_profile(path: str, values: Dict, description: str) -> Optional[str]:
    try:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as fh:
            fh.write(profile_toml(values, description))
        os.replace(tmp, path)
        return None
    except OSError as exc:
        return f"cannot write profile {path}: {exc}"


def write_report(run_dir: str, report: Dict, chrome: Dict) -> None:
    pid = os.getpid()
    write_json_atomic(os.path.join(run_dir, f"scheduler-{pid}.json"), report)
    write_json_atomic(os.path.join(run_dir, f"trace-{pid}.json"), chrome)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
