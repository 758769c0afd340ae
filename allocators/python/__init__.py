# rtkit.allocators -- where the native libraries live, and their Python bindings (rtkit.allocators.pmem).
import os

LIB_DIR = os.path.dirname(os.path.abspath(__file__))
MALLOC_LIBRARY = "librtkit_malloc.so"
PMEM_LIBRARY = "librtkit_pmem.so"


# In a source checkout (editable install) the libraries are in build/native, where build.py puts them.
_CHECKOUT_BUILD = os.path.join(os.path.dirname(os.path.dirname(LIB_DIR)), "build", "native")


def library_path(name: str) -> str:
    """Path of a native library shipped in this package ('' when the build did not produce it).
    RTKIT_LIB_DIR overrides the folder (used by tests against a sanitizer build)."""
    override = os.environ.get("RTKIT_LIB_DIR")
    for folder in ([override] if override else [LIB_DIR, _CHECKOUT_BUILD]):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    return ""


def malloc_library_path() -> str:
    return library_path(MALLOC_LIBRARY)


def pmem_library_path() -> str:
    return library_path(PMEM_LIBRARY)
