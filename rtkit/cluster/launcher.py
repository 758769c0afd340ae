# launcher.py -- `rtkit launch`: a local TF parameter-server cluster, every task a separate `rtkit run` process.
"""The launcher owns processes, never TensorFlow: it picks free localhost ports, starts each task as
``python -m rtkit run --out CLUSTER_DIR ... -- CMD`` with that task's TF_CONFIG, prefixes every output
line with the task (``[worker:1] ...``), forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT (and SIGUSR1/SIGUSR2, which
stop nothing) to all tasks, restarts failed workers (``--restart-failed N``: up to N times each), and ends
the job:

- all training tasks (chief, workers) done -> the parameter servers, which block in ``join()`` forever,
  get SIGTERM (SIGKILL after a grace period); the job's exit code is 0. A training task that blocks in
  ``tf.distribute.Server.join()`` (a TF2 ``ParameterServerStrategy`` worker: the coordinator sends it
  its steps) counts as done once the hooks say it serves (the file named by ``RTKIT_LAUNCH_SERVING``);
  it is then stopped with the parameter servers;
- a training task fails with no restart left -> the others are stopped, the exit code is that task's;
- a parameter server dies -> TF cannot rebuild its variables without a checkpoint, so the job ends
  with one line naming it and the PS's exit code (restart with a checkpoint folder to resume).

Each task runs in its own session (process group) so the launcher alone decides who gets a signal,
and a stop reaches the task's whole tree.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Dict, List, Optional, Sequence, Tuple

from rtkit import std_streams, tree_guard
from rtkit.cluster.spec import ClusterError, Task
from rtkit.launch import PASSED_ON_SIGNALS, STOP_SIGNALS

CLUSTER_FILE = "cluster.json"
SERVING_DIR = ".serving"      # one empty file per task attempt that entered Server.join()
STOP_GRACE_S = 10.0
TRAINING_ROLES = ("chief", "worker")
# A local cluster of more tasks than this is a typo (each task is a TensorFlow process on this host)
MAX_TASKS = 256
MAX_PORT = 65535


PORT_FLOOR = 20000   # below the kernel's usual ephemeral range; the pick moves lower if that range starts lower


def _ephemeral_range() -> Tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low, high = (int(v) for v in fh.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def pick_ports(count: int, host: str = "127.0.0.1") -> List[int]:
    """`count` distinct free ports, all bound (gRPC's way: every interface, SO_REUSEADDR) until every port is
    chosen. Chosen below the ephemeral range: a port the kernel may hand to some outgoing connection (a task's
    own gRPC client among them) before the task that owns it has bound it fails that task's server."""
    import random

    low, _ = _ephemeral_range()
    floor = PORT_FLOOR if low - PORT_FLOOR > count * 4 else max(1024, low - 12000)
    # a random start: two launches at once (two jobs, two test runs) rarely walk the same ports
    start = random.randrange(floor, max(floor + 1, low - count * 4))
    socks = []
    try:
        port = start
        while len(socks) < count and port < low:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
                socks.append(s)
            except OSError:
                s.close()
            port += 1
        while len(socks) < count:   # no room below the ephemeral range: let the kernel choose
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    except OSError as exc:
        raise ClusterError(f"rtkit launch: cannot find {count} free localhost ports ({exc.strerror}); "
                           "start fewer tasks or pass --ports") from None
    finally:
        for s in socks:
            s.close()


def build_cluster(ps: int, workers: int, chief: bool, ports: Optional[Sequence[int]] = None,
                  host: str = "localhost") -> Dict[str, List[str]]:
    if ps < 1 and workers < 1:
        raise ClusterError("rtkit launch: --workers must be at least 1 when --ps is 0 (a collective "
                           "MultiWorkerMirroredStrategy cluster of workers)")
    if workers < (0 if chief else 1):
        raise ClusterError("rtkit launch: --workers must be at least 1 (or 0 with --chief)")
    total = ps + workers + (1 if chief else 0)
    if total > MAX_TASKS:
        raise ClusterError(f"rtkit launch: --ps {ps} --workers {workers}{' --chief' if chief else ''} makes {total} "
                           f"tasks; a local cluster has at most {MAX_TASKS} tasks")
    if ports:
        _check_ports(ports, total)
    ports = list(ports) if ports else pick_ports(total)
    cluster: Dict[str, List[str]] = {}
    it = iter(ports)
    if chief:
        cluster["chief"] = [f"{host}:{next(it)}"]
    if workers:
        cluster["worker"] = [f"{host}:{next(it)}" for _ in range(workers)]
    if ps:
        cluster["ps"] = [f"{host}:{next(it)}" for _ in range(ps)]
    return cluster


def _check_ports(ports: Sequence[int], total: int) -> None:
    """--ports as given: one valid, distinct port per task."""
    for port in ports:
        if not 1 <= port <= MAX_PORT:
            raise ClusterError(f"rtkit launch: --ports {port}: a port is 1 to {MAX_PORT}")
    if len(ports) != total:
        raise ClusterError(f"rtkit launch: --ports lists {len(ports)} port(s), the cluster has {total} task(s)")
    seen = set()
    for port in ports:
        if port in seen:
            raise ClusterError(f"rtkit launch: --ports lists port {port} twice; give each task its own port")
        seen.add(port)


def check_ports_free(cluster: Dict[str, List[str]]) -> None:
    from rtkit.cluster.spec import check_port_free

    for role, hosts in cluster.items():
        for i in range(len(hosts)):
            check_port_free(Task(role, i, cluster, "launch"))


@dataclass
class _Proc:
    task: Task
    attempt: int
    popen: subprocess.Popen
    started: float
    reader: Optional[threading.Thread] = None
    # the stop signals forwarded to it: one that came while it started reaches it once it is known, and only once
    stops: Dict[int, object] = field(default_factory=dict)


@dataclass
class Launch:
    command: List[str]
    cluster: Dict[str, List[str]]
    out_dir: str
    run_args: List[str] = field(default_factory=list)   # passed to every `rtkit run`
    ps_sets: List[str] = field(default_factory=list)    # KEY=VALUE for PS tasks only; {task}, {index} expanded
    restart_failed: int = 0
    examples_per_step: Optional[int] = None
    python: str = sys.executable
    events: List[dict] = field(default_factory=list)
    _out_lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: Optional[str] = None

    # -- bookkeeping -----------------------------------------------------------------------------
    def _event(self, kind: str, task: Optional[Task] = None, **extra) -> None:
        rec = {"t_unix": round(time.time(), 3), "event": kind}
        if task is not None:
            rec["task"] = task.name
        rec.update(extra)
        self.events.append(rec)
        self._write_cluster_file()

    def _write_cluster_file(self, final: Optional[dict] = None) -> None:
        from rtkit import atomic

        doc = {"cluster_schema": 1, "cluster": self.cluster, "command": self.command,
               "restart_failed": self.restart_failed, "examples_per_step": self.examples_per_step,
               "events": self.events}
        if final:
            doc.update(final)
        try:
            atomic.write_json(os.path.join(self.out_dir, CLUSTER_FILE), doc)
        except OSError:
            pass    # the task directories still make a cluster report

    def _say(self, text: str) -> None:
        with self._out_lock:
            std_streams.say(f"rtkit launch: {text}")

    # -- processes -------------------------------------------------------------------------------
    def _stream(self, proc: _Proc) -> None:
        prefix = f"[{proc.task.role}:{proc.task.index}] ".encode()
        out = sys.stdout.buffer
        for line in iter(proc.popen.stdout.readline, b""):
            with self._out_lock:
                try:
                    out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
                    out.flush()
                except BrokenPipeError:   # nobody reads them any more: the lines go nowhere, the job runs on
                    std_streams.silence(out)
                except ValueError:
                    pass
        proc.popen.stdout.close()

    def _clock_file(self) -> str:
        """The coordinator's step count, shared with the serving tasks (rtkit/hooks/tf2_cluster.py)."""
        return os.path.join(self.out_dir, SERVING_DIR, "step-clock")

    def _prepare_signals(self) -> None:
        os.makedirs(os.path.join(self.out_dir, SERVING_DIR), exist_ok=True)
        with open(self._clock_file(), "wb") as fh:
            fh.write(bytes(8))

    def _remove_signals(self) -> None:
        """Every task has exited: the serving marks and the clock were this launch's own, nobody reads them now."""
        import shutil

        shutil.rmtree(os.path.join(self.out_dir, SERVING_DIR), ignore_errors=True)

    def _serving_file(self, task: Task, attempt: int) -> str:
        return os.path.join(self.out_dir, SERVING_DIR, f"{task.name}.{attempt}")

    def _serving(self, proc: _Proc) -> bool:
        """Whether this training task blocks in tf.distribute.Server.join() (a TF2 PS-strategy worker)."""
        return os.path.exists(self._serving_file(proc.task, proc.attempt))

    def _start(self, task: Task, attempt: int) -> _Proc:
        env = tree_guard.env_dying_with_me(os.environ)   # its `rtkit run` dies with this process, even by kill -9
        env["TF_CONFIG"] = task.tf_config()
        env["RTKIT_LAUNCH_SERVING"] = self._serving_file(task, attempt)
        env["RTKIT_LAUNCH_CLOCK"] = self._clock_file()
        for var in ("RTKIT_RUN_DIR", "RTKIT_ACTIVE"):
            env.pop(var, None)
        role_args = []
        if task.role == "ps":
            for item in self.ps_sets:   # per-task values, e.g. a tier pool file of its own per PS
                role_args += ["--set", item.replace("{task}", task.name).replace("{index}", str(task.index))]
        argv = [self.python, "-m", "rtkit", "run", "--out", self.out_dir, "--quiet", *self.run_args, *role_args,
                "--", *self.command]
        popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        proc = _Proc(task, attempt, popen, time.time())
        proc.reader = threading.Thread(target=self._stream, args=(proc,), daemon=True, name=f"rtkit-{task.name}")
        proc.reader.start()
        self._event("start", task, attempt=attempt, pid=popen.pid)
        return proc

    @staticmethod
    def _signal(proc: _Proc, sig: int) -> None:
        """To the task's `rtkit run`, which forwards the signal to the command and still records how it ended. SIGKILL
        too, to it alone: the command leads a process group of its own, and the tree guard in the group of `rtkit run`
        ends the command's tree once `rtkit run` is gone (a SIGKILL to that group would kill the guard with it)."""
        try:
            os.kill(proc.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _stop_all(self, procs: List[_Proc], why: str) -> None:
        """SIGTERM to every live task (rtkit run forwards it and still writes its report), then SIGKILL."""
        live = [p for p in procs if p.popen.poll() is None]
        if not live:
            return
        self._stopping = why
        for p in live:
            self._event("stop", p.task, reason=why)
            self._signal(p, signal.SIGTERM)
        deadline = time.time() + STOP_GRACE_S
        for p in live:
            try:
                p.popen.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                self._signal(p, signal.SIGKILL)
                p.popen.wait()

    # -- the job ---------------------------------------------------------------------------------
    def run(self) -> int:
        tasks = [Task(role, i, self.cluster, "launch") for role in ("ps", "chief", "worker")
                 for i in range(len(self.cluster.get(role, [])))]
        received: List[int] = []
        procs: List[_Proc] = []

        def forward(signum, frame):
            stop = signum not in PASSED_ON_SIGNALS
            if stop:
                received.append(signum)
            for p in procs:
                if p.popen.poll() is None:
                    if stop:
                        p.stops[signum] = True
                    self._signal(p, signum)

        def admit(proc: _Proc) -> None:
            """A task just started joins the ones a signal reaches. A stop signal that came while it started (the tasks
            started before it had it) is sent to it now: else it runs on and the launcher waits for it forever. The
            passed-on ones are not: a "checkpoint now" came before it had anything to save, or a handler to take it."""
            procs.append(proc)
            for sig in list(received):
                # forward marks each one it sends; no handler runs inside setdefault: sent here or there, never both
                claim = object()
                if proc.stops.setdefault(sig, claim) is claim and proc.popen.poll() is None:
                    self._signal(proc, sig)

        previous = {}
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS + PASSED_ON_SIGNALS:
                if signal.getsignal(s) is signal.SIG_IGN:
                    continue   # ignored by whoever started the launcher (nohup): by every task too, as by `rtkit run`
                previous[s] = signal.signal(s, forward)
        self._prepare_signals()
        self._event("launch", None, tasks=[t.name for t in tasks])
        first_failure: Optional[int] = None
        restarts: Dict[str, int] = {}
        try:
            for t in tasks:
                admit(self._start(t, 0))
            while True:
                for p in list(procs):
                    code = p.popen.poll()
                    if code is None or getattr(p, "_seen", False):
                        continue
                    if code < 0:      # the `rtkit run` wrapper itself died of a signal: report it as a shell does
                        code = 128 - code
                    p._seen = True   # type: ignore[attr-defined]
                    if p.reader:
                        p.reader.join(timeout=5)
                    self._event("exit", p.task, attempt=p.attempt, exit_code=code)
                    if code == 0 or received or self._stopping is not None:
                        continue   # done, or stopped by us (a PS ends only that way)
                    if p.task.role == "ps":
                        if first_failure is None:
                            first_failure = code
                        self._say(f"parameter server ps:{p.task.index} ({p.task.address}) exited with code {code}: "
                                  f"TF cannot recover a PS without its checkpoint; stopping the job "
                                  f"(run again with the workload's checkpoint folder to resume)")
                        self._stop_all(procs, f"ps:{p.task.index} died")
                        continue
                    used = restarts.get(p.task.name, 0)
                    if used < self.restart_failed and self._stopping is None:
                        restarts[p.task.name] = used + 1
                        self._say(f"{p.task.role}:{p.task.index} exited with code {code}: restarting it "
                                  f"({used + 1} of {self.restart_failed})")
                        self._event("restart", p.task, attempt=p.attempt + 1, after_exit_code=code)
                        admit(self._start(p.task, p.attempt + 1))
                        continue
                    if first_failure is None:
                        first_failure = code
                        self._say(f"{p.task.role}:{p.task.index} failed with exit code {code}; stopping the job")
                        self._stop_all(procs, f"{p.task.name} failed")
                if all(getattr(p, "_seen", False) for p in procs):
                    break
                training = [p for p in procs if p.task.role in TRAINING_ROLES]   # restarts included
                exited = [p for p in training if p.popen.poll() is not None and getattr(p, "_seen", False)]
                serving = [p for p in training if p.popen.poll() is None and self._serving(p)]
                if (self._stopping is None and training and not received and exited
                        and len(exited) + len(serving) == len(training)):
                    if serving:
                        self._say("training is done (the remaining workers serve the coordinator's steps in "
                                  "Server.join()); stopping the servers")
                    elif any(p.task.role == "ps" for p in procs):
                        self._say("all workers are done; stopping the parameter servers")
                    self._stop_all(procs, "workers done")
                time.sleep(0.1)
        finally:
            for p in procs:
                if p.popen.poll() is None:
                    self._signal(p, signal.SIGKILL)
                    p.popen.wait()
                if p.reader:
                    p.reader.join(timeout=5)
            for s, prev in previous.items():
                signal.signal(s, prev)
            self._remove_signals()
        if received:
            code = 128 + received[0]
        else:
            code = first_failure if first_failure is not None else 0
        self._write_cluster_file({"exit_code": code, "end_unix": round(time.time(), 3)})
        self._say(f"cluster folder: {self.out_dir} (see `rtkit report {self.out_dir}`)")
        return code


def default_out_dir(out: str, name: str) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join(out, f"{stamp}-{name}-cluster")
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path
