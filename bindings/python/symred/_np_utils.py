"""``symred.numpy.utils``: dense NumPy versions of the common kernels, under the names of
``pykeops.numpy.utils``, for checking symbolic reductions against the full n x m matrix.

``x`` is (n, d), ``y`` is (m, d); results are (n, m) unless stated.
"""

import numpy as np

__all__ = ["squared_distances", "differences", "np_kernel", "log_np_kernel", "grad_np_kernel",
           "np_kernel_sphere", "chain_rules", "log_sum_exp", "WarmUpGpu", "numpytools"]


def squared_distances(x, y):
    """|x_i - y_j|^2, as |x_i|^2 + |y_j|^2 - 2 <x_i, y_j>."""
    return (np.sum(x * x, axis=1)[:, None] + np.sum(y * y, axis=1)[None, :]
            - 2.0 * (x @ y.T))


def differences(x, y):
    """x_i[k] - y_j[k], of shape (d, n, m)."""
    return x.T[:, :, None] - y.T[:, None, :]


def np_kernel(x, y, s, kernel):
    """The kernel matrix of scale s: ``gaussian`` exp(-r^2/s^2), ``laplacian`` exp(-r/s),
    ``cauchy`` 1/(1 + r^2/s^2), ``inverse_multiquadric`` 1/sqrt(1 + r^2/s^2)."""
    return np.exp(log_np_kernel(x, y, s, kernel))


def log_np_kernel(x, y, s, kernel):
    """The logarithm of :func:`np_kernel`."""
    q = squared_distances(x, y) / (s * s)
    logs = {
        "gaussian": lambda: -q,
        "laplacian": lambda: -np.sqrt(q),
        "cauchy": lambda: -np.log1p(q),
        "inverse_multiquadric": lambda: -0.5 * np.log1p(q),
    }
    if kernel not in logs:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {', '.join(logs)}")
    return logs[kernel]()


def grad_np_kernel(x, y, s, kernel):
    """The derivative of the kernel with respect to r^2 = |x_i - y_j|^2."""
    r2 = squared_distances(x, y)
    s2 = s * s
    q = r2 / s2
    grads = {
        "gaussian": lambda: -np.exp(-q) / s2,
        "laplacian": lambda: -np.exp(-np.sqrt(q)) / (2 * s2 * np.sqrt(q)),
        "cauchy": lambda: -1.0 / (s2 * (1 + q) ** 2),
        "inverse_multiquadric": lambda: -0.5 / (s2 * (1 + q) ** 1.5),
    }
    if kernel not in grads:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {', '.join(grads)}")
    return grads[kernel]()


def np_kernel_sphere(nalpha, nbeta, s, kernel):
    """Kernels of unit normals: ``binet`` <a,b>^2, ``linear`` <a,b>, ``gaussian_unoriented``
    exp((2<a,b>^2 - 2)/s^2), ``gaussian_oriented`` exp((2<a,b> - 2)/s^2)."""
    p = nalpha @ nbeta.T
    kernels = {
        "binet": lambda: p * p,
        "linear": lambda: p,
        "gaussian_unoriented": lambda: np.exp((2.0 * p * p - 2.0) / (s * s)),
        "gaussian_oriented": lambda: np.exp((2.0 * p - 2.0) / (s * s)),
    }
    if kernel not in kernels:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {', '.join(kernels)}")
    return kernels[kernel]()


def log_sum_exp(mat, axis=0):
    """log(sum(exp(mat), axis)), with the maximum factored out."""
    m = np.max(mat, axis=axis)
    return m + np.log(np.sum(np.exp(mat - np.expand_dims(m, axis)), axis=axis))


def chain_rules(q, ax, by, Aa, p):
    """The gradient with respect to x of sum_ij q_i . K_ij p_j for a radial kernel, given
    ``Aa`` (n, m), the kernel's derivative with respect to |x_i - y_j|^2: component k is
    sum_j q_i . (2 (x_i[k] - y_j[k]) Aa_ij p_j). Returns float32 (n, d), as pykeops."""
    res = np.zeros(ax.shape, dtype=np.float32)
    for k in range(ax.shape[1]):
        diff = ax[:, k][:, None] - by[:, k][None, :]
        res[:, k] = np.sum(q * ((2 * diff * Aa) @ p), axis=1)
    return res


def WarmUpGpu():
    """Runs a tiny reduction on the GPU, so that later timings leave out its start-up; does
    nothing without a GPU (:data:`symred.config.gpu_available`)."""
    from .config import gpu_available

    if not gpu_available:
        return
    from .genred import Genred

    g = Genred("Exp(-oos2 * SqDist(x, y)) * b", ["x = Vi(1)", "y = Vj(1)", "b = Vj(1)",
                                                   "oos2 = Pm(1)"], reduction_op="Sum", axis=1)
    dum = np.random.rand(10, 1)
    for _ in range(2):
        g(dum, dum, np.random.rand(10, 1), np.array([1.0]), backend="GPU")


def _detect_complex(x, arraytype, is_complex):
    """pykeops' detect_complex: a list holding a complex, a complex array, or a complex."""
    if isinstance(x, list):
        return any(isinstance(v, complex) for v in x)
    if isinstance(x, arraytype):
        return bool(is_complex(x))
    return isinstance(x, complex)


class numpytools:
    """pykeops' table of array operations for NumPy (``pykeops.numpy.utils.numpytools``), which
    generic code written against both bindings calls: the same names and meanings."""

    norm = staticmethod(np.linalg.norm)
    arraysum = staticmethod(np.sum)
    exp = staticmethod(np.exp)
    log = staticmethod(np.log)
    arraytype = np.ndarray
    float_types = [float, np.float16, np.float32, np.float64]
    is_tensor = staticmethod(lambda x: isinstance(x, np.ndarray))
    copy = staticmethod(np.copy)
    eq = staticmethod(np.equal)
    transpose = staticmethod(lambda x: x.T)
    permute = staticmethod(lambda x, *axes: x.transpose(*axes))
    contiguous = staticmethod(np.ascontiguousarray)
    numpy = staticmethod(lambda x: x)
    tile = staticmethod(np.tile)
    solve = staticmethod(np.linalg.solve)
    size = staticmethod(lambda x: x.size)
    view = staticmethod(np.reshape)
    long = staticmethod(lambda x: x.astype(np.int64))
    dtype = staticmethod(lambda x: x.dtype)
    dtypename = staticmethod(lambda dt: dt.name)
    rand = staticmethod(lambda m, n, dtype: np.random.rand(m, n).astype(dtype))
    randn = staticmethod(lambda m, n, dtype: np.random.randn(m, n).astype(dtype))
    zeros = staticmethod(lambda shape, dtype, device=None, requires_grad=None:
                         np.zeros(shape, dtype=dtype))
    empty = staticmethod(lambda shape, dtype, device=None, requires_grad=None:
                         np.empty(shape, dtype=dtype))
    eye = staticmethod(lambda n, dtype: np.eye(n, dtype=dtype))
    array = staticmethod(lambda x, dtype, device=None: np.array(x, dtype=dtype))
    get_pointer = staticmethod(lambda x: x.__array_interface__["data"][0])
    device = staticmethod(lambda x: "cpu")
    device_type_index = staticmethod(lambda x: ("cpu", None))
    device_dict = staticmethod(lambda x: {"cat": "cpu"})

    detect_complex = staticmethod(lambda x: _detect_complex(x, np.ndarray, np.iscomplexobj))

    @staticmethod
    def view_as_complex(x):
        return x.view({"float32": "complex64", "float64": "complex128"}[x.dtype.name])

    @staticmethod
    def view_as_real(x):
        return x.view({"complex64": "float32", "complex128": "float64"}[x.dtype.name])


def _bind_numpytools():
    from .cluster import swap_axes
    from .genred import Genred
    from .solve import KernelSolve

    numpytools.Genred, numpytools.KernelSolve = Genred, KernelSolve
    numpytools.swap_axes = staticmethod(swap_axes)


_bind_numpytools()
