"""pykeops.numpy-style import path: ``from symred.numpy import Genred, LazyTensor``."""

import sys

from . import _generic
from . import _np_utils as utils
from . import cluster
from .genred import Genred
from .lazytensor import ComplexLazyTensor, LazyTensor, Pm, Vi, Vj
from .solve import KernelSolve

__all__ = ["Genred", "KernelSolve", "LazyTensor", "ComplexLazyTensor", "Vi", "Vj", "Pm",
           "cluster", "utils", "generic_sum", "generic_logsumexp", "generic_argmin",
           "generic_argkmin"]

generic_sum, generic_logsumexp, generic_argmin, generic_argkmin = _generic.bind(Genred)

# ``import symred.numpy.cluster`` / ``from symred.numpy.cluster import ...`` (pykeops' paths,
# also .utils and .operations): this module is not a package, so the submodules are registered
# under those names; ``operations`` (where pykeops keeps KernelSolve) is this module.
sys.modules[__name__ + ".cluster"] = cluster
sys.modules[__name__ + ".utils"] = utils
sys.modules[__name__ + ".operations"] = sys.modules[__name__]
