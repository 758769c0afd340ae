# test_callers.py -- no function without a caller: every function of the C libraries and of the Python package is called.
"""C: each library's sources are compiled to objects one function a section (-ffunction-sections), so every call or
address taken of a global function, even within its own file, is a relocation naming it; a function no relocation
names, apart from its own body's, has no caller. The functions a library exports are called from outside it and
must be named below. Python: a module-level function whose name appears nowhere else in the package's code (as a
name, an attribute or inside a string: getattr, entry points) has none."""
import ast
import glob
import importlib.util
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO
from test_imports import modules

# glibc's allocator entry points, taken from the program by LD_PRELOAD: the program calls them
INTERPOSED = {"malloc", "free", "calloc", "realloc", "reallocarray", "aligned_alloc", "posix_memalign", "memalign",
              "valloc", "pvalloc", "cfree", "free_sized", "free_aligned_sized", "malloc_usable_size", "mallinfo",
              "mallinfo2", "malloc_info", "malloc_trim", "mallopt"}
# C++'s operator new, new[], delete and delete[] in all their forms (mangled names): C++ programs call them
INTERPOSED_CXX = ("_Znw", "_Zna", "_Zdl", "_Zda")
# Python functions whose only callers are tests, each with why it is the package's
PY_TEST_CALLERS = {
    "_ranks_np": "rtkit.workloads.zipf: the numpy twin of the input graph's rank formula, the oracle its tests check "
                 "the graph and expected_distinct against",
    "glossary_lines": "rtkit.report.glossary: makes docs/report.md's glossary table from the glossary (the test says "
                      "when the doc is out of date)",
}


def _public_api():
    """The functions declared by the public headers (rtkit/pmem.h, rtkit/prmalloc.h): the bindings and programs call
    them."""
    names = set()
    for path in glob.glob(os.path.join(REPO, "allocators", "include", "rtkit", "*.h")):
        text = re.sub(r"/\*.*?\*/", "", open(path).read(), flags=re.S)
        names |= set(re.findall(r"\b(rtkit_\w+)\s*\(", text))
    return names


def _build():
    spec = importlib.util.spec_from_file_location("_rtkit_build_callers", os.path.join(REPO, "allocators", "build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _objects(out):
    """[(library, source, object)] for each library's sources, compiled with its flags at -O0 (nothing inlined away)."""
    build = _build()
    jobs = []
    for lib, (folders, cflags, _) in build.libraries().items():
        os.makedirs(os.path.join(out, lib))
        for src in build._sources(folders):
            # pmem/alloc.c and prmalloc/alloc.c both: the folder is part of the name
            name = os.path.relpath(src, os.path.join(REPO, "allocators", "src")).replace(os.sep, "_")
            obj = os.path.join(out, lib, name[:-2] + ".o")
            cmd = [build.CC, *build.CFLAGS, *build._gen_flags(out), *cflags, "-O0", "-g0", "-ffunction-sections",
                   "-c", "-o", obj, src]
            jobs.append((lib, src, obj, cmd))
    with ThreadPoolExecutor(2) as pool:
        for proc, (_, src, _, cmd) in zip(pool.map(lambda j: subprocess.run(j[3], capture_output=True, text=True), jobs),
                                          jobs):
            assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    return [(lib, os.path.relpath(src, REPO), obj) for lib, src, obj, _ in jobs]


def _functions(obj):
    """{name: exported?} of the global functions obj defines."""
    out = {}
    for line in subprocess.run(["readelf", "-sW", obj], capture_output=True, text=True, check=True).stdout.splitlines():
        f = line.split()
        if len(f) >= 8 and f[3] == "FUNC" and f[4] in ("GLOBAL", "WEAK") and f[6] != "UND":
            out[f[7]] = f[5] == "DEFAULT"
    return out


def _named_by_relocations(obj):
    """The symbols obj's code and data refer to, but a function's references to itself (recursion) and the unwind and
    debug tables' (which name every function's section)."""
    named, section = set(), ""
    for line in subprocess.run(["readelf", "-rW", obj], capture_output=True, text=True, check=True).stdout.splitlines():
        m = re.match(r"Relocation section '\.rela(\S*)'", line)
        if m:
            section = m.group(1)
            continue
        f = line.split()
        if section.startswith((".eh_frame", ".debug")) or len(f) < 5 or not re.fullmatch(r"[0-9a-f]{16}", f[0]):
            continue
        if section != ".text." + f[4] and not f[4].startswith("."):
            named.add(f[4])
    return named


def uncalled_c(out):
    """(functions no library code calls, exported functions) of the C libraries: {name: source}, {name: source}."""
    defined, exported, named = {}, {}, set()
    for _, src, obj in _objects(out):
        for name, public in _functions(obj).items():
            defined[name] = src
            if public:
                exported[name] = src
        named |= _named_by_relocations(obj)
    return {n: s for n, s in defined.items() if n not in named and n not in exported}, exported


needs_binutils = pytest.mark.skipif(not (shutil.which("readelf") and shutil.which(os.environ.get("CC", "cc"))),
                                    reason="readelf (binutils) or the C compiler is not installed")


@needs_binutils
def test_every_function_of_the_c_libraries_has_a_caller(tmp_path):
    dead, exported = uncalled_c(str(tmp_path))
    assert len(exported) > 40 and "rtkit_pmem_open" in exported, exported  # the check sees the libraries
    assert not dead, "functions nothing calls (remove them, or make them static and use them): " + \
        ", ".join(f"{n} ({s})" for n, s in sorted(dead.items()))
    api = _public_api()
    stray = sorted(n for n in exported if n not in api and n not in INTERPOSED and not n.startswith(INTERPOSED_CXX))
    assert not stray, f"exported but neither public API (allocators/include/rtkit/*.h) nor interposed: {stray}"
    assert not api - set(exported), f"declared public but not exported: {sorted(api - set(exported))}"


@needs_binutils
def test_the_c_check_sees_a_function_without_a_caller(tmp_path):
    # a scratch library source holding one function nothing calls and one called only from its own file
    src = tmp_path / "scratch.c"
    src.write_text("__attribute__((visibility(\"hidden\"))) int rtk_nobody_calls(void) { return 1; }\n"
                   "__attribute__((visibility(\"hidden\"))) int rtk_called_here(void) { return 2; }\n"
                   "int rtkit_scratch_api(void) { return rtk_called_here(); }\n")
    obj = tmp_path / "scratch.o"
    subprocess.run([os.environ.get("CC", "cc"), "-O0", "-ffunction-sections", "-fPIC", "-c", "-o", str(obj), str(src)],
                   check=True)
    assert _functions(str(obj)) == {"rtk_nobody_calls": False, "rtk_called_here": False, "rtkit_scratch_api": True}
    assert _named_by_relocations(str(obj)) == {"rtk_called_here"}


def uncalled_python():
    """Module-level functions of the package that no code of it names: {name: module}."""
    defined, names = {}, set()
    for module, path in modules().items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("__"):
                defined[node.name] = module
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names |= set(re.findall(r"[A-Za-z_]\w*", node.value))
    with open(os.path.join(REPO, "pyproject.toml")) as fh:  # console scripts: "rtkit.cli:main"
        names |= set(re.findall(r"[A-Za-z_]\w*", fh.read()))
    return {n: m for n, m in defined.items() if n not in names}


def test_every_module_level_python_function_has_a_caller():
    dead = uncalled_python()
    assert set(PY_TEST_CALLERS) <= set(dead), "no longer test-only, drop from PY_TEST_CALLERS: " + \
        ", ".join(sorted(set(PY_TEST_CALLERS) - set(dead)))
    dead = {n: m for n, m in dead.items() if n not in PY_TEST_CALLERS}
    assert not dead, "functions nothing calls: " + ", ".join(f"{m}.{n}" for n, m in sorted(dead.items()))
