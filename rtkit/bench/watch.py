# watch.py -- a long bundled-workload job watched from outside as a user would: rtkit top in tmux, Prometheus, TensorBoard.
"""`python -m rtkit.bench.watch OUT [--steps N] [--every S]` starts `rtkit run --tensorboard OUT/tb --metrics-port P`
on the bundled workload (its loss written by the script into OUT/tb/train, rtkit's figures into OUT/tb/rtkit),
light on CPU (one intra/inter-op thread, a small batch, a per-batch read latency), and while it runs:

- `rtkit top OUT/run` in a tmux session; the screen is captured when the first step is seen, then every
  `--every` seconds, and once more after the job has ended (OUT/screens/NNN.txt, the capture time on top);
- the metrics endpoint scraped at the same moments and parsed with prometheus_client's OpenMetrics parser
  (OUT/scrapes/NNN.txt raw, figures in the summary);
- at the end both TensorBoard runs read back with TensorBoard's own EventAccumulator.

OUT/watch.json is what was seen: per capture, the time, the job's step count and the figures; the event files'
tags and step ranges; whether rtkit's step_ms steps are the loss's steps. Nothing here decides pass or fail:
the figures are for the reader (docs/live.md)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List, Optional

WORKLOAD = ["wdl", "--input", "legacy", "--input-latency-ms", "100", "--batch", "256", "--rows", "4096",
            "--capacity", "4096", "--threads-intra", "1", "--threads-inter", "1", "--no-progress"]
POLL_S = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True).stdout


def scrape(port: int) -> Optional[str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read().decode()
    except OSError:
        return None


def scrape_figures(text: Optional[str]) -> Dict[str, Any]:
    """{series: value} of the rtkit_ gauges (labels dropped but allocator_state's)."""
    if not text:
        return {}
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    out: Dict[str, Any] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + (f"{{state={s.labels['state']}}}" if "state" in s.labels else "")
            out[key] = s.value
    return out


def event_scalars(folder: str) -> Dict[str, Dict[str, Any]]:
    """{tag: {count, first_step, last_step}} of the scalars in a TensorBoard run folder, read by TensorBoard."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(folder, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    out: Dict[str, Dict[str, Any]] = {}
    tags = acc.Tags()
    for tag in tags.get("scalars", []):
        steps = [e.step for e in acc.Scalars(tag)]
        out[tag] = {"count": len(steps), "first_step": min(steps), "last_step": max(steps), "steps": steps}
    for tag in tags.get("tensors", []):
        steps = [e.step for e in acc.Tensors(tag)]
        out[tag] = {"count": len(steps), "first_step": min(steps), "last_step": max(steps), "steps": steps}
    return out


class Watch:
    def __init__(self, out: str, steps: int, every: float):
        self.out, self.steps, self.every = os.path.abspath(out), steps, every
        self.run_dir = os.path.join(self.out, "run")
        self.tb = os.path.join(self.out, "tb")
        self.port = _free_port()
        self.session = f"rtkit-watch-{os.getpid()}"
        self.captures: List[Dict[str, Any]] = []
        for sub in ("screens", "scrapes"):
            os.makedirs(os.path.join(self.out, sub), exist_ok=True)

    def start(self) -> None:
        rtkit = [sys.executable, "-m", "rtkit"]
        self.command = [*rtkit, "run", "--run-dir", self.run_dir, "--tensorboard", self.tb,
                        "--metrics-port", str(self.port), "--", sys.executable, "-m", "rtkit.workloads", *WORKLOAD,
                        "--steps", str(self.steps), "--data-dir", os.path.join(self.out, "data"),
                        "--summary-dir", os.path.join(self.tb, "train")]
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        self.log = open(os.path.join(self.out, "rtkit-run.log"), "w")
        self.t0 = time.time()
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def start_top(self) -> None:
        top = " ".join([sys.executable, "-m", "rtkit", "top", self.run_dir, "--interval", "2"])
        subprocess.run(["tmux", "new-session", "-d", "-s", self.session, "-x", "120", "-y", "30",
                        f"{top}; echo top exit $?; sleep 3600"], check=True)

    def capture(self, why: str) -> None:
        n = len(self.captures)
        screen = _tmux("capture-pane", "-p", "-t", self.session)
        raw = scrape(self.port)
        live = _json(os.path.join(self.run_dir, "live.json"))
        now = time.time()
        with open(os.path.join(self.out, "screens", f"{n:03d}.txt"), "w") as fh:
            fh.write(f"# {why}, {now - self.t0:.0f} s after the start\n{screen}")
        with open(os.path.join(self.out, "scrapes", f"{n:03d}.txt"), "w") as fh:
            fh.write(raw if raw is not None else "(no answer)\n")
        steps = ((live or {}).get("steps") or {}).get("count")
        self.captures.append({"n": n, "why": why, "t_s": round(now - self.t0, 1), "live_steps": steps,
                              "job_running": self.proc.poll() is None, "scrape": scrape_figures(raw),
                              "screen": screen.rstrip().splitlines()})

    def run(self) -> Dict[str, Any]:
        self.start()
        live_path = os.path.join(self.run_dir, "live.json")
        while not os.path.isfile(live_path) and self.proc.poll() is None:
            time.sleep(POLL_S / 4)
        self.start_top()
        try:
            first = None
            while self.proc.poll() is None:
                steps = ((_json(live_path) or {}).get("steps") or {}).get("count") or 0
                if first is None and steps >= 1:
                    first = time.time()
                    time.sleep(2 * POLL_S)   # top's next redraw
                    self.capture("first step seen in live.json")
                    last = first
                elif first is not None and time.time() - last >= self.every:
                    self.capture("periodic")
                    last = time.time()
                time.sleep(POLL_S)
            self.log.close()
            time.sleep(5)   # top redraws every 2 s: one frame of the finished report
            self.capture("after the end")
            _tmux("send-keys", "-t", self.session, "q")
            time.sleep(2)
            quit_screen = _tmux("capture-pane", "-p", "-t", self.session)
        finally:
            _tmux("kill-session", "-t", self.session)
        report = _json(os.path.join(self.run_dir, "report.json")) or {}
        rtkit_tb = event_scalars(os.path.join(self.tb, "rtkit"))
        loss_tb = event_scalars(os.path.join(self.tb, "train"))
        loss_steps = set(loss_tb.get("loss", {}).get("steps", []))
        ours = set(rtkit_tb.get("rtkit/step_ms", {}).get("steps", []))
        result = {
            "command": self.command, "exit_code": self.proc.returncode, "wall_s": round(time.time() - self.t0, 1),
            "report_steps": (report.get("steps") or {}).get("count"),
            "report_status": (report.get("run") or {}).get("status"),
            "top_quit_screen_tail": quit_screen.rstrip().splitlines()[-2:],
            "tensorboard": {"rtkit": {t: {k: v for k, v in d.items() if k != "steps"} for t, d in rtkit_tb.items()},
                            "train": {t: {k: v for k, v in d.items() if k != "steps"} for t, d in loss_tb.items()},
                            "step_ms_steps_are_loss_steps": bool(ours) and ours <= loss_steps,
                            "step_ms_steps_without_loss": len(ours - loss_steps)},
            "captures": self.captures,
        }
        with open(os.path.join(self.out, "watch.json"), "w") as fh:
            json.dump(result, fh, indent=1)
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtkit.bench.watch", description=__doc__.splitlines()[0])
    p.add_argument("out", help="a folder for the run, the event files, the screens and the scrapes")
    p.add_argument("--steps", type=int, default=11000, help="training steps (default 11000: about 20 minutes "
                   "at the 100 ms read latency)")
    p.add_argument("--every", type=float, default=120.0, help="seconds between captures (default 120)")
    args = p.parse_args(argv)
    w = Watch(args.out, args.steps, args.every)
    try:
        result = w.run()
    finally:
        w.stop()
    print(f"exit {result['exit_code']}, {result['report_steps']} steps in {result['wall_s']} s, "
          f"{len(result['captures'])} captures; {os.path.join(w.out, 'watch.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
