# test_callers.py -- no function without a caller: every function of the C libraries, every function and method in Python.
"""C: each library's sources are compiled to objects one function a section (-ffunction-sections), so every call or
address taken of a global function, even within its own file, is a relocation naming it; a function no relocation
names, apart from its own body's, has no caller. The functions a library exports are called from outside it and
must be named below. Python: a module-level function or a method of a class whose name appears nowhere else in the
package's code (as a name, an attribute or inside a string: getattr, entry points), its own body aside, has none; a
method a library calls (a dunder, an override of a base outside the package) is not counted."""
import ast
import builtins
import collections
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
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
# Python functions and methods whose only callers are tests, each with why it is the package's
PY_TEST_CALLERS = {
    "Pool.sync": "rtkit.allocators.pmem: the Python API of rtkit_pmem_sync (docs/pmem.md: volatile mode's sync() at "
                 "checkpoints)",
    "Pool.rebalance": "rtkit.allocators.pmem: the Python API of rtkit_pmem_rebalance_now (rtkit/pmem.h), the "
                      "background pass on demand",
    "Pool.release_thread_cache": "rtkit.allocators.pmem: the Python API of rtkit_pmem_thread_release (rtkit/pmem.h), "
                                 "a thread's cache given back on demand",
    "glossary_lines": "rtkit.report.glossary: makes docs/report.md's glossary table from the glossary (the test says "
                      "when the doc is out of date)",
}
# The hooks TensorFlow and Keras call on the package's classes derived from theirs: base as the source spells it ->
# (method names, why). A standard library base needs no entry: the test asks the class itself.
LIBRARY_HOOKS = {
    "keras.callbacks.Callback": ({"on_train_begin", "on_epoch_begin", "on_epoch_end", "on_train_batch_begin",
                                  "on_train_batch_end"}, "Keras's fit calls a callback's hooks"),
}
# Methods a library calls by its protocol on a class of the package that has no base to ask, each with why
PY_PROTOCOL_METHODS = {
    "_Loader.create_module": "rtkit.bootstrap.sitecustomize: the import system calls a loader's create_module "
                             "(importlib's loader protocol; its exec_module is named elsewhere too)",
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


def _words(tree):
    """How often each identifier occurs in tree's code: as a name, an attribute or a word inside a string (getattr,
    entry points, a name a docstring gives)."""
    words = collections.Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words[node.id] += 1
        elif isinstance(node, ast.Attribute):
            words[node.attr] += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            words.update(re.findall(r"[A-Za-z_]\w*", node.value))
    return words


def _is_dunder(name):
    return name.startswith("__") and name.endswith("__")


def _calls_super(fn):
    """fn calls super().<its own name>: it overrides a method its base has, which the base's callers call."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == fn.name
               and isinstance(n.func.value, ast.Call) and isinstance(n.func.value.func, ast.Name)
               and n.func.value.func.id == "super" for n in ast.walk(fn))


def _imported_modules(tree):
    """{local name: module} of tree's `import x [as y]` statements (at any depth): how a base's root is resolved."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    return out


def _standard_base(text, imported):
    """The class a base spelled `text` names, when it is a builtin or the standard library's (imported here, which
    costs little); None for a base of a third-party library (TensorFlow, Keras: LIBRARY_HOOKS) or unresolved."""
    root, _, rest = text.partition(".")
    if not rest:
        return getattr(builtins, text, None)
    module = imported.get(root)
    if module is None or module.split(".")[0] not in sys.stdlib_module_names:
        return None
    obj = importlib.import_module(module)
    for part in rest.split("."):
        obj = getattr(obj, part, None)
    return obj


def _library_override(name, bases, package_classes, imported):
    """A base outside the package (ancestors through the package's own classes included) has the method `name`: a
    library calls it (a standard class's attribute, or a third-party base's hook named in LIBRARY_HOOKS)."""
    seen, todo = set(), list(bases)
    while todo:
        text = todo.pop()
        if text in seen:
            continue
        seen.add(text)
        own = text.rpartition(".")[2]
        if own in package_classes:
            todo.extend(package_classes[own])
            continue
        base = _standard_base(text, imported)
        if base is not None and hasattr(base, name):
            return True
        if name in LIBRARY_HOOKS.get(text, ((), ""))[0]:
            return True
    return False


def _definitions():
    """[(module, class name or None, function node, class bases, module's imports)] of every module-level function
    and every method of a class (at any depth) of the package, and {class name: [its bases as spelled]}."""
    defs, package_classes = [], collections.defaultdict(list)
    for module, path in modules().items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        imported = _imported_modules(tree)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.append((module, None, node, [], imported))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases]
                package_classes[node.name].extend(bases)
                defs.extend((module, node.name, fn, bases, imported) for fn in node.body
                            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return defs, package_classes


def _package_words():
    words = collections.Counter()
    for path in modules().values():
        with open(path, encoding="utf-8") as fh:
            words += _words(ast.parse(fh.read(), path))
    with open(os.path.join(REPO, "pyproject.toml")) as fh:  # console scripts: "rtkit.cli:main"
        words.update(re.findall(r"[A-Za-z_]\w*", fh.read()))
    return words


def uncalled_python(words=None, defs=None):
    """Module-level functions and methods of the package that no code of it names, apart from their own bodies:
    {name or Class.name: module}. A method a library calls is not one: dunders, an override that calls super()'s
    method, a method a base outside the package has (LIBRARY_HOOKS for TensorFlow's and Keras's)."""
    words = _package_words() if words is None else words
    defs, package_classes = _definitions() if defs is None else defs
    dead = {}
    for module, cls, fn, bases, imported in defs:
        if _is_dunder(fn.name) or words[fn.name] > _words(fn)[fn.name]:
            continue
        if cls is not None and (_calls_super(fn) or _library_override(fn.name, bases, package_classes, imported)):
            continue
        dead[fn.name if cls is None else f"{cls}.{fn.name}"] = module
    return dead


def test_every_python_function_and_method_has_a_caller():
    dead = uncalled_python()
    allowed = {**PY_TEST_CALLERS, **PY_PROTOCOL_METHODS}
    assert set(allowed) <= set(dead), "called now, drop from PY_TEST_CALLERS or PY_PROTOCOL_METHODS: " + \
        ", ".join(sorted(set(allowed) - set(dead)))
    dead = {n: m for n, m in dead.items() if n not in allowed}
    assert not dead, "functions and methods nothing calls: " + ", ".join(f"{m}.{n}" for n, m in sorted(dead.items()))


def test_every_library_hook_is_a_method_of_a_class_on_that_base():
    defs, _ = _definitions()
    defined = {(text, fn.name) for _, cls, fn, bases, _ in defs if cls for text in bases}
    stale = sorted(f"{base}.{name}" for base, (names, _) in LIBRARY_HOOKS.items() for name in names
                   if (base, name) not in defined)
    assert not stale, f"no class of the package on that base defines them, drop from LIBRARY_HOOKS: {stale}"


def test_the_python_check_sees_a_method_without_a_caller():
    # a scratch module: a method nothing names, one only its own body names (recursion), one named elsewhere, an
    # override of a standard base's method, a super() override, a Keras hook, a dunder
    tree = ast.parse(textwrap.dedent("""
        import threading
        class Worker(threading.Thread):
            def run(self): pass
            def nobody_calls(self): pass
            def calls_itself(self, n): return self.calls_itself(n - 1) if n else 0
            def called(self): pass
            def close(self): super().close()
            def __repr__(self): return ""
        class Hook(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None): pass
        def user(w): w.called()
        """))
    imported = _imported_modules(tree)
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    defs = [("scratch", c.name, fn, [ast.unparse(b) for b in c.bases], imported) for c in classes for fn in c.body]
    defs.append(("scratch", None, tree.body[-1], [], imported))
    dead = uncalled_python(_words(tree), (defs, {}))
    assert dead == {"Worker.nobody_calls": "scratch", "Worker.calls_itself": "scratch", "user": "scratch"}
