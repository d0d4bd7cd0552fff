"""pykeops.numpy-style import path: ``from symred.numpy import Genred, LazyTensor``."""

import sys

from . import cluster
from .genred import Genred
from .lazytensor import LazyTensor, Pm, Vi, Vj
from .solve import KernelSolve

__all__ = ["Genred", "KernelSolve", "LazyTensor", "Vi", "Vj", "Pm", "cluster"]

# ``import symred.numpy.cluster`` / ``from symred.numpy.cluster import ...`` (pykeops' path):
# this module is not a package, so the submodule is registered under that name.
sys.modules[__name__ + ".cluster"] = cluster
