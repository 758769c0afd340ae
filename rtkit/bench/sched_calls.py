# sched_calls.py -- TF calls and CPU time per step of the bundled wdl under the scheduler, staging held on or off.
"""What a scheduler step costs beyond the script's own, in figures a busy machine does not spoil: the TF calls
(Session.run / callable runs reaching the TF runtime) the step's thread makes per step, and the process's CPU time
per step (all threads). `--stage off` holds the tuner's "as the script was" configuration on a graph the scheduler
has staged (the case the tuner leaves running when it keeps the script's configuration); `--stage on` holds
staging on; `--stage none` runs without the scheduler (TF default). One process, in-process hooks:

    python -m rtkit.bench.sched_calls --stage off --steps 60 [--input legacy] [--batch 2048]

prints one JSON line: tf_calls_per_step (the step's thread), cpu_ms_per_step, wall_ms_per_step."""
from __future__ import annotations

import argparse
import json
import os
import threading
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtkit.bench.sched_calls", description=__doc__.split("\n")[0])
    p.add_argument("--stage", choices=("off", "on", "none"), default="off")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warm", type=int, default=10, help="steps left out of the figures (tracing, first runs)")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--input", choices=("legacy", "prefetch"), default="legacy")
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    if args.stage != "none":
        os.environ.update(RTKIT_SCHED="1", RTKIT_SCHED_STAGE="1", RTKIT_SCHED_TUNE="0")
    import tensorflow as tf
    from tensorflow.python.client import pywrap_tf_session as pywrap

    from rtkit.hooks import install

    install.on_tensorflow(tf)
    if args.stage != "none":
        from rtkit import scheduler

        sched = scheduler.active()
        sched.tuner = None
        sched.active["stage"] = args.stage == "on"   # what the tuner sets for its chosen configuration

    main_thread = threading.get_ident()
    calls = [0]
    marks = []   # (calls, cpu s, wall s) at each step the hooks time

    def counting(orig):
        def wrapped(*a, **k):
            if threading.get_ident() == main_thread:  # rtkit's own runs on this thread too (an inline put)
                calls[0] += 1
            return orig(*a, **k)
        return wrapped

    for name in ("TF_SessionRun_wrapper", "TF_SessionRunCallable"):
        setattr(pywrap, name, counting(getattr(pywrap, name)))

    from rtkit.hooks import steps as hook_steps

    rec = hook_steps.recorder()
    orig_record = rec.record

    def record(*a, **k):
        marks.append((calls[0], time.process_time(), time.perf_counter()))
        return orig_record(*a, **k)

    rec.record = record
    from rtkit.workloads import run

    run("wdl", api="session", steps=args.steps, batch=args.batch, rows=args.rows, data_dir=args.data_dir,
        progress=False, input_mode=args.input)
    # the step is the signature that recurs; every recorded session run before the warm-up is left out
    m = marks[args.warm:]
    n = len(m) - 1
    out = {"stage": args.stage, "input": args.input, "steps_measured": n,
           "tf_calls_per_step": round((m[-1][0] - m[0][0]) / n, 3) if n > 0 else None,
           "cpu_ms_per_step": round(1000.0 * (m[-1][1] - m[0][1]) / n, 2) if n > 0 else None,
           "wall_ms_per_step": round(1000.0 * (m[-1][2] - m[0][2]) / n, 2) if n > 0 else None}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
