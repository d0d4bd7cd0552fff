"""Leading batch dimensions on Genred arrays and LazyTensors (pykeops' broadcasting), run as one
kernel launch with block-diagonal ranges: against a Python loop over the batches."""

import numpy as np
import pytest

import symred.genred as genred_mod
from symred.numpy import Genred, LazyTensor
from test_ranges import F2, dense_F, mask_of, masked_reduce, random_ranges

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
    # pykeops' numbering: with one batch dimension, dim=1 reduces over i and dim=2 over j.
    out = ((-((X - Y) ** 2).sum(-1) * P).exp() * Bv).sum(dim=2)
    g = Genred(GAUSS, ALIASES, axis=1)
    loop = np.stack([g(x[k], y[k], b[k], p[k]) for k in range(3)])
    assert out.shape == (3, 7, 1)
    np.testing.assert_allclose(out, loop, rtol=1e-12)
    idx = ((X - Y) ** 2).sum(-1).argmin(dim=1)
    assert idx.shape == (3, 5, 1)
    D = ((x[:, :, None, :] - y[:, None, :, :]) ** 2).sum(-1)
    np.testing.assert_array_equal(idx[..., 0], D.argmin(axis=1))


def test_batch_errors():
    x, y, b, p = data(6)
    g = Genred(GAUSS, ALIASES, axis=1)
    with pytest.raises(ValueError, match="do not broadcast"):
        g(x, y[:2], b[:2], p)
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


# ---- ranges together with batch dimensions ------------------------------------------------


def stack_ranges(per_batch):
    """Per-batch 6-tuples stacked into one with a leading batch dimension, the shorter ones
    padded with empty blocks and intervals (allowed by the format)."""
    out = []
    for t in range(6):
        arrs = [np.asarray(r[t], dtype=np.int64) for r in per_batch]
        n = max(len(a) for a in arrs)
        padded = []
        for a in arrs:
            if t in (1, 4):  # slices: repeat the last end (no new intervals)
                last = a[-1] if len(a) else 0
                padded.append(np.concatenate([a, np.full(n - len(a), last, np.int64)]))
            else:
                padded.append(np.concatenate([a.reshape(-1, 2),
                                              np.zeros((n - len(a), 2), np.int64)]))
        out.append(np.stack(padded))
    return tuple(out)


def batch_data(B=3, M=13, N=17, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, M, 3)), rng.standard_normal((B, N, 3))


@pytest.mark.parametrize("red", ["Sum", "ArgKMin", "LogSumExp", "Min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_per_batch_ranges_against_masked_dense_loop(red, axis, monkeypatch):
    x, y = batch_data(seed=1)
    per = [random_ranges(13, 17, seed=10 + k, drop=axis) for k in range(3)]
    R = stack_ranges(per)
    kw = {"opt_arg": 3} if red == "ArgKMin" else {}
    g = Genred(F2, ["x = Vi(3)", "y = Vj(3)"], reduction_op=red, axis=axis, **kw)
    counter = CountingLib(genred_mod.lib)
    monkeypatch.setattr(genred_mod, "lib", counter)
    out = g(x, y, ranges=R)
    assert counter.runs == 1
    for k in range(3):
        want = masked_reduce(red, dense_F(x[k], y[k]), mask_of(per[k], axis, 13, 17), axis)
        if red == "ArgKMin":
            np.testing.assert_array_equal(out[k].reshape(want.shape), want)
        else:
            np.testing.assert_allclose(out[k], want, rtol=1e-12, atol=1e-12)


def test_per_batch_ranges_cpu_jit():
    """The JIT (the other tests run on the reference interpreter), float32, ArgKMin over i."""
    x, y = (a.astype(np.float32) for a in batch_data(B=4, M=40, N=50, seed=8))
    per = [random_ranges(40, 50, seed=60 + k, drop=0) for k in range(4)]
    g = Genred(F2, ["x = Vi(3)", "y = Vj(3)"], reduction_op="ArgKMin", opt_arg=3, axis=0)
    out = g(x, y, ranges=stack_ranges(per), backend="CPU")
    assert g.plan(backend="CPU")["backend"] == "cpu-jit", g.explain(backend="CPU")
    for k in range(4):
        want = masked_reduce("ArgKMin", dense_F(x[k], y[k]), mask_of(per[k], 0, 40, 50), 0)
        np.testing.assert_array_equal(out[k].reshape(want.shape), want)


def test_ranges_without_batch_dimensions_apply_to_every_batch():
    # A shared reduced side (y with no batch) and 2-D ranges; then two batch dimensions with
    # ranges of batch shape (2, 1) broadcast to (2, 3).
    x, y = batch_data(B=2, seed=2)
    R = random_ranges(13, 17, seed=3)
    g = Genred(F2, ["x = Vi(3)", "y = Vj(3)"], reduction_op="Sum", axis=1)
    out = g(x, y[0], ranges=R)
    for k in range(2):
        want = masked_reduce("Sum", dense_F(x[k], y[0]), mask_of(R, 1, 13, 17), 1)
        np.testing.assert_allclose(out[k], want, rtol=1e-12, atol=1e-12)
    x4 = np.random.default_rng(4).standard_normal((2, 3, 13, 3))
    per = [random_ranges(13, 17, seed=20 + a) for a in range(2)]
    R2 = tuple(r[:, None] for r in stack_ranges(per))
    out = g(x4, y[0], ranges=R2)
    assert out.shape == (2, 3, 13, 2)
    for a in range(2):
        for c in range(3):
            want = masked_reduce("Sum", dense_F(x4[a, c], y[0]), mask_of(per[a], 1, 13, 17), 1)
            np.testing.assert_allclose(out[a, c], want, rtol=1e-12, atol=1e-12)


def test_lazytensor_batched_ranges():
    x, y = batch_data(seed=5)
    per = [random_ranges(13, 17, seed=30 + k) for k in range(3)]
    R = stack_ranges(per)
    X, Y = LazyTensor(x[:, :, None, :]), LazyTensor(y[:, None, :, :])
    out = (X - Y).sqnorm2().sum(dim=2, ranges=R)
    for k in range(3):
        Fd = dense_F(x[k], y[k])[..., :1]
        want = masked_reduce("Sum", Fd, mask_of(per[k], 1, 13, 17), 1)
        np.testing.assert_allclose(out[k], want, rtol=1e-12)


def test_batched_ranges_errors():
    x, y = batch_data(seed=6)
    per = [random_ranges(13, 17, seed=40 + k) for k in range(3)]
    R = stack_ranges(per)
    g = Genred(F2, ["x = Vi(3)", "y = Vj(3)"], axis=1)
    with pytest.raises(ValueError, match=r"batch dimensions \(4,\) do not match the arrays' "
                                         r"batch shape \(3,\)"):
        g(x, y, ranges=stack_ranges(per + per[:1]))
    with pytest.raises(ValueError, match="the six arrays must have the same batch dimensions"):
        g(x, y, ranges=(R[0][0],) + R[1:])
    bad = list(R)
    bad[0] = R[0].copy()
    bad[0][1, 0] = [0, 14]  # 13 rows per batch
    with pytest.raises(ValueError, match=r"ranges_i\[1, 0\] = \[0, 14\] in batch \(1,\): "
                                         r"entries must lie in \[0, 13\]"):
        g(x, y, ranges=tuple(bad))
    bad = list(R)
    bad[1] = R[1] + 1000
    with pytest.raises(ValueError, match="slices_i.*the number of intervals"):
        g(x, y, ranges=tuple(bad))
    with pytest.raises(TypeError, match="integer arrays"):
        g(x, y, ranges=(R[0].astype(float),) + R[1:])
    with pytest.raises(ValueError, match="6-tuple"):
        g(x, y, ranges=R[:5])


def test_torch_batched_ranges_forward_and_backward():
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    from symred.torch import Genred as TGenred

    xn, yn = batch_data(seed=7)
    # Both triples describe the same pattern (drop=2: no cluster dropped from either), so the
    # gradient with respect to y, which reads the transposed triple, sees the forward's mask.
    per = [random_ranges(13, 17, seed=50 + k, drop=2) for k in range(3)]
    R = tuple(torch.from_numpy(r).int() for r in stack_ranges(per))
    x = torch.tensor(xn, requires_grad=True)
    y = torch.tensor(yn, requires_grad=True)
    g = TGenred("Exp(-SqDist(x, y))", ["x = Vi(3)", "y = Vj(3)"], axis=1)
    out = g(x, y, ranges=R)
    masks = torch.stack([torch.from_numpy(mask_of(r, 1, 13, 17)) for r in per])
    dense = torch.exp(-((x[:, :, None] - y[:, None]) ** 2).sum(-1))
    want = (dense * masks).sum(2, keepdim=True)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    w = torch.randn(3, 13, 1, dtype=torch.float64)
    got = torch.autograd.grad((out * w).sum(), (x, y))
    ref = torch.autograd.grad((want * w).sum(), (x, y))
    for a, c in zip(got, ref):
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)
