"""Builds libsymred with CMake and bundles it in the package (the metadata is in pyproject.toml).

`pip install ./bindings/python` and `pip wheel ./bindings/python` run build_py below: it
configures the checkout that contains bindings/python (or $SYMRED_SOURCE_DIR) in a temporary
directory with the tests, examples and MPI companion off, builds the shared library only, and
copies it into the package as symred/libsymred.so, where symred/_lib.py looks after
$SYMRED_LIB. The wheel is tagged py3-none-<platform>: it holds native libraries but no
Python extension module (ctypes loads them), so one wheel serves every Python 3.
$CMAKE_BUILD_PARALLEL_LEVEL sets the build jobs (default 2). $SYMRED_WHEEL_BUILD_DIR, when set,
is the CMake build directory to use and keep (an incremental rebuild; scripts/build-wheel.sh
sets it), instead of a temporary one.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:  # setuptools 70.1 and later
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # no wheel support installed: `pip install` builds none either
        bdist_wheel = None

HERE = Path(__file__).resolve().parent
PKG_VERSION = "0.1.0"  # also in pyproject.toml and symred/__init__.py


def source_root():
    env = os.environ.get("SYMRED_SOURCE_DIR")
    root = Path(env).resolve() if env else HERE.parent.parent
    if not (root / "CMakeLists.txt").is_file() or not (root / "include" / "symred.h").is_file():
        raise SystemExit(
            f"symred: no symred source tree at {root} (CMakeLists.txt and include/symred.h); "
            f"install from a checkout (pip install ./bindings/python) or set SYMRED_SOURCE_DIR")
    m = re.search(r"project\(symred VERSION ([0-9.]+)", (root / "CMakeLists.txt").read_text())
    if not m or m.group(1) != PKG_VERSION:
        raise SystemExit(f"symred: the C library's version ({m.group(1) if m else '?'}) is not "
                         f"the package's ({PKG_VERSION}); update setup.py, pyproject.toml and "
                         f"symred/__init__.py")
    return root


class BuildPyWithLibrary(build_py):
    """build_py, then CMake's build of libsymred.so copied into the package."""

    def run(self):
        super().run()
        root = source_root()
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")
        keep = os.environ.get("SYMRED_WHEEL_BUILD_DIR")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            self.build_library(root, jobs, keep)
        else:
            with tempfile.TemporaryDirectory(prefix="symred-cmake-") as tmp:
                self.build_library(root, jobs, tmp)

    def build_library(self, root, jobs, build):
        """Configures and builds the library in the directory build, and copies it (and
        libsymred_xla when jaxlib's headers were found) into the package."""
        configure = ["cmake", "-S", str(root), "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                     "-DSYMRED_BUILD_TESTS=OFF", "-DSYMRED_BUILD_EXAMPLES=OFF",
                     "-DSYMRED_BUILD_BENCH=OFF", "-DSYMRED_MPI=OFF"]
        self.announce("symred: " + " ".join(configure), level=2)
        # The XLA FFI handlers of symred.jax are built when the installing Python has jax.
        env = dict(os.environ, SYMRED_PYTHON=os.environ.get("SYMRED_PYTHON", sys.executable))
        subprocess.run(configure, check=True, env=env)
        subprocess.run(["cmake", "--build", build, "--target", "symred", "-j", jobs],
                       check=True)
        built = Path(build) / "libsymred.so"
        dest = Path(self.build_lib) / "symred" / "libsymred.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        # The real file (libsymred.so is a link to the versioned name): ctypes loads it by
        # path, so the soname links are not needed, and a wheel cannot hold links.
        shutil.copyfile(built.resolve(), dest)
        os.chmod(dest, 0o755)
        cache = (Path(build) / "CMakeCache.txt").read_text()
        if "SYMRED_JAX_INCLUDE_DIR:PATH=/" in cache:
            subprocess.run(["cmake", "--build", build, "--target", "symred_xla", "-j", jobs],
                           check=True)
            xla = dest.parent / "libsymred_xla.so"
            shutil.copyfile(Path(build) / "libsymred_xla.so", xla)
            os.chmod(xla, 0o755)


if bdist_wheel is not None:

    class BdistWheelAnyPython(bdist_wheel):
        """Tags the wheel py3-none-<platform>: the libraries are loaded with ctypes, so they
        depend on the platform but not on the Python version or its ABI."""

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat


class BinaryDistribution(Distribution):
    """A wheel with a native library is not pure Python: tag it for the platform."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildPyWithLibrary}
if bdist_wheel is not None:
    cmdclass["bdist_wheel"] = BdistWheelAnyPython
setup(cmdclass=cmdclass, distclass=BinaryDistribution)
