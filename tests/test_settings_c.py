# test_settings_c.py -- the C libraries take every setting from rtkit/config.py's table, and their files call one way.
import collections
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, run_rtkit
from rtkit import config as cfg

SRC = os.path.join(REPO, "allocators", "src")
OPTIONS = {os.path.join("common", "options.h"), os.path.join("common", "options.c")}
ROW = re.compile(r'X\((\w+), "(\w+)", "(\w+)", (RTK_KIND_\w+), (-?\d+)LL, "([^"]*)", ([01]), (-?\d+)LL, ([01]), '
                 r'(-?\d+)LL, (RTK_PART_\w+), "(\w*)", ([01])\)')
KINDS = {"bool": "RTK_KIND_BOOL", "int": "RTK_KIND_INT", "size": "RTK_KIND_SIZE", "str": "RTK_KIND_STR",
         "path": "RTK_KIND_STR"}
PARTS = {"malloc": "RTK_PART_MALLOC", "tier": "RTK_PART_TIER", "pmem": "RTK_PART_PMEM"}


def _build_module():
    spec = importlib.util.spec_from_file_location("_rtkit_native_build", os.path.join(REPO, "allocators", "build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _c_sources():
    files = {}
    for path in sorted(glob.glob(os.path.join(SRC, "*", "*.[ch]"))):
        with open(path) as fh:
            files[os.path.relpath(path, SRC)] = fh.read()
    return files


def _strip_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)


def test_generated_header_rows_are_the_tables():
    rows = ROW.findall(_build_module().settings_header_text())
    want = [s for s in cfg.SETTINGS if s.c]
    assert [r[2] for r in rows] == [s.env for s in want]
    for (ident, key, env, kind, dflt, dtext, has_min, lo, has_max, hi, part, alias, inv), s in zip(rows, want):
        assert ident == s.key.upper() and key == s.key and kind == KINDS[s.kind] and part == PARTS[s.c]
        assert alias == s.alias_env and inv == str(int(s.alias_inverted))
        assert dtext == s.to_env(s.default)
        if s.kind in ("bool", "int", "size"):
            assert int(dflt) == int(s.default)
        assert (has_min == "1") == (s.minimum is not None) and int(lo) == (s.minimum or 0)
        assert (has_max == "1") == (s.maximum is not None) and int(hi) == (s.maximum or 0)


def test_the_built_header_is_current(prm):
    """What `make native` / pip compiled against is the table's current text (the file is never edited)."""
    build = _build_module()
    path = os.path.join(build.GEN_DIR, build.SETTINGS_HEADER)
    with open(path) as fh:
        assert fh.read() == build.settings_header_text()


def test_c_names_no_setting_by_hand():
    """No RTKIT_* string in C outside the options module: names, defaults and limits come from the header."""
    for name, text in _c_sources().items():
        if name in OPTIONS:
            continue
        literals = re.findall(r'"(?:[^"\\\n]|\\.)*"', _strip_comments(text))
        bad = [lit for lit in literals if "RTKIT_" in lit]
        assert not bad, f"{name} names a setting by hand: {bad}"


def test_every_c_setting_is_read_and_every_read_is_a_c_setting():
    used = set()
    for name, text in _c_sources().items():
        if name not in OPTIONS:  # the options module makes the names; the libraries use them
            used |= set(re.findall(r"\bRTK_OPT_([A-Z0-9_]+)\b", _strip_comments(text)))
    declared = {s.key.upper() for s in cfg.SETTINGS if s.c}
    assert used == declared, {"read but not c=True in the table": used - declared,
                              "c=True but never read": declared - used}


def test_options_module_is_the_only_getenv():
    for name, text in _c_sources().items():
        if name not in OPTIONS:
            assert "getenv(" not in _strip_comments(text), f"{name} reads the environment itself"


# ---- no circle between C files
# Each source file is compiled to an object; `nm` lists the global symbols it defines and those it needs. File A
# depends on file B when A needs a symbol B defines (functions and variables alike; inline helpers in headers are
# not symbols and belong to no file). The graph of every file under allocators/src must have no cycle.

def _symbols(tmp_path):
    """{file: global symbols it defines}, {file: symbols it needs}, for every C file under allocators/src."""
    build = _build_module()
    flags = [*build.CFLAGS, *build._gen_flags(str(tmp_path))]
    defines, needs = {}, {}
    for src in sorted(glob.glob(os.path.join(SRC, "*", "*.c"))):
        name = os.path.relpath(src, SRC)
        obj = str(tmp_path / (name.replace(os.sep, "_") + ".o"))
        subprocess.run([build.CC, *flags, "-c", "-o", obj, src], check=True)
        nm = lambda *opt: subprocess.run(["nm", *opt, obj], capture_output=True, text=True, check=True).stdout
        defines[name] = {line.split()[-1] for line in nm("--defined-only", "-g").splitlines() if line.strip()}
        needs[name] = {line.split()[-1] for line in nm("--undefined-only").splitlines() if line.strip()}
    return defines, needs


def _dependency_graph(tmp_path):
    defines, needs = _symbols(tmp_path)
    owner = {sym: name for name, syms in defines.items() for sym in syms}
    return {name: {owner[s] for s in needs[name] if s in owner and owner[s] != name} for name in defines}


def _cycle(graph):
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


@pytest.mark.skipif(not shutil.which("nm"), reason="nm (binutils) is not installed")
def test_no_circle_between_c_files(tmp_path):
    graph = _dependency_graph(tmp_path)
    assert graph["prmalloc/tier_pool.c"] and graph["prmalloc/init.c"], "the graph must see real dependencies"
    cycle = _cycle(graph)
    assert cycle is None, "calls go in a circle: " + " -> ".join(cycle)


# The system calls the C libraries make, each behind a primitive of common/os.h (as mimalloc's prim.h): a file that
# names one of them directly bypasses the one layer that keeps errno and words the failure. log.c writes its line
# to stderr itself: it is what a failing primitive would report through.
SYSCALLS = {"mmap", "mmap64", "munmap", "mremap", "madvise", "mincore", "msync", "open", "open64", "openat", "close",
            "read", "write", "pread", "pread64", "pwrite", "pwrite64", "fsync", "fdatasync", "unlink", "rename",
            "stat", "stat64", "lstat", "lstat64", "fstat", "fstat64", "__fxstat", "__fxstat64", "statfs", "statfs64",
            "fstatfs", "fstatfs64", "flock", "lseek", "lseek64", "fallocate", "fallocate64", "posix_fallocate",
            "posix_fallocate64", "ftruncate", "ftruncate64", "sync_file_range", "getrusage", "clock_gettime", "getpid",
            "syscall", "sched_yield", "sysconf", "time", "gettimeofday", "nanosleep", "clock_nanosleep", "usleep",
            "ioctl", "fcntl", "fcntl64", "posix_fadvise", "posix_fadvise64", "mprotect", "getrlimit", "getrlimit64",
            "setrlimit", "prctl", "mkdir", "readlink", "access", "dup", "dup2", "pipe", "pipe2", "kill", "gettid",
            "sysinfo", "sched_getaffinity", "openat64", "__open_2", "__open64_2", "__read_chk", "__pread_chk"}
OS_LAYER = {os.path.join("common", name) for name in ("os.c", "os_file.c", "log.c")}


@pytest.mark.skipif(not shutil.which("nm"), reason="nm (binutils) is not installed")
def test_the_c_libraries_call_the_os_only_through_os_h(tmp_path):
    _, needs = _symbols(tmp_path)
    calls = {name: needs[name] & SYSCALLS for name in needs if name not in OS_LAYER}
    assert len(calls) > 20 and needs[os.path.join("common", "os_file.c")] & SYSCALLS, "the check must see the calls"
    assert not any(calls.values()), {name: sorted(c) for name, c in calls.items() if c}


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# ---- booleans are parsed: RTKIT_PMEM_MEMBARRIER=1 (what `rtkit run` exports) keeps membarrier; the old negative
# name still works for one release, its value inverted, with one warning line

POOL_SCRIPT = ("import json, os; from rtkit.allocators.pmem import Pool\n"
               "with Pool.anonymous(8 << 20) as p:\n"
               "    h = p.alloc(100); p.free(h); s = p.stats()\n"
               "print(json.dumps({'membarrier': s['membarrier'], 'env': os.environ.get('RTKIT_PMEM_MEMBARRIER')}))\n")


def _membarrier_available():
    import ctypes
    import platform
    if platform.machine() != "x86_64":
        return False
    cmds = ctypes.CDLL(None).syscall(324, 0, 0, 0)  # SYS_membarrier, MEMBARRIER_CMD_QUERY
    return cmds > 0 and bool(cmds & 8)  # MEMBARRIER_CMD_PRIVATE_EXPEDITED


@pytest.mark.skipif(not _membarrier_available(), reason="the kernel offers no membarrier")
@pytest.mark.parametrize("assignment,expect", [(None, True), ("pmem_membarrier=0", False),
                                               ("pmem_no_membarrier=1", False), ("pmem_no_membarrier=0", True)])
def test_pool_inside_rtkit_run_uses_membarrier(tmp_path, assignment, expect):
    args = ["run", "--run-dir", str(tmp_path / "r")]
    if assignment is not None:
        args += ["--set", assignment]
    proc = run_rtkit([*args, "--", sys.executable, "-c", POOL_SCRIPT], check_rc=0)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["env"] == ("1" if expect else "0")  # rtkit run exports every setting under its new name
    assert seen["membarrier"] is expect, proc.stderr
    renamed = [l for l in proc.stderr.splitlines() if "RTKIT_PMEM_NO_MEMBARRIER is renamed" in l
               and not l.startswith("rtkit: note:")]
    assert len(renamed) == (1 if assignment and "no_membarrier" in assignment else 0), proc.stderr


@pytest.mark.skipif(not _membarrier_available(), reason="the kernel offers no membarrier")
def test_the_old_membarrier_variable_works_in_c_and_warns_once(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_")}
    script = POOL_SCRIPT + "with Pool.anonymous(8 << 20) as q: print(q.stats()['membarrier'])\n"
    for old, expect in (("1", False), ("0", True)):
        proc = subprocess.run([sys.executable, "-c", script], env={**env, "RTKIT_PMEM_NO_MEMBARRIER": old},
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.strip().splitlines()
        assert json.loads(lines[0])["membarrier"] is expect and lines[1] == str(expect)
        said = [l for l in proc.stderr.splitlines() if "RTKIT_PMEM_NO_MEMBARRIER" in l]
        assert len(said) == 1 and "renamed RTKIT_PMEM_MEMBARRIER" in said[0] and "opposite" in said[0], proc.stderr


def test_bad_pmem_value_one_line_and_default(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_")}
    env["RTKIT_PMEM_REBALANCE_MS"] = "3600001"
    script = ("from rtkit.allocators.pmem import Pool\n"
              "p = Pool.anonymous(8 << 20); p2 = Pool.anonymous(8 << 20); print('ok'); p.close(); p2.close()\n")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)  # the installed rtkit, not the source folder
    assert proc.returncode == 0 and proc.stdout == "ok\n"
    lines = [l for l in proc.stderr.splitlines() if "RTKIT_PMEM_REBALANCE_MS" in l]
    s = cfg.BY_KEY["pmem_rebalance_ms"]
    assert len(lines) == 1 and "'3600001'" in lines[0] and s.accepted() in lines[0], proc.stderr
    assert "using the default '1000'" in lines[0]
    with pytest.raises(ValueError):
        s.parse("3600001")  # Python's validation enforces the same limit


def test_internal_names_in_c_are_rtkits_own():
    """The only RTKIT_ names C spells out are rtkit's internal variables (not settings) and the allocator's marker."""
    with open(os.path.join(SRC, "common", "options.h")) as fh:
        names = set(re.findall(r'"(_?RTKIT_\w+)"', _strip_comments(fh.read())))
    assert names == {"RTKIT_RUN_DIR", "_RTKIT_MALLOC_ROOT"}
    assert "RTKIT_RUN_DIR" in cfg.INTERNAL_ENV and "RTKIT_RUN_DIR" not in cfg.BY_ENV


# ---- adding a C setting: its table row and its user, nothing else

PROBE_ROW = ('    _s("malloc_scratch_probe", "int", 7, "", "a setting this test adds", minimum=0, maximum=1000, '
             'c="malloc"),\n')
PROBE_USE = ('    if (rtk_setting_num(RTK_OPT_MALLOC_SCRATCH_PROBE) == 42)\n'
             '        rtk_log_line("scratch probe read 42");\n')


def _tree_files(root, folders):
    out = {}
    for folder in folders:
        for base, _, names in os.walk(os.path.join(root, folder)):
            for name in names:
                path = os.path.join(base, name)
                with open(path, "rb") as fh:
                    out[os.path.relpath(path, root)] = fh.read()
    return out


def test_a_new_c_setting_touches_its_row_and_its_user(tmp_path):
    """A scratch copy of the table and the C sources gets one setting: a row in rtkit/config.py and one reader in
    the C file that uses it. It builds, the allocator reads its value, and its stats file echoes it."""
    scratch = tmp_path / "repo"
    (scratch / "rtkit").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "rtkit", "config.py"), scratch / "rtkit" / "config.py")
    for part in ("src", "include", "build.py"):
        src = os.path.join(REPO, "allocators", part)
        (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, scratch / "allocators" / part)
    before = _tree_files(scratch, ["rtkit", "allocators"])

    table = scratch / "rtkit" / "config.py"
    text = table.read_text()
    anchor = "    # -- stage-aware scheduler\n"
    assert anchor in text
    table.write_text(text.replace(anchor, PROBE_ROW + anchor))
    user = scratch / "allocators" / "src" / "prmalloc" / "init.c"
    text = user.read_text()
    anchor = "    rtk_engine.plan_source = \"none\";\n"
    assert anchor in text
    user.write_text(text.replace(anchor, PROBE_USE + anchor))

    after = _tree_files(scratch, ["rtkit", "allocators"])
    touched = sorted(k for k in after if before.get(k) != after[k])
    assert touched == [os.path.join("allocators", "src", "prmalloc", "init.c"), os.path.join("rtkit", "config.py")]

    out = tmp_path / "out"
    subprocess.run([sys.executable, str(scratch / "allocators" / "build.py"), "--out", str(out), "--only", "malloc"],
                   check=True, stdout=subprocess.DEVNULL)
    lib = str(out / "librtkit_malloc.so")
    probe = "import ctypes; ctypes.CDLL(None).rtkit_step_mark()"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTKIT_")}
    for value, said in (("42", "scratch probe read 42"), ("lots", "RTKIT_MALLOC_SCRATCH_PROBE='lots' is not valid")):
        run_dir = tmp_path / f"run-{value}"
        run_dir.mkdir()
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                              env={**env, "LD_PRELOAD": lib, "RTKIT_RUN_DIR": str(run_dir),
                                   "RTKIT_MALLOC_SCRATCH_PROBE": value})
        assert proc.returncode == 0 and said in proc.stderr, proc.stderr
        (stats,) = glob.glob(str(run_dir / "allocator-*.json"))
        with open(stats) as fh:
            doc = json.load(fh)
        assert doc["config"]["malloc_scratch_probe"] == (42 if value == "42" else 7), doc["config"]
        if value != "42":
            assert [e for e in doc["errors"] if "RTKIT_MALLOC_SCRATCH_PROBE" in e], doc["errors"]
