# launch.py -- starts the user's command with rtkit's environment, forwards signals, samples it, and waits.
"""The parent side of `rtkit run`. Never imports TensorFlow."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from rtkit import config as cfg

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _append_path_list(current: Optional[str], item: str, sep: str, first: bool = False) -> str:
    parts = [p for p in (current or "").split(sep) if p and not (first and p == item)]
    if item not in parts:
        parts.insert(0 if first else len(parts), item)
    return sep.join(parts)


def _glibc_hugetlb(current: Optional[str]) -> str:
    """GLIBC_TUNABLES with huge pages for glibc's own heaps, unless the user chose that tunable: the small
    objects that stay with glibc (hash nodes of new ids, every step) then fault 2 MiB at a time, not 4 KiB."""
    parts = [p for p in (current or "").split(":") if p]
    if not any(p.split("=", 1)[0] == "glibc.malloc.hugetlb" for p in parts):
        parts.append("glibc.malloc.hugetlb=1")
    return ":".join(parts)


def build_child_env(resolved: cfg.Resolved, run_dir: str, base_env: Dict[str, str],
                    notes: List[str]) -> Dict[str, str]:
    """The child's environment: the user's own, plus rtkit's settings, preload and bootstrap (appended)."""
    env = dict(base_env)
    env.update(resolved.child_env())
    env["RTKIT_RUN_DIR"] = run_dir
    env["RTKIT_ACTIVE"] = "1"
    env["RTKIT_RUN_PID"] = str(os.getpid())   # the command's parent: tells the command's own process (bootstrap)
    if resolved.profile:
        env["RTKIT_PROFILE"] = resolved.profile
    if resolved["malloc"]:
        from rtkit.allocators import malloc_library_path

        lib = malloc_library_path()
        if lib:
            env["LD_PRELOAD"] = _append_path_list(env.get("LD_PRELOAD"), lib, " ")
            if resolved["malloc_route_tf"] and "TF_ONEDNN_USE_SYSTEM_ALLOCATOR" not in base_env:
                env["TF_ONEDNN_USE_SYSTEM_ALLOCATOR"] = "1"
            if resolved["malloc_thp"]:
                env["GLIBC_TUNABLES"] = _glibc_hugetlb(env.get("GLIBC_TUNABLES"))
        else:
            notes.append("allocator library librtkit_malloc.so not found in the installed package: "
                         "ran without it (reinstall rtkit with `pip install .` to build it)")
    if resolved["hooks"]:
        # first: Python runs only the first sitecustomize on its path, so a user's own one in PYTHONPATH would
        # shadow the bootstrap; the folder holds nothing else, and the bootstrap runs the user's one in turn
        env["PYTHONPATH"] = _append_path_list(env.get("PYTHONPATH"), BOOTSTRAP_DIR, os.pathsep, first=True)
    return env


def changed_env(before: Dict[str, str], after: Dict[str, str]) -> Dict[str, str]:
    return {k: v for k, v in after.items() if before.get(k) != v and not k.startswith("RTKIT_")}


# ---------------------------------------------------------------------------------------------
# sampling the child and its descendants from /proc (cheap, no psutil object churn per sample)


def _proc_stat(pid: int, started: Optional[int] = None):
    """(minflt, majflt, utime_s, stime_s, threads, rss_bytes) of one process, or None if it is gone (or, with
    `started`, if the pid now belongs to a process started at another time: a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    if fields[0] in ("Z", "X"):  # exited, not yet reaped: its zero RSS is not a sample
        return None
    if started is not None and int(fields[19]) != started:
        return None
    # fields[0] is state (field 3 of proc(5)); index = proc(5) field number - 3
    return (int(fields[7]), int(fields[9]), int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK,
            int(fields[17]), int(fields[21]) * PAGE_SIZE)


def start_ticks(pid: int) -> Optional[int]:
    """When the process started (clock ticks since boot), which tells a reused pid apart; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
        return int(raw[raw.rfind(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _proc_io(pid: int) -> Optional[dict]:
    """The child's /proc/PID/io (bytes read from / dirtied for / cancelled before the disk), or None."""
    try:
        with open(f"/proc/{pid}/io", "r") as fh:
            raw = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
        return {"read_bytes": int(raw["read_bytes"]), "write_bytes": int(raw["write_bytes"]),
                "cancelled_write_bytes": int(raw["cancelled_write_bytes"])}
    except (OSError, KeyError, ValueError):
        return None


def _descendants(pid: int) -> List[int]:
    try:
        import psutil

        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # psutil missing or the process is gone: sample the child alone
        return [pid]


# Listing the descendants reads /proc/*/stat of every process on the machine (psutil's parent map): ~2 ms with
# 140 processes, more on a busy host. Done at every 200 ms sample by each `rtkit run` of a 6-task local cluster,
# it would cost 4% of the cluster's CPU per training step. The known processes are sampled every time; the list
# is renewed at most this often (a descendant is seen within this time of its start).
DESCENDANTS_EVERY_S = 2.0


@dataclass
class Sampler:
    pid: int
    start: float
    interval_s: float
    samples: List[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None
    _pids: Dict[int, Optional[int]] = field(default_factory=dict)   # pid -> its start time (clock ticks)
    _listed: float = float("-inf")

    def sample_once(self) -> None:
        total = [0, 0, 0.0, 0.0, 0, 0]
        procs = 0
        now = time.monotonic()
        if now - self._listed >= DESCENDANTS_EVERY_S:
            # start times are read afresh at each listing: a listed pid whose start time changed is a new
            # process (its pid reused by a new descendant), sampled from now on; between listings the start
            # time keeps a pid reused by an unrelated process out of the sums
            self._pids = {pid: start_ticks(pid) for pid in _descendants(self.pid)}
            self._listed = now
        for pid, started in self._pids.items():
            st = _proc_stat(pid, started)
            if st is None:
                continue
            procs += 1
            for i, v in enumerate(st):
                total[i] += v
        if procs == 0:
            return
        self.samples.append({
            "t_s": round(time.time() - self.start, 3), "rss_bytes": total[5], "minor_faults": total[0],
            "major_faults": total[1], "cpu_user_s": round(total[2], 3), "cpu_system_s": round(total[3], 3),
            "threads": total[4], "processes": procs,
        })

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def start_thread(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="rtkit-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)


@dataclass
class ChildResult:
    exit_code: int
    signal_name: Optional[str]
    status: str                  # ok | failed | killed | interrupted | not_started
    error: Optional[str]
    rusage: Optional[dict]
    samples: List[dict]
    start: float
    end: float
    leftovers: Optional[str] = None  # a note: descendants still running when the command exited


def _in_terminal_foreground() -> bool:
    """Whether rtkit runs in its terminal's foreground group (Ctrl-C then reaches the child directly)."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


# What rtkit run and rtkit launch forward to the job. These stop it (the run was interrupted):
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# These are the command's own business (a batch system's "checkpoint now" sent to the job's top process), not a stop;
# their default action would end rtkit alone, and leave the job to its tree guard or running orphaned
PASSED_ON_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


class _Forwarder:
    """Forwards the stop signals and the passed-on ones to the child. A terminal's Ctrl-C already reaches the child
    (same foreground process group), so SIGINT is forwarded only when the signal did not come from there."""

    SIGNALS = STOP_SIGNALS
    PASSED_ON = PASSED_ON_SIGNALS

    def __init__(self, proc: subprocess.Popen, own_group: bool = False):
        self.proc = proc
        self.own_group = own_group
        self.received: Optional[int] = None
        self.before_start: List[int] = []   # signals that came before the child existed, forwarded once it does
        self.previous = {}

    def _terminal_delivers_sigint(self) -> bool:
        return _in_terminal_foreground()

    def handler(self, signum, frame):
        if signum not in self.PASSED_ON:
            self.received = signum
        if self.proc is None:  # installed before the child starts: forwarded once it exists (started())
            self.before_start.append(signum)
            return
        self.forward(signum)

    def started(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        for signum in self.before_start:
            self.forward(signum)

    def forward(self, signum):
        if signum == signal.SIGINT and self._terminal_delivers_sigint():
            return
        # Safety rule (docs/safety.md): a stop signal reaches the child's whole process group (its `sleep`s and
        # workers too), or, when the child shares rtkit's terminal group, every descendant of the child; a passed-on
        # one reaches the child alone, as it would without rtkit (its workers may have no handler: it would end them)
        try:
            if signum in self.PASSED_ON:
                os.kill(self.proc.pid, signum)
            elif self.own_group:
                os.killpg(self.proc.pid, signum)
            else:
                for pid in reversed(_descendants(self.proc.pid)):
                    os.kill(pid, signum)
        except OSError:
            # os.kill, not Popen.send_signal: that polls first and may reap an exited child, whose exit
            # status wait4 then never sees (a signalled job reported as exit 0)
            try:
                os.kill(self.proc.pid, signum)
            except OSError:
                pass

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS + self.PASSED_ON:
                if signal.getsignal(s) is signal.SIG_IGN:
                    continue   # ignored by whoever started rtkit (nohup): by rtkit and by the command alike
                self.previous[s] = signal.signal(s, self.handler)
        return self

    def __exit__(self, *exc):
        for s, prev in self.previous.items():
            signal.signal(s, prev)


def run_child(command: List[str], env: Dict[str, str], interval_s: float, on_start=None) -> ChildResult:
    """on_start(sampler): called once the child runs (the live snapshot, rtkit/live/); returns what to stop()."""
    start = time.time()
    # Without a terminal the child leads its own process group, so that a signal reaches all of it; at a
    # terminal it stays in the foreground group (Ctrl-C and terminal reads keep working) and signals are sent
    # to its descendants one by one. rtkit becomes the subreaper of the tree, so descendants the child leaves
    # behind are found (and noted in the report) when it exits.
    from rtkit import early_signals
    from rtkit.tree_guard import TreeGuard

    own_group = not _in_terminal_foreground()
    _become_subreaper()
    fwd = _Forwarder(None, own_group)  # before the child exists: a signal from then on is never lost
    guard = TreeGuard()
    with fwd:
        if fwd.received is None and early_signals.pending() is not None:
            fwd.received = early_signals.pending()   # came while rtkit started
        if fwd.received is not None:
            name = signal.Signals(fwd.received).name
            return ChildResult(128 + fwd.received, name, "interrupted",
                               f"interrupted by {name} before the command started", None, [], start, time.time())
        guard.start(own_group)
        # Safety rule (docs/safety.md): until its exec the command's process has rtkit's handlers, and a signal sent
        # to it there (Ctrl-C to the terminal's group, a kill of the pid or group) would run one and be lost. The
        # fork happens with these signals blocked; the child puts back the default action where rtkit set a handler
        # (as exec would; an ignored one stays ignored) before it unblocks them: a signal that came meanwhile then
        # acts on it as on a command that has not run a line yet (128+N).
        own_mask = signal.pthread_sigmask(signal.SIG_BLOCK, fwd.SIGNALS + fwd.PASSED_ON)
        mask = early_signals.child_mask()
        handled = list(fwd.previous)

        def in_child():
            if own_group and sys.version_info < (3, 11):
                os.setpgrp()
            for s in handled:
                signal.signal(s, signal.SIG_DFL)
            guard.in_child()
            # the command starts with the signal mask rtkit was given
            signal.pthread_sigmask(signal.SIG_SETMASK, own_mask if mask is None else mask)

        try:
            group: Dict[str, object] = {"preexec_fn": in_child}
            if own_group and sys.version_info >= (3, 11):
                group["process_group"] = 0
            try:
                proc = subprocess.Popen(command, env=env, **group)
            finally:   # a signal for rtkit that came meanwhile runs its handler now (forwarded once the child is known)
                signal.pthread_sigmask(signal.SIG_SETMASK, own_mask)
        except FileNotFoundError:
            guard.finish()
            return ChildResult(127, None, "not_started", f"command not found: {command[0]}", None, [], start,
                               time.time())
        except PermissionError:
            guard.finish()
            return ChildResult(126, None, "not_started", f"permission denied: {command[0]}", None, [], start,
                               time.time())
        except OSError as exc:
            guard.finish()
            return ChildResult(126, None, "not_started", f"cannot start {command[0]}: {exc.strerror}", None, [],
                               start, time.time())
        fwd.started(proc)
        sampler = Sampler(proc.pid, start, interval_s)
        sampler.start_thread()
        live = on_start(sampler) if on_start else None
        io = None
        # wait for the exit without reaping: the zombie's /proc/PID/io holds its final disk figures
        # (dirty pages of an unlinked pool file are cancelled during the exit itself)
        while True:
            try:
                os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
                break
            except InterruptedError:
                continue
            except (ChildProcessError, OSError):
                break
        io = _proc_io(proc.pid)
        while True:
            try:
                _, status, ru = os.wait4(proc.pid, 0)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                status, ru = 0, None
                break
    proc.returncode = 0  # reaped by wait4; keep Popen from waiting again
    guard.finish()
    sampler.stop()
    if live:
        live.stop()
    end = time.time()
    rusage = None
    if ru is not None:
        rusage = {"minor_faults": ru.ru_minflt, "major_faults": ru.ru_majflt, "max_rss_bytes": ru.ru_maxrss * 1024,
                  "cpu_user_s": round(ru.ru_utime, 3), "cpu_system_s": round(ru.ru_stime, 3)}
        if io:
            rusage["io"] = io
    leftovers = leftover_note()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"SIG{sig}"
        state = "interrupted" if fwd.received is not None or sig == signal.SIGINT else "killed"
        return ChildResult(128 + sig, name, state, None, rusage, sampler.samples, start, end, leftovers)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1
    state = "ok" if code == 0 else ("interrupted" if fwd.received is not None else "failed")
    return ChildResult(code, None, state, None, rusage, sampler.samples, start, end, leftovers)


def _become_subreaper() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def leftover_note() -> Optional[str]:
    """The processes the command left running (reparented to rtkit, its subreaper), as one report note."""
    me, found = os.getpid(), []
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                raw = fh.read().decode(errors="replace")
        except OSError:
            continue
        comm, rest = raw[raw.find("(") + 1:raw.rfind(")")], raw[raw.rfind(")") + 2:].split()
        if len(rest) > 1 and rest[0] != "Z" and int(rest[1]) == me:
            found.append(f"{name} ({comm})")
    if not found:
        return None
    shown = ", ".join(found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
    return (f"the command exited while {len(found)} process(es) it started were still running: {shown}; "
            "rtkit left them running (they are not part of this report's figures)")
