# sched_calls.py -- TF calls and CPU time per step of the bundled wdl under the scheduler, staging held on or off.
"""What a scheduler step costs beyond the script's own, in figures a busy machine does not spoil: the TF calls
(Session.run / callable runs reaching the TF runtime) the step's thread makes per step, and the process's CPU time
per step (all threads). The workload runs under `rtkit run` (the real bootstrap and hooks). `--stage off` holds the
tuner's "as the script was" configuration on a graph the scheduler has staged (what the tuner leaves running when
it keeps the script's configuration); `--stage on` holds staging on; `--stage none` runs without the scheduler:

    python -m rtkit.bench.sched_calls --stage off --steps 60 [--input legacy] [--batch 2048]

prints one JSON line: tf_calls_per_step (the step's thread), cpu_ms_per_step, wall_ms_per_step."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

# Runs in the child, after the bootstrap has hooked TensorFlow: holds the scheduler's choice, counts TF calls on the
# step's thread (rtkit's own runs there included, e.g. an inline put) and marks each step's start.
DRIVER = r"""
import json, sys, threading, time
import tensorflow as tf
from tensorflow.python.client import pywrap_tf_session as pywrap
stage, steps, warm, batch, rows, input_mode, data_dir = sys.argv[1:8]
if stage != "none":
    from rtkit import scheduler
    sched = scheduler.active()
    sched.tuner = None
    sched.active["stage"] = stage == "on"   # what the tuner sets for its chosen configuration
me, calls, marks = threading.get_ident(), [0], []
def counting(orig):
    def wrapped(*a, **k):
        if threading.get_ident() == me:
            calls[0] += 1
        return orig(*a, **k)
    return wrapped
for name in ("TF_SessionRun_wrapper", "TF_SessionRunCallable"):
    setattr(pywrap, name, counting(getattr(pywrap, name)))
session_run = tf.compat.v1.Session.run
def run(self, fetches, *a, **k):
    if isinstance(fetches, list) and len(fetches) == 2:   # the workload's step: [train_op, loss]
        marks.append((calls[0], time.process_time(), time.perf_counter()))
    return session_run(self, fetches, *a, **k)
tf.compat.v1.Session.run = run
from rtkit.workloads import run as run_workload
run_workload("wdl", api="session", steps=int(steps), batch=int(batch), rows=int(rows), data_dir=data_dir or None,
             progress=False, input_mode=input_mode)
m = marks[int(warm):]
n = len(m) - 1
print("SCHED_CALLS " + json.dumps({
    "stage": stage, "input": input_mode, "steps_measured": n,
    "tf_calls_per_step": round((m[-1][0] - m[0][0]) / n, 3) if n > 0 else None,
    "cpu_ms_per_step": round(1000.0 * (m[-1][1] - m[0][1]) / n, 2) if n > 0 else None,
    "wall_ms_per_step": round(1000.0 * (m[-1][2] - m[0][2]) / n, 2) if n > 0 else None}), flush=True)
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtkit.bench.sched_calls", description=__doc__.split("\n")[0])
    p.add_argument("--stage", choices=("off", "on", "none"), default="off")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warm", type=int, default=10, help="steps left out of the figures (tracing, first runs)")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--input", choices=("legacy", "prefetch"), default="legacy")
    p.add_argument("--data-dir", default="")
    args = p.parse_args(argv)
    sets = ["sched=0"] if args.stage == "none" else ["sched=1", "sched_stage=1", "sched_tune=0"]
    with tempfile.TemporaryDirectory(prefix="rtkit-sched-calls-") as run_dir:
        cmd = [sys.executable, "-m", "rtkit", "run", "--quiet", "--run-dir", run_dir, "--set", "malloc=0"]
        for s in sets:
            cmd += ["--set", s]
        cmd += ["--", sys.executable, "-c", DRIVER, args.stage, str(args.steps), str(args.warm), str(args.batch),
                str(args.rows), args.input, args.data_dir]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("SCHED_CALLS ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(f"rtkit.bench.sched_calls: the run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}\n")
        return 1
    print(json.dumps(json.loads(lines[-1].split(" ", 1)[1])), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
