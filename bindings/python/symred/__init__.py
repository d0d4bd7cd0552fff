"""symred: symbolic kernel reductions from Python (ctypes over libsymred + NumPy).

The names follow pykeops.numpy, so that KeOps code ports by changing an import::

    from symred import Genred, LazyTensor   # or: from symred.numpy import ...

One deliberate difference: arg reductions (ArgMin, ArgKMin, Min_ArgMin, ...) return int64
indices where pykeops returns floats.

The shared library is found through $SYMRED_LIB, then the installed location, then the build
trees of the checkout (build/, build-ci/, build*/); see :data:`lib_path`.
"""

from ._lib import SymredError, SymredRuntimeError, SymredValueError, lib_path, version
from .genred import REDUCTIONS, Genred
from .lazytensor import LazyTensor, Pm, Vi, Vj
from .solve import KernelSolve

__version__ = "0.1.0"

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
    "__version__",
]
