"""``symred.torch.utils``: the helpers of ``pykeops.torch.utils`` (dense kernels to check
symbolic reductions against, ``is_on_device``, ``torchsolve``) and ``WarmUpGpu``, which older
pykeops releases kept here and tutorials import from here."""

import torch

from ._np_utils import WarmUpGpu, _detect_complex
from ._torch_cluster import swap_axes

__all__ = ["is_on_device", "torchsolve", "squared_distances", "torch_kernel", "WarmUpGpu",
           "torchtools"]


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


_TORCH_DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
                 "int32": torch.int32, "int64": torch.int64}


class torchtools:
    """pykeops' table of array operations for torch (``pykeops.torch.utils.torchtools``), which
    generic code written against both bindings calls: the same names and meanings. Genred and
    KernelSolve are symred.torch's (set when symred.torch is imported)."""

    swap_axes = staticmethod(swap_axes)
    copy = staticmethod(torch.clone)
    exp = staticmethod(torch.exp)
    log = staticmethod(torch.log)
    norm = staticmethod(torch.norm)
    arraytype = torch.Tensor
    float_types = [float]
    eq = staticmethod(torch.eq)
    transpose = staticmethod(lambda x: x.t())
    permute = staticmethod(lambda x, *dims: x.permute(*dims))
    contiguous = staticmethod(lambda x: x.contiguous())
    solve = staticmethod(lambda A, b: torchsolve(A, b).contiguous())
    arraysum = staticmethod(lambda x, axis=None: x.sum() if axis is None else x.sum(dim=axis))
    long = staticmethod(lambda x: x.long())
    size = staticmethod(lambda x: x.numel())
    tile = staticmethod(lambda x, *reps: x.repeat(*reps))
    numpy = staticmethod(lambda x: x.detach().cpu().numpy())
    view = staticmethod(lambda x, s: x.view(s))
    is_tensor = staticmethod(lambda x: isinstance(x, torch.Tensor))
    dtype = staticmethod(lambda x: x.dtype if hasattr(x, "dtype") else type(x))
    rand = staticmethod(lambda m, n, dtype, device: torch.rand(m, n, dtype=dtype, device=device))
    randn = staticmethod(lambda m, n, dtype, device:
                         torch.randn(m, n, dtype=dtype, device=device))
    zeros = staticmethod(lambda shape, dtype, device, requires_grad=False:
                         torch.zeros(*shape, dtype=dtype, device=device,
                                     requires_grad=requires_grad))
    empty = staticmethod(lambda shape, dtype, device, requires_grad=False:
                         torch.empty(*shape, dtype=dtype, device=device,
                                     requires_grad=requires_grad))
    eye = staticmethod(lambda n, dtype, device: torch.eye(n, dtype=dtype, device=device))
    device = staticmethod(lambda x: x.device if isinstance(x, torch.Tensor) else None)
    get_pointer = staticmethod(lambda x: x.data_ptr())
    pointer = staticmethod(lambda x: x.data.data_ptr())
    device_type_index = staticmethod(lambda x: (x.device.type, x.device.index)
                                     if isinstance(x, torch.Tensor) else (None, None))

    detect_complex = staticmethod(lambda x: _detect_complex(x, torch.Tensor, torch.is_complex))

    @staticmethod
    def view_as_complex(x):
        return torch.view_as_complex(x.view(*x.shape[:-1], x.shape[-1] // 2, 2))

    @staticmethod
    def view_as_real(x):
        return torch.view_as_real(x).view(*x.shape[:-1], 2 * x.shape[-1])

    @staticmethod
    def dtypename(dtype):
        names = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                 int: int, list: "float32"}
        if dtype not in names:
            raise ValueError(f"{dtype} is not a dtype symred takes")
        return names[dtype]

    @staticmethod
    def array(x, dtype, device):
        if dtype not in _TORCH_DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {', '.join(_TORCH_DTYPES)}")
        return torch.tensor(x, dtype=_TORCH_DTYPES[dtype], device=device)
