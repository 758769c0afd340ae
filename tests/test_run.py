# test_run.py -- `rtkit run` end to end with real processes: exit codes, pass-through, bad input, signals, reports.
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import RTKIT, load_report, run_rtkit, unpreloaded_env

PY = sys.executable


def test_exit_code_passes_through_and_report_is_written(tmp_path):
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", "import sys; sys.exit(3)"])
    assert proc.returncode == 3
    report = load_report(tmp_path / "r")
    assert report["schema_version"] == 3
    assert report["run"]["exit_code"] == 3
    assert report["run"]["status"] == "failed"
    assert report["run"]["command"][-1] == "import sys; sys.exit(3)"
    assert "rtkit: report:" in proc.stderr


def test_default_run_directory_under_out(tmp_path):
    proc = run_rtkit(["run", "--out", str(tmp_path), "--name", "my job", "--", PY, "-c", "pass"], check_rc=0)
    dirs = os.listdir(tmp_path)
    assert len(dirs) == 1 and dirs[0].endswith("-my-job"), dirs
    assert load_report(tmp_path / dirs[0])["run"]["status"] == "ok"
    assert str(tmp_path / dirs[0]) in proc.stderr


def test_stdout_and_stderr_pass_through_unchanged(tmp_path):
    script = "import sys; sys.stdout.write('out-line\\n'); sys.stderr.write('err-line\\n')"
    proc = run_rtkit(["run", "--quiet", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", script], check_rc=0)
    assert proc.stdout == "out-line\n"  # rtkit itself never writes to stdout
    assert "err-line" in proc.stderr


def _run_exiting_3(tmp_path, script="", **streams):
    """`rtkit run` of a script that ends with exit code 3, started with `streams` (Popen's stdout=..., preexec_fn=...)."""
    proc = subprocess.run([RTKIT, "run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", script + "\nraise SystemExit(3)"],
                          env=unpreloaded_env(), **{"stdin": subprocess.DEVNULL, **streams})
    assert load_report(tmp_path / "r")["run"]["exit_code"] == 3
    return proc


@pytest.mark.parametrize("closed", [0, 1, 2])
def test_a_standard_stream_rtkit_gets_closed_reaches_the_command_closed(tmp_path, closed):
    """rtkit started with fd 0, 1 or 2 closed: the command starts with it closed too (none of rtkit's files in its
    place), ends with its own exit code, and rtkit's lines never land on stdout."""
    seen, out = tmp_path / "open-fds", tmp_path / "stdout"
    script = ("import os\n"
              "def is_open(fd):\n    try:\n        return bool(os.fstat(fd))\n    except OSError:\n        return False\n"
              "fds = [is_open(fd) for fd in range(3)]\n"   # before the open below takes the lowest free number
              f"open({str(seen)!r}, 'w').write(repr(fds))")
    with open(out, "w") as stdout:
        proc = _run_exiting_3(tmp_path, script, stdout=stdout, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: os.close(closed))
    assert proc.returncode == 3, proc.stderr
    assert seen.read_text() == repr([fd != closed for fd in range(3)])
    assert out.read_text() == ""


def test_output_nobody_reads_leaves_the_exit_code_to_the_command(tmp_path):
    """rtkit's stdout and stderr are a pipe whose reader is gone (`rtkit run ... 2>&1 | head`): its own lines are lost,
    the command's exit code is not."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = _run_exiting_3(tmp_path, stdout=write_end, stderr=write_end)
    finally:
        os.close(write_end)
    assert proc.returncode == 3


def test_missing_command_is_usage_error(tmp_path):
    proc = run_rtkit(["run", "--out", str(tmp_path)])
    assert proc.returncode == 2
    assert "no command given" in proc.stderr


def test_unknown_flag_is_usage_error():
    proc = run_rtkit(["run", "--no-such-flag", "--", "true"])
    assert proc.returncode == 2
    assert "unrecognized arguments" in proc.stderr or "no-such-flag" in proc.stderr


def test_command_not_found_exits_127_with_report(tmp_path):
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", "rtkit-no-such-command-xyz"])
    assert proc.returncode == 127
    assert "command not found: rtkit-no-such-command-xyz" in proc.stderr
    report = load_report(tmp_path / "r")
    assert report["run"]["status"] == "not_started"


def test_unknown_profile_is_usage_error(tmp_path):
    proc = run_rtkit(["run", "--profile", "nope", "--out", str(tmp_path), "--", "true"])
    assert proc.returncode == 2
    assert "unknown profile 'nope'" in proc.stderr and "throughput" in proc.stderr
    assert os.listdir(tmp_path) == []


def test_bad_set_value_is_usage_error(tmp_path):
    proc = run_rtkit(["run", "--set", "malloc_min_size=lots", "--out", str(tmp_path), "--", "true"])
    assert proc.returncode == 2
    assert "malloc_min_size" in proc.stderr and "64K" in proc.stderr


def test_bad_env_value_one_line_and_job_still_runs(tmp_path):
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", "print('hello')"],
                     env={"RTKIT_WARMUP_STEPS": "many"})
    assert proc.returncode == 0
    assert proc.stdout == "hello\n"
    lines = [l for l in proc.stderr.splitlines() if l.startswith("rtkit: environment RTKIT_WARMUP_STEPS")]
    assert len(lines) == 1 and "whole number" in lines[0]
    report = load_report(tmp_path / "r")
    assert report["run"]["settings"]["warmup_steps"]["value"] == 3
    assert any("RTKIT_WARMUP_STEPS" in n for n in report["notes"])


def test_unwritable_out_falls_back_and_job_runs(tmp_path):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("x")
    proc = run_rtkit(["run", "--out", str(blocked / "sub"), "--", PY, "-c", "print('ran')"])
    assert proc.returncode == 0
    assert proc.stdout == "ran\n"
    line = [l for l in proc.stderr.splitlines() if l.startswith("rtkit: cannot write the run directory")]
    assert len(line) == 1 and "--out" in line[0]


def test_script_that_raises(tmp_path):
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", "raise ValueError('boom')"])
    assert proc.returncode == 1
    assert "ValueError: boom" in proc.stderr
    assert load_report(tmp_path / "r")["run"]["status"] == "failed"


def test_child_killed_by_signal(tmp_path):
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", script])
    assert proc.returncode == 128 + signal.SIGKILL
    report = load_report(tmp_path / "r")
    assert report["run"]["status"] == "killed" and report["run"]["signal"] == "SIGKILL"


def test_sigterm_is_forwarded_and_report_written(tmp_path):
    marker = tmp_path / "got-term"
    script = (
        "import signal, sys, time\n"
        f"def h(s, f):\n    open({str(marker)!r}, 'w').write('x'); sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, h)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n")
    proc = subprocess.Popen([RTKIT, "run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=unpreloaded_env())
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7
    assert marker.exists()
    assert load_report(tmp_path / "r")["run"]["exit_code"] == 7


def test_user_preload_and_pythonpath_are_appended_not_replaced(tmp_path):
    user_dir = tmp_path / "userpath"
    user_dir.mkdir()
    script = "import os, json; print(json.dumps([os.environ.get('LD_PRELOAD',''), os.environ.get('PYTHONPATH','')]))"
    jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    preload = jemalloc if os.path.exists(jemalloc) else ""
    proc = run_rtkit(["run", "--quiet", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", script],
                     env={"LD_PRELOAD": preload, "PYTHONPATH": str(user_dir)}, check_rc=0)
    ld_preload, pythonpath = json.loads(proc.stdout)
    # the bootstrap folder (it holds only sitecustomize.py) goes first, else a user's sitecustomize shadows it
    assert pythonpath.split(os.pathsep)[1:] == [str(user_dir)]
    assert pythonpath.split(os.pathsep)[0].endswith(os.path.join("rtkit", "bootstrap"))
    if preload:
        assert ld_preload.split()[0] == preload
    assert ld_preload.split()[-1].endswith("librtkit_malloc.so")


def test_user_sitecustomize_still_runs(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE_RAN = True\n")
    proc = run_rtkit(["run", "--quiet", "--run-dir", str(tmp_path / "r"), "--", PY, "-c",
                      "import builtins; print(getattr(builtins, 'USER_SITE_RAN', False))"],
                     env={"PYTHONPATH": str(site)}, check_rc=0)
    assert proc.stdout.strip() == "True"
    # and rtkit's own bootstrap ran too (a user's sitecustomize earlier on the path must not shadow it)
    assert os.path.exists(tmp_path / "r" / "bootstrap-loaded")


def test_script_without_tensorflow_summary_says_the_bootstrap_loaded(tmp_path):
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", "print('no tf here')"], check_rc=0)
    assert "no Python process under rtkit loaded the bootstrap" not in proc.stderr
    hook = load_report(tmp_path / "r")["steps"]["hook"]
    assert hook["status"] == "no_tensorflow" and "bootstrap loaded" in hook["detail"], hook
    assert "TensorFlow was never imported" in proc.stderr
    # a command that is not Python never loads the bootstrap: that stays the line it was
    run_rtkit(["run", "--run-dir", str(tmp_path / "sh"), "--", "true"], check_rc=0)
    assert load_report(tmp_path / "sh")["steps"]["hook"]["status"] == "not_loaded"


def test_import_sitecustomize_gives_the_users_own_module(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("USER_VALUE = 42\n")
    script = "import sitecustomize; print(sitecustomize.__file__, getattr(sitecustomize, 'USER_VALUE', None))"
    proc = run_rtkit(["run", "--quiet", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", script],
                     env={"PYTHONPATH": str(site)}, check_rc=0)
    assert proc.stdout.split() == [str(site / "sitecustomize.py"), "42"]
    # the bootstrap still loaded (it is what ran the user's module)
    assert load_report(tmp_path / "r")["steps"]["hook"]["status"] == "no_tensorflow"


def test_process_samples_and_rusage(tmp_path):
    script = "import time\nx = bytearray(200 * 1024 * 1024)\nfor i in range(0, len(x), 4096): x[i] = 1\ntime.sleep(0.6)\n"
    run_rtkit(["run", "--set", "sample_interval_ms=50", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", script],
              check_rc=0)
    proc = load_report(tmp_path / "r")["process"]
    assert proc["peak_rss_bytes"] >= 200 * 1024 * 1024
    assert proc["minor_faults"] >= 200 * 1024 * 1024 // 4096 // 2  # THP may fold some faults
    assert len(proc["samples"]) >= 3
    assert all(s["threads"] >= 1 for s in proc["samples"])


def test_manual_steps_with_rtkit_step(tmp_path):
    script = "import rtkit, time\nfor i in range(7):\n    time.sleep(0.01)\n    rtkit.step()\n"
    run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", script], check_rc=0)
    steps = load_report(tmp_path / "r")["steps"]
    assert steps["count"] == 7 and steps["source"] == "manual"
    assert all(s["step_ms"] >= 9 for s in steps["per_step"][1:])


def test_hooks_off_leaves_no_step_file(tmp_path):
    run_rtkit(["run", "--set", "hooks=off", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", "pass"], check_rc=0)
    assert not [f for f in os.listdir(tmp_path / "r") if f.startswith("steps-")]
    hook = load_report(tmp_path / "r")["steps"]["hook"]
    assert hook["status"] == "off" and "RTKIT_HOOKS=0" in hook["detail"]   # the truth, not "no process loaded it"


def test_killed_job_keeps_the_steps_flushed_before_the_kill(tmp_path):
    script = ("import os, signal, time, rtkit\n"
              "end = time.time() + 6.5\n"
              "while time.time() < end:\n    time.sleep(0.05)\n    rtkit.step()\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = run_rtkit(["run", "--run-dir", str(tmp_path / "r"), "--", PY, "-c", script])
    assert proc.returncode == 128 + signal.SIGKILL
    steps = load_report(tmp_path / "r")["steps"]
    assert steps["count"] >= 50  # the periodic flush (every 5 s) ran before the kill
