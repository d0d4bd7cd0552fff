"""pykeops.numpy-style import path: ``from symred.numpy import Genred, LazyTensor``."""

from .genred import Genred
from .lazytensor import LazyTensor, Pm, Vi, Vj
from .solve import KernelSolve

__all__ = ["Genred", "KernelSolve", "LazyTensor", "Vi", "Vj", "Pm"]
