# setup.py -- only the native-library build hook; the package layout is declared in pyproject.toml.
import os
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithNative(build_py):
    """Builds the two shared libraries through allocators/build.py (the script `make native` runs): into the
    built package for a wheel, into the bindings' source folder for an editable install (where they then load
    from, since the editable package is that folder)."""

    def run(self):
        super().run()
        sys.path.insert(0, os.path.join(HERE, "allocators"))
        import build as native_build  # allocators/build.py

        if self.editable_mode:
            out = native_build.PACKAGE_LIB_DIR
        else:
            out = os.path.join(self.build_lib, "rtkit", "allocators")  # the package rtkit.allocators
        native_build.build_libraries(out)


class BinaryDistribution(Distribution):
    # The wheel carries .so files, so it must be tagged for this platform.
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithNative}, distclass=BinaryDistribution)
