"""Leading batch dimensions on Genred arrays and LazyTensors (pykeops' broadcasting), run as one
kernel launch with block-diagonal ranges: against a Python loop over the batches."""

import numpy as np
import pytest

import symred.genred as genred_mod
from symred.numpy import Genred, LazyTensor

ALIASES = ["x = Vi(2)", "y = Vj(2)", "b = Vj(1)", "p = Pm(1)"]
GAUSS = "Exp(-SqDist(x, y) * p) * b"


def data(seed=0, B=3, M=7, N=5):
    rng = np.random.default_rng(seed)
    return (rng.random((B, M, 2)), rng.random((B, N, 2)), rng.random((B, N, 1)),
            rng.random((B, 1)) + 0.5)


class CountingLib:
    """genred's ``lib`` with a count of the kernel runs."""

    def __init__(self, lib):
        self._lib, self.runs = lib, 0

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if name.startswith("sr_kernel_run"):
            def counted(*a):
                self.runs += 1
                return fn(*a)
            return counted
        return fn


def test_batched_sum_with_batched_parameter_is_one_launch(monkeypatch):
    x, y, b, p = data()
    g = Genred(GAUSS, ALIASES, axis=1)
    loop = np.stack([g(x[k], y[k], b[k], p[k]) for k in range(3)])
    counter = CountingLib(genred_mod.lib)
    monkeypatch.setattr(genred_mod, "lib", counter)
    out = g(x, y, b, p)
    assert counter.runs == 1
    assert out.shape == (3, 7, 1)
    np.testing.assert_allclose(out, loop, rtol=1e-12)


@pytest.mark.parametrize("axis", [0, 1])
def test_argkmin_indices_are_per_batch(axis):
    x, y, _, _ = data(1, B=4, M=9, N=11)
    g = Genred("SqDist(x, y)", ALIASES[:2], reduction_op="ArgKMin", opt_arg=3, axis=axis)
    out = g(x, y)
    loop = np.stack([g(x[k], y[k]) for k in range(4)])
    np.testing.assert_array_equal(out, loop)
    assert out.shape == ((4, 9, 3) if axis == 1 else (4, 11, 3))


def test_broadcast_shared_reduced_side_and_output_side():
    x, y, b, p = data(2)
    g = Genred(GAUSS, ALIASES, axis=1)
    # y, b shared by the batches (batch dimension 1), p one number
    out = g(x, y[:1], b[:1], p[0])
    loop = np.stack([g(x[k], y[0], b[0], p[0]) for k in range(3)])
    np.testing.assert_allclose(out, loop, rtol=1e-12)
    # x shared, y batched: the output side is repeated
    out = g(x[:1], y, b, p)
    loop = np.stack([g(x[0], y[k], b[k], p[k]) for k in range(3)])
    np.testing.assert_allclose(out, loop, rtol=1e-12)
    # plain 2-D x with batched y
    out = g(x[0], y, b, p)
    np.testing.assert_allclose(out, loop, rtol=1e-12)


def test_two_batch_dimensions_broadcast_axis0_min_argmin():
    rng = np.random.default_rng(3)
    x = rng.random((2, 1, 6, 2))
    y = rng.random((1, 3, 8, 2))
    g = Genred("SqDist(x, y)", ALIASES[:2], reduction_op="Min_ArgMin", axis=0)
    v, i = g(x, y)
    assert v.shape == (2, 3, 8, 1) and i.shape == (2, 3, 8, 1)
    for a in range(2):
        for c in range(3):
            wv, wi = g(x[a, 0], y[0, c])
            np.testing.assert_allclose(v[a, c], wv, rtol=1e-12)
            np.testing.assert_array_equal(i[a, c], wi)


def test_float32_logsumexp_and_kmin():
    x, y, b, p = (a.astype(np.float32) for a in data(4))
    for red, kw in (("LogSumExp", {}), ("KMin", {"opt_arg": 2})):
        g = Genred("-SqDist(x, y) * p + b", ALIASES, reduction_op=red, axis=1, **kw)
        out = g(x, y, b, p)
        loop = np.stack([g(x[k], y[k], b[k], p[k]) for k in range(3)])
        np.testing.assert_allclose(out, loop, rtol=1e-6, atol=1e-6)


def test_lazytensor_batches():
    x, y, b, p = data(5)
    X, Y = LazyTensor(x[:, :, None, :]), LazyTensor(y[:, None, :, :])
    Bv, P = LazyTensor(b[:, None, :, :]), LazyTensor(p[:, None, None, :])
    out = ((-((X - Y) ** 2).sum(-1) * P).exp() * Bv).sum(dim=1)
    g = Genred(GAUSS, ALIASES, axis=1)
    loop = np.stack([g(x[k], y[k], b[k], p[k]) for k in range(3)])
    assert out.shape == (3, 7, 1)
    np.testing.assert_allclose(out, loop, rtol=1e-12)
    idx = ((X - Y) ** 2).sum(-1).argmin(dim=0)
    assert idx.shape == (3, 5, 1)
    D = ((x[:, :, None, :] - y[:, None, :, :]) ** 2).sum(-1)
    np.testing.assert_array_equal(idx[..., 0], D.argmin(axis=1))


def test_batch_errors():
    x, y, b, p = data(6)
    g = Genred(GAUSS, ALIASES, axis=1)
    with pytest.raises(ValueError, match="do not broadcast"):
        g(x, y[:2], b[:2], p)
    with pytest.raises(ValueError, match="ranges with batch dimensions"):
        g(x, y, b, p, ranges=((), (), (), (), (), ()))
    gk = Genred("SqDist(x, y)", ALIASES[:2], reduction_op="ArgKMin", opt_arg=6, axis=1)
    with pytest.raises(ValueError, match="exceeds the 5 reduced rows of each batch"):
        gk(x, y)
    gv = Genred("SqDist(x, Var(1, 2, 1)) * Var(2, 1, 2)", ["x = Vi(2)"], axis=1)
    with pytest.raises(ValueError, match="needs an alias"):
        gv(x, y, p)


def test_torch_batches_forward_and_backward():
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    from symred.torch import Genred as TGenred

    x, y, b, p = (torch.tensor(a, requires_grad=True) for a in data(7))
    g = TGenred(GAUSS, ALIASES, axis=1)
    out = g(x, y, b, p)
    loop = torch.stack([g(x[k], y[k], b[k], p[k]) for k in range(3)])
    assert out.shape == (3, 7, 1)
    assert torch.allclose(out, loop, rtol=1e-12)
    w = torch.randn(3, 7, 1, dtype=torch.float64)
    grads = torch.autograd.grad((out * w).sum(), (x, y, b, p))
    wants = torch.autograd.grad((loop * w).sum(), (x, y, b, p))
    for a, c in zip(grads, wants):
        assert torch.allclose(a, c, rtol=1e-10, atol=1e-12)
    idx = TGenred("SqDist(x, y)", ALIASES[:2], reduction_op="ArgMin", axis=1)(x, y)
    D = ((x[:, :, None, :] - y[:, None, :, :]) ** 2).sum(-1)
    assert torch.equal(idx[..., 0], D.argmin(dim=2))
