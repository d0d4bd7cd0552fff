"""pykeops.numpy-style import path: ``from symred.numpy import Genred, LazyTensor``."""

from .genred import Genred
from .lazytensor import LazyTensor, Pm, Vi, Vj

__all__ = ["Genred", "LazyTensor", "Vi", "Vj", "Pm"]
