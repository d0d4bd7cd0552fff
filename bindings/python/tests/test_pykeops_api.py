"""pykeops' API on symred, NumPy and torch, each against the dense computation: ``K @ v``,
``t()``, batch dimensions numbered as pykeops, the weighted LogSumExp, ``sinc``, ``out=``,
pickling a Genred, a float64 tensor parameter, the pykeops module names (symred.config,
symred.numpy.utils, .operations), keopscore's trailing commas, and the name-mapping shim that
runs pykeops' own test suite (scripts/pykeops-suite.sh)."""

import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import symred
import symred.numpy as snp
from symred import Genred, LazyTensor

RNG = np.random.default_rng(7)
N, M, D = 9, 7, 3


def gauss(x, y):
    """The dense (…, n, m) Gaussian kernel exp(-|x_i - y_j|^2)."""
    return np.exp(-((x[..., :, None, :] - y[..., None, :, :]) ** 2).sum(-1))


def lazy_gauss(L, x, y):
    return (-((L(x[..., :, None, :]) - L(y[..., None, :, :])) ** 2).sum(-1)).exp()


# ---- K @ v, t(), matvec ----------------------------------------------------------------------


def test_matmul_numpy():
    x, y = RNG.random((N, D)), RNG.random((M, D))
    K, Kd = lazy_gauss(LazyTensor, x, y), gauss(x, y)
    v1, v2 = RNG.random(M), RNG.random((M, 2))
    np.testing.assert_allclose(K @ v1, Kd @ v1, rtol=1e-12)
    assert (K @ v1).shape == (N,)
    np.testing.assert_allclose(K @ v2, Kd @ v2, rtol=1e-12)
    np.testing.assert_allclose(K.matvec(v2), Kd @ v2, rtol=1e-12)
    w = RNG.random((N, 2))
    np.testing.assert_allclose(K.t() @ w, Kd.T @ w, rtol=1e-12)
    np.testing.assert_allclose(K.T @ w, Kd.T @ w, rtol=1e-12)
    np.testing.assert_allclose(K.rmatvec(w), Kd.T @ w, rtol=1e-12)
    # keyword arguments go to the reduction
    np.testing.assert_allclose(K.__matmul__(v2, backend="reference"), Kd @ v2, rtol=1e-12)


def test_matmul_batched_and_errors():
    x, y = RNG.random((2, N, D)), RNG.random((2, M, D))
    K = lazy_gauss(LazyTensor, x, y)
    v = RNG.random((2, M, 3))
    got = K @ v
    assert got.shape == (2, N, 3)
    np.testing.assert_allclose(got, gauss(x, y) @ v, rtol=1e-12)
    xl, yl = LazyTensor(x[0][:, None, :]), LazyTensor(y[0][None, :, :])
    with pytest.raises(ValueError, match="K @ v needs a LazyTensor K of dimension 1"):
        (xl - yl) @ v[0]
    with pytest.raises(TypeError):
        K @ "not an array"


def test_transpose_swaps_roles():
    """t() of a formula where the same array is read as x_i and as y_j (x - x'), with a weight
    on j: the transpose puts the weight on i; twice is the identity; t() of an i-only
    LazyTensor is j-indexed."""
    x, y, b = RNG.random((N, D)), RNG.random((M, D)), RNG.random((M, 1))
    xi, yj, bj = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :]), LazyTensor(b[None])
    F = ((xi - yj) ** 2).sum(-1) * bj  # (N, M)
    Fd = ((x[:, None] - y[None]) ** 2).sum(-1) * b[:, 0][None]
    assert F.t().shape == (M, N)
    np.testing.assert_allclose(F.t().sum(dim=1), Fd.T.sum(1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(F.t().t().sum(dim=1), Fd.sum(1, keepdims=True), rtol=1e-12)
    # (x_i - x_j) with one array: its transpose is -(x_i - x_j)
    A = LazyTensor(x[:, None, :]) - LazyTensor(x[None, :, :])
    np.testing.assert_allclose(A.t().sum(dim=1), -A.sum(dim=1), atol=1e-12)
    assert xi.t().shape == (1, N, D)


def test_transpose_swaps_ranges():
    from symred.numpy.cluster import swap_axes

    x, y = RNG.random((4, D)), RNG.random((6, D))
    K = lazy_gauss(LazyTensor, x, y)
    Kd = gauss(x, y)
    # rows 0-1 see columns 0-2, rows 2-3 see columns 3-5
    rg = (np.array([[0, 2], [2, 4]]), np.array([1, 2]), np.array([[0, 3], [3, 6]]),
          np.array([[0, 3], [3, 6]]), np.array([1, 2]), np.array([[0, 2], [2, 4]]))
    K.ranges = rg
    mask = np.zeros((4, 6))
    mask[:2, :3] = mask[2:, 3:] = 1
    w = RNG.random((4, 1))
    np.testing.assert_allclose(K.t() @ w, (Kd * mask).T @ w, rtol=1e-12)
    assert K.t().ranges[0] is swap_axes(rg)[0]


def test_matmul_and_transpose_torch():
    torch = pytest.importorskip("torch")
    from symred.torch import LazyTensor as TL

    x = torch.rand(N, D, dtype=torch.float64, requires_grad=True)
    y = torch.rand(M, D, dtype=torch.float64)
    v = torch.rand(M, 2, dtype=torch.float64)
    K = (-((TL(x[:, None, :]) - TL(y[None, :, :])) ** 2).sum(-1)).exp()
    Kd = (-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)).exp()
    got, want = K @ v, Kd @ v
    assert torch.allclose(got, want, rtol=1e-12)
    gx, = torch.autograd.grad(got.sum(), x)
    wx, = torch.autograd.grad(want.sum(), x)
    assert torch.allclose(gx, wx, rtol=1e-10)
    w = torch.rand(N, dtype=torch.float64)
    assert torch.allclose(K.t() @ w, Kd.t() @ w, rtol=1e-12)
    assert (K.t() @ w).shape == (M,)


# ---- batch dimensions ------------------------------------------------------------------------


def batched():
    x = RNG.random((2, 3, N, 1, D))
    y = RNG.random((2, 1, 1, M, D))
    b = RNG.random((2, 3, 1, M, 2))
    return x, y, b


def test_batch_dims_are_numbered_as_pykeops():
    x, y, b = batched()
    X, Y, Bv = LazyTensor(x), LazyTensor(y), LazyTensor(b)
    F = (-((X - Y) ** 2).sum(-1)).exp() * Bv  # (2, 3, N, M, 2)
    assert F.shape == (2, 3, N, M, 2) and F.dim() == 5 and F.nbatchdims == 2
    Kd = np.exp(-((x - y) ** 2).sum(-1))[..., None] * b  # (2, 3, N, M, 2)
    # dim = B reduces over i, B + 1 over j; -3 and -2 are the same axes
    np.testing.assert_allclose(F.sum(dim=2), Kd.sum(2), rtol=1e-12)
    np.testing.assert_allclose(F.sum(3), Kd.sum(3), rtol=1e-12)
    np.testing.assert_allclose(F.sum(dim=-3), Kd.sum(2), rtol=1e-12)
    np.testing.assert_allclose(F.sum(axis=-2), Kd.sum(3), rtol=1e-12)
    np.testing.assert_allclose(F.max(2), Kd.max(2), rtol=1e-12)
    np.testing.assert_array_equal(F.argmin(dim=3), Kd.argmin(3))
    # B + 2 (and -1) is the vector axis: an operation, not a reduction
    S = F.sum(4)
    assert isinstance(S, LazyTensor) and S.shape == (2, 3, N, M)
    np.testing.assert_allclose(S.sum(3), Kd.sum(-1).sum(3)[..., None], rtol=1e-12)
    assert isinstance(F.sum(-1), LazyTensor)
    for bad in (0, 1, 5, -4):
        with pytest.raises(ValueError, match="must be 2 .over i, one result per j. or 3 .over j"):
            F.sum_reduction(dim=bad)
    with pytest.raises(ValueError, match="with 2 batch dimensions"):
        F.logsumexp(dim=1)


def test_unbatched_dims_unchanged():
    x, y = RNG.random((N, D)), RNG.random((M, D))
    K = lazy_gauss(LazyTensor, x, y)
    assert K.shape == (N, M) and K.dim() == 3 and K.batchdims == ()
    np.testing.assert_allclose(K.sum(0), gauss(x, y).sum(0)[:, None], rtol=1e-12)
    np.testing.assert_allclose(K.sum(dim=-2), gauss(x, y).sum(1)[:, None], rtol=1e-12)
    assert isinstance(K.sum(2), LazyTensor)


def test_batch_dims_torch():
    torch = pytest.importorskip("torch")
    from symred.torch import LazyTensor as TL

    x, y, b = (torch.from_numpy(a) for a in batched())
    F = (-((TL(x) - TL(y)) ** 2).sum(-1)).exp() * TL(b)
    Kd = (-((x - y) ** 2).sum(-1)).exp()[..., None] * b
    assert F.shape == (2, 3, N, M, 2)
    assert torch.allclose(F.sum(2), Kd.sum(2), rtol=1e-12)
    assert torch.allclose(F.sum(dim=3), Kd.sum(3), rtol=1e-12)


# ---- weighted LogSumExp, sinc ----------------------------------------------------------------


def test_weighted_logsumexp_numpy():
    x, y = RNG.random((N, D)), RNG.random((M, D))
    w = RNG.random((M, 2)) + 0.1
    F = -((LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])) ** 2).sum(-1)
    Fd = -((x[:, None] - y[None]) ** 2).sum(-1)
    want = np.log((np.exp(Fd)[:, :, None] * w[None]).sum(1))
    np.testing.assert_allclose(F.logsumexp(dim=1, weight=LazyTensor(w[None])), want, rtol=1e-12)
    np.testing.assert_allclose(F.logsumexp(dim=1, other=LazyTensor(w[None])), want, rtol=1e-12)
    # over i, with a weight on i
    u = RNG.random((N, 1)) + 0.1
    want0 = np.log((np.exp(Fd) * u).sum(0))[:, None]
    np.testing.assert_allclose(F.logsumexp(dim=0, weight=LazyTensor(u[:, None])), want0,
                               rtol=1e-12)
    # the same through Genred, with formula2
    g = Genred("-SqDist(x,y)", ["x=Vi(3)", "y=Vj(3)", "w=Vj(2)"], reduction_op="LogSumExp",
               axis=1, formula2="w")
    np.testing.assert_allclose(g(x, y, w), want, rtol=1e-12)
    with pytest.raises(ValueError, match="needs a scalar formula"):
        Genred("x-y", ["x=Vi(3)", "y=Vj(3)", "w=Vj(2)"], reduction_op="LogSumExp", axis=1,
               formula2="w")
    with pytest.raises(TypeError, match="weight and other"):
        F.logsumexp(dim=1, weight=LazyTensor(w[None]), other=LazyTensor(w[None]))


def test_weighted_logsumexp_torch_grad():
    torch = pytest.importorskip("torch")
    from symred.torch import LazyTensor as TL

    x = torch.rand(N, D, dtype=torch.float64, requires_grad=True)
    y = torch.rand(M, D, dtype=torch.float64)
    w = (torch.rand(M, 1, dtype=torch.float64) + 0.1).requires_grad_()
    got = (-((TL(x[:, None, :]) - TL(y[None, :, :])) ** 2).sum(-1)).logsumexp(
        dim=1, weight=TL(w[None]))
    Fd = -((x[:, None] - y[None]) ** 2).sum(-1)
    want = torch.logsumexp(Fd + torch.log(w[:, 0])[None], dim=1, keepdim=True)
    assert torch.allclose(got, want, rtol=1e-12)
    g = torch.autograd.grad(got.square().sum(), (x, w))
    h = torch.autograd.grad(want.square().sum(), (x, w))
    for a, b in zip(g, h):
        assert torch.allclose(a, b, rtol=1e-9)


def test_sinc_numpy():
    x = np.array([0.0, 0.25, -0.5, 1.0, 1.5, 3.0])[:, None]
    got = LazyTensor(x[:, None, :]).sinc().sum(dim=1)
    want = np.sinc(x)  # NumPy's sinc is the normalised one too
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert got[0, 0] == 1.0


def test_sinc_torch_values_and_grad():
    torch = pytest.importorskip("torch")
    from symred.torch import LazyTensor as TL

    x = torch.tensor([[0.0], [0.3], [-1.7], [2.0], [5.5]], dtype=torch.float64,
                     requires_grad=True)
    got = TL(x[:, None, :]).sinc().sum(dim=1)
    want = torch.sinc(x)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-15)
    g, = torch.autograd.grad(got.sum(), x)
    h, = torch.autograd.grad(want.sum(), x)
    assert torch.allclose(g, h, rtol=1e-10, atol=1e-14)
    assert g[0, 0] == 0.0


# ---- out=, pickling, dtypes ------------------------------------------------------------------


def test_out_numpy():
    x, y = RNG.random((N, D)), RNG.random((M, D))
    K = lazy_gauss(LazyTensor, x, y)
    v = RNG.random((M, 2))
    out = np.full((N, 2), np.nan)
    res = K.__matmul__(v, out=out)
    assert res is out
    np.testing.assert_allclose(out, gauss(x, y) @ v, rtol=1e-12)
    g = Genred("SqDist(x,y)", ["x=Vi(3)", "y=Vj(3)"], axis=1)
    out = np.empty((N, 1))
    assert g(x, y, out=out) is out
    np.testing.assert_allclose(out, ((x[:, None] - y[None]) ** 2).sum(-1).sum(1, keepdims=True),
                               rtol=1e-12)
    with pytest.raises(ValueError, match=r"out must be a NumPy array of shape \(9, 1\)"):
        g(x, y, out=np.empty((M, 1)))
    gm = Genred("SqDist(x,y)", ["x=Vi(3)", "y=Vj(3)"], reduction_op="Min_ArgMin", axis=1)
    with pytest.raises(ValueError, match="returns two"):
        gm(x, y, out=np.empty((N, 1)))


def test_out_torch():
    torch = pytest.importorskip("torch")
    import symred.torch as st

    x, y = torch.rand(N, D, dtype=torch.float64), torch.rand(M, D, dtype=torch.float64)
    g = st.Genred("SqDist(x,y)", ["x=Vi(3)", "y=Vj(3)"], axis=1)
    out = torch.empty(N, 1, dtype=torch.float64)
    assert g(x, y, out=out) is out
    assert torch.allclose(out, ((x[:, None] - y[None]) ** 2).sum(-1).sum(1, keepdim=True))
    with pytest.raises(ValueError, match="dtype float64"):
        g(x, y, out=torch.empty(N, 1, dtype=torch.float32))


def test_pickle_genred():
    x, y, w = RNG.random((N, D)), RNG.random((M, D)), RNG.random((M, 2))
    for g in (Genred("SqDist(x,y)", ["x=Vi(3)", "y=Vj(3)"], reduction_op="ArgKMin", axis=1,
                     opt_arg=2),
              Genred("-SqDist(x,y)", ["x=Vi(3)", "y=Vj(3)", "w=Vj(2)"], "LogSumExp", 1,
                     formula2="w")):
        args = (x, y) if g.formula2 is None else (x, y, w)
        h = pickle.loads(pickle.dumps(g))
        assert type(h) is type(g) and h.reduction_op == g.reduction_op and h.axis == 1
        np.testing.assert_array_equal(h(*args), g(*args))
    ks = snp.KernelSolve("Exp(-SqDist(x,y))*b", ["x=Vi(3)", "y=Vj(3)", "b=Vj(1)"], "b", axis=1)
    ks2 = pickle.loads(pickle.dumps(ks))
    b = RNG.random((N, 1))
    xs = RNG.random((N, D))
    np.testing.assert_allclose(ks2(xs, xs, b, alpha=1.0), ks(xs, xs, b, alpha=1.0), rtol=1e-12)


def test_pickle_torch_genred():
    torch = pytest.importorskip("torch")
    import symred.torch as st

    g = st.Genred("SqDist(x,y)", ["x=Vi(3)", "y=Vj(3)"], reduction_op="Sum", axis=1)
    h = pickle.loads(pickle.dumps(g))
    assert type(h) is st.Genred
    x, y = torch.rand(N, D), torch.rand(M, D)
    assert torch.equal(h(x, y), g(x, y))


def test_float64_tensor_parameter_of_shape_1():
    torch = pytest.importorskip("torch")
    from symred.torch import LazyTensor as TL

    x = torch.rand(N, 1, D, dtype=torch.float64)
    t = torch.tensor([2.5], dtype=torch.float64)
    for F in (TL(x) * t, t * TL(x)):
        got = F.sum(dim=0)
        assert got.dtype == torch.float64
        assert torch.allclose(got, (x * t).sum(0), rtol=1e-12)


# ---- pykeops' module names, formulas, and the shim -------------------------------------------


def test_pykeops_module_names():
    import importlib

    cfg = importlib.import_module("symred.config")
    assert isinstance(cfg.gpu_available, bool)
    utils = importlib.import_module("symred.numpy.utils")
    assert importlib.import_module("symred.numpy.operations").KernelSolve is snp.KernelSolve
    x, y = RNG.random((N, D)), RNG.random((M, D))
    sq = ((x[:, None] - y[None]) ** 2).sum(-1)
    np.testing.assert_allclose(utils.squared_distances(x, y), sq, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(utils.differences(x, y), np.moveaxis(x[:, None] - y[None], -1, 0))
    np.testing.assert_allclose(utils.np_kernel(x, y, 0.7, "gaussian"), np.exp(-sq / 0.49),
                               rtol=1e-10)
    np.testing.assert_allclose(utils.np_kernel(x, y, 0.7, "cauchy"), 1 / (1 + sq / 0.49),
                               rtol=1e-10)
    # the derivative in r^2, by finite differences of the kernel as a function of r^2
    for kernel in ("gaussian", "laplacian", "cauchy", "inverse_multiquadric"):
        s, r2, h = 0.7, 0.8, 1e-6
        x1, y1 = np.array([[math.sqrt(r2), 0.0]]), np.zeros((1, 2))
        x2 = np.array([[math.sqrt(r2 + h), 0.0]])
        fd = (utils.np_kernel(x2, y1, s, kernel) - utils.np_kernel(x1, y1, s, kernel)) / h
        np.testing.assert_allclose(utils.grad_np_kernel(x1, y1, s, kernel), fd, rtol=1e-4)
    m = RNG.random((4, 5)) * 50
    np.testing.assert_allclose(utils.log_sum_exp(m, axis=1), np.log(np.exp(m).sum(1)),
                               rtol=1e-12)
    n = RNG.standard_normal((4, 3))
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    np.testing.assert_allclose(utils.np_kernel_sphere(n, n, 1.0, "binet"), (n @ n.T) ** 2)
    with pytest.raises(ValueError, match="unknown kernel"):
        utils.np_kernel(x, y, 1.0, "bogus")


def test_keopscore_trailing_commas():
    x, y = RNG.random((N, D)), RNG.random((M, D))
    g = Genred("Abs(x-y,)", ["x=Vi(3)", "y=Vj(3)"], axis=1)
    np.testing.assert_allclose(g(x, y), np.abs(x[:, None] - y[None]).sum(1), rtol=1e-12)


def test_shim_maps_module_names_only():
    """pykeops_shim: ``pykeops.X`` is ``symred.X``, the pykeops package installed or not."""
    here = Path(__file__).resolve().parent.parent
    code = ("import pykeops_shim, symred, symred.numpy, symred.torch\n"
            "import pykeops, pykeops.config, pykeops.numpy, pykeops.torch\n"
            "from pykeops.numpy.utils import squared_distances\n"
            "from pykeops.torch.cluster import grid_cluster\n"
            "from pykeops.torch.operations import KernelSolve\n"
            "assert pykeops is symred and pykeops.numpy is symred.numpy\n"
            "assert pykeops.torch.LazyTensor is symred.torch.LazyTensor\n"
            "assert squared_distances is symred.numpy.utils.squared_distances\n"
            "assert KernelSolve is symred.torch.KernelSolve\n"
            "try:\n"
            "    import pykeops.nothing_there\n"
            "except ImportError:\n"
            "    print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(here / "pykeops_shim"), str(here), os.environ.get("PYTHONPATH", "")]))
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
