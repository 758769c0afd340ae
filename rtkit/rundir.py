# rundir.py -- how run directories are named and created (`rtkit run`, `demo`, and each run of `bench`).
from __future__ import annotations

import os
import re
import stat
import tempfile
from datetime import datetime
from typing import List, Optional, Tuple


def slug(text: str) -> str:
    """A name that is safe as one path component."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60] or "run"


def default_name(command: List[str]) -> str:
    """The run's name from its command: the script or module, not the interpreter."""
    parts = [os.path.basename(c) for c in command[:3]]
    if parts and re.match(r"python[0-9.]*$", parts[0]) and len(parts) > 1:
        parts = parts[1:]
        if parts[0] == "-m" and len(parts) > 1:
            parts = parts[1:]
    return slug(parts[0] if parts else "run")


_BENCH_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")


def bench_tag(config: str, round_no: int) -> str:
    """`rtkit bench`'s name for one configuration in one round (`profile:memory` -> `profile_memory-r1`)."""
    return f"{_BENCH_UNSAFE.sub('_', config)}-r{round_no}"


def bench_run_dir(out: str, config: str, round_no: int) -> str:
    """`rtkit bench`'s run directory for one configuration in one round."""
    return os.path.join(out, "runs", bench_tag(config, round_no))


class RunDirRefused(Exception):
    """A --run-dir that rtkit must not write into: the message is the one line for the user."""


def check_given(folder: str) -> None:
    """Safety rule (docs/safety.md): a run directory the user names is used only if it is new, or an empty
    directory the user owns. A shared or reused folder could hold links planted for rtkit's files, or a
    previous run's files that the new report would take as its own."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise RunDirRefused(f"--run-dir {folder}: exists and is not a directory; pass a new folder")
    if st.st_uid != os.getuid():
        raise RunDirRefused(f"--run-dir {folder}: owned by another user; pass a new folder of your own")
    if os.listdir(folder):
        raise RunDirRefused(f"--run-dir {folder}: exists and is not empty; pass a new or empty folder "
                            "(a run never merges another run's files)")


def make_writable(folder: str, fresh: bool = False) -> None:
    """Create `folder` (its parents as needed; the folder itself 0700: it holds the command line and the
    environment) and prove it takes a file: OSError when it does not. fresh: the folder must not exist."""
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        if fresh:
            raise
    probe = os.path.join(folder, f".rtkit-write-test-{os.getpid()}")
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    os.unlink(probe)


def make_run_dir(out: str, name: str, exact: Optional[str]) -> Tuple[str, Optional[str]]:
    """Create OUT/<time>-<name> (or `exact`, refused with RunDirRefused when it exists and is not an empty
    folder of the user's). An unwritable place is not fatal: the run goes on with a temporary directory and
    the returned note says where the report went."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    wanted = exact or os.path.join(out, f"{stamp}-{name}")
    if exact:
        check_given(exact)
    try:
        if exact:
            make_writable(wanted)
            return os.path.abspath(wanted), None
        base, n = wanted, 1
        while True:  # a fresh folder of our own: mkdir, not a test then a create
            try:
                make_writable(wanted, fresh=True)
                return os.path.abspath(wanted), None
            except FileExistsError:
                n += 1
                wanted = f"{base}-{n}"
    except OSError as exc:
        fallback = fallback_dir(name)
        return fallback, (f"rtkit: cannot write the run directory {wanted} ({exc.strerror}): "
                          f"using {fallback} instead; pass --out DIR with a writable folder")


def fallback_dir(name: str) -> str:
    """A fresh private folder in the system's temporary directory, for a run whose own place takes no files."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return tempfile.mkdtemp(prefix=f"rtkit-{stamp}-{name}-")


_TEMPORARY = re.compile(r"^\..+\.tmp-\d+-\d+$|^.+\.tmp\.\d+\.\d+$")   # atomic.py's and the C writer's


def remove_temporaries(folder: str) -> List[str]:
    """Remove the half-written temporaries of rtkit's atomic writers (a full disk, a killed writer) from a run
    directory this run made; returns their names. Finished files are kept."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        if _TEMPORARY.match(name):
            try:
                os.unlink(os.path.join(folder, name))
                removed.append(name)
            except OSError:
                pass
    return removed


MAX_TASK_ATTEMPTS = 10_000


def task_dir_name(task_name: str, attempt: int) -> str:
    """A cluster task's run directory: `worker-1`, then `worker-1.restart1`, `.restart2`, ... for its restarts."""
    return task_name if attempt == 0 else f"{task_name}.restart{attempt}"


def make_task_dir(out: str, task_name: str) -> Tuple[str, int]:
    """Claim OUT/<task>[.restartN] with one mkdir (atomic, also on NFS), so the tasks of a job sharing `out`
    and a task's restarts never collide; returns (path, attempt). OSError when `out` is unusable."""
    os.makedirs(out, exist_ok=True)
    for attempt in range(MAX_TASK_ATTEMPTS):
        path = os.path.join(out, task_dir_name(task_name, attempt))
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return os.path.abspath(path), attempt
    raise OSError(f"{MAX_TASK_ATTEMPTS} run directories of {task_name} already exist in {out}")
