# conftest.py -- shared fixtures and markers: the C test build, the `rtkit` command of this interpreter, a run helper.
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The C test programs and the libraries they run against (a test build; the package's own libraries are in
# allocators/python/, built by the install).
NATIVE_DIR = os.path.join(REPO, "build", "native")
RTKIT = os.path.join(os.path.dirname(sys.executable), "rtkit")


def _have_tensorflow():
    try:
        import importlib.util
        return importlib.util.find_spec("tensorflow") is not None
    except ValueError:
        return False


HAVE_TF = _have_tensorflow()

# A test that runs TensorFlow (in-process or in a child): it is also `slow` (left out by `make test-fast`,
# `pytest -m "not slow"`) and skipped where TensorFlow is not installed.
requires_tf = pytest.mark.tf


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection, which must see the added `slow` marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("tf") is not None:
            item.add_marker(pytest.mark.slow)
            if not HAVE_TF:
                item.add_marker(pytest.mark.skip(reason="tensorflow is not installed"))


@pytest.fixture(scope="session")
def prm():
    """build/native with librtkit_malloc.so and the prmalloc C test programs, built once per session so that
    the tests never run stale binaries (test_prmalloc.py and test_tier.py share it)."""
    subprocess.run([sys.executable, os.path.join(REPO, "allocators", "build.py"), "--tests", "--only", "prmalloc",
                    "--out", NATIVE_DIR], check=True, stdout=subprocess.DEVNULL)
    return NATIVE_DIR


def run_rtkit(args, env=None, cwd=None, timeout=600, check_rc=None):
    """Run the real `rtkit` command; returns CompletedProcess with text stdout/stderr."""
    full_env = dict(os.environ)
    full_env.pop("LD_PRELOAD", None)
    full_env.update(env or {})
    proc = subprocess.run([RTKIT, *args], env=full_env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    if check_rc is not None and proc.returncode != check_rc:
        raise AssertionError(f"rtkit {' '.join(args)} exited {proc.returncode}, expected {check_rc}\n"
                             f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def load_report(run_dir):
    with open(os.path.join(run_dir, "report.json")) as fh:
        return json.load(fh)


@pytest.fixture
def rtkit_run():
    return run_rtkit
