# launch.py -- `rtkit launch [--ps N] --workers M [--chief] -- CMD ...`: a local TF cluster, every task under rtkit.
from __future__ import annotations

import argparse
import os

from rtkit.errors import UserError


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "launch", help="run a local TF cluster (parameter servers or collective workers), every task under `rtkit run`",
        description="Start PS, chief and worker tasks of CMD as separate processes on free localhost ports, each "
                    "under `rtkit run` with its TF_CONFIG; stream their output with a task prefix; stop the "
                    "parameter servers (and TF2 workers serving in Server.join()) when training is done; exit "
                    "with the first failing task's code. TF1 between-graph and TF2 ParameterServerStrategy jobs "
                    "take --ps N (TF2: add --chief, the coordinator); MultiWorkerMirroredStrategy jobs take "
                    "--workers M alone. The run directories of all tasks go to one cluster folder: "
                    "`rtkit report FOLDER` merges them.",
        usage="rtkit launch [--ps N] --workers M [--chief] [options] -- CMD [ARGS...]")
    p.add_argument("--ps", type=_count, default=0, help="parameter-server tasks (default 0: a collective cluster)")
    p.add_argument("--workers", type=_count, required=True, help="worker tasks")
    p.add_argument("--chief", action="store_true", help="add a separate chief task (else worker 0 is the chief)")
    p.add_argument("--restart-failed", type=_count, default=0, metavar="K",
                   help="restart a chief/worker that fails, up to K times each (default 0)")
    p.add_argument("--out", default="rtkit-runs", help="folder for the cluster folder (default rtkit-runs)")
    p.add_argument("--cluster-dir", help="exact cluster folder to use instead of OUT/<time>-<name>-cluster")
    p.add_argument("--name", help="name of the job (default: the command's name)")
    p.add_argument("--ports", help="comma-separated ports for chief, workers, then ps (default: free ones)")
    p.add_argument("--examples-per-step", type=_count, default=None, metavar="N",
                   help="examples in one worker step (the batch size), for examples/s in the cluster report")
    p.add_argument("--profile", help="tuning profile for every task (as `rtkit run --profile`)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="rtkit setting for every task (repeatable, as `rtkit run --set`)")
    p.add_argument("--ps-set", action="append", default=[], metavar="KEY=VALUE",
                   help="rtkit setting for the PS tasks only; {task} and {index} expand per task, e.g. "
                        "--ps-set tier_pool_path=/dev/shm/pool-{task} (tier mode on the parameter servers)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command every task runs, after --")
    p.set_defaults(func=main)


def main(args) -> int:
    from rtkit import rundir
    from rtkit.cluster import launcher
    from rtkit.cluster.spec import ClusterError

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("rtkit launch: error: no command given: use `rtkit launch --ps N --workers M -- CMD [ARGS...]`")
    ports = None
    if args.ports:
        try:
            ports = [int(p) for p in args.ports.split(",")]
        except ValueError:
            raise UserError(f"rtkit launch: --ports {args.ports!r}: expected comma-separated port numbers") from None
    try:
        cluster = launcher.build_cluster(args.ps, args.workers, args.chief, ports)
        launcher.check_ports_free(cluster)
    except ClusterError as exc:   # the spec's own words, said by launch
        raise UserError(str(exc).replace("rtkit: ", "rtkit launch: ", 1)) from None
    run_args = [a for s in args.set for a in ("--set", s)]
    if args.profile:
        run_args += ["--profile", args.profile]
    out_dir = args.cluster_dir or launcher.default_out_dir(args.out, rundir.slug(args.name or rundir.default_name(command)))
    try:
        rundir.make_writable(out_dir)
    except OSError as exc:
        raise UserError(f"rtkit launch: cannot create the cluster folder {out_dir} ({exc.strerror}): pass --out DIR "
                        f"with a writable folder") from None
    job = launcher.Launch(command=command, cluster=cluster, out_dir=os.path.abspath(out_dir), run_args=run_args,
                          restart_failed=args.restart_failed, examples_per_step=args.examples_per_step,
                          ps_sets=list(args.ps_set))
    return job.run()
