# test_run_signals.py -- `rtkit run` under signals at any moment: a report or one line, the child's steps kept, no orphans.
import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from conftest import RTKIT, load_report, run_rtkit, unpreloaded_env

PY = sys.executable
pytestmark = pytest.mark.timeout(300)


def _default_stop_signals():
    """In a child about to exec rtkit: the stop signals a test sends at their default action, however pytest was
    started (a background job of a shell ignores SIGINT and SIGQUIT, and rtkit and its command keep an ignore)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def _start(args, block=()):
    """`rtkit ARGS` with `block` signals blocked from its first instruction: a signal sent at once then waits,
    pending, for rtkit's own handlers, whatever the machine's load (the child still gets the caller's mask)."""
    def preexec():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # SIGQUIT's default action: no core file
        _default_stop_signals()
        if block:
            signal.pthread_sigmask(signal.SIG_BLOCK, set(block))
    return subprocess.Popen([RTKIT, *args], env=unpreloaded_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=preexec)


def _wait_for(predicate, what, proc=None):
    """Poll for an observable event; the loop bound only guards against a hang, it is never the pass condition."""
    for _ in range(18000):  # 3 minutes
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"rtkit exited ({proc.returncode}) before {what}: {proc.stderr.read()}")
        time.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


def _report_or_one_line(proc, out_dir, sig):
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    reports = [os.path.join(d, "report.json") for d, _, files in os.walk(out_dir) if "report.json" in files]
    if reports:
        with open(reports[0]) as fh:
            report = json.load(fh)
        assert report["run"]["status"] == "interrupted", report["run"]
        assert proc.returncode == 128 + sig, err
        return report, err
    lines = [line for line in err.splitlines() if signal.Signals(sig).name in line]
    assert len(lines) == 1 and "no report" in lines[0], err
    return None, err


def test_sigterm_at_once_leaves_a_report(tmp_path):
    # sent before rtkit ran a line of Python: pending until its first handler exists
    proc = _start(["run", "--out", str(tmp_path), "--", PY, "-c", "import time; time.sleep(30)"],
                  block=(signal.SIGTERM,))
    proc.send_signal(signal.SIGTERM)
    report, err = _report_or_one_line(proc, tmp_path, signal.SIGTERM)
    assert report is not None, err
    assert "before the command started" in (report["run"]["error"] or ""), report["run"]
    assert "rtkit: interrupted" in err


@pytest.mark.parametrize("moment", ["run_dir", "child_marker"])
def test_sigterm_at_each_moment_leaves_a_report(tmp_path, moment):
    marker = tmp_path / "child-started"
    script = f"import time\nopen({str(marker)!r}, 'w').close()\ntime.sleep(60)\n"
    out = tmp_path / "out"
    proc = _start(["run", "--out", str(out), "--", PY, "-c", script])
    try:
        if moment == "run_dir":
            _wait_for(lambda: out.exists() and os.listdir(out), "the run directory", proc)
        else:
            _wait_for(marker.exists, "the child's marker", proc)
        proc.send_signal(signal.SIGTERM)
        report, err = _report_or_one_line(proc, out, signal.SIGTERM)
        assert report is not None, err
    finally:
        if proc.poll() is None:
            proc.kill()


STEPPING = ("import os, sys, time, threading, ctypes, rtkit\n"
            "for _ in range(184):\n    rtkit.step()\n"
            "if sys.argv[2] == 'c_call':\n"
            # the main thread blocked in C, as in TensorFlow's server.join(): no Python handler can run there.
            # The thread is created by pthread_create, not threading: CPython (< 3.13) detaches its threads, and
            # pthread_join of a detached thread returns EINVAL at once (the child then simply exited 0).
            "    def forever(_):\n        while True:\n            time.sleep(600)\n"
            "    body = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(forever)\n"
            "    libc = ctypes.CDLL(None)\n    tid = ctypes.c_ulong()\n"
            "    libc.pthread_create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]\n"
            "    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]\n"
            "    assert libc.pthread_create(ctypes.byref(tid), None, body, None) == 0\n"
            "    open(sys.argv[1], 'w').close()\n"
            "    sys.exit(f'pthread_join returned {libc.pthread_join(tid, None)}')\n"   # never, unless the signal is lost
            "else:\n    open(sys.argv[1], 'w').close()\n    time.sleep(600)\n")


@pytest.mark.parametrize("sig, where", [(signal.SIGTERM, "sleep"), (signal.SIGHUP, "sleep"),
                                        (signal.SIGQUIT, "sleep"), (signal.SIGTERM, "c_call")])
def test_child_steps_survive_the_signal_with_its_exit_code(tmp_path, sig, where):
    marker = tmp_path / "stepped"
    proc = _start(["run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", STEPPING, str(marker), where])
    try:
        _wait_for(marker.exists, "184 steps", proc)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)   # hang guard: a handler that never ran would wait 600 s
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err       # as without rtkit: killed by the signal
    report = load_report(tmp_path / "r")
    assert report["run"]["signal"] == signal.Signals(sig).name
    assert report["steps"]["count"] == 184, (report["steps"]["hook"], err)


def _alive(pid, started):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X") and fields[19] == started


def _start_time(pid):
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[19]


def test_kill_9_of_rtkit_takes_the_tree_with_it(tmp_path):
    pids_file = tmp_path / "pids.json"
    script = ("import json, os, subprocess, sys, time\n"
              "a = subprocess.Popen(['sleep', '600'])\n"
              "b = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"   # left the group too
              f"tmp = {str(pids_file)!r} + '.tmp'\n"
              "json.dump([os.getpid(), a.pid, b.pid], open(tmp, 'w'))\n"
              f"os.rename(tmp, {str(pids_file)!r})\n"
              "time.sleep(600)\n")
    proc = _start(["run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", script])
    tree = []
    try:
        _wait_for(pids_file.exists, "the child's process tree", proc)
        tree = [(pid, _start_time(pid)) for pid in json.loads(pids_file.read_text())]
        proc.kill()
        proc.wait(timeout=60)
        _wait_for(lambda: not any(_alive(pid, started) for pid, started in tree), "the tree to go")
    finally:
        for pid, started in tree:
            if _alive(pid, started):
                os.kill(pid, signal.SIGKILL)


def _outcome_after(proc, act):
    """rtkit's (stdout, stderr) once `act` was done and rtkit ended; killed when the test fails meanwhile."""
    try:
        act()
        return proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()


def _assert_the_parent_outlived_its_killed_child(proc, tmp_path, kill_the_child):
    """The script (3 steps, a fork, 1 step) printed its child's SIGTERM and ended well, with its 4 steps."""
    out, err = _outcome_after(proc, kill_the_child)
    assert proc.returncode == 0, err
    assert out == f"child signal {int(signal.SIGTERM)}\n"
    assert load_report(tmp_path / "r")["steps"]["count"] == 4


def test_a_forked_childs_signal_never_ends_its_parent(tmp_path):
    marker = tmp_path / "forked"
    script = ("import os, sys, time, rtkit\n"
              "for _ in range(3):\n    rtkit.step()\n"
              "pid = os.fork()\n"
              "if pid == 0:\n    time.sleep(600)\n    os._exit(0)\n"
              f"open({str(marker)!r} + '.tmp', 'w').write(str(pid))\n"
              f"os.rename({str(marker)!r} + '.tmp', {str(marker)!r})\n"
              "_, status = os.waitpid(pid, 0)\n"
              "print('child signal', os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)\n"
              "rtkit.step()\n")
    proc = _start(["run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", script])
    _assert_the_parent_outlived_its_killed_child(proc, tmp_path, lambda: (
        _wait_for(marker.exists, "the fork", proc), os.kill(int(marker.read_text()), signal.SIGTERM)))


# The command's own process sets rtkit's signal flush (and its at-fork hooks) at its start; a Python process the
# command starts sets it at its first step, after the script's own at-fork hooks, which then run first in a child.
AS_DESCENDANT = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', sys.argv[1]]))"


def _as(where, script):
    return [PY, "-c", script] if where == "command" else [PY, "-c", AS_DESCENDANT, script]


@pytest.mark.parametrize("where", ["command", "descendant"])
def test_a_signal_in_the_childs_first_instants_after_fork_never_ends_its_parent(tmp_path, where):
    """The child takes SIGTERM in an at-fork hook registered before rtkit's (the first thing it runs after the
    fork, in a descendant): rtkit's handler is the parent's there, and its wake-up byte must not reach the parent's
    watcher."""
    script = ("import os, signal, time, rtkit\n"
              "os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))\n"
              "for _ in range(3):\n    rtkit.step()\n"
              "pid = os.fork()\n"
              "if pid == 0:\n    time.sleep(600)\n    os._exit(0)\n"
              "_, status = os.waitpid(pid, 0)\n"
              # the parent's watcher thread has read any byte the child's signal wrote by the time the parent's
              # main thread, blocked in waitpid meanwhile, gets here: the watcher acts on it at once
              "time.sleep(0.5)\n"
              "print('child signal', os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)\n"
              "rtkit.step()\n")
    proc = _start(["run", "--run-dir", str(tmp_path / "r"), "--", *_as(where, script)])
    _assert_the_parent_outlived_its_killed_child(proc, tmp_path, lambda: None)


def _stdout_of_a_run_that_ended_well(tmp_path, script, where="command"):
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", *_as(where, script)])
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_signal_the_script_blocked_stays_pending_for_it(tmp_path):
    """A SIGTERM that the script blocks (a critical section, then sigwait) waits for it: no thread of rtkit's takes it
    (rtkit's handler would then end the script)."""
    script = ("import os, signal, time, rtkit\n"
              "for _ in range(3):\n    rtkit.step()\n"
              "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
              "os.kill(os.getpid(), signal.SIGTERM)\n"
              # a thread that does not block it takes it once it runs: rtkit's get 3 s to (never a pass condition)
              "for _ in range(300):\n"
              "    if signal.SIGTERM not in signal.sigpending():\n        break\n"
              "    time.sleep(0.01)\n"
              "print('took', signal.Signals(signal.sigwait({signal.SIGTERM})).name)\n"
              "rtkit.step()\n")
    assert _stdout_of_a_run_that_ended_well(tmp_path, script) == "took SIGTERM\n"
    assert load_report(tmp_path / "r")["steps"]["count"] == 4


@pytest.mark.parametrize("where", ["command", "descendant"])
def test_a_signal_mask_that_a_fork_hook_set_in_the_child_stays(tmp_path, where):
    """The script's own at-fork hook blocks SIGUSR1 in the child: rtkit's fork hooks, which run after it in a
    descendant, give back only the signals they blocked themselves."""
    script = ("import os, signal, rtkit\n"
              "os.register_at_fork(after_in_child=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1}))\n"
              "rtkit.step()\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    print('child blocks SIGUSR1:', signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, []))\n"
              "    os._exit(0)\n"
              "os.waitpid(pid, 0)\n")
    assert _stdout_of_a_run_that_ended_well(tmp_path, script, where) == "child blocks SIGUSR1: True\n"


def test_a_handler_the_script_set_in_c_keeps_its_signal(tmp_path):
    """faulthandler.register(SIGQUIT) (tracebacks on `kill -QUIT`, the job runs on), set before rtkit's first step: it
    sets its handler in C, Python's own table still says SIG_DFL there, and rtkit's handler must not replace it."""
    dump = tmp_path / "tracebacks"
    script = ("import faulthandler, os, signal, rtkit\n"
              f"faulthandler.register(signal.SIGQUIT, file=open({str(dump)!r}, 'w'))\n"
              "rtkit.step()\n"
              "os.kill(os.getpid(), signal.SIGQUIT)\n"   # its handler has run when kill returns
              "print('dumped, running on')\n"
              "rtkit.step()\n")
    assert _stdout_of_a_run_that_ended_well(tmp_path, script) == "dumped, running on\n"
    assert "most recent call first" in dump.read_text()
    assert load_report(tmp_path / "r")["steps"]["count"] == 2


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2])
def test_a_signal_for_the_scripts_own_handler_reaches_it(tmp_path, sig):
    """SIGUSR1/SIGUSR2 sent to `rtkit run` (a batch system's "checkpoint now" to the job's top process) reach the
    script's handler: their default action would end rtkit instead, and its tree guard then the script. They reach
    the script alone, as without rtkit: its own helper processes, which have no handler, must not die of them."""
    marker = tmp_path / "handler-set"
    script = ("import signal, subprocess, sys, time\n"
              "helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
              "got = []\n"
              f"signal.signal({int(sig)}, lambda s, f: got.append(s))\n"
              f"open({str(marker)!r}, 'w').close()\n"
              "while not got:\n    time.sleep(0.01)\n"
              # one sent to the helper too is pending there by now, and comes before SIGTERM (a lower number)
              "helper.terminate()\n"
              "print('took', signal.Signals(got[0]).name, '- helper ended by', signal.Signals(-helper.wait()).name)\n")
    proc = _start(["run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", script])
    out, err = _outcome_after(proc, lambda: (_wait_for(marker.exists, "the script's handler", proc),
                                             proc.send_signal(sig)))
    assert proc.returncode == 0, err
    assert out == f"took {signal.Signals(sig).name} - helper ended by SIGTERM\n"
    assert load_report(tmp_path / "r")["run"]["status"] == "ok"


def _sleepers(tag):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[:2] == [b"sleep", tag.encode()]:
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_sigterm_reaches_the_process_group(tmp_path):
    tag = "41.25"
    proc = subprocess.Popen([RTKIT, "run", "--run-dir", str(tmp_path / "r"), "--set", "malloc=0", "--",
                             "sh", "-c", f"sleep {tag} & sleep {tag} & wait"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            if len(_sleepers(tag)) >= 2:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        time.sleep(0.3)
        assert _sleepers(tag) == []
    finally:
        for pid in _sleepers(tag):
            os.kill(pid, signal.SIGKILL)


def test_leftover_descendants_are_noted(tmp_path):
    tag = "3.375"
    try:
        proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--set", "malloc=0", "--", "sh", "-c",
                          f"sleep {tag} & exit 0"], timeout=60)
        assert proc.returncode == 0, proc.stderr
        notes = load_report(tmp_path / "r")["notes"]
        assert any("still running" in n and "sleep" in n for n in notes), notes
    finally:
        for pid in _sleepers(tag):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("where", ["command", "descendant"])
def test_steps_a_user_thread_made_first_are_flushed_at_sigterm(tmp_path, where):
    """A worker thread's first steps (where no signal handler can be set), the main thread's next: SIGTERM keeps all
    (in a descendant, the handler is set at the main thread's first step)."""
    marker = tmp_path / "stepped"
    script = ("import threading, time, rtkit\n"
              "def work():\n    for _ in range(5):\n        rtkit.step()\n"
              "t = threading.Thread(target=work)\nt.start()\nt.join()\n"
              "for _ in range(3):\n    rtkit.step()\n"
              f"open({str(marker)!r}, 'w').close()\n"
              "time.sleep(600)\n")
    _assert_steps_kept_at_sigterm(tmp_path, _as(where, script), marker, 8)


def _assert_steps_kept_at_sigterm(tmp_path, command, marker, steps):
    """rtkit run of `command`, sent SIGTERM once the script made `marker`: it died by it and kept its `steps`."""
    proc = _start(["run", "--run-dir", str(tmp_path / "r"), "--", *command])
    out, err = _outcome_after(proc, lambda: (_wait_for(marker.exists, f"{steps} steps", proc),
                                             proc.send_signal(signal.SIGTERM)))
    assert proc.returncode == 128 + signal.SIGTERM, err
    report = load_report(tmp_path / "r")
    assert report["run"]["signal"] == "SIGTERM"
    assert report["steps"]["count"] == steps, (report["steps"]["hook"], err)


# Thread a is held inside the making of the step recorder until thread b has asked for it too (b's call returned, or
# b waits its turn in _create): without one maker at a time, b makes a second recorder and a's or b's steps are lost.
TWO_FIRST_STEPS = r"""
import os, threading, rtkit
held, b_asked = threading.Event(), threading.Event()
def profile(frame, event, arg):
    code, me = frame.f_code, threading.current_thread().name
    if os.path.basename(code.co_filename) != "steps.py":
        return
    if me == "a" and event == "call" and code.co_name == "__init__" and not held.is_set():
        held.set()
        b_asked.wait()
    elif me == "b" and (event, code.co_name) in (("call", "_create"), ("return", "recorder")):
        b_asked.set()
threading.setprofile(profile)
def a():
    for _ in range(4):
        rtkit.step()
def b():
    held.wait()
    rtkit.step()
threads = [threading.Thread(target=a, name="a"), threading.Thread(target=b, name="b")]
for t in threads:
    t.start()
for t in threads:
    t.join()
threading.setprofile(None)
rtkit.step()
rtkit.step()
"""


def test_two_threads_first_steps_at_once_make_one_recorder(tmp_path):
    """Two threads' first steps at once: one step recorder takes both threads' steps (none lost to a second one)."""
    _stdout_of_a_run_that_ended_well(tmp_path, TWO_FIRST_STEPS)
    assert load_report(tmp_path / "r")["steps"]["count"] == 7


# `rtkit run` (its real main, in a process of its own) with an at-fork hook that stands for a sender who signals the
# command's process between its fork and its exec: the hook runs in the child of the fork that starts the command
# (subprocess's, which runs at-fork hooks since rtkit passes a preexec_fn), first thing after the fork.
SIGNAL_BEFORE_EXEC = r"""
import os, sys, traceback
from rtkit import cli
sig, run_dir = int(sys.argv[1]), sys.argv[2]
def in_the_window():
    if any(frame.name == "_execute_child" for frame in traceback.extract_stack()):   # not the tree guard's fork
        os.kill(os.getpid(), sig)
os.register_at_fork(after_in_child=in_the_window)
sys.exit(cli.main(["run", "--run-dir", run_dir, "--", sys.executable, "-c", "print('the command ran')"]))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_between_the_commands_fork_and_exec_is_not_lost(tmp_path, sig):
    """Until its exec the command's process has rtkit's handlers: a signal taken there was swallowed (the command
    ran on as if never signalled, exit 0). Now it waits, blocked, for the command's own dispositions (those rtkit
    was started with), and ends it as it would have ended a command that had not yet run a line: 128+N."""
    proc = subprocess.run([PY, "-c", SIGNAL_BEFORE_EXEC, str(int(sig)), str(tmp_path / "r")], env=unpreloaded_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240,
                          preexec_fn=_default_stop_signals)
    assert "the command ran" not in proc.stdout
    assert proc.returncode == 128 + sig, proc.stderr
    run = load_report(tmp_path / "r")["run"]
    assert (run["exit_code"], run["signal"]) == (128 + sig, signal.Signals(sig).name)


def test_a_signal_the_caller_ignored_stays_ignored_for_the_command(tmp_path):
    """`nohup rtkit run -- CMD`: SIGHUP stays ignored for the command, as it would be without rtkit (rtkit's own
    handler, set over the ignore, used to make exec give the command the default action: a hangup then ended it)."""
    def preexec():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    script = "import signal; print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)"
    proc = subprocess.run([RTKIT, "run", "--run-dir", str(tmp_path / "r"), "--quiet", "--", PY, "-c", script],
                          env=unpreloaded_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          preexec_fn=preexec, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "True\n"


# A daemon's way (a fork, then every inherited descriptor closed: by os.closerange, or one by one) in the child of a
# stepping script, whose SIGUSR1 handler then takes signals. rtkit's wake-up pipe for the forked child was among the
# closed descriptors.
DAEMON = r"""
import os, signal, sys, threading, rtkit
rtkit.step()
pid = os.fork()
if pid == 0:
    if sys.argv[1] == "closerange":
        os.closerange(3, 1 << 16)
    else:
        for fd in range(3, 1024):
            try:
                os.close(fd)
            except OSError:
                pass
        # rtkit's watcher thread, which reads the pipe, has seen it closed; a call gives the main thread its turn
        for t in threading.enumerate():
            if t.name == "rtkit-signal-flush":
                t.join()
        (lambda: None)()
        files = [os.open(os.path.join(sys.argv[2], f"f{i}"), os.O_RDWR | os.O_CREAT) for i in range(64)]
    got = []
    signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    for _ in range(5):
        os.kill(os.getpid(), signal.SIGUSR1)   # its handler has run when kill returns
    if sys.argv[1] == "reopen":
        for fd in files:
            os.write(fd, b"mine")
            os.close(fd)
    print("daemon took", len(got), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("daemon exit", os.waitstatus_to_exitcode(status))
rtkit.step()
"""


def test_a_daemon_that_closed_rtkits_wakeup_pipe_gets_no_noise(tmp_path):
    """Each signal the daemon then handled printed "Exception ignored when trying to write to the signal wakeup fd ...
    Bad file descriptor" on the job's stderr: rtkit's broken plumbing, in the user's output. Now none."""
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--quiet", "--", PY, "-c", DAEMON, "closerange"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "daemon took 5\ndaemon exit 0\n"
    assert "wakeup" not in proc.stderr and "Bad file descriptor" not in proc.stderr, proc.stderr
    assert load_report(tmp_path / "r")["steps"]["count"] == 2


def test_a_daemon_that_reused_rtkits_wakeup_pipe_number_gets_no_signal_bytes(tmp_path):
    """The daemon closed its descriptors one by one, then its own files took the closed pipe's number: each signal it
    handled wrote a byte into one of them."""
    files = tmp_path / "files"
    files.mkdir()
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--quiet", "--", PY, "-c", DAEMON, "reopen",
                      str(files)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "daemon took 5\ndaemon exit 0\n"
    assert {f.read_bytes() for f in files.iterdir()} == {b"mine"}
    assert proc.stderr == ""


def test_steps_a_user_thread_made_while_the_main_thread_waits_are_flushed_at_sigterm(tmp_path):
    """The main thread starts the training thread and waits for it, never calling into rtkit: the recorder is made on
    the training thread, where no signal handler can be set. SIGTERM still writes its steps."""
    marker = tmp_path / "stepped"
    script = ("import threading, time, rtkit\n"
              "def work():\n    for _ in range(5):\n        rtkit.step()\n"
              f"    open({str(marker)!r}, 'w').close()\n"
              "    time.sleep(600)\n"
              "t = threading.Thread(target=work)\nt.start()\nt.join()\n")
    _assert_steps_kept_at_sigterm(tmp_path, [PY, "-c", script], marker, 5)
