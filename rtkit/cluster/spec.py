# spec.py -- which task of a TF parameter-server cluster this process is: TF_CONFIG or the classic flags, validated.
"""Two sources, checked in this order:

1. ``TF_CONFIG`` (what TFJob, Estimator and tf.distribute use)::

       {"cluster": {"ps": ["h:2222"], "worker": ["h:2223", "h:2224"], "chief": ["h:2225"]},
        "task": {"type": "worker", "index": 1}}

2. The classic flags of TF 1.x distributed scripts, found on the user's command line:
   ``--job_name`` (ps|worker|chief), ``--task_index`` (default 0), ``--ps_hosts`` and
   ``--worker_hosts`` (comma-separated host:port), optionally ``--chief_hosts``. Both
   ``--flag=value`` and ``--flag value`` are understood, with one or two dashes.

Any defect is a :class:`ClusterError` whose text is the one line shown to the user (exit 2).
"""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from rtkit.errors import UserError

ROLES = ("chief", "worker", "ps", "evaluator")
FLAG_HOSTS = {"ps_hosts": "ps", "worker_hosts": "worker", "chief_hosts": "chief"}
_EXAMPLE = ('{"cluster": {"ps": ["host:2222"], "worker": ["host:2223"]}, '
            '"task": {"type": "worker", "index": 0}}')


class ClusterError(UserError):
    """A bad cluster spec: the message is the one line shown to the user (exit code 2)."""


@dataclass(frozen=True)
class Task:
    role: str
    index: int
    cluster: Dict[str, List[str]]
    source: str                      # "TF_CONFIG" | "flags" | "launch"

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def address(self) -> Optional[str]:
        hosts = self.cluster.get(self.role) or []
        return hosts[self.index] if self.index < len(hosts) else None

    @property
    def is_chief(self) -> bool:
        """TF's rule: the chief task if the cluster has one, else worker 0."""
        if "chief" in self.cluster:
            return self.role == "chief"
        return self.role == "worker" and self.index == 0

    def as_dict(self) -> Dict[str, object]:
        return {"role": self.role, "index": self.index, "address": self.address, "is_chief": self.is_chief,
                "source": self.source, "cluster": self.cluster}

    def tf_config(self) -> str:
        return tf_config(self.cluster, self.role, self.index)


def tf_config(cluster: Mapping[str, Sequence[str]], role: str, index: int) -> str:
    return json.dumps({"cluster": {k: list(v) for k, v in cluster.items()}, "task": {"type": role, "index": index}},
                      separators=(",", ":"))


def _check_cluster(cluster: object, where: str) -> Dict[str, List[str]]:
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterError(f"rtkit: {where}: 'cluster' must map roles to lists of host:port, e.g. {_EXAMPLE}")
    out: Dict[str, List[str]] = {}
    for role, hosts in cluster.items():
        if role not in ROLES:
            raise ClusterError(f"rtkit: {where}: unknown role '{role}' in the cluster: use {', '.join(ROLES)}")
        if isinstance(hosts, str):
            hosts = [h for h in hosts.split(",") if h]
        if not isinstance(hosts, list) or not hosts:
            raise ClusterError(f"rtkit: {where}: cluster role '{role}' needs a non-empty list of host:port")
        for h in hosts:
            host, _, port = str(h).rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ClusterError(f"rtkit: {where}: '{h}' of role '{role}' is not host:port (port 1-65535)")
        out[role] = [str(h) for h in hosts]
    if "chief" in out and len(out["chief"]) != 1:
        raise ClusterError(f"rtkit: {where}: a cluster has at most one chief, got {len(out['chief'])}")
    return out


def _check_task(role: object, index: object, cluster: Dict[str, List[str]], where: str) -> Task:
    if role not in ROLES:
        raise ClusterError(f"rtkit: {where}: unknown task type '{role}': use one of {', '.join(ROLES)}")
    if isinstance(index, bool) or not isinstance(index, int):
        try:
            index = int(str(index))
        except ValueError:
            raise ClusterError(f"rtkit: {where}: task index '{index}' is not a whole number") from None
    if role != "evaluator":
        hosts = cluster.get(str(role), [])
        if not 0 <= index < len(hosts):
            raise ClusterError(f"rtkit: {where}: task {role}:{index} is not in the cluster "
                               f"('{role}' has {len(hosts)} task(s))")
    return Task(str(role), int(index), cluster, "TF_CONFIG" if where == "TF_CONFIG" else "flags")


def from_tf_config(text: str) -> Task:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ClusterError(f"rtkit: TF_CONFIG is not valid JSON ({exc}): set it like {_EXAMPLE}") from None
    if not isinstance(data, dict):
        raise ClusterError(f"rtkit: TF_CONFIG must be a JSON object like {_EXAMPLE}")
    for key in ("cluster", "task"):
        if key not in data:
            raise ClusterError(f"rtkit: TF_CONFIG has no '{key}' field: set it like {_EXAMPLE}")
    task = data["task"]
    if not isinstance(task, dict):
        raise ClusterError(f"rtkit: TF_CONFIG 'task' must be an object with 'type' and 'index': {_EXAMPLE}")
    for key in ("type", "index"):
        if key not in task:
            raise ClusterError(f"rtkit: TF_CONFIG task has no '{key}' field: set it like {_EXAMPLE}")
    cluster = _check_cluster(data["cluster"], "TF_CONFIG")
    return _check_task(task["type"], task["index"], cluster, "TF_CONFIG")


def _flag_values(command: Sequence[str]) -> Dict[str, str]:
    wanted = {"job_name", "task_index", *FLAG_HOSTS}
    found: Dict[str, str] = {}
    args = list(command)
    for i, arg in enumerate(args):
        if not arg.startswith("-") or arg == "--":
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        if name in wanted:
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            found[name] = value
    return found


def from_flags(command: Sequence[str]) -> Optional[Task]:
    """The task named by --job_name/--task_index/--ps_hosts/--worker_hosts in `command`, or None."""
    flags = _flag_values(command)
    if "job_name" not in flags:
        return None
    for needed in ("ps_hosts", "worker_hosts"):
        if not flags.get(needed):
            raise ClusterError(f"rtkit: --job_name is given but --{needed} is missing: pass the cluster's "
                               f"comma-separated host:port lists, or use TF_CONFIG")
    cluster = {role: flags[flag].split(",") for flag, role in FLAG_HOSTS.items() if flags.get(flag)}
    cluster = _check_cluster(cluster, "--ps_hosts/--worker_hosts")
    return _check_task(flags["job_name"], flags.get("task_index", "0"), cluster, "--job_name/--task_index")


def detect(env: Mapping[str, str], command: Sequence[str]) -> Optional[Task]:
    """This process's task, or None outside a cluster. An empty TF_CONFIG counts as unset (TF does the same)."""
    text = env.get("TF_CONFIG", "").strip()
    if text:
        return from_tf_config(text)
    return from_flags(command)


def detect_checked(env: Mapping[str, str], command: Sequence[str]) -> Optional[Task]:
    """detect(), and this task's own port free when its address is on this machine (ClusterError if not)."""
    task = detect(env, command)
    if task is not None:
        check_port_free(task)
    return task


_LOCAL_HOSTS = {"localhost", "127.0.0.1", "0.0.0.0", "::1", "[::1]", "[::]", ""}


def is_local(host: str) -> bool:
    return host in _LOCAL_HOSTS or host in (socket.gethostname(), socket.getfqdn())


def check_port_free(task: Task) -> None:
    """A task whose own address is on this machine must find its port free: otherwise TF's server fails
    with a gRPC trace long after start-up. Binding like gRPC does (all interfaces, SO_REUSEADDR) tells."""
    address = task.address
    if not address:
        return
    host, _, port = address.rpartition(":")
    if not is_local(host):
        return
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("0.0.0.0", int(port)))
    except OSError as exc:
        raise ClusterError(f"rtkit: task {task.role}:{task.index} address {address}: port {port} is taken "
                           f"({exc.strerror}): give this task a free port in the cluster spec") from None
    finally:
        probe.close()
