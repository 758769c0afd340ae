# test_trace_format.py -- the scheduler's Chrome trace (trace-<pid>.json) checked against the Trace Event Format.
"""The rules are those of the Trace Event Format document (the JSON Chrome's about:tracing and Perfetto load):
an object with a `traceEvents` array (or a bare array); every event has a phase `ph`; events other than
metadata have `name`, `pid`, `tid` and a numeric `ts` in microseconds; complete events (X) have a `dur` >= 0;
B/E pairs nest per thread; counters (C) carry numeric args; metadata (M) events are one of the named kinds
with their `args`; `displayTimeUnit` is "ms" or "ns"."""
import json
import os
import sys


from conftest import requires_tf, run_rtkit
from tf_scripts import session_training

PHASES = set("BEXiIPCbneSTpFsftNODMVvRc(),")
METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
            "thread_sort_index": "sort_index", "process_labels": "labels"}


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def trace_errors(doc):
    """Every way `doc` breaks the format, as strings (empty: valid)."""
    errs = []
    if isinstance(doc, list):
        events = doc
    elif isinstance(doc, dict):
        events = doc.get("traceEvents")
        if not isinstance(events, list):
            return ["no traceEvents array"]
        if "displayTimeUnit" in doc and doc["displayTimeUnit"] not in ("ms", "ns"):
            errs.append(f"displayTimeUnit {doc['displayTimeUnit']!r}")
    else:
        return ["neither an object nor an array"]
    open_b = {}
    for i, e in enumerate(events):
        where = f"event {i}"
        if not isinstance(e, dict):
            errs.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            errs.append(f"{where}: phase {ph!r}")
            continue
        if not isinstance(e.get("pid"), (int, str)):
            errs.append(f"{where}: pid {e.get('pid')!r}")
        if ph == "M":
            key = METADATA.get(e.get("name"))
            if key is None or not isinstance(e.get("args"), dict) or key not in e["args"]:
                errs.append(f"{where}: metadata {e.get('name')!r} without args.{key}")
            if e.get("name", "").startswith("thread_") and not isinstance(e.get("tid"), (int, str)):
                errs.append(f"{where}: thread metadata without tid")
            continue
        if not isinstance(e.get("name"), str):
            errs.append(f"{where}: name {e.get('name')!r}")
        if not isinstance(e.get("tid"), (int, str)):
            errs.append(f"{where}: tid {e.get('tid')!r}")
        if not _is_num(e.get("ts")) or e["ts"] < 0:
            errs.append(f"{where}: ts {e.get('ts')!r}")
        if "args" in e and not isinstance(e["args"], dict):
            errs.append(f"{where}: args not an object")
        if "cat" in e and not isinstance(e["cat"], str):
            errs.append(f"{where}: cat not a string")
        if ph == "X" and (not _is_num(e.get("dur")) or e["dur"] < 0):
            errs.append(f"{where}: complete event with dur {e.get('dur')!r}")
        if ph == "C" and not (isinstance(e.get("args"), dict) and e["args"]
                              and all(_is_num(v) for v in e["args"].values())):
            errs.append(f"{where}: counter without numeric args")
        if ph in ("i", "I") and e.get("s", "t") not in ("g", "p", "t"):
            errs.append(f"{where}: instant scope {e.get('s')!r}")
        key = (e.get("pid"), e.get("tid"))
        if ph == "B":
            open_b.setdefault(key, []).append(e)
        elif ph == "E":
            if not open_b.get(key):
                errs.append(f"{where}: E without B on {key}")
            else:
                b = open_b[key].pop()
                if _is_num(e.get("ts")) and _is_num(b.get("ts")) and e["ts"] < b["ts"]:
                    errs.append(f"{where}: E before its B")
    errs.extend(f"B without E on {k}" for k, v in open_b.items() if v)
    return errs


def test_the_checker_catches_broken_traces():
    good = {"traceEvents": [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "p"}},
                            {"name": "a", "ph": "X", "ts": 10.0, "dur": 2, "pid": 1, "tid": 0},
                            {"name": "b", "ph": "B", "ts": 11, "pid": 1, "tid": 1},
                            {"name": "b", "ph": "E", "ts": 12, "pid": 1, "tid": 1}], "displayTimeUnit": "ms"}
    assert trace_errors(good) == []
    for broken in ({"events": []}, {"traceEvents": [{"name": "a", "ph": "X", "ts": 1, "pid": 1, "tid": 0}]},
                   {"traceEvents": [{"name": "a", "ph": "Q", "ts": 1, "pid": 1, "tid": 0}]},
                   {"traceEvents": [{"name": "a", "ph": "X", "ts": "1", "dur": 1, "pid": 1, "tid": 0}]},
                   {"traceEvents": [{"name": "a", "ph": "B", "ts": 1, "pid": 1, "tid": 0}]},
                   {"traceEvents": [{"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {}}]},
                   {"traceEvents": [], "displayTimeUnit": "s"}):
        assert trace_errors(broken), broken


SCRIPT = session_training(width=64, batch=64, steps=30, dataset=True)


@requires_tf
def test_the_schedulers_trace_follows_the_format(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    run_rtkit(["run", "--quiet", "--run-dir", str(run_dir), "--set", "sched=on", "--set", "sched_stage=on", "--",
               sys.executable, str(script)], check_rc=0)
    traces = [f for f in os.listdir(run_dir) if f.startswith("trace-") and f.endswith(".json")]
    assert traces, os.listdir(run_dir)
    for name in traces:
        with open(run_dir / name) as fh:
            doc = json.load(fh)
        assert trace_errors(doc) == [], trace_errors(doc)[:10]
        kinds = {e["ph"] for e in doc["traceEvents"]}
        assert "X" in kinds and "M" in kinds     # the op and step spans, and the track names
