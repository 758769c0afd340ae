#!/usr/bin/env python3
# build.py -- the one native build: the two shared libraries and the C test programs (setup.py and make call it).
"""Usage: python allocators/build.py [--out DIR] [--tests] [--bench] [--asan]

Without --out the libraries go to allocators/python/ (PACKAGE_LIB_DIR), next to the bindings that load them
(the editable install's rtkit.allocators is that folder); with --tests or --bench the default is build/native/.

Libraries are built from every .c file in the source folders they list, so adding a file needs no
edit here. Test programs are allocators/tests/<group>_*.c, built by the rule for <group>;
allocators/tests/<group>_*.cc are C++ test programs built with $CXX (g++) by the same rules.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# The one folder the bindings (rtkit.allocators) load the libraries from in a checkout; setup.py builds a wheel's
# copy into the installed package's same folder.
PACKAGE_LIB_DIR = os.path.join(HERE, "python")
TEST_BUILD_DIR = os.path.join(os.path.dirname(HERE), "build", "native")  # C test programs and their libraries
CC = os.environ.get("CC", "cc")
CXX = os.environ.get("CXX", "g++")
CFLAGS = ["-std=gnu11", "-O2", "-g", "-fPIC", "-pthread", "-Wall", "-Wextra", "-Wno-unused-parameter",
          "-fvisibility=hidden", "-I" + os.path.join(HERE, "include"), "-I" + os.path.join(HERE, "src")]
ASAN_FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer", "-O1"]
# unit tests (prmalloc_unit_*) run under valgrind memcheck: block sizes from malloc_usable_size, not glibc's
# chunk header (memcheck replaces glibc's allocator, a redzone sits there). No effect on the preload library.
VALGRIND_FLAGS = ["-DRTK_CHECKED_LIBC"]


def have_libpmem():
    return os.path.exists("/usr/include/libpmem.h")


def pmem_flags():
    return (["-DRTK_HAVE_LIBPMEM"], ["-lpmem"]) if have_libpmem() else ([], [])


# The preload library links the PMEM pool in for tier mode (prmalloc/tier.c) but exports none of its rtkit_pmem_*
# symbols: under LD_PRELOAD they would otherwise take the place of librtkit_pmem.so's in a job that uses both.
MALLOC_VERSION_SCRIPT = "{ global: *; local: rtkit_pmem_*; };\n"


def malloc_version_script(out_dir):
    path = os.path.join(out_dir, "librtkit_malloc.map")
    os.makedirs(out_dir, exist_ok=True)
    if not os.path.exists(path) or open(path).read() != MALLOC_VERSION_SCRIPT:
        with open(path, "w") as f:
            f.write(MALLOC_VERSION_SCRIPT)
    return path


# name -> (source folders under src/, extra cflags, extra link flags)
def libraries(out_dir=None):
    pmem_c, pmem_l = pmem_flags()
    # tier mode's pool is volatile scratch: no flush to choose, so the preload library maps it with plain mmap and
    # stays free of libpmem (which would load libndctl, libudev, libcrypto, ... into every preloaded process)
    malloc_l = ["-ldl"]
    if out_dir:
        malloc_l.append("-Wl,--version-script=" + malloc_version_script(out_dir))
    return {
        "librtkit_malloc.so": (["common", "prmalloc", "pmem"], [], malloc_l),
        "librtkit_pmem.so": (["common", "pmem"], pmem_c, pmem_l),
    }


# A library's public header is copied beside it (librtkit_pmem.so -> librtkit_pmem.h): the Python bindings
# generate their cffi declarations from the header of the very build they load.
PUBLIC_HEADERS = {"librtkit_pmem.so": "pmem.h"}


# test-name prefix -> (source folders compiled in, libraries linked, extra flags)
# prmalloc_* tests are plain programs run under LD_PRELOAD; *_unit_* link the sources directly.
def test_rules():
    pmem_c, pmem_l = pmem_flags()
    return {
        # -fno-builtin: the compiler must not elide the malloc/free pairs the tests exist to exercise
        "prmalloc_unit": (["common", "prmalloc", "pmem"], ["-ldl"], ["-DRTK_NO_INTERPOSE", "-fno-builtin"]),
        "prmalloc": ([], ["-ldl"], ["-fno-builtin"]),
        # C++ (allocators/tests/prmalloc_cxx_*.cc, built with $CXX): operator new/delete under the preload;
        # -fno-sized-deallocation is not set: the sized delete forms are what the tests call
        "prmalloc_cxx": ([], ["-ldl"], ["-fno-builtin"]),
        "pmem": (["common", "pmem"], pmem_l, pmem_c),
    }


def _sources(folders):
    files = []
    for folder in folders:
        files += sorted(glob.glob(os.path.join(HERE, "src", folder, "*.c")))
    return files


def _run(cmd):
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        sys.exit(f"native build failed: {' '.join(cmd)}")


def build_libraries(out_dir, extra_flags=(), only=None):
    os.makedirs(out_dir, exist_ok=True)
    built = []
    for name, (folders, cflags, ldflags) in libraries(out_dir).items():
        if only and not any(word in name for word in only):
            continue
        target = os.path.join(out_dir, name)
        _run([CC, *CFLAGS, *extra_flags, *cflags, "-shared", "-o", target, *_sources(folders), *ldflags])
        built.append(target)
        if name in PUBLIC_HEADERS:
            shutil.copyfile(os.path.join(HERE, "include", "rtkit", PUBLIC_HEADERS[name]), target[:-3] + ".h")
    return built


def _rule_for(test_name):
    # the longest matching prefix wins, so prmalloc_unit_* is not taken for prmalloc_*
    rules = test_rules()
    for prefix in sorted(rules, key=len, reverse=True):
        if test_name.startswith(prefix + "_"):
            return rules[prefix]
    return None


def build_tests(out_dir, extra_flags=(), only=None):
    tests_dir = os.path.join(out_dir, "tests")
    os.makedirs(tests_dir, exist_ok=True)
    built = []
    for src in sorted(glob.glob(os.path.join(HERE, "tests", "*.c"))):
        name = os.path.splitext(os.path.basename(src))[0]
        if only and not any(name.startswith(word) for word in only):
            continue
        rule = _rule_for(name)
        if rule is None:
            sys.exit(f"no build rule for allocators/tests/{name}.c (prefixes: {', '.join(test_rules())})")
        folders, ldflags, cflags = rule
        target = os.path.join(tests_dir, name)
        _run([CC, *CFLAGS, *extra_flags, *cflags, "-o", target, src, *_sources(folders), *ldflags, "-lm"])
        built.append(target)
    built += _build_cxx_tests(tests_dir, extra_flags, only)
    return built


def _build_cxx_tests(tests_dir, extra_flags=(), only=None):
    """C++ test programs (allocators/tests/*.cc): plain programs (no library sources linked), run under LD_PRELOAD."""
    sources = sorted(glob.glob(os.path.join(HERE, "tests", "*.cc")))
    if sources and not shutil.which(CXX):
        sys.exit(f"no C++ compiler '{CXX}' found for allocators/tests/*.cc: install g++ or set CXX")
    built = []
    cxxflags = ["-std=gnu++17" if f == "-std=gnu11" else f for f in CFLAGS]
    for src in sources:
        name = os.path.splitext(os.path.basename(src))[0]
        if only and not any(name.startswith(word) for word in only):
            continue
        rule = _rule_for(name)
        if rule is None:
            sys.exit(f"no build rule for allocators/tests/{name}.cc (prefixes: {', '.join(test_rules())})")
        folders, ldflags, cflags = rule
        if folders:
            sys.exit(f"allocators/tests/{name}.cc: C++ tests cannot link C library sources (rule {folders})")
        target = os.path.join(tests_dir, name)
        _run([CXX, *cxxflags, *extra_flags, *cflags, "-o", target, src, *ldflags])
        built.append(target)
    return built


def build_bench(out_dir, extra_flags=()):
    """Micro-benchmarks (allocators/bench/*.c): plain programs, run under LD_PRELOAD by bench/run_micro.py."""
    bench_dir = os.path.join(out_dir, "bench")
    os.makedirs(bench_dir, exist_ok=True)
    built = []
    for src in sorted(glob.glob(os.path.join(HERE, "bench", "*.c"))):
        name = os.path.splitext(os.path.basename(src))[0]
        target = os.path.join(bench_dir, name)
        # group benches (pmem_*) link their group's sources like its tests; the rest are plain programs
        folders, ldflags, cflags = _rule_for(name) or ([], [], [])
        if name.startswith("pmem_") and os.path.exists("/usr/include/libpmemobj.h"):
            ldflags = [*ldflags, "-lpmemobj"]  # the PMEM bench compares against PMDK's allocator
        # -fno-builtin: keep the malloc/free pairs being measured
        _run([CC, *CFLAGS, *extra_flags, *cflags, "-fno-builtin", "-o", target, src, *_sources(folders),
              *ldflags, "-ldl", "-lm"])
        built.append(target)
    return built


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build rtkit's native libraries and C tests.")
    parser.add_argument("--out", help="output folder (default: allocators/python, where rtkit.allocators loads "
                                      "the libraries from; build/native with --tests or --bench)")
    parser.add_argument("--tests", action="store_true", help="also build the C test programs")
    parser.add_argument("--asan", action="store_true", help="build with AddressSanitizer")
    parser.add_argument("--valgrind", action="store_true",
                        help="unit tests for valgrind memcheck (no glibc chunk-header reads)")
    parser.add_argument("--bench", action="store_true", help="also build the micro-benchmarks (allocators/bench)")
    parser.add_argument("--only", action="append", choices=["malloc", "pmem", "prmalloc"],
                        help="build only this group (library and its tests); repeatable")
    args = parser.parse_args(argv)
    if shutil.which(CC) is None:
        sys.exit(f"no C compiler '{CC}' found: install gcc (apt-get install gcc) or set CC")
    flags = (ASAN_FLAGS if args.asan else []) + (VALGRIND_FLAGS if args.valgrind else [])
    only = args.only and [{"malloc": "prmalloc"}.get(w, w) for w in args.only]
    lib_only = only and [{"prmalloc": "malloc"}.get(w, w) for w in only]
    out = args.out or (TEST_BUILD_DIR if args.tests or args.bench else PACKAGE_LIB_DIR)
    built = build_libraries(out, flags, lib_only)
    if args.tests:
        built += build_tests(out, flags, only)
    if args.bench:
        built += build_bench(out, flags)
    for path in built:
        print(path)


if __name__ == "__main__":
    main()
