# setup.py -- package layout (three source folders, one import root) and the native-library build hook.
import os
import sys

from setuptools import Distribution, find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))

# Top-level folders of the design card that install under the single import root `rtkit`.
PACKAGE_DIRS = {
    "rtkit": "rtkit",
    "rtkit.scheduler": "scheduler",
    "rtkit.allocators": "allocators/python",
    "rtkit.profiles": "profiles",
}


def _packages():
    packages = []
    for root, folder in PACKAGE_DIRS.items():
        packages.append(root)
        packages += [f"{root}.{sub}" for sub in find_packages(folder)]
    return sorted(set(packages))


def _package_dir():
    mapping = dict(PACKAGE_DIRS)
    for root, folder in PACKAGE_DIRS.items():
        for sub in find_packages(folder):
            mapping[f"{root}.{sub}"] = os.path.join(folder, *sub.split("."))
    return mapping


class BuildPyWithNative(build_py):
    """Builds the two shared libraries into the package, through the same script `make native` runs."""

    def run(self):
        super().run()
        sys.path.insert(0, os.path.join(HERE, "allocators"))
        import build as native_build  # allocators/build.py

        native_build.build_libraries(os.path.join(self.build_lib, "rtkit", "allocators"))


class BinaryDistribution(Distribution):
    # The wheel carries .so files, so it must be tagged for this platform.
    def has_ext_modules(self):
        return True


setup(
    packages=_packages(),
    package_dir=_package_dir(),
    package_data={"rtkit.profiles": ["*.toml"], "rtkit.report": ["*.html", "*.js", "*.css"]},
    include_package_data=False,
    cmdclass={"build_py": BuildPyWithNative},
    distclass=BinaryDistribution,
)
