"""The sum split (docs/simplifier.md): SGPR's d/dg of the M-wide Sum, one Genred that symred runs
as two fused kernels, against NumPy on the dense matrix, with leading batch dimensions, and its
gradients through symred.torch."""

import numpy as np
import pytest

from symred.numpy import Genred

M = 24
Q = "(SqNorm2(x) - 2 * MatVecMult(Zt, x) + zn)"
FORMULA = f"(SqDist(z, x) + {Q}) * Exp(-g * SqDist(z, x)) * Exp(-g * {Q})"
ALIASES = ["z = Vi(3)", "x = Vj(3)", "g = Pm(1)", f"Zt = Pm({3 * M})", f"zn = Pm({M})"]


def data(seed=0, n=40, m=57, batch=()):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((M, 3)) * 0.5
    return (rng.standard_normal(batch + (n, 3)), rng.standard_normal(batch + (m, 3)),
            np.array([0.7]), W.reshape(-1).copy(), (W * W).sum(1))


def dense(z, x, g, Zt, zn):
    d = ((z[:, None, :] - x[None, :, :]) ** 2).sum(-1)           # n x m
    q = (x * x).sum(1)[:, None] - 2 * x @ Zt.reshape(M, 3).T + zn  # m x M
    return ((d[:, :, None] + q[None]) * np.exp(-g[0] * d)[:, :, None]
            * np.exp(-g[0] * q)[None]).sum(1)


def test_split_fires_and_equals_dense():
    g = Genred(FORMULA, ALIASES, reduction_op="Sum", axis=1, dtype="float64")
    assert g.plan(backend="cpu")["strategy"] == "sum split", g.explain(backend="cpu")
    args = data()
    np.testing.assert_allclose(g(*args, backend="cpu"), dense(*args), rtol=1e-12, atol=1e-12)


def test_split_with_batch_dimensions_equals_the_loop():
    g = Genred(FORMULA, ALIASES, reduction_op="Sum", axis=1, dtype="float64")
    z, x, gg, Zt, zn = data(seed=1, batch=(3,))
    assert g.plan(backend="cpu")["strategy"] == "sum split", g.explain(backend="cpu")
    out = g(z, x, gg, Zt, zn, backend="cpu")
    assert out.shape == (3, 40, M)
    for b in range(3):
        np.testing.assert_allclose(out[b], dense(z[b], x[b], gg, Zt, zn), rtol=1e-12,
                                   atol=1e-12)


def test_split_gradients_through_torch():
    torch = pytest.importorskip("torch")
    from symred.torch import Genred as TGenred
    g = TGenred(FORMULA, ALIASES, reduction_op="Sum", axis=1, dtype="float64")
    z, x, gg, Zt, zn = (torch.tensor(a, requires_grad=True) for a in data(seed=2))
    assert g.plan(backend="cpu")["strategy"] == "sum split", g.explain(backend="cpu")
    out = g(z, x, gg, Zt, zn, backend="cpu")
    w = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    gz, gx, gp = torch.autograd.grad((out * w).sum(), (z, x, gg))
    d = ((z[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    q = (x * x).sum(1)[:, None] - 2 * x @ Zt.reshape(M, 3).T + zn
    ref = ((d[:, :, None] + q[None]) * torch.exp(-gg[0] * d)[:, :, None]
           * torch.exp(-gg[0] * q)[None]).sum(1)
    rz, rx, rp = torch.autograd.grad((ref * w).sum(), (z, x, gg))
    for a, b in ((gz, rz), (gx, rx), (gp, rp)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
