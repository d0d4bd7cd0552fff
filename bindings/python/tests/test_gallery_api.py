"""pykeops API that KeOps' gallery scripts (tutorials, examples, benchmarks) use, each against
the dense NumPy or torch computation: a reduction or solve made with ``call=False`` exposes the
Genred or KernelSolve it calls as ``callfun``, and calling either gives the result; a solver's
``alpha`` may be a one-element array or tensor; a variable of dimension 1 may be a 1-D array."""

import numpy as np
import pytest

import symred
import symred.numpy
from symred import Vi, Vj

RNG = np.random.default_rng(11)
N, M, D = 12, 9, 2


def gauss(x, y, s=0.5):
    return np.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1) / (2 * s * s))


def test_reduction_call_false_callfun_numpy():
    x, y, b = RNG.random((N, D)), RNG.random((M, D)), RNG.random((M, 3))
    K = (-Vi(x).sqdist(Vj(y)) / 0.5).exp()
    red = (K * Vj(b)).sum(axis=1, call=False)
    assert isinstance(red.callfun, symred.Genred)
    assert red.callfun is red.genred
    want = gauss(x, y) @ b
    np.testing.assert_allclose(red(), want, rtol=1e-12)
    # pykeops calls callfun with the LazyTensor's arrays: x, y, b in the order of the formula
    np.testing.assert_allclose(red.callfun(*red._arrays), want, rtol=1e-12)


def test_solve_call_false_callfun_numpy():
    x, b, alpha = RNG.random((N, D)), RNG.random((N, 2)), 0.1
    K = (-Vi(x).sqdist(Vj(x)) / 0.5).exp()
    cfun = K.solve(Vi(b), alpha=alpha, eps=1e-12, call=False)
    assert isinstance(cfun.callfun, symred.KernelSolve)
    want = np.linalg.solve(alpha * np.eye(N) + gauss(x, x), b)
    np.testing.assert_allclose(cfun(), want, rtol=1e-6, atol=1e-9)
    assert "KernelSolve" in repr(cfun.callfun)


def test_solve_call_false_callfun_torch():
    torch = pytest.importorskip("torch")
    from symred.torch import LazyTensor as keops  # as the gallery's solver example does
    from symred.torch import Vi, Vj

    x = torch.rand(N, D, dtype=torch.float64, requires_grad=True)
    b = torch.rand(N, 2, dtype=torch.float64)
    alpha, s = 0.1, 0.5
    K = keops.exp(-keops.sum((Vi(x) - Vj(x)) ** 2, dim=2) / (2 * s * s))
    cfun = keops.solve(K, Vi(b), alpha=alpha, eps=1e-12, call=False)
    assert isinstance(cfun.callfun, symred.torch.KernelSolve)
    c = cfun()
    Kd = alpha * torch.eye(N, dtype=torch.float64) + torch.exp(
        -((x[:, None, :] - x[None, :, :]) ** 2).sum(-1) / (2 * s * s))
    want = torch.linalg.solve(Kd, b)
    torch.testing.assert_close(c, want, rtol=1e-6, atol=1e-9)
    e = torch.rand(N, 2, dtype=torch.float64)
    (g,) = torch.autograd.grad(c, x, e)
    (g_want,) = torch.autograd.grad(want, x, e)
    torch.testing.assert_close(g, g_want, rtol=1e-5, atol=1e-8)


def test_solve_alpha_one_element_array():
    """The solver benchmark passes alpha as a shape-(1,) array, as pykeops allows."""
    x, b = RNG.random((N, D)).astype(np.float32), RNG.random((N, 1)).astype(np.float32)
    g = np.array([2.0], dtype=np.float32)
    ks = symred.KernelSolve("Exp(-g * SqDist(x, y)) * a",
                            ["x = Vi(2)", "y = Vj(2)", "a = Vj(1)", "g = Pm(1)"], "a", axis=1)
    alpha = np.ones((1,), dtype=np.float32) * 0.8
    Kd = alpha[0] * np.eye(N) + np.exp(-2.0 * ((x[:, None] - x[None]) ** 2).sum(-1))
    want = np.linalg.solve(Kd, b.astype(np.float64))
    np.testing.assert_allclose(ks(x, x, b, g, alpha=alpha), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ks(x, x, b, g, alpha=np.float32(0.8)), want, rtol=1e-4,
                               atol=1e-5)
    with pytest.raises(ValueError, match="one-element"):
        ks(x, x, b, g, alpha=np.ones(2))


def test_solve_alpha_one_element_tensor():
    torch = pytest.importorskip("torch")
    import symred.torch

    x, b = torch.rand(N, D, dtype=torch.float64), torch.rand(N, 1, dtype=torch.float64)
    g = torch.tensor([2.0], dtype=torch.float64)
    ks = symred.torch.KernelSolve("Exp(-g * SqDist(x, y)) * a",
                                  ["x = Vi(2)", "y = Vj(2)", "a = Vj(1)", "g = Pm(1)"], "a",
                                  axis=1)
    alpha = torch.ones(1, dtype=torch.float64) * 0.8
    Kd = 0.8 * torch.eye(N, dtype=torch.float64) + torch.exp(
        -2.0 * ((x[:, None] - x[None]) ** 2).sum(-1))
    torch.testing.assert_close(ks(x, x, b, g, alpha=alpha, eps=1e-12),
                               torch.linalg.solve(Kd, b), rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="one-element"):
        ks(x, x, b, g, alpha=torch.ones(2, dtype=torch.float64))


def test_flat_dim1_variable_numpy():
    """A 1-D array for a variable of dimension 1 is read as (n, 1), as pykeops reads it (the
    3-D convolution benchmark passes b.squeeze() for B = Vj(1))."""
    x, y, b = RNG.random((N, 3)), RNG.random((M, 3)), RNG.random(M)
    f = symred.numpy.generic_sum("Exp(-SqDist(X,Y)) * B", "A = Vi(1)", "X = Vi(3)",
                                 "Y = Vj(3)", "B = Vj(1)")
    want = gauss(x, y, s=np.sqrt(0.5)) @ b
    got = f(x, y, b)
    assert got.shape == (N, 1)
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-12)
    # beside batched arrays, a variable keeps its (..., n, d) shape
    with pytest.raises(ValueError, match=r"must have shape \(\.\.\., ny, 1\)"):
        f(x[None], y[None], b)
    # KernelSolve's unknown keeps its (n, 1) shape
    ks = symred.KernelSolve("Exp(-SqDist(x,y)) * a", ["x = Vi(3)", "y = Vj(3)", "a = Vj(1)"],
                            "a", axis=1)
    with pytest.raises(ValueError, match=r"a\[:, None\]"):
        ks(x, x, RNG.random(N))


def test_flat_dim1_variable_torch():
    torch = pytest.importorskip("torch")
    import symred.torch

    x = torch.rand(N, 3, dtype=torch.float64, requires_grad=True)
    y = torch.rand(M, 3, dtype=torch.float64)
    b = torch.rand(M, dtype=torch.float64, requires_grad=True)
    f = symred.torch.generic_sum("Exp(-SqDist(X,Y)) * B", "A = Vi(1)", "X = Vi(3)",
                                 "Y = Vj(3)", "B = Vj(1)")
    got = f(x, y, b)
    want = torch.exp(-((x[:, None] - y[None]) ** 2).sum(-1)) @ b
    assert got.shape == (N, 1)
    torch.testing.assert_close(got[:, 0], want, rtol=1e-12, atol=0)
    e = torch.rand(N, 1, dtype=torch.float64)
    gx, gb = torch.autograd.grad(got, (x, b), e)
    wx, wb = torch.autograd.grad(want, (x, b), e[:, 0])
    assert gb.shape == b.shape
    torch.testing.assert_close(gx, wx, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gb, wb, rtol=1e-10, atol=1e-12)
