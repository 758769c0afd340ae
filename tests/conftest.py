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


# The C test builds, by the fixture that names them: group -> fixture.
_BUILD_GROUPS = {"prmalloc": "prm", "pmem": "pmem_build", "prmalloc-asan": "prm_asan", "pmem-asan": "pmem_asan"}


class _NativeBuilds:
    """The C test builds of a session, each run once so that no test runs stale binaries. prmalloc builds into
    build/native/, pmem and the AddressSanitizer build of prmalloc into private folders (their tests point
    RTKIT_LIB_DIR or their programs' paths at them)."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory, self.started = tmp_path_factory, {}

    def start(self, group):
        if group not in self.started:
            out = NATIVE_DIR if group == "prmalloc" else str(self.tmp_path_factory.mktemp(f"{group}-native"))
            only, _, variant = group.partition("-")
            cmd = [sys.executable, os.path.join(REPO, "allocators", "build.py"), "--tests", "--only", only,
                   *([f"--{variant}"] if variant else []), "--out", out]
            self.started[group] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL), out, cmd)

    def get(self, group):
        self.start(group)
        proc, out, cmd = self.started[group]
        if proc.wait() != 0:
            pytest.fail(f"native build failed (exit {proc.returncode}): {' '.join(cmd)}", pytrace=False)
        return out


@pytest.fixture(scope="session", autouse=True)
def _native_builds(request, tmp_path_factory):
    """Starts the builds that the selected tests need when the session starts, in the background: they overlap
    each other and the first tests (on 2 cores), and are waited for by the first test that needs each."""
    builds = _NativeBuilds(tmp_path_factory)
    for group, fixture in _BUILD_GROUPS.items():
        if any(fixture in item.fixturenames for item in request.session.items):
            builds.start(group)
    yield builds
    for proc, _, _ in builds.started.values():
        proc.wait()


@pytest.fixture(scope="session")
def prm(_native_builds):
    """build/native: librtkit_malloc.so and the prmalloc C test programs (test_prmalloc.py, test_tier.py)."""
    return _native_builds.get("prmalloc")


@pytest.fixture(scope="session")
def pmem_build(_native_builds):
    """A private folder with librtkit_pmem.so, its header and the pmem C test programs (test_pmem.py)."""
    return _native_builds.get("pmem")


@pytest.fixture(scope="session")
def prm_asan(_native_builds):
    """A private folder with the prmalloc C test programs and librtkit_malloc.so built with AddressSanitizer
    (test_prmalloc.py, test_prmalloc_peer_cases.py): one build for the tests that run under it."""
    return _native_builds.get("prmalloc-asan")


@pytest.fixture(scope="session")
def pmem_asan(_native_builds):
    """A private folder with the pmem C test programs built with AddressSanitizer (test_asan.py)."""
    return _native_builds.get("pmem-asan")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """One folder for the workloads' synthetic data sets, shared by the session: each is generated once per
    (rows, seed) and then read (rtkit.workloads.data caches by name)."""
    return str(tmp_path_factory.mktemp("criteo"))


@pytest.fixture(scope="session")
def malloc_lib():
    """The package's librtkit_malloc.so, the one `rtkit run` preloads: a test of what the launcher does with it
    fails here, naming the fix, when it is not built (rather than passing without it)."""
    from rtkit.allocators import malloc_library_path
    lib = malloc_library_path()
    if not lib:
        pytest.fail("librtkit_malloc.so is not built: run `make native` (or `make install`)", pytrace=False)
    return lib


def preload_env(native, extra=None, preload=True):
    """The test process's environment without rtkit's variables, with native/librtkit_malloc.so preloaded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RTKIT_", "_RTKIT_")) and k != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = os.path.join(native, "librtkit_malloc.so")
    env.update(extra or {})
    return env


def unpreloaded_env(extra=None):
    """The test process's environment without LD_PRELOAD (rtkit adds its own library), plus `extra`."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(extra or {})
    return env


def run_rtkit(args, env=None, cwd=None, timeout=600, check_rc=None):
    """Run the real `rtkit` command; returns CompletedProcess with text stdout/stderr."""
    proc = subprocess.run([RTKIT, *args], env=unpreloaded_env(env), cwd=cwd, capture_output=True, text=True,
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


# The bundled wdl workload under `rtkit run --html` as test_report_agree.py runs it in each mode; small step
# counts keep it affordable on 2 cores.
WDL_STEPS = 24


def wdl_run(run_dir, data_dir, api, extra=()):
    """One such run: its folder, report, `rtkit: ` summary lines and the workload's own output."""
    args = ["run", "--html", "--run-dir", str(run_dir), *extra, "--", os.path.join(os.path.dirname(sys.executable),
            "python"), "-m", "rtkit.workloads", "wdl", "--api", api, "--steps", str(WDL_STEPS), "--batch", "128",
            "--rows", "4000", "--data-dir", data_dir, "--no-progress"]
    proc = run_rtkit(args, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = [l for l in proc.stderr.splitlines() if l.startswith("rtkit: ")]
    return {"dir": str(run_dir), "report": load_report(str(run_dir)), "summary": summary, "stdout": proc.stdout}


@pytest.fixture(scope="session")
def wdl_default_runs(tmp_path_factory, data_dir):
    """wdl_default_runs(api): the default-settings wdl_run of that API, made when a test first asks for it and
    shared by the session: the views of its figures (test_report_agree.py) and the steps the hooks found in it
    (test_hooks_tf.py) are checked on the one run, which TensorFlow's start-up makes the costly part."""
    runs = {}

    def get(api):
        if api not in runs:
            runs[api] = wdl_run(tmp_path_factory.mktemp(f"wdl-{api}") / "default", data_dir, api)
        return runs[api]
    return get


# tmpfs when there is one: pool tests then measure the allocator, not the disk
SHM = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


@pytest.fixture
def pool_dir(tmp_path):
    """A fresh folder for pool files, on /dev/shm when writable (removed afterwards), else tmp_path."""
    if SHM:
        d = os.path.join(SHM, f"rtkit-test-pool-{os.getpid()}-{os.urandom(4).hex()}")
        os.makedirs(d)
        yield d
        subprocess.run(["rm", "-rf", d])
    else:
        yield str(tmp_path)
