# sitecustomize.py -- runs at start-up of every Python process under `rtkit run`; hooks TensorFlow lazily.
"""Installs an import watcher: when `tensorflow`, `keras` or `tf_keras` finishes importing, rtkit's hooks are installed.
TensorFlow is never imported here. Any failure leaves the user's program unchanged. A sitecustomize that this
one shadows (later on sys.path) is still run."""
import os
import sys


def _chain_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.machinery
    import importlib.util

    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # `import sitecustomize` in the user's program then gives the user's module, as it would without rtkit
    sys.modules["_rtkit_bootstrap"] = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module


def _record_loaded():
    """One empty marker in the run directory, so the report can tell "the bootstrap ran, TensorFlow never
    came" from "no Python process ran under rtkit"; one open() per process, made by the first one only."""
    run_dir = os.environ.get("RTKIT_RUN_DIR")
    if not run_dir:
        return
    try:
        os.close(os.open(os.path.join(run_dir, "bootstrap-loaded"),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))
    except OSError:
        pass  # already there (another process), or an unwritable run directory the parent reports


def _import_rtkit():
    try:
        import rtkit  # noqa: F401 - the interpreter that has rtkit installed
    except ImportError:
        # Another interpreter than rtkit's own: load the pure-Python package from where this file lives.
        import importlib.util

        pkg_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        spec = importlib.util.spec_from_file_location("rtkit", os.path.join(pkg_dir, "__init__.py"),
                                                      submodule_search_locations=[pkg_dir])
        module = importlib.util.module_from_spec(spec)
        sys.modules["rtkit"] = module
        spec.loader.exec_module(module)


class _AfterImport:
    """A meta-path finder that runs a callback after a watched top-level module has been executed."""

    def __init__(self, callbacks):
        self.callbacks = callbacks
        self.busy = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.callbacks or name in self.busy:
            return None
        import importlib.util

        self.busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, callback = spec.loader, self.callbacks[name]

        class _Loader:
            def create_module(self, s):
                return loader.create_module(s)

            def exec_module(self, module):
                loader.exec_module(module)
                try:
                    callback(module)
                except Exception as exc:  # hooks must never break the user's import
                    sys.stderr.write(f"rtkit: hooks for {name} not installed: {exc!r}\n")

            def __getattr__(self, attr):
                return getattr(loader, attr)

        spec.loader = _Loader()
        return spec


def _install():
    if os.environ.get("RTKIT_HOOKS", "1").strip().lower() in ("0", "false", "off", "no"):
        return
    _record_loaded()
    _import_rtkit()
    from rtkit.hooks import install

    def on_tf(module):
        install.on_tensorflow(module)

    def on_keras(module):
        install.on_keras(module)

    sys.meta_path.insert(0, _AfterImport({"tensorflow": on_tf, "keras": on_keras, "tf_keras": on_keras}))
    if os.environ.get("RTKIT_RUN_PID") == str(os.getppid()):
        # the command's own process, in its main thread: the one place a signal handler can be set whatever thread
        # steps first (its descendants set it at their first step, from the main thread)
        from rtkit.hooks import steps

        steps.install_signal_flush_at_start()


try:
    _install()
except Exception as _exc:  # never let rtkit stop the interpreter from starting
    sys.stderr.write(f"rtkit: bootstrap disabled: {_exc!r}\n")
try:
    _chain_next_sitecustomize()
except Exception as _exc:
    sys.stderr.write(f"rtkit: the next sitecustomize failed: {_exc!r}\n")
