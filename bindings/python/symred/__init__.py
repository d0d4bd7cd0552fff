"""symred: symbolic kernel reductions from Python (ctypes over libsymred + NumPy).

The names follow pykeops.numpy, so that KeOps code ports by changing an import::

    from symred import Genred, LazyTensor   # or: from symred.numpy import ...

One deliberate difference: arg reductions (ArgMin, ArgKMin, Min_ArgMin, ...) return int64
indices where pykeops returns floats.

The shared library is found through $SYMRED_LIB (a file or its directory), then the copy
bundled in the package (symred/libsymred.so, which `pip install` builds with CMake), then the
system's (the dynamic linker's, then the usual lib directories), then the build trees of the
checkout (build/, build-ci/, build*/); see :data:`lib_path`. :func:`info` prints what is used.
"""

from ._lib import SymredError, SymredRuntimeError, SymredValueError, lib_path, version
from ._info import info
from .genred import REDUCTIONS, Genred
from .lazytensor import ComplexLazyTensor, LazyTensor, Pm, Vi, Vj
from .solve import KernelSolve

__version__ = "0.1.0"  # also in setup.py and pyproject.toml; sr_version() matches

__all__ = [
    "Genred",
    "KernelSolve",
    "LazyTensor",
    "Vi",
    "Vj",
    "Pm",
    "REDUCTIONS",
    "SymredError",
    "SymredValueError",
    "SymredRuntimeError",
    "lib_path",
    "version",
    "info",
    "__version__",
]
