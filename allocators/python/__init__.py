# rtkit.allocators -- where the native libraries live, and their Python bindings (rtkit.allocators.pmem).
import os

# The libraries sit next to this file in both installs: a wheel's build_py hook builds them into the package, and
# the editable install's package is this source folder, where `make install`/`python allocators/build.py` put them.
LIB_DIR = os.path.dirname(os.path.abspath(__file__))
MALLOC_LIBRARY = "librtkit_malloc.so"
PMEM_LIBRARY = "librtkit_pmem.so"


def library_path(name: str) -> str:
    """Path of a native library shipped in this package ('' when the build did not produce it).
    RTKIT_LIB_DIR overrides the folder (used by tests against a sanitizer or private build)."""
    path = os.path.join(os.environ.get("RTKIT_LIB_DIR") or LIB_DIR, name)
    return path if os.path.exists(path) else ""


def malloc_library_path() -> str:
    return library_path(MALLOC_LIBRARY)


def pmem_library_path() -> str:
    return library_path(PMEM_LIBRARY)
