# tree_guard.py -- a small watcher process that kills the command's whole tree when `rtkit run` itself dies (kill -9).
"""rtkit forks the guard before it starts the command. The guard holds the read end of a pipe whose only write
ends are rtkit's (and the command's, until its exec: the command writes its own pid there first, so no moment
exists where the command runs unwatched). EOF without "done" means rtkit died: the guard stops the command's
descendants (so none forks away or is reparented while it looks), then kills them all. A normal end says
"done" first and the guard leaves everything as it is (rtkit notes leftovers itself)."""
from __future__ import annotations

import os
import signal
from typing import List, Optional, Set

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _children_map() -> dict:
    kids: dict = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                raw = fh.read()
            ppid = int(raw[raw.rfind(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    return kids


def _tree(root: int) -> List[int]:
    kids, out, todo = _children_map(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def _kill_tree(root: int, group: bool) -> None:
    stopped: Set[int] = set()
    for _ in range(50):  # until a look finds no process that was not stopped yet
        new = [p for p in _tree(root) if p not in stopped]
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
            stopped.add(pid)
    if group:
        try:
            os.killpg(root, signal.SIGKILL)
        except OSError:
            pass
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _guard(read_fd: int, group: bool) -> None:
    for sig in STOP_SIGNALS:  # the signals rtkit forwards are not for the guard
        signal.signal(sig, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # never hold rtkit's terminal or pipes open
        os.dup2(devnull, fd)
    data = b""
    while True:
        try:
            chunk = os.read(read_fd, 256)
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    words = data.split()
    if b"done" in words or b"pid" not in words:
        return
    root = int(words[words.index(b"pid") + 1])
    _kill_tree(root, group)


LAUNCHER_ENV = "RTKIT_LAUNCHER_PID"   # set by `rtkit launch` and the benches for each `rtkit run` they start: their pid


def env_dying_with_me(env) -> dict:
    """env for an `rtkit run` this process starts: that run dies with this process. Start it from a thread that
    outlives it (the main thread, or the launcher's waiting one): the parent-death signal follows the forking thread."""
    return {**env, LAUNCHER_ENV: str(os.getpid())}


def die_with_launcher(env=os.environ) -> None:
    """An `rtkit run` started by `rtkit launch` or a bench dies with its starter (kill -9 included), and this process's
    tree guard then ends the command's tree, as when this `rtkit run` itself is killed. Safety rule (docs/safety.md)."""
    try:
        launcher = int(env.get(LAUNCHER_ENV, ""))
    except ValueError:
        return
    import ctypes

    # PR_SET_PDEATHSIG (1): sent when the thread that forked this process ends; the launcher forks its tasks from the
    # thread that waits for them all. A command rtkit starts never inherits it (a fork clears it).
    if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) != 0:
        return
    if os.getppid() != launcher:   # the launcher died before the prctl: no signal will come, and no command runs yet
        os.kill(os.getpid(), signal.SIGKILL)


class TreeGuard:
    def __init__(self) -> None:
        self.pid: Optional[int] = None
        self._write: Optional[int] = None

    def start(self, group: bool) -> None:
        """Fork the guard (group: the command will lead its own process group). No guard if fork fails."""
        try:
            read_fd, write_fd = os.pipe()
            pid = os.fork()
        except OSError:
            return
        if pid == 0:
            try:
                os.close(write_fd)
                _guard(read_fd, group)
            finally:
                os._exit(0)
        os.close(read_fd)
        self.pid, self._write = pid, write_fd

    def in_child(self) -> None:
        """Runs in the command's process before its exec: names it to the guard."""
        if self._write is not None:
            os.write(self._write, b"pid %d\n" % os.getpid())

    def finish(self) -> None:
        """rtkit is done with the command: the guard leaves without touching anything."""
        if self._write is None:
            return
        try:
            os.write(self._write, b" done\n")
        except OSError:
            pass
        os.close(self._write)
        self._write = None
        while True:
            try:
                os.waitpid(self.pid, 0)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                break
