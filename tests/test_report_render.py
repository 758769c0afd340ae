# test_report_render.py -- `rtkit report` (terminal, --json, --html), summary lines and `rtkit compare` on real runs and edge cases.
import copy
import json
import os
import re
import statistics
import sys
from html.parser import HTMLParser

import pytest

from conftest import load_report, requires_tf, run_rtkit
from tf_scripts import session_training
from rtkit.report import compare as compare_mod
from rtkit.report import fmt, html as html_mod, summary, terminal

PY = sys.executable
TF_STEPS = 30

TF_SCRIPT = session_training(width=128, batch=256, steps=TF_STEPS)

ANSI = re.compile(r"\x1b\[")


# ---------------------------------------------------------------------------------------------
# real runs, made once per module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Real run directories from the real `rtkit run`: a TF session job, a second one with the
    scheduler on, a plain Python job, and a job that fails with exit code 3."""
    base = tmp_path_factory.mktemp("runs")
    out = {}
    script = base / "train.py"
    script.write_text(TF_SCRIPT)
    plain = "import time\nx = [bytearray(1 << 20) for _ in range(40)]\ntime.sleep(0.6)\n"
    out["plain"] = str(base / "plain")
    out["plain_proc"] = run_rtkit(["run", "--run-dir", out["plain"], "--", PY, "-c", plain], check_rc=0)
    out["fail"] = str(base / "fail")
    out["fail_proc"] = run_rtkit(["run", "--run-dir", out["fail"], "--", PY, "-c", "import sys; sys.exit(3)"],
                                 check_rc=3)
    return out, base, script


@pytest.fixture(scope="module")
def tf_runs(runs):
    out, base, script = runs
    tf = {}
    tf["a"] = str(base / "tf_a")
    tf["a_proc"] = run_rtkit(["run", "--run-dir", tf["a"], "--", PY, str(script)], check_rc=0)
    tf["b"] = str(base / "tf_b")
    tf["b_proc"] = run_rtkit(["run", "--run-dir", tf["b"], "--set", "sched=on", "--", PY, str(script)], check_rc=0)
    return tf


def report_cli(*args):
    return run_rtkit(["report", *map(str, args)])


# ---------------------------------------------------------------------------------------------
# HTML checks


class _Checker(HTMLParser):
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.tags, self.urls, self.text = [], [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.urls.extend(v for k, v in attrs if k in ("src", "href", "xlink:href") and v)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.urls.extend(v for k, v in attrs if k in ("src", "href", "xlink:href") and v)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def check_html(text):
    c = _Checker()
    c.feed(text)
    c.close()
    assert not c.errors, c.errors[:5]
    assert not c.stack, f"unclosed: {c.stack}"
    assert text.startswith("<!DOCTYPE html>")
    for bad in ("script", "link", "img", "iframe"):
        assert bad not in c.tags, f"<{bad}> in a self-contained report"
    assert not [u for u in c.urls if not u.startswith("#")], c.urls
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in text
    return c


# ---------------------------------------------------------------------------------------------
# terminal view on real runs


@requires_tf
def test_terminal_report_of_a_real_tf_run(tf_runs):
    rep = load_report(tf_runs["a"])
    assert rep["steps"]["count"] == TF_STEPS
    proc = report_cli(tf_runs["a"])
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert not ANSI.search(text), "colour codes when stdout is not a tty"
    for line in text.splitlines():
        assert len(line) <= 80, f"line over 80 columns: {line!r}"
    summ = rep["steps"]["summary"]
    assert re.search(rf"steps counted\s+{TF_STEPS} from tf.compat.v1 Session.run\n", text)
    assert re.search(rf"median step time\s+{re.escape(fmt.ms(summ['step_ms_median']))}\n", text)
    assert re.search(rf"p5 step time\s+{re.escape(fmt.ms(summ['step_ms_p5']))}\n", text)
    assert re.search(rf"p95 step time\s+{re.escape(fmt.ms(summ['step_ms_p95']))}\n", text)
    assert re.search(rf"peak RSS\s+{re.escape(fmt.nbytes(rep['process']['peak_rss_bytes']))}\n", text)
    assert re.search(rf"minor faults \(whole run\)\s+{fmt.num(rep['process']['minor_faults'])}\n", text)
    assert re.search(rf"major faults \(whole run\)\s+{fmt.num(rep['process']['major_faults'])}\n", text)
    assert "status     ok" in text.replace("status ", "status     ", 1) or re.search(r"status\s+ok", text)
    for title in ("Run", "Steps", "Process"):
        assert re.search(rf"^{title}\n-+$", text, re.M), title
    assert re.search(r"^PMEM tier: off \(tier mode needs tier_pool_path\)$", text, re.M)
    assert re.search(r"^Notes: none$|^Notes\n", text, re.M)


@requires_tf
def test_scheduler_section_of_a_real_run(tf_runs):
    rep = load_report(tf_runs["b"])
    assert isinstance(rep["scheduler"], dict), "scheduler on but no scheduler section"
    text = report_cli(tf_runs["b"]).stdout
    assert re.search(r"^Scheduler\n-+$", text, re.M)
    assert "stages:" in text
    settings = re.search(r"settings\s+(\d+) not default", text)
    assert settings and int(settings.group(1)) >= 1
    assert re.search(r"sched\s+on\s+\[cli\]", text)


def test_terminal_report_of_a_failed_run(runs):
    out, _, _ = runs
    text = report_cli(out["fail"]).stdout
    assert re.search(r"status\s+failed", text)
    assert re.search(r"exit code\s+3", text)
    assert re.search(r"^Steps\n-+\n\s+steps counted\s+0 \(source: none\)", text, re.M)
    assert re.search(r"^Allocator \(PRMalloc\): off$", text, re.M) or "Allocator (PRMalloc)\n" in text


def test_summary_lines_real_run(runs):
    out, _, _ = runs
    rep = load_report(out["plain"])
    lines = summary.lines(rep)
    assert 3 <= len(lines) <= 8
    assert all(line.startswith("rtkit: ") for line in lines)
    assert lines[0].startswith("rtkit: ok (exit 0)")
    assert lines[-1] == f"rtkit: report: {os.path.join(out['plain'], 'report.json')}"
    assert fmt.nbytes(rep["process"]["peak_rss_bytes"]) in "\n".join(lines)
    # rtkit run itself printed them on stderr
    assert lines[0] in out["plain_proc"].stderr


@requires_tf
def test_summary_lines_have_steps(tf_runs):
    rep = load_report(tf_runs["a"])
    text = "\n".join(summary.lines(rep))
    assert f"steps: {TF_STEPS} counted from tf.compat.v1 Session.run" in text
    assert f"median step time {fmt.ms(rep['steps']['summary']['step_ms_median'])}" in text
    assert f"steps: {TF_STEPS} counted from tf.compat.v1 Session.run" in tf_runs["a_proc"].stderr


def test_json_flag_prints_the_report(runs):
    out, _, _ = runs
    proc = report_cli(out["plain"], "--json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == load_report(out["plain"])


# ---------------------------------------------------------------------------------------------
# HTML on real runs


@requires_tf
def test_html_report_of_a_real_run(tf_runs, tmp_path):
    proc = report_cli(tf_runs["a"], "--html")
    assert proc.returncode == 0, proc.stderr
    path = os.path.join(tf_runs["a"], "report.html")
    assert proc.stdout.strip() == path
    text = open(path, encoding="utf-8").read()
    c = check_html(text)
    assert c.tags.count("svg") >= 3, "RSS, step time and faults plots"
    for title in ("RSS over time", "Step time per step", "Minor page faults per step"):
        assert title in text
    rep = load_report(tf_runs["a"])
    body = "".join(c.text)
    assert fmt.ms(rep["steps"]["summary"]["step_ms_median"]) in body
    assert fmt.nbytes(rep["process"]["peak_rss_bytes"]) in body
    # one polyline point per step in the step-time plot
    step_svg = text[text.index("Step time per step"):]
    points = re.search(r'<polyline[^>]*points="([^"]+)"', step_svg).group(1).split()
    assert len(points) == TF_STEPS
    # `--html RUN_DIR` (flag first, no PATH) writes the default file too
    os.unlink(path)
    proc = report_cli("--html", tf_runs["a"])
    assert proc.returncode == 0 and proc.stdout.strip() == path and os.path.exists(path)
    # explicit path
    other = tmp_path / "x.html"
    proc = report_cli(tf_runs["a"], "--html", other)
    assert proc.returncode == 0 and other.exists()


def test_html_of_failed_run_without_steps(runs, tmp_path):
    out, _, _ = runs
    dest = tmp_path / "f.html"
    assert report_cli(out["fail"], "--html", dest).returncode == 0
    text = dest.read_text()
    check_html(text)
    assert "Step time per step" not in text           # no steps, no step plot
    assert 'class="status failed"' in text


# ---------------------------------------------------------------------------------------------
# bad input


def test_missing_or_bad_run_dir(tmp_path):
    for args in ([tmp_path / "nope"], [tmp_path], [tmp_path / "nope", "--json"], [tmp_path / "nope", "--html"]):
        proc = report_cli(*args)
        assert proc.returncode == 2, args
        assert proc.stdout == ""
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("rtkit: "), proc.stderr
    proc = report_cli()
    assert proc.returncode == 2 and "RUN_DIR is required" in proc.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "report.json").write_text("{ not json")
    proc = report_cli(bad)
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr
    (bad / "report.json").write_text("[1, 2]")
    proc = report_cli(bad)
    assert proc.returncode == 2 and "not an rtkit report" in proc.stderr
    proc = run_rtkit(["compare", str(tmp_path / "nope"), str(bad)])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("version", [1, 2])
def test_a_report_of_a_previous_schema_is_one_line(runs, tmp_path, version):
    """A report.json of an older schema_version (1: the tier's figures inside the allocator's, no bounds section;
    2: the tier's settings echoed under their pmem_* names) is not rebuilt into today's shape: `rtkit report` and
    `rtkit compare` say so in one line and exit 2."""
    out, _, _ = runs
    rep = load_report(out["plain"])
    rep["schema_version"] = version
    if version == 1:
        del rep["bounds"]
    else:
        rep["pmem"] = {"state": "on", "pmem_path": "/dev/shm/pool", "medium": "tmpfs", "pmem_size": 1 << 30}
    old = tmp_path / "old"
    old.mkdir()
    (old / "report.json").write_text(json.dumps(rep))
    for args in ([old], [old, "--json"], [old, "--html", tmp_path / "old.html"]):
        proc = report_cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and f"schema_version {version}" in proc.stderr, proc.stderr
    assert not (tmp_path / "old.html").exists()
    for pair in ([old, out["plain"]], [out["plain"], old]):
        proc = run_rtkit(["compare", *map(str, pair)])
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.count("\n") == 1 and f"schema_version {version}" in proc.stderr, proc.stderr


def test_html_unwritable_path(runs, tmp_path):
    out, _, _ = runs
    proc = report_cli(out["plain"], "--html", tmp_path / "no" / "such" / "dir" / "r.html")
    assert proc.returncode == 2
    assert proc.stderr.startswith("rtkit: cannot write")


def test_html_unwritable_path_of_a_cluster_folder(tmp_path):
    """The same one line for a cluster folder's HTML (one helper writes both)."""
    task = tmp_path / "c" / "worker-0"
    task.mkdir(parents=True)
    (task / "task.json").write_text(json.dumps({"role": "worker", "index": 0, "status": "ok", "dir": "worker-0"}))
    proc = report_cli(tmp_path / "c", "--html", tmp_path / "no" / "such" / "r.html")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith(f"rtkit: cannot write '{tmp_path / 'no' / 'such' / 'r.html'}'")


def _wide_report(runs, tmp_path):
    """A copy of a real run's report with values long enough to wrap at any width."""
    out, _, _ = runs
    rep = load_report(out["plain"])
    rep["notes"] = ["word " * 80]
    d = tmp_path / "wide"
    d.mkdir()
    (d / "report.json").write_text(json.dumps(rep))
    return d


def _report_on(d, tty_cols=None):
    """`rtkit report D` with stdout a pipe, or a terminal `tty_cols` wide (a pty); COLUMNS unset."""
    import pty, fcntl, struct, subprocess, termios
    from conftest import RTKIT
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if tty_cols is None:
        return subprocess.run([RTKIT, "report", str(d)], env=env, capture_output=True, text=True, check=True).stdout
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, tty_cols, 0, 0))
    proc = subprocess.Popen([RTKIT, "report", str(d)], env={**env, "NO_COLOR": "1"}, stdout=slave,
                            stderr=subprocess.PIPE)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:   # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    assert proc.returncode == 0, proc.stderr.read()
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_report_width_follows_the_terminal_and_is_80_on_a_pipe(runs, tmp_path):
    d = _wide_report(runs, tmp_path)
    piped = _report_on(d).splitlines()
    assert max(map(len, piped)) <= 80 and max(map(len, piped)) >= 75
    wide = _report_on(d, tty_cols=132).splitlines()
    assert 100 < max(map(len, wide)) <= 132, max(map(len, wide))
    narrow = _report_on(d, tty_cols=70).splitlines()
    assert max(map(len, narrow)) <= 70


# ---------------------------------------------------------------------------------------------
# compare


@requires_tf
def test_compare_two_real_runs(tf_runs):
    a, b = load_report(tf_runs["a"]), load_report(tf_runs["b"])
    proc = run_rtkit(["compare", tf_runs["a"], tf_runs["b"], "--json"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    metrics = {m["key"]: m for m in data["metrics"]}
    expect = {
        "step_ms_median": (a["steps"]["summary"]["step_ms_median"], b["steps"]["summary"]["step_ms_median"]),
        "step_ms_p95": (a["steps"]["summary"]["step_ms_p95"], b["steps"]["summary"]["step_ms_p95"]),
        "steps_per_s": (a["steps"]["summary"]["steps_per_s"], b["steps"]["summary"]["steps_per_s"]),
        "peak_rss_bytes": (a["process"]["peak_rss_bytes"], b["process"]["peak_rss_bytes"]),
        "cpu_s": (a["process"]["cpu_user_s"] + a["process"]["cpu_system_s"],
                  b["process"]["cpu_user_s"] + b["process"]["cpu_system_s"]),
    }
    for key, (va, vb) in expect.items():
        m = metrics[key]
        assert m["a"] == pytest.approx(va) and m["b"] == pytest.approx(vb), key
        assert m["ratio"] == pytest.approx(vb / va), key
    assert metrics["steps"]["a"] == metrics["steps"]["b"] == TF_STEPS
    assert any(d["key"] == "sched" and d["a"] is False and d["b"] is True for d in data["settings_differ"])
    assert {"component": "scheduler", "a": "off", "b": "on"} in data["components_differ"]
    text = run_rtkit(["compare", tf_runs["a"], tf_runs["b"]], env={"COLUMNS": "80"}).stdout
    for line in text.splitlines():
        assert len(line) <= 80, line
    row = next(l for l in text.splitlines() if l.startswith("median step time"))
    m = metrics["step_ms_median"]
    assert fmt.ms(m["a"]) in row and fmt.ms(m["b"]) in row and fmt.ratio(m["ratio"]) in row
    head_a, head_b = text.split("\nB: ")[0], text.split("\nB: ")[1].split("\n\n")[0]
    assert "scheduler off" in head_a and "scheduler on" in head_b
    # the settings that differ come before the figures, and a wide terminal gets whole paths
    assert text.index("  sched: off -> on") < text.index("figures (")
    wide = run_rtkit(["compare", tf_runs["a"], tf_runs["b"]], env={"COLUMNS": "200"}).stdout
    assert f"A: {tf_runs['a']}  [ok]" in wide and max(len(l) for l in wide.splitlines()) > 80
    assert run_rtkit(["compare", tf_runs["a"], tf_runs["b"], "--width", "200"]).stdout == wide


def test_compare_ratios_on_a_modified_copy(runs, tmp_path):
    """A copy of a real report with known changes: ratios and verdicts must follow exactly."""
    out, _, _ = runs
    a = load_report(out["plain"])
    # enough steps, tightly spread, for the step figures to get verdicts (the noise rule wants samples)
    a["steps"]["per_step"] = [{"step": i + 1, "step_ms": 10.0 + (i % 3) * 0.01, "minor_faults": 40} for i in range(30)]
    a["steps"]["warmup_steps"] = 0
    b = copy.deepcopy(a)
    b["steps"]["per_step"] = [dict(x, step_ms=x["step_ms"] * 0.8, minor_faults=0) for x in a["steps"]["per_step"]]
    a["steps"]["summary"].update(step_ms_median=10.0, step_ms_p95=20.0, steps_per_s=100.0,
                                 minor_faults_per_step_median=40)
    b["steps"]["summary"].update(step_ms_median=8.0, step_ms_p95=30.0, steps_per_s=125.0,
                                 minor_faults_per_step_median=0)
    b["process"]["peak_rss_bytes"] = a["process"]["peak_rss_bytes"] * 2
    a["allocator"] = None
    b["allocator"] = {"state": "planned", "hit_rate": 0.9, "totals": {"arena_hits": 900, "fallbacks": 100}}
    data = compare_mod.compare(a, b)
    m = {x["key"]: x for x in data["metrics"]}
    assert m["step_ms_median"]["ratio"] == pytest.approx(0.8) and m["step_ms_median"]["better"] == "b"
    assert m["step_ms_p95"]["ratio"] == pytest.approx(1.5) and m["step_ms_p95"]["better"] == "a"
    assert m["steps_per_s"]["ratio"] == pytest.approx(1.25) and m["steps_per_s"]["better"] == "b"
    assert m["peak_rss_bytes"]["ratio"] == pytest.approx(2.0) and m["peak_rss_bytes"]["better"] == "a"
    assert m["faults_per_step_median"]["ratio"] == 0.0 and m["faults_per_step_median"]["better"] == "b"
    assert m["hit_rate"]["a"] is None and m["hit_rate"]["b"] == pytest.approx(0.9)
    assert m["hit_rate"]["ratio"] is None
    text = compare_mod.render(a, b, width=100)
    assert re.search(r"median step time\s+10\.0 ms\s+8\.00 ms\s+0\.80x\s+B better", text)
    assert re.search(r"peak RSS .*2\.00x\s+A better", text)
    assert re.search(r"arena hit rate \(whole run\)\s+-\s+90\.0%\s+-", text)
    assert "what differs (A -> B):" in text and "allocator: off -> planned" in text


def test_compare_marks_ratios_inside_the_runs_noise(runs):
    """Two runs whose steps scatter widely: a 5% median difference is noise, a 2x one is not; a tiny
    after-plan fault figure (0.05 vs 1.9 faults/step) is never '37x better'."""
    out, _, _ = runs
    a = load_report(out["plain"])
    per = [{"step": i + 1, "t_s": i * 0.1, "step_ms": 100.0 * (0.7 + 0.6 * ((i * 7) % 10) / 10), "minor_faults": 3}
           for i in range(30)]
    a["steps"]["per_step"], a["steps"]["warmup_steps"] = per, 0
    a["steps"]["summary"].update(step_ms_median=100.0, steps_per_s=10.0)
    b = copy.deepcopy(a)
    b["steps"]["per_step"] = [dict(x, step_ms=x["step_ms"] * 1.05) for x in per]
    b["steps"]["summary"].update(step_ms_median=105.0, steps_per_s=9.52)
    # after the plan most steps take no fault; one step in B took 50 (a spike, not a trend)
    a["allocator"] = {"state": "planned", "minor_faults_per_step_after_plan": 0.05, "plan": {"made_at_step": 4},
                      "per_step": [{"step": i, "minor_faults": 1 if i == 10 else 0} for i in range(1, 31)]}
    b["allocator"] = {"state": "planned", "minor_faults_per_step_after_plan": 1.9, "plan": {"made_at_step": 4},
                      "per_step": [{"step": i, "minor_faults": 50 if i == 20 else 0} for i in range(1, 31)]}
    m = {x["key"]: x for x in compare_mod.compare(a, b)["metrics"]}
    assert m["step_ms_median"]["within_noise"] and m["step_ms_median"]["better"] is None
    assert m["step_ms_median"]["noise"] > 0.05
    assert m["faults_after_plan"]["within_noise"] and m["faults_after_plan"]["better"] is None
    text = compare_mod.render(a, b, width=120)
    assert re.search(r"median step time .*1\.05x\s+within noise", text)
    b["steps"]["per_step"] = [dict(x, step_ms=x["step_ms"] * 2) for x in per]
    b["steps"]["summary"].update(step_ms_median=200.0)
    m = {x["key"]: x for x in compare_mod.compare(a, b)["metrics"]}
    assert m["step_ms_median"]["better"] == "a" and not m["step_ms_median"]["within_noise"]


# ---------------------------------------------------------------------------------------------
# hand-made sections (allocator / pmem / scheduler shapes) and robustness


def full_report(base):
    """A real report with allocator, pmem and scheduler sections filled in by hand, under the keys of
    rtkit/report/contract.py (the allocator's and scheduler's only in part: test_report_contract.py checks
    the real writers)."""
    rep = copy.deepcopy(base)
    n = 20
    rep["steps"]["count"] = n
    rep["steps"]["source"] = "session"
    rep["steps"]["per_step"] = [{"step": i + 1, "t_s": 0.1 * i, "step_ms": 50.0 + (i % 3), "minor_faults": 900 if i < 5 else 1,
                                 "rss_bytes": 10 << 20} for i in range(n)]
    rep["steps"]["summary"].update(measured_steps=n - 3, step_ms_median=51.0, step_ms_p5=50.0, step_ms_p95=52.0,
                                   step_ms_mean=51.0, steps_per_s=19.6, minor_faults_per_step_median=1)
    rep["allocator"] = {
        "state": "planned", "hit_rate": 0.975, "totals": {"arena_hits": 39000, "fallbacks": 1000},
        "minor_faults_per_step_before_plan": 2100.0, "minor_faults_per_step_after_plan": 0.25,
        "plan": {"classes": [{"size_bytes": 65536 << k, "blocks": 2, "reserved_bytes": 131072 << k} for k in range(3)],
                 "reserved_bytes": 3 * (1 << 30) // 2, "spacing": 1.25},
        "per_step": [{"step": i + 1, "arena_hits": 0 if i < 5 else 2000, "fallbacks": 2000 if i < 5 else 30}
                     for i in range(n)],
        "notes": ["plan from steps 3-5"],
    }
    rep["pmem"] = {"state": "on", "tier_pool_path": "/dev/shm/pool", "tier_pool_size": 1 << 30, "tier_bytes": 300 << 20,
                   "tier_resident_max": 256 << 20, "background_moves": 7,
                   "classes": [{"record_bytes": 64 << k, "allocations": 10 * k} for k in range(3)]}
    rep["scheduler"] = {
        "stages": {"input": {"ops": 12, "op_time_ms_per_step": 4.5}, "embedding": {"ops": 80, "op_time_ms_per_step": 20.0},
                   "dense": {"ops": 40, "op_time_ms_per_step": 15.0}, "apply": {"ops": 9, "op_time_ms_per_step": 2.0}},
        "chosen": {"compute_threads": 2, "input_threads": 1},
        "tuning": {"done": True, "steps_used": 12,
                   "trials": [{"compute_threads": c, "input_threads": 1, "step_ms_median": 40.0 + c} for c in (1, 2, 4)]},
        "speedup_over_first_x": 1.15,
        "pipeline": {"enabled": True, "occupancy_mean_batches": 1.5, "occupancy_samples_batches": [1, 2, 2, 1, 1, 2]},
        "notes": ["input stage pipelined"],
    }
    rep["notes"] = ["a run note"]
    return rep


def test_component_sections_terminal(runs):
    out, _, _ = runs
    rep = full_report(load_report(out["plain"]))
    text = terminal.render(rep)
    for line in text.splitlines():
        assert len(line) <= 80, line
    assert re.search(r"allocator state\s+planned", text)
    assert re.search(r"plan classes\s+3 classes, 6 blocks, spacing 1\.25", text)
    assert re.search(r"arena bytes reserved\s+1\.50 GiB", text)
    assert re.search(r"arena hit rate \(whole run\)\s+97\.5%", text)
    assert re.search(r"mean minor faults/step before plan \(step to step\)\s+2,100", text)
    assert re.search(r"mean minor faults/step after plan \(step to step\)\s+0\.25", text)
    assert re.search(r"^\s+64\.0 KiB\s+2\s+128\.0 KiB$", text, re.M)
    assert re.search(r"tier pool size\s+1\.00 GiB", text) and re.search(r"background moves\s+7", text)
    assert re.search(r"tier resident max\s+256\.0 MiB", text)   # a size setting's echo, whatever its suffix
    assert re.search(r"scheduler configuration\s+compute_threads=2, input_threads=1", text)
    assert re.search(r"tuning gain\s+15%", text)
    assert re.search(r"mean pipeline occupancy\s+1\.5\n", text)
    assert re.search(r"^\s+embedding\s+80\s+20\.0 ms$", text, re.M)
    assert re.search(r"tuning trials\s+3 \(12 steps used\)", text)
    assert "- plan from steps 3-5" in text and "- input stage pipelined" in text and "- a run note" in text
    lines = summary.lines(rep)
    assert 4 <= len(lines) <= 9
    assert any("allocator: planned, arena hit rate (whole run) 97.5%" in l for l in lines)
    assert any("scheduler:" in l and "tuning gain 15%" in l for l in lines)
    assert any("memory:" in l and "mean minor faults/step after plan (step to step) 0.25" in l for l in lines)
    # schema 1 scheduler: pipelines are not counted as steps, so nothing is called pipelined
    assert not any("pipelined steps" in l for l in lines)


def test_component_sections_html(runs, tmp_path):
    out, _, _ = runs
    rep = full_report(load_report(out["plain"]))
    path = html_mod.write(rep, str(tmp_path / "r.html"))
    text = open(path).read()
    c = check_html(text)
    assert "Allocator: arena hits and fallbacks per step" in text
    assert "Tuning trials: median step time" in text
    assert "Pipeline occupancy" in text
    assert c.tags.count("svg") >= 6
    body = "".join(c.text)
    assert "97.5%" in body and "1.50 GiB" in body and "15%" in body


def test_sections_off_are_one_line(runs):
    out, _, _ = runs
    rep = load_report(out["plain"])
    rep["allocator"] = rep["pmem"] = rep["scheduler"] = None
    text = terminal.render(rep)
    for name in ("Allocator (PRMalloc)", "PMEM tier", "Scheduler"):
        assert re.search(rf"^{re.escape(name)}: off( \(.*\))?$", text, re.M), name
    assert not any("allocator" in l for l in summary.lines(rep))


def _paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


@pytest.mark.slow  # hundreds of renders (~6 s of CPU)
def test_renderers_survive_missing_and_null_fields(runs):
    """Drop or null every field of a full report in turn: every view still renders."""
    out, _, _ = runs
    full = full_report(load_report(out["plain"]))
    full["process"]["samples"] = full["process"]["samples"][:3]
    for path in list(_paths(full)):
        for mode in ("drop", "null", "text"):
            rep = copy.deepcopy(full)
            node = rep
            for k in path[:-1]:
                node = node[k]
            if mode == "drop":
                del node[path[-1]]
            else:
                node[path[-1]] = None if mode == "null" else "weird"
            terminal.render(rep)
            summary.lines(rep)
            check_html(html_mod.render(rep))
            compare_mod.render(full, rep)


def test_long_values_wrap_within_80_columns(runs):
    out, _, _ = runs
    rep = load_report(out["plain"])
    rep["run"]["command"] = [PY, "-c", "x" * 300]
    rep["notes"] = ["n" * 50 + " " + "word " * 60]
    rep["steps"]["other_signatures"] = [{"signature": "fetch:" + "y" * 200, "count": 3}]
    text = terminal.render(rep)
    assert all(len(l) <= 80 for l in text.splitlines())
    assert "x" * 40 in text


# ---------------------------------------------------------------------------------------------
# the SVG helpers


def test_svg_ticks_cover_the_data_and_outliers_are_cut():
    from rtkit.report import svg
    for lo, hi in ((0, 78), (0, 80), (0, 0.003), (3, 3), (0, 1e9), (-5, 17)):
        ticks = svg.nice_ticks(lo, hi)
        assert ticks[0] <= lo and ticks[-1] >= hi and len(ticks) >= 2
    assert svg.clip_cap([10] * 30) is None
    assert svg.clip_cap([4000] + [25] * 50) == pytest.approx(svg.nice_ticks(0, 62.5)[-1])
    assert svg.clip_cap([0] * 20 + [900]) is None           # nothing to compare the outlier with
    pts = [(i, 25.0) for i in range(1, 60)] + [(60, 4000.0)]
    chart = svg.line_chart([("t", pts)], "T", "step", "ms", clip=True)
    assert "1 point(s) above" in chart and "max 4000" in chart
    ys = [float(p.split(",")[1]) for p in re.search(r'points="([^"]+)"', chart).group(1).split()]
    assert min(ys) >= 30 - 0.01        # nothing drawn above the plot's top edge
    bars = svg.bar_chart([("h", [(i, 10) for i in range(40)] + [(40, 5000)])], "B", "step", "n")
    assert "1 bar(s) above" in bars
    groups = "".join(re.findall(r'<g fill="[^"]+">(.*?)</g>', bars))
    tops = [float(y) for y in re.findall(r'<rect x="[^"]+" y="([^"]+)"', groups)]
    assert len(tops) == 41 and min(tops) >= 30 - 0.01   # the cut bar stops at the plot's top edge
    many = [(i, float(i % 7)) for i in range(100000)]
    assert len(svg.downsample(many)) <= 1500


# ---------------------------------------------------------------------------------------------
# what `rtkit run` prints, and the API behind the steps


def test_quiet_prints_nothing_on_success_and_the_summary_on_failure(tmp_path):
    ok = run_rtkit(["run", "--quiet", "--run-dir", str(tmp_path / "ok"), "--", PY, "-c", "pass"], check_rc=0)
    assert ok.stderr == "" and ok.stdout == ""
    assert os.path.isfile(tmp_path / "ok" / "report.json")
    bad = run_rtkit(["run", "--quiet", "--run-dir", str(tmp_path / "bad"), "--", PY, "-c", "raise SystemExit(4)"],
                    check_rc=4)
    assert "rtkit: failed (exit 4)" in bad.stderr and "rtkit: report: " in bad.stderr


@requires_tf
def test_make_callable_steps_are_named_so(tmp_path):
    script = tmp_path / "cb.py"
    script.write_text(TF_SCRIPT.replace("""    for i in range({n}):
        s.run([loss, train], {{x: np.random.rand(256, 128).astype(np.float32)}})""".format(n=TF_STEPS), f"""    step = s.make_callable([loss, train], feed_list=[x])
    for i in range({TF_STEPS}):
        step(np.random.rand(256, 128).astype(np.float32))"""))
    assert "make_callable" in script.read_text()
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", PY, str(script)], check_rc=0)
    rep = load_report(str(tmp_path / "r"))
    assert rep["steps"]["count"] == TF_STEPS and rep["steps"]["api"] == "tf.compat.v1 Session.make_callable"
    assert f"steps: {TF_STEPS} counted from tf.compat.v1 Session.make_callable" in proc.stderr


def test_compare_across_schema_versions(runs):
    """A report of another schema version (keys renamed or missing, sections of another shape) compares: the
    header says the versions differ and what one of them lacks is '-'."""
    out, _, _ = runs
    a = load_report(out["plain"])
    b = copy.deepcopy(a)
    b["schema_version"] = a["schema_version"] + 1
    del b["steps"]["summary"]["step_ms_p95"]
    b["scheduler"] = {"schema_version": 2, "chosen": {"compute_threads": 2}, "pipeline": {"staged_steps": 0,
                      "not_staged_reason": "no tf.data input"}, "tuning": None}
    text = compare_mod.render(a, b, width=100)
    assert f"report schema versions differ (A {a['schema_version']}, B {b['schema_version']})" in text
    assert "scheduler: off -> on" in text
    data = compare_mod.compare(a, b)
    m = {x["key"]: x for x in data["metrics"]}
    assert m["pipelined_steps"]["a"] is None and m["pipelined_steps"]["b"] == 0
    assert "no step pipelined (no tf.data input)" in "\n".join(summary.lines(b))


def test_scheduler_words_say_an_unstaged_step_ran_the_script_graph():
    """With staging off on a staged graph, an unstaged step is the script's own run: the summary says so
    (and reports of schedulers that did not count unstaged steps do not claim it)."""
    from rtkit.report import scheduler_outcome

    tuned_off = {"tuning": {"done": True, "chosen": {"stage_pipelined": False}}}
    sc = {"pipeline": {"staged_steps": 24, "unstaged_steps": 176}, **tuned_off}
    assert scheduler_outcome.pipeline(sc).endswith("(in tuning trials; the chosen configuration does not pipeline: the script's "
                                       "own graph ran, 0 extra runs per step)")
    sc = {"pipeline": {"staged_steps": 0, "unstaged_steps": 200}}
    assert scheduler_outcome.pipeline(sc) == "no step pipelined (staging off: the script's own graph ran, 0 extra runs per step)"
    old = {"pipeline": {"staged_steps": 24}, **tuned_off}
    assert "0 extra runs" not in scheduler_outcome.pipeline(old)


def test_scheduler_words_for_tf_function_steps_name_the_global_pools_not_keras_fit():
    """A TF2 custom loop's steps run on TensorFlow's global pools, which the scheduler set; its eager tf.data input
    got the stage options. The summary says so, and never speaks of a Keras fit that did not run."""
    from rtkit.report import scheduler_outcome

    sc = {"keras": {"applied": True, "inter_op_threads": 2, "intra_op_threads": 2,
                    "datasets": [{"private_threadpool_size": 1, "prefetch": 2}]}, "pipeline": {"staged_steps": 0}}
    words = scheduler_outcome.applied(sc, "function")
    assert words == ("applied to TensorFlow's global thread pools (the tf.function steps run on them): "
                     "inter_op_threads=2, intra_op_threads=2, the loop's tf.data input: private threadpool size 1, "
                     "prefetch 2"), words
    assert "Keras" not in scheduler_outcome.pipeline(sc)
    tuning = scheduler_outcome.tuning({"steps": {"source": "function"}}, {"done": False, "steps_used": 0})
    assert tuning == "no tuning (the tuner times session steps; tf.function calls run none)", tuning
    assert scheduler_outcome.applied(sc, "keras").startswith("applied to Keras: ")
    assert "applied to" not in scheduler_outcome.applied(sc, "session")


def test_lookahead_words_count_tables_in_the_singular_and_plural():
    from rtkit.report import scheduler_outcome

    def words(n):
        la = {"state": "on", "mode": "on", "rows_from": "feeds", "pages_requested": 10, "bytes_requested": 40960,
              "batches": 3, "resident_share": 0.5, "tables_measured": n, "worker_cpu_s": 0.1}
        return scheduler_outcome.lookahead({"pipeline": {"lookahead": la}})
    assert "(mincore, 1 table)" in words(1) and "(mincore, 2 tables)" in words(2), (words(1), words(2))


def test_lookahead_words_say_the_pager_answered_for_its_pages_where_it_ran():
    # rtkit_tier_resident reads the pager's books for the pages it holds: "mincore" would not be true there
    from rtkit.report import scheduler_outcome, sections, summary

    la = {"state": "on", "mode": "on", "rows_from": "feeds", "pages_requested": 10, "bytes_requested": 40960,
          "batches": 3, "resident_share": 0.5, "tables_measured": 2, "worker_cpu_s": 0.1}
    sc = {"lookahead_only": True, "state": "off (sched=0)", "pipeline": {"enabled": False, "lookahead": la}}
    paged = {"scheduler": sc, "pmem": {"pager": {"on": True}}}
    assert "(the pager, 2 tables)" in summary.scheduler_line(paged)
    assert "(the pager, 2 tables)" in dict(sections.scheduler_section(paged).rows)["lookahead"]
    assert "(mincore, 2 tables)" in summary.scheduler_line({"scheduler": sc, "pmem": {"pager": {"on": False}}})


def test_a_staged_lookahead_that_backed_off_says_how_many_batches_it_did_not_look_at():
    # the share resident is of the batches looked at: the line must not read as if it covered every batch
    from rtkit.report import scheduler_outcome

    la = {"state": "on", "mode": "on", "rows_from": "staged batch", "pages_requested": 10, "bytes_requested": 40960,
          "batches": 2000, "resident_share": 0.99, "tables_measured": 52, "worker_cpu_s": 1.0, "late_batches": 0,
          "wasted_pages": 0, "skipped_steps": 1231}
    text = scheduler_outcome.lookahead({"pipeline": {"enabled": True, "lookahead": la}})
    assert text.endswith(", 1,231 batches not looked at (backing off: the batches looked at before them had almost "
                         "all their pages in DRAM already)"), text


def test_the_lookahead_alone_is_said_as_the_scheduler_off_and_what_it_did():
    """The scheduler off, its lookahead of fed ids alone (tier mode): the summary and the Scheduler section say the
    scheduler was off and what the lookahead did, never that a configuration was applied or steps not pipelined;
    a lookahead that found no fed table gather says why; regions not found in the pool are said."""
    from rtkit.report import scheduler_outcome, sections, summary

    la = {"state": "on", "mode": "on", "rows_from": "feeds", "pages_requested": 10, "bytes_requested": 40960,
          "batches": 3, "resident_share": 0.5, "tables_measured": 1, "worker_cpu_s": 0.1, "regions": 2,
          "regions_found": 1}
    sc = {"lookahead_only": True, "state": "off (sched=0)", "stages": None, "chosen": None, "tuning": None,
          "speedup_over_first_x": None, "errors": [], "notes": [],
          "pipeline": {"enabled": False, "occupancy_mean_batches": None, "occupancy_samples_batches": [],
                       "lookahead": la}}
    line = summary.scheduler_line({"scheduler": sc})
    assert line == ("rtkit: scheduler: off (sched=0: no thread pools, staging or tuning); only its lookahead of fed "
                    "ids ran (tier mode); lookahead 10 pages (40.0 KiB of rows) requested together just before their "
                    "steps (rows from the steps' feeds) over 3 steps, 50.0% of the step's pages resident already "
                    "(mincore, 1 table), 1 of 2 tables and optimizer slots found in the pool, CPU 0.1 s"), line
    rows = dict(sections.scheduler_section({"scheduler": sc}).rows)
    assert set(rows) == {"state", "lookahead"} and rows["lookahead"] in line, rows
    off = dict(la, state="off", off_reason="no table rows from the runs' feeds: no gather of a table variable")
    sc_off = dict(sc, pipeline=dict(sc["pipeline"], lookahead=off))
    assert scheduler_outcome.lookahead(sc_off) == "lookahead off (no table rows from the runs' feeds: no gather " \
        "of a table variable)"
    assert compare_mod._state({"scheduler": sc})["scheduler"] == "lookahead only"
    # gathers whose indices are not computable from the feeds (word2vec's NCE weights, at sampled ids) are said
    skipped = dict(la, gathers_skipped=["loss/nce_loss/embedding_lookup: its indices come from "
                                        "LogUniformCandidateSampler (x), which writes state"] * 2)
    text = scheduler_outcome.lookahead(dict(sc, pipeline=dict(sc["pipeline"], lookahead=skipped)))
    assert text.endswith(", CPU 0.1 s, 2 other table gathers not looked at (gathers_skipped says why)"), text
    # the wall time the steps waited for it (part of their step times), measuring only as well
    timed = scheduler_outcome.lookahead(dict(sc, pipeline=dict(sc["pipeline"], lookahead=dict(
        la, before_s=0.53, pages_read_ahead=4))))
    assert timed.endswith("found in the pool, 4 not resident read ahead, CPU 0.1 s, the steps waited 0.53 s for it "
                          "in all"), timed
    timed = scheduler_outcome.lookahead(dict(sc, pipeline=dict(sc["pipeline"], lookahead=dict(
        la, mode="measure", before_s=0.39))))
    assert timed.endswith("found in the pool, the steps waited 0.39 s for it in all"), timed


def test_scheduler_section_and_summary_put_the_bound_beside_the_staged_step():
    """The overlap bound and the staged step over it: in the Scheduler section's rows and on the summary line,
    with the input and compute they come from; nothing when no probe step measured them."""
    from rtkit.report import sections, summary

    bound = {"input_ms": 39.0, "compute_ms": 21.0, "input_cpu_pct": 25.0, "bound_x": 0.65, "x_of_bound": 1.04}
    rep = {"scheduler": {"pipeline": {"staged_steps": 150, "overlap_bound": bound}}}
    rows = dict((k.strip(), v) for k, v, *_ in sections.scheduler_section(rep).rows)
    text = rows["overlap bound (staged step / unstaged step, at best)"]
    assert text.startswith("0.65x (input 39.0 ms, compute 21.0 ms, each alone; input CPU 25% of its wall time)"), text
    assert text.endswith("staged step / the bound 1.04x"), text
    line = summary.scheduler_line(rep)
    assert "overlap bound (staged step / unstaged step, at best) 0.65x" in line and "the bound 1.04x" in line, line
    del bound["x_of_bound"]
    assert "no staged step after tuning" in summary.scheduler_line(rep)
    rep["scheduler"]["pipeline"].pop("overlap_bound")
    assert "overlap bound" not in summary.scheduler_line(rep)
    assert not any("overlap bound" in str(r[0]) for r in sections.scheduler_section(rep).rows)


def test_not_default_lists_only_settings_whose_value_differs(runs):
    """A profile that restates defaults (throughput includes default, which sets malloc/hooks to their defaults)
    changes only what it sets to other values: "not default" names those, as compare's "what differs" does."""
    from rtkit import config
    out, _, _ = runs
    rep = load_report(out["plain"])
    rep["run"]["settings"] = config.resolve(profile="throughput").as_report()
    text = terminal.render(rep, width=120)
    listed = re.findall(r"^\s+(\w+)\s+.*\[(?:cli|env|profile:[\w-]+)\]$", text, re.M)
    n = re.search(r"settings\s+(\d+) not default", text)
    base = copy.deepcopy(rep)
    base["run"]["settings"] = config.resolve().as_report()
    differ = [d["key"] for d in compare_mod.compare(base, rep)["settings_differ"]]
    assert differ and sorted(listed) == differ and n and int(n.group(1)) == len(differ), text
    assert all(config.BY_KEY[k].default != rep["run"]["settings"][k]["value"] for k in listed)


def test_compare_gives_no_verdict_on_single_samples_or_few_epochs(runs):
    """Whole-run figures are one sample per run and a median of 5 epochs says nothing of its spread: within
    noise, unless the difference is past the rule's bands (glossary.MIN_SAMPLES, WHOLE_RUN_BAND, the floors)."""
    out, _, _ = runs
    a = load_report(out["plain"])
    b = copy.deepcopy(a)
    a["process"]["major_faults"], b["process"]["major_faults"] = 4, 14
    a["run"]["duration_s"], b["run"]["duration_s"] = 10.0, 12.7
    for r, epochs in ((a, [4.0, 4.1, 3.9, 4.2, 4.0]), (b, [3.0, 3.1, 2.9, 3.0, 3.05])):
        r["steps"]["keras"] = {"epochs": 5, "epoch_s": epochs, "epoch_s_median": sorted(epochs)[2]}
    m = {x["key"]: x for x in compare_mod.compare(a, b)["metrics"]}
    for key in ("major_faults", "duration_s", "epoch_s_median"):
        assert m[key]["within_noise"] and m[key]["better"] is None, (key, m[key])
    text = compare_mod.render(a, b, width=120)
    assert re.search(r"major faults \(whole run\)\s+4\s+14\s+3\.50x\s+within noise", text), text
    # past the bands: 3x wall time, thousands of major faults, 20 epochs each clearly apart
    b["run"]["duration_s"] = 30.0
    a["process"]["major_faults"], b["process"]["major_faults"] = 400, 1400
    for r, e in ((a, 4.0), (b, 3.0)):
        epochs = [e + 0.01 * (i % 3) for i in range(20)]
        r["steps"]["keras"] = {"epochs": 20, "epoch_s": epochs, "epoch_s_median": statistics.median(epochs)}
    m = {x["key"]: x for x in compare_mod.compare(a, b)["metrics"]}
    assert m["duration_s"]["better"] == "a" and m["major_faults"]["better"] == "a"
    assert m["epoch_s_median"]["better"] == "b"


def test_allocator_call_totals_say_which_are_estimates_or_partial(runs, tmp_path):
    """The census samples small mallocs by bytes and counts a glibc free only while large frees are watched: a
    real run's totals show tens of thousands of mallocs against a few frees. The labels say which figures are
    estimates and which partial, in the terminal and the HTML report alike."""
    out, _, _ = runs
    rep = load_report(out["plain"])
    totals = rep["allocator"]["totals"]
    assert totals["malloc_calls"] > totals["free_calls"]     # what a bare label would present as a leak
    text = terminal.render(rep)
    assert re.search(r"malloc calls \(estimate\)\s+[\d,]+$", text, re.M)
    assert re.search(r"small calls \(estimate\)\s+[\d,]+$", text, re.M)
    assert re.search(r"free calls \(partial\)\s+[\d,]+$", text, re.M)
    assert not re.search(r"^\s+(malloc|free|small) calls\s+[\d,]", text, re.M)
    assert re.search(r"bucket bytes\s+count \(estimate\)\s+bytes", text)
    body = "".join(check_html(open(html_mod.write(rep, str(tmp_path / "r.html"))).read()).text)
    assert "free calls (partial)" in body and "malloc calls (estimate)" in body and "count (estimate)" in body
