# test_imports.py -- the import arrows of docs/architecture.md: no circles, and none of the forbidden arrows.
"""Reads the source tree with `ast` (nothing is imported), maps scheduler/ to rtkit.scheduler and
allocators/python/ to rtkit.allocators as the install does, and checks the module graph."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"rtkit": "rtkit", "rtkit.scheduler": "scheduler", "rtkit.allocators": os.path.join("allocators", "python")}


def modules():
    """{module name: source path} for every .py file of the three packages."""
    out = {}
    for package, folder in PACKAGES.items():
        base = os.path.join(ROOT, folder)
        for dirpath, dirnames, files in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = os.path.relpath(dirpath, base)
            if package == "rtkit" and rel.split(os.sep)[0] in ("scheduler", "allocators"):
                continue
            parts = [package] + ([] if rel == "." else rel.split(os.sep))
            for f in files:
                if f.endswith(".py"):
                    name = ".".join(parts + ([] if f == "__init__.py" else [f[:-3]]))
                    out[name] = os.path.join(dirpath, f)
    return out


def imports_of(name, path, known):
    """The rtkit modules `name` imports (at any depth of the file: lazy imports are arrows too)."""
    is_pkg = path.endswith("__init__.py")
    pkg = name if is_pkg else name.rpartition(".")[0]
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from rtkit.report import fmt` imports rtkit.report.fmt (and runs rtkit.report's __init__, a
            # parent, which the checks leave aside); `from rtkit.config import X` imports rtkit.config
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t.startswith("rtkit") and t != name:
                found.add(t)
    return found


def graph():
    mods = modules()
    return {name: imports_of(name, path, mods) for name, path in mods.items()}


def _parents(name):
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_the_tree_is_found():
    g = graph()
    for name in ("rtkit.cli", "rtkit.config", "rtkit.hooks.install", "rtkit.scheduler.core", "rtkit.scheduler.threads",
                 "rtkit.scheduler.pipeline", "rtkit.scheduler.measure", "rtkit.allocators.pmem", "rtkit.report.load",
                 "rtkit.report.figures", "rtkit.report.sections", "rtkit.runner"):
        assert name in g, name
    assert "rtkit.hooks.registry" in g["rtkit.hooks.install"]


def test_no_import_cycles():
    # a package's __init__ importing its own submodule is not a circle in the sense that matters here
    g = {m: {t for t in deps if t not in _parents(m)} for m, deps in graph().items()}
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def _under(name, prefix):
    return name == prefix or name.startswith(prefix + ".")


LEAVES = ("rtkit.config", "rtkit.atomic", "rtkit.errors", "rtkit.report.contract", "rtkit.pool_room")

# the Scheduler's concerns, bottom up: core composes them; threads reads nothing of the other two, and the pipeline
# reads the measuring side's constants, never the other way round
SCHEDULER_CONCERNS = ("rtkit.scheduler.threads", "rtkit.scheduler.measure", "rtkit.scheduler.pipeline")
# a report is read (load), figures are derived from it (figures), then shown (sections, terminal, html)
REPORT_LAYERS = ("rtkit.report.load", "rtkit.report.figures", "rtkit.report.sections")


def forbidden(src, dst):
    """The arrows docs/architecture.md (and /work/shared/ARCHITECTURE.md) rule out."""
    if _under(src, "rtkit.scheduler") and _under(dst, "rtkit.hooks"):
        return "the scheduler never imports the hooks: the hooks register it"
    if src in LEAVES:
        return "config, atomic, errors, the report contract and the pool room checks import nothing of rtkit (everyone may use them)"
    if src == "rtkit" and dst != "rtkit.hooks.steps":
        return "rtkit/__init__ stays a leaf (only rtkit.step()'s lazy import of the step recorder)"
    if _under(src, "rtkit.report") and (_under(dst, "rtkit.hooks") or _under(dst, "rtkit.bootstrap")
                                        or _under(dst, "rtkit.scheduler") or _under(dst, "rtkit.launch")):
        return "report reads run directories only"
    if _under(src, "rtkit.commands") and _under(dst, "rtkit.commands") and src != dst:
        return "a command never imports a sibling command (shared code lives in library modules)"
    if _under(src, "rtkit.workloads") and (_under(dst, "rtkit.hooks") or dst == "rtkit"):
        return "workloads are ordinary TensorFlow scripts: rtkit must find their steps by itself"
    if src in SCHEDULER_CONCERNS and (dst == "rtkit.scheduler.core" or dst in SCHEDULER_CONCERNS
                                      and SCHEDULER_CONCERNS.index(dst) > SCHEDULER_CONCERNS.index(src)):
        return "a concern of the Scheduler never imports core (which composes them) or a concern above it"
    if src in REPORT_LAYERS and dst in REPORT_LAYERS and REPORT_LAYERS.index(dst) > REPORT_LAYERS.index(src):
        return "load and figures never import what shows the report"
    if src == "rtkit.__main__" and dst == "rtkit.cli":
        return None
    if _under(dst, "rtkit.cli") or (_under(dst, "rtkit.commands") and not _under(src, "rtkit.commands")
                                     and src != "rtkit.cli"):
        return "nothing below the CLI imports it"
    if not (_under(src, "rtkit.hooks") or _under(src, "rtkit.bootstrap")) and _under(dst, "rtkit.hooks") \
            and src != "rtkit":
        return "only the bootstrap (and rtkit.step) reach the hooks"
    return None


def test_no_forbidden_arrows():
    bad = [f"{src} -> {dst}: {why}" for src, deps in sorted(graph().items()) for dst in sorted(deps)
           if (why := forbidden(src, dst))]
    assert not bad, "\n".join(bad)


def test_report_never_imports_tensorflow():
    mods = modules()
    for name, path in mods.items():
        if _under(name, "rtkit.report") or name == "rtkit.config":
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    assert not any(a.name.split(".")[0] in ("tensorflow", "keras") for a in node.names), name
                elif isinstance(node, ast.ImportFrom) and node.module:
                    assert node.module.split(".")[0] not in ("tensorflow", "keras"), name


def test_the_checker_sees_a_forbidden_arrow():
    assert forbidden("rtkit.scheduler.core", "rtkit.hooks.registry")
    assert forbidden("rtkit.config", "rtkit.errors")
    assert forbidden("rtkit.commands.demo", "rtkit.commands.run")
    assert not forbidden("rtkit.hooks.install", "rtkit.scheduler")
    assert forbidden("rtkit.scheduler.measure", "rtkit.scheduler.pipeline")
    assert forbidden("rtkit.scheduler.threads", "rtkit.scheduler.core")
    assert not forbidden("rtkit.scheduler.pipeline", "rtkit.scheduler.measure")
    assert forbidden("rtkit.report.load", "rtkit.report.sections")
    assert forbidden("rtkit.report.figures", "rtkit.report.sections")
    assert not forbidden("rtkit.report.sections", "rtkit.report.figures")
