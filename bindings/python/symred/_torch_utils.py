"""``symred.torch.utils``: the helpers of ``pykeops.torch.utils`` (dense kernels to check
symbolic reductions against, ``is_on_device``, ``torchsolve``) and ``WarmUpGpu``, which older
pykeops releases kept here and tutorials import from here."""

import torch

from ._np_utils import WarmUpGpu

__all__ = ["is_on_device", "torchsolve", "squared_distances", "torch_kernel", "WarmUpGpu"]


def is_on_device(x):
    """Whether the tensor lives on a CUDA device."""
    return x.is_cuda


def torchsolve(A, B):
    """X with A X = B (``torch.linalg.solve``)."""
    return torch.linalg.solve(A, B)


def squared_distances(x, y):
    """|x_i - y_j|^2 (n, m), as |x_i|^2 + |y_j|^2 - 2 <x_i, y_j>."""
    return ((x ** 2).sum(1).reshape(-1, 1) + (y ** 2).sum(1).reshape(1, -1)
            - 2.0 * x @ y.t())


def torch_kernel(x, y, s, kernel):
    """The kernel matrix of scale s: ``gaussian`` exp(-r^2/s^2), ``laplacian`` exp(-r/s),
    ``cauchy`` 1/(1 + r^2/s^2), ``inverse_multiquadric`` 1/sqrt(1 + r^2/s^2)."""
    sq = squared_distances(x, y)
    kernels = {
        "gaussian": lambda: torch.exp(-sq / (s * s)),
        "laplacian": lambda: torch.exp(-torch.sqrt(sq) / s),
        "cauchy": lambda: 1.0 / (1 + sq / (s * s)),
        "inverse_multiquadric": lambda: torch.rsqrt(1 + sq / (s * s)),
    }
    if kernel not in kernels:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {', '.join(kernels)}")
    return kernels[kernel]()
