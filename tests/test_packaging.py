# test_packaging.py -- the package mapping of pyproject.toml: the editable tree imports, and a built wheel is complete.
import glob
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from conftest import REPO

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - older Pythons
    import tomli as _toml

with open(os.path.join(REPO, "pyproject.toml"), "rb") as _fh:
    SETUPTOOLS = _toml.load(_fh)["tool"]["setuptools"]
PACKAGE_DIR = SETUPTOOLS["package-dir"]
LIBRARIES = ("librtkit_malloc.so", "librtkit_pmem.so")
PROFILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "profiles", "*.toml")))

# Imports every mapped package from wherever `python` finds rtkit, and says where each came from.
PROBE = """
import json, os, sys
import rtkit, rtkit.allocators, rtkit.allocators.pmem, rtkit.scheduler, rtkit.profiles
from rtkit import config
with rtkit.allocators.pmem.Pool.anonymous(64 << 20) as pool:
    pool.free(pool.alloc(100))
json.dump({"rtkit": rtkit.__file__, "scheduler": rtkit.scheduler.__file__, "allocators": rtkit.allocators.__file__,
           "malloc": rtkit.allocators.malloc_library_path(), "pmem": rtkit.allocators.pmem_library_path(),
           "profiles": config.available_profiles()}, sys.stdout)
"""


def _source_packages():
    """Every package (folder with __init__.py) under the mapped folders, by its installed name."""
    found = set()
    for name, folder in PACKAGE_DIR.items():
        root = os.path.join(REPO, folder)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, root)
                found.add(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    return found


def test_every_package_folder_is_declared():
    assert PACKAGE_DIR == {"rtkit": "rtkit", "rtkit.scheduler": "scheduler", "rtkit.allocators": "allocators/python",
                           "rtkit.profiles": "profiles"}
    assert set(SETUPTOOLS["packages"]) == _source_packages(), \
        "pyproject.toml [tool.setuptools] packages must list every folder with an __init__.py under the mapped folders"
    readme = open(os.path.join(REPO, "README.md")).read()
    for name, folder in PACKAGE_DIR.items():
        assert f"`{folder}/` -> `{name}`" in readme, f"README's layout line lacks {folder} -> {name}"


def _probe(cwd, env=None, args=()):
    proc = subprocess.run([sys.executable, *args, "-c", PROBE], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _editable():
    try:
        direct = importlib.metadata.distribution("rtkit").read_text("direct_url.json") or "{}"
    except importlib.metadata.PackageNotFoundError:
        return False
    return bool(json.loads(direct).get("dir_info", {}).get("editable"))


@pytest.mark.skipif(not _editable(), reason="rtkit is not installed editable (`make install` does)")
def test_editable_tree_imports_from_the_source_folders(tmp_path):
    """From the repository root (where ./rtkit shadows the install's finder for `rtkit` itself), from elsewhere,
    and with rtkit run's bootstrap folder on PYTHONPATH, the mapped packages are the source folders, so an edit
    takes effect without a reinstall, and the libraries are found beside the bindings."""
    bootstrap = {"PYTHONPATH": os.path.join(REPO, "rtkit", "bootstrap")}
    for where in (_probe(REPO), _probe(str(tmp_path)), _probe(REPO, bootstrap)):
        assert where["rtkit"] == os.path.join(REPO, "rtkit", "__init__.py")
        assert where["scheduler"] == os.path.join(REPO, "scheduler", "__init__.py")
        assert where["allocators"] == os.path.join(REPO, "allocators", "python", "__init__.py")
        assert where["malloc"] == os.path.join(REPO, "allocators", "python", "librtkit_malloc.so")
        assert where["pmem"] == os.path.join(REPO, "allocators", "python", "librtkit_pmem.so")
        assert sorted(where["profiles"]) == [p[:-5] for p in PROFILES]
        assert all(p.startswith(os.path.join(REPO, "profiles") + os.sep) for p in where["profiles"].values())


def _copy_source_tree(dest):
    """The files a clone would have (tracked, plus new files not ignored), without the checkout's build outputs."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                                capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: cannot tell sources from build outputs")
    for rel in filter(None, listed):
        src = os.path.join(REPO, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


@pytest.mark.slow
def test_wheel_is_complete_and_imports_outside_the_checkout(tmp_path):
    """The CI/user path: `pip wheel` builds both libraries into the package; installed on its own (no editable
    finder: python -S, only the dependencies' folder added) it imports, loads its libraries and profiles, and
    `rtkit run` preloads the installed allocator."""
    src, dist, target, elsewhere = (tmp_path / d for d in ("src", "dist", "target", "elsewhere"))
    _copy_source_tree(src)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(src)], check=True, capture_output=True, timeout=600)
    wheels = glob.glob(str(dist / "rtkit-*.whl"))
    assert len(wheels) == 1, os.listdir(dist)
    assert not wheels[0].endswith("-none-any.whl"), "a wheel with .so files must carry a platform tag"
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    for lib in LIBRARIES:
        assert f"rtkit/allocators/{lib}" in names
    assert "rtkit/allocators/librtkit_pmem.h" in names  # the bindings' cffi declarations come from it
    assert {f"rtkit/profiles/{p}" for p in PROFILES} <= names and PROFILES
    for pkg in _source_packages():
        assert pkg.replace(".", "/") + "/__init__.py" in names, pkg
    assert "rtkit/bootstrap/sitecustomize.py" in names and "rtkit/scheduler/core.py" in names
    assert "rtkit/bench/wdl_census.json" in names  # the scaling bench's recorded census

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), wheels[0]],
                   check=True, capture_output=True, timeout=300)
    elsewhere.mkdir()
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])  # numpy, cffi, psutil
    env = {"PYTHONPATH": os.pathsep.join([str(target), *deps])}
    where = _probe(str(elsewhere), env, args=("-S",))
    for key in ("rtkit", "scheduler", "allocators", "malloc", "pmem"):
        assert where[key].startswith(str(target) + os.sep), (key, where[key])
    assert sorted(where["profiles"]) == [p[:-5] for p in PROFILES]
    assert all(p.startswith(str(target) + os.sep) for p in where["profiles"].values())

    child = "import os, rtkit.scheduler; print(os.environ['LD_PRELOAD'] + ' ' + rtkit.scheduler.__file__)"
    proc = subprocess.run([sys.executable, "-S", "-m", "rtkit", "run", "--out", str(tmp_path / "runs"), "--",
                           sys.executable, "-S", "-c", child], cwd=str(elsewhere), capture_output=True, text=True,
                          env=dict(os.environ, **env), timeout=120)
    assert proc.returncode == 0, proc.stderr
    preload, scheduler = proc.stdout.split()[-2:]
    assert preload == str(target / "rtkit" / "allocators" / "librtkit_malloc.so") and scheduler.startswith(str(target))
