"""symred.KernelSolve and LazyTensor.solve against numpy.linalg.solve of the dense matrix."""

import numpy as np
import pytest

import symred
from symred import KernelSolve, LazyTensor

FORMULA = "Exp(-g * SqDist(x, y)) * b"
G = 2.0


def aliases(nb, axis=1):
    i, j = ("Vi", "Vj") if axis == 1 else ("Vj", "Vi")
    return [f"x = {i}(2)", f"y = {j}(2)", f"b = {j}({nb})", "g = Pm(1)"]


def dense(x, alpha):
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    return np.exp(-G * d2) + alpha * np.eye(len(x))


def data(n, nb, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (n, 2)).astype(dtype), rng.uniform(-1, 1, (n, nb)).astype(dtype))


TOL = {np.float32: dict(eps=1e-5, atol=2e-3), np.float64: dict(eps=1e-10, atol=1e-7)}


@pytest.mark.parametrize("n", [50, 97])
@pytest.mark.parametrize("nb", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernelsolve_matches_numpy(n, nb, dtype):
    x, b = data(n, nb, dtype)
    Kinv = KernelSolve(FORMULA, aliases(nb), "b", axis=1)
    a = Kinv(x, x, b, np.array([G], dtype), alpha=0.5, eps=TOL[dtype]["eps"])
    assert a.shape == b.shape and a.dtype == dtype
    ref = np.linalg.solve(dense(x.astype(np.float64), 0.5), b.astype(np.float64))
    np.testing.assert_allclose(a, ref, rtol=0, atol=TOL[dtype]["atol"] * abs(ref).max())


def test_kernelsolve_axis_0_and_default_eps():
    x, b = data(60, 2, np.float64, seed=1)
    a = KernelSolve(FORMULA, aliases(2, axis=0), "b", axis=0)(x, x, b, np.array([G]), alpha=1.0)
    ref = np.linalg.solve(dense(x, 1.0), b)
    # pykeops' rule: |r|^2 < size(b) eps^2 with eps = 1e-6.
    r = dense(x, 1.0) @ a - b
    assert (r ** 2).sum() < b.size * 1e-12
    np.testing.assert_allclose(a, ref, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lazytensor_solve(dtype):
    x, b = data(97, 3, dtype, seed=2)
    x_i, x_j = LazyTensor(x[:, None, :]), LazyTensor(x[None, :, :])
    K = (-G * ((x_i - x_j) ** 2).sum()).exp()
    a = K.solve(b, alpha=0.5, eps=TOL[dtype]["eps"])
    ref = np.linalg.solve(dense(x.astype(np.float64), 0.5), b.astype(np.float64))
    np.testing.assert_allclose(a, ref, rtol=0, atol=TOL[dtype]["atol"] * abs(ref).max())
    # The right-hand side as a Vi LazyTensor, as pykeops' examples write it.
    a2 = K.solve(LazyTensor(b[:, None, :]), alpha=0.5, eps=TOL[dtype]["eps"])
    np.testing.assert_array_equal(a, a2)


def test_no_convergence_is_reported():
    x, b = data(50, 1, np.float64)
    Kinv = KernelSolve(FORMULA, aliases(1), "b", axis=1)
    with pytest.raises(symred.SymredRuntimeError) as e:
        Kinv(x, x, b, np.array([G]), alpha=0.1, max_iter=1)
    assert e.value.status_name == "ENOCONV"
    assert "no convergence after 1 iterations" in str(e.value)
    assert "residual" in str(e.value)


def test_bad_input():
    x, b = data(50, 1, np.float64)
    g = np.array([G])
    Kinv = KernelSolve(FORMULA, aliases(1), "b", axis=1)
    with pytest.raises(ValueError, match="alpha"):
        Kinv(x, x, b, g, alpha=-1.0)
    with pytest.raises(ValueError, match="square"):
        Kinv(x, x[:40], b[:40], g)
    # Different data for x_i and x_j: K is not symmetric.
    y = np.random.default_rng(7).uniform(-1, 1, (50, 2))
    with pytest.raises(ValueError, match="not symmetric"):
        Kinv(x, y, b, g, alpha=0.5)
    with pytest.raises(ValueError, match="varinvalias"):
        KernelSolve(FORMULA, aliases(1), "c", axis=1)
    with pytest.raises(ValueError, match="batch dimensions are not supported"):
        Kinv(np.stack([x, x]), x, b, g)
    # b of the output index: not a right-hand side of a Sum over j.
    with pytest.raises(ValueError, match="b_index"):
        KernelSolve(FORMULA, aliases(1), "x", axis=1)(x, x, b, g)
    with pytest.raises(ValueError, match="var="):
        x_i, x_j = LazyTensor(x[:, None, :]), LazyTensor(x[None, :, :])
        (-((x_i - x_j) ** 2).sum()).exp().solve(b, var=x_j)
