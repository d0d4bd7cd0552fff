"""pykeops names and semantics that ported code (KeOps' tutorials, GeomLoss) relies on: parameters
converted to the data's dtype, generic_sum / generic_logsumexp / generic_argmin /
generic_argkmin, and the cluster helpers under pykeops' module paths with its signatures."""

import inspect
import sys
from pathlib import Path

import numpy as np
import pytest

import symred.numpy as snp

SHIM = Path(__file__).resolve().parents[1] / "pykeops_shim"
GAUSS = ("Exp(-g * SqDist(x, y)) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)", "g = Pm(1)"])


def _data(dt=np.float32):
    rng = np.random.default_rng(0)
    return (rng.random((7, 3)).astype(dt), rng.random((9, 3)).astype(dt),
            rng.random((9, 2)).astype(dt))


def _dense(x, y, b, g):
    d2 = ((x[:, None, :].astype(np.float64) - y[None, :, :]) ** 2).sum(-1)
    return np.exp(-g * d2) @ b.astype(np.float64)


def test_numpy_parameter_follows_data_dtype():
    x, y, b = _data()
    f = snp.Genred(*GAUSS, reduction_op="Sum", axis=1)
    g64 = np.array([1.7], dtype=np.float64)
    want = _dense(x, y, b, np.float32(1.7))
    for g in (g64, 1.7, [1.7]):
        out = f(x, y, b, g)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, want, rtol=1e-5)
    # Data arrays of two dtypes stay an error.
    with pytest.raises(TypeError, match="mixed dtypes"):
        f(x, y.astype(np.float64), b, g64)


def test_numpy_batched_parameter_follows_data_dtype():
    x, y, b = _data()
    f = snp.Genred(*GAUSS, reduction_op="Sum", axis=1)
    g = np.array([[1.0], [2.0]])  # float64, one value per batch
    out = f(np.stack([x, x]), y, b, g)
    assert out.dtype == np.float32 and out.shape == (2, 7, 2)
    for k in range(2):
        np.testing.assert_allclose(out[k], _dense(x, y, b, np.float32(g[k, 0])), rtol=1e-5)


def test_lazytensor_parameter_follows_data_dtype():
    x, y, b = _data()
    g = np.array([1.7])  # float64 beside float32 variables
    x_i, y_j = snp.LazyTensor(x[:, None, :]), snp.LazyTensor(y[None, :, :])
    K = (-snp.Pm(g) * x_i.sqdist(y_j)).exp()
    out = (K * snp.LazyTensor(b[None, :, :])).sum(dim=1)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, _dense(x, y, b, np.float32(1.7)), rtol=1e-5)
    with pytest.raises(TypeError, match="mixed dtypes"):
        x_i.sqdist(snp.LazyTensor(y.astype(np.float64)[None, :, :]))


def test_torch_parameter_follows_data_dtype_and_differentiates():
    torch = pytest.importorskip("torch")
    import symred.torch as st

    x, y, b = (torch.from_numpy(a) for a in _data())
    g = torch.tensor([1.7], dtype=torch.float64, requires_grad=True)
    f = st.Genred(*GAUSS, reduction_op="Sum", axis=1)
    out = f(x, y, b, g)
    assert out.dtype == torch.float32
    out.sum().backward()
    # Dense float64 reference: d/dg sum_ij exp(-g d2) b_j = -sum_ij d2 exp(-g d2) b_j.
    d2 = ((x[:, None, :].double() - y[None, :, :].double()) ** 2).sum(-1)
    want_grad = -(d2 * torch.exp(-1.7 * d2) @ b.double()).sum()
    assert g.grad.dtype == torch.float64
    np.testing.assert_allclose(float(g.grad), float(want_grad), rtol=1e-4)
    np.testing.assert_allclose(out.detach().numpy(), _dense(*_data(), np.float32(1.7)),
                               rtol=1e-5)
    with pytest.raises(TypeError, match="mixed dtypes"):
        f(x.double(), y, b, g)


def test_jax_parameter_follows_data_dtype():
    jnp = pytest.importorskip("jax.numpy")
    import symred.jax as sj

    x, y, b = _data()
    f = sj.Genred(*GAUSS, reduction_op="Sum", axis=1)
    out = f(jnp.asarray(x), jnp.asarray(y), jnp.asarray(b), 1.7)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), _dense(x, y, b, np.float32(1.7)), rtol=1e-5)


def test_generic_reductions_numpy():
    x, y, _ = _data(np.float64)
    d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    s = snp.generic_sum("Exp(-SqDist(x, y))", "a = Vi(1)", "x = Vi(3)", "y = Vj(3)")
    np.testing.assert_allclose(s(x, y)[:, 0], np.exp(-d2).sum(1), rtol=1e-12)
    s0 = snp.generic_sum("Exp(-SqDist(x, y))", "a = Vj(1)", "x = Vi(3)", "y = Vj(3)")
    np.testing.assert_allclose(s0(x, y)[:, 0], np.exp(-d2).sum(0), rtol=1e-12)
    lse = snp.generic_logsumexp("-SqDist(x, y)", "a = Vi(1)", "x = Vi(3)", "y = Vj(3)")
    np.testing.assert_allclose(lse(x, y)[:, 0], np.log(np.exp(-d2).sum(1)), rtol=1e-12)
    am = snp.generic_argmin("SqDist(x, y)", "a = Vi(1)", "x = Vi(3)", "y = Vj(3)")
    np.testing.assert_array_equal(am(x, y)[:, 0], d2.argmin(1))
    ak = snp.generic_argkmin("SqDist(x, y)", "a = Vi(3)", "x = Vi(3)", "y = Vj(3)")
    np.testing.assert_array_equal(ak(x, y), np.argsort(d2, axis=1)[:, :3])
    with pytest.raises(ValueError, match="Vi\\(dim\\)"):
        snp.generic_sum("SqDist(x, y)", "a = Pm(1)", "x = Vi(3)", "y = Vj(3)")


def test_generic_reductions_torch():
    torch = pytest.importorskip("torch")
    import symred.torch as st

    x, y, _ = (torch.from_numpy(a) for a in _data(np.float64))
    lse = st.generic_logsumexp("-SqDist(x, y)", "a = Vi(1)", "x = Vi(3)", "y = Vj(3)")
    d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    torch.testing.assert_close(lse(x, y)[:, 0], torch.logsumexp(-d2, dim=1))


# pykeops 2.3's signatures (pykeops/{numpy,torch}/cluster/*.py).
CLUSTER_SIGNATURES = {
    "grid_cluster": ["x", "size"],
    "sort_clusters": ["x", "lab"],
    "cluster_ranges": ["lab", "Nlab"],
    "cluster_centroids": ["x", "lab", "Nlab", "weights", "weights_c"],
    "from_matrix": ["ranges_i", "ranges_j", "keep"],
    "swap_axes": ["ranges"],
}


@pytest.fixture
def shim():
    """``import pykeops...`` resolving to symred for one test."""
    sys.path.insert(0, str(SHIM))
    import pykeops_shim  # noqa: F401

    pykeops_shim.install()
    yield
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__module__ != "pykeops_shim"]
    sys.path.remove(str(SHIM))
    for name in [n for n in sys.modules if n.split(".")[0] in ("pykeops", "pykeops_shim")]:
        del sys.modules[name]


@pytest.mark.parametrize("binding", ["numpy", "torch"])
def test_cluster_names_and_signatures_through_the_shim(shim, binding):
    if binding == "torch":
        pytest.importorskip("torch")
    import importlib

    mod = importlib.import_module(f"pykeops.{binding}.cluster")
    extra = {"numpy": ["x", "lab", "weights"], "torch": ["x", "lab", "weights", "min_weight"]}
    want = dict(CLUSTER_SIGNATURES, cluster_ranges_centroids=extra[binding])
    for name, params in want.items():
        assert list(inspect.signature(getattr(mod, name)).parameters) == params, name
    gen = importlib.import_module(f"pykeops.{binding}")
    for name in ("generic_sum", "generic_logsumexp", "generic_argmin", "generic_argkmin"):
        assert callable(getattr(gen, name))


def test_torch_cluster_dtypes_as_pykeops():
    torch = pytest.importorskip("torch")
    from symred.torch import cluster as tc

    x = torch.tensor([[0.0], [0.1], [0.9], [0.05], [0.5]])
    lab = tc.grid_cluster(x, 0.2)
    assert lab.dtype == torch.int32 and lab.tolist() == [0, 0, 2, 0, 1]  # pykeops' example
    w = torch.tensor([1.0, 0.5, 1.0, 1.0, 10.0])
    xs = torch.tensor([[0.0], [0.5], [1.0], [2.0], [3.0]])
    ranges, cent, w_c = tc.cluster_ranges_centroids(xs, torch.tensor([0, 0, 1, 1, 1]), weights=w)
    assert ranges.tolist() == [[0, 2], [2, 5]] and ranges.dtype == torch.int64
    torch.testing.assert_close(cent, torch.tensor([[1 / 6], [2.75]]))
    assert w_c.dtype == torch.float32 and w_c.tolist() == [1.5, 12.0]
    _, _, counts = tc.cluster_ranges_centroids(xs, torch.tensor([0, 0, 1, 1, 1]))
    assert counts.dtype == torch.float32 and counts.tolist() == [2.0, 3.0]


# ---- symbolic variables, call=False, indexing, dtype_acc="float16", utils ---------------------


def test_symbolic_variables_numpy():
    x, y, b = _data(np.float64)
    K = (-snp.Pm(2, 1) * snp.Vi(0, 3).sqdist(snp.Vj(1, 3))).exp() * snp.Vj(3, 2)
    red = K.sum(dim=1)  # symbolic variables: a callable, as pykeops
    assert callable(red) and not isinstance(red, np.ndarray)
    np.testing.assert_allclose(red(x, y, np.array([0.5]), b), _dense(x, y, b, 0.5), rtol=1e-12)
    # Symbolic variables beside arrays: the arrays' variables come after the symbolic ones.
    K2 = (-snp.Vi(0, 3).sqdist(snp.LazyTensor(y[None]))).exp() * snp.LazyTensor(b[None])
    np.testing.assert_allclose(K2.sum(dim=1)(x), _dense(x, y, b, 1.0), rtol=1e-12)
    # The (index, dim, cat) tuple form is the same variable.
    K3 = snp.LazyTensor((0, 3, 0)).sqdist(snp.LazyTensor((1, 3, 1)))
    d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    np.testing.assert_allclose(K3.sum(dim=0)(x, y)[:, 0], d2.sum(0), rtol=1e-12)
    with pytest.raises(ValueError, match="category"):
        snp.LazyTensor((0, 3, 5))
    with pytest.raises(TypeError, match="ints"):
        snp.Vi(0, 2.5)


def test_symbolic_variables_torch_differentiate():
    torch = pytest.importorskip("torch")
    import symred.torch as st

    x, y, b = (torch.from_numpy(a) for a in _data(np.float64))
    x.requires_grad_(True)
    red = ((-st.Vi(0, 3).sqdist(st.Vj(1, 3))).exp() * st.Vj(2, 2)).sum(dim=1)
    out = red(x, y, b)
    d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    want = torch.exp(-d2) @ b
    torch.testing.assert_close(out, want)
    (gx,) = torch.autograd.grad(out.sum(), x)
    (wx,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(gx, wx)


def test_call_false_returns_the_reduction():
    x, y, b = _data(np.float64)
    K = (-snp.LazyTensor(x[:, None]).sqdist(snp.LazyTensor(y[None]))).exp()
    red = (K * snp.LazyTensor(b[None])).sum(dim=1, call=False)
    assert isinstance(red.genred, snp.Genred)
    np.testing.assert_allclose(red(), _dense(x, y, b, 1.0), rtol=1e-12)
    np.testing.assert_allclose(red(backend="CPU"), red(), rtol=1e-12)
    np.testing.assert_array_equal(K.argKmin(2, dim=1, call=False)(), K.argKmin(2, dim=1))
    z = x[:, :1] + 1j * x[:, 1:2]
    Kz = snp.LazyTensor(z[:, None]) * snp.LazyTensor(b[None, :, :1])
    np.testing.assert_allclose(Kz.sum(dim=1, call=False)(), z * b[:, 0].sum(), rtol=1e-12)


def test_solve_call_false():
    rng = np.random.default_rng(1)
    x, b = rng.random((30, 2)), rng.random((30, 1))
    K = (-10 * snp.LazyTensor(x[:, None]).sqdist(snp.LazyTensor(x[None]))).exp()
    solver = K.solve(b, alpha=0.5, call=False)
    a = solver()
    dense = np.exp(-10 * ((x[:, None] - x[None]) ** 2).sum(-1)) + 0.5 * np.eye(30)
    np.testing.assert_allclose(a, K.solve(b, alpha=0.5), rtol=1e-12)
    np.testing.assert_allclose(dense @ a, b, atol=1e-5)


def test_indexing_with_batch_dimensions():
    rng = np.random.default_rng(2)
    x, y = rng.random((2, 5, 1, 3)), rng.random((2, 1, 4, 3))
    D = snp.LazyTensor(x) - snp.LazyTensor(y)
    want = ((x[..., 1] - y[..., 1]) ** 2).sum(-1)[..., None]  # (2, 5, 1): over j
    np.testing.assert_allclose((D[:, :, :, 1] ** 2).sum(dim=2), want, rtol=1e-12)
    np.testing.assert_allclose((D[:, :, :, 1:2] ** 2).sum(dim=2), want, rtol=1e-12)
    np.testing.assert_allclose((D[1] ** 2).sum(dim=2), want, rtol=1e-12)
    with pytest.raises(ValueError, match="last dimension"):
        D[:, :, 1]  # three axes given, four leading ones: refused, as pykeops does


def test_dtype_acc_float16():
    x, y, b = _data()
    f = snp.Genred(*GAUSS, reduction_op="Sum", axis=1, dtype_acc="float16")
    out = f(x.astype(np.float16), y.astype(np.float16), b.astype(np.float16), 1.0)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), _dense(x, y, b, 1.0), rtol=2e-3)
    with pytest.raises(ValueError, match="float16 data only"):
        f(x, y, b, 1.0)


def test_utils_through_the_shim(shim):
    import importlib

    nu = importlib.import_module("pykeops.numpy.utils")
    assert nu.WarmUpGpu() is None  # a no-op without a GPU, a warm-up with one
    rng = np.random.default_rng(3)
    x, y, p, q = rng.random((5, 2)), rng.random((6, 2)), rng.random((6, 1)), rng.random((5, 1))
    s = 0.7
    # chain_rules with the Gaussian's derivative is the gradient of sum_ij q_i K_ij p_j.
    got = nu.chain_rules(q, x, y, nu.grad_np_kernel(x, y, s, "gaussian"), p)
    d = x[:, None, :] - y[None, :, :]
    K = np.exp(-(d ** 2).sum(-1) / s ** 2)
    want = (q[:, :, None] * (K[:, :, None] * -2 * d / s ** 2) * p[None, :, :]).sum(1)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    nt = nu.numpytools
    assert nt.Genred is snp.Genred and nt.swap_axes((1, 2, 3, 4, 5, 6)) == (4, 5, 6, 1, 2, 3)
    z = nt.view_as_complex(np.arange(4.0).reshape(1, 4))
    assert z.dtype == np.complex128 and z[0, 1] == 2 + 3j and nt.detect_complex(z)
    torch = pytest.importorskip("torch")
    tu = importlib.import_module("pykeops.torch.utils")
    assert tu.WarmUpGpu() is None
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    for k in ("gaussian", "laplacian", "cauchy", "inverse_multiquadric"):
        np.testing.assert_allclose(tu.torch_kernel(tx, ty, s, k).numpy(),
                                   nu.np_kernel(x, y, s, k), rtol=1e-9)
    assert not tu.is_on_device(tx)
    tt = tu.torchtools
    assert tt.Genred is importlib.import_module("pykeops.torch").Genred
    assert tt.array([1, 2], "float64", "cpu").dtype == torch.float64
    assert tt.view_as_complex(tx).shape == (5, 1)
    assert tt.view_as_real(tt.view_as_complex(tx)).equal(tx)
    A = torch.eye(3, dtype=torch.float64) * 2
    torch.testing.assert_close(tu.torchsolve(A, torch.ones(3, 1, dtype=torch.float64)),
                               torch.full((3, 1), 0.5, dtype=torch.float64))
