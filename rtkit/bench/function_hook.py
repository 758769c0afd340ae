# function_hook.py -- what the tf.function step hook adds to one call: an empty tf.function, hooked vs not, interleaved.
"""An empty ``@tf.function`` runs under `rtkit run` (the real bootstrap, hooks and allocator, whose step mark is
part of the hook's cost). Blocks of calls alternate between the hook rtkit installed at ``Function.__call__`` and
the call it wraps (``__wrapped__``), A B A B; each block gives its mean time per call, and the figure is the median
of the paired differences (hooked block minus the plain block before it), so load that drifts over the run moves
both sides of a pair alike. Wall time and the calling thread's CPU time are both given: on a busy machine the
wall time of an empty call spreads by hundreds of microseconds, the thread's CPU time much less:

    python -m rtkit.bench.function_hook [--rounds 40] [--calls 200]

prints one JSON line (microseconds per call)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

# Runs in the child, where the bootstrap hooked TensorFlow on import.
DRIVER = r"""
import json, statistics, sys, time
import tensorflow as tf
from tensorflow.python.eager.polymorphic_function import polymorphic_function

rounds, calls = int(sys.argv[1]), int(sys.argv[2])
cls = polymorphic_function.Function
hooked = cls.__call__
plain = getattr(hooked, "__wrapped__", None)
if plain is None:
    sys.exit("rtkit's tf.function hook is not installed in this process")

@tf.function
def empty(x):
    return x

x = tf.constant(1.0)
for _ in range(50):
    empty(x)
times = {(n, c): [] for n in ("plain", "hooked") for c in ("wall", "cpu")}
try:
    for _ in range(rounds):
        for name, fn in (("plain", plain), ("hooked", hooked)):
            cls.__call__ = fn
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                empty(x)
            times[(name, "wall")].append((time.perf_counter() - t0) / calls * 1e6)
            times[(name, "cpu")].append((time.thread_time() - c0) / calls * 1e6)
finally:
    cls.__call__ = hooked
out = {"rounds": rounds, "calls_per_block": calls}
for clock in ("wall", "cpu"):
    diffs = [h - p for p, h in zip(times[("plain", clock)], times[("hooked", clock)])]
    out[f"plain_{clock}_us_median"] = round(statistics.median(times[("plain", clock)]), 2)
    out[f"hooked_{clock}_us_median"] = round(statistics.median(times[("hooked", clock)]), 2)
    out[f"overhead_{clock}_us_median"] = round(statistics.median(diffs), 2)
    out[f"overhead_{clock}_us_p25_p75"] = [round(q, 2) for q in statistics.quantiles(diffs, n=4)[::2]]
print("RESULT " + json.dumps(out))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args(argv)
    rtkit = os.path.join(os.path.dirname(sys.executable), "rtkit")
    with tempfile.TemporaryDirectory(prefix="rtkit-fnhook-") as tmp:
        driver = os.path.join(tmp, "driver.py")
        with open(driver, "w") as fh:
            fh.write(DRIVER)
        proc = subprocess.run([rtkit, "run", "--quiet", "--run-dir", os.path.join(tmp, "run"), "--", sys.executable,
                               driver, str(max(2, a.rounds)), str(max(1, a.calls))], capture_output=True, text=True)
    lines = [ln[len("RESULT "):] for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(f"rtkit.bench.function_hook: the driver failed (exit {proc.returncode}): "
                         f"{proc.stderr.strip()[-500:]}\n")
        return 1
    print(lines[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
