"""LazyTensor: pykeops' shape convention, every operation against NumPy broadcasting, and
agreement with Genred."""

import numpy as np
import pytest
from helpers import assert_same, reduce_np

from symred import Genred, LazyTensor, Pm, Vi, Vj

NX, NY, D = 8, 11, 3


def arrays(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(0.1, 1.0, (NX, D)).astype(dtype),
            rng.uniform(0.1, 1.0, (NY, D)).astype(dtype))


# name -> (LazyTensor expression, the same on NumPy arrays X (nx,1,3), Y (1,ny,3)).
# Where both spell alike, one lambda serves both.
def same(f):
    return (f, f)


W9 = np.linspace(0.5, 1.5, 9)
OPS = {
    "add": same(lambda x, y: x + y),
    "sub": same(lambda x, y: x - y),
    "mul": same(lambda x, y: x * y),
    "div": same(lambda x, y: x / y),
    "neg": same(lambda x, y: -x + y),
    "scalars": same(lambda x, y: 2 * x - 0.5 + y / 4 - 3),
    "negative_float": same(lambda x, y: x * -1.25 + y),
    "rsub_rdiv": same(lambda x, y: 1.5 - x + 2 / y),
    "pow_int": same(lambda x, y: (x - y) ** 3),
    "pow_square": same(lambda x, y: (x - y) ** 2),
    "pow_sqrt": same(lambda x, y: (x * y) ** 0.5),
    "pow_rsqrt": same(lambda x, y: (x * y) ** -0.5),
    "pow_float": same(lambda x, y: x**1.7 * y),
    "abs": (lambda x, y: abs(x - y), lambda x, y: np.abs(x - y)),
    "scalprod": ((lambda x, y: (x | y)), lambda x, y: (x * y).sum(-1, keepdims=True)),
    "exp": (lambda x, y: (-x * y).exp(), lambda x, y: np.exp(-x * y)),
    "log": (lambda x, y: (x + y).log(), lambda x, y: np.log(x + y)),
    "sqrt": (lambda x, y: (x + y).sqrt(), lambda x, y: np.sqrt(x + y)),
    "rsqrt": (lambda x, y: (x + y).rsqrt(), lambda x, y: 1 / np.sqrt(x + y)),
    "sin_cos": (lambda x, y: x.sin() * y.cos(), lambda x, y: np.sin(x) * np.cos(y)),
    "relu": (lambda x, y: (x - y).relu(), lambda x, y: np.maximum(x - y, 0)),
    "sign": (lambda x, y: (x - y).sign(), lambda x, y: np.sign(x - y)),
    "step": (lambda x, y: (x - y).step(), lambda x, y: (x - y >= 0).astype(float)),
    "square": (lambda x, y: (x - y).square(), lambda x, y: (x - y) ** 2),
    "sqnorm2": (lambda x, y: (x - y).sqnorm2(),
                lambda x, y: ((x - y) ** 2).sum(-1, keepdims=True)),
    "norm2": (lambda x, y: (x - y).norm2(),
              lambda x, y: np.sqrt(((x - y) ** 2).sum(-1, keepdims=True))),
    "normalize": (lambda x, y: (x - y).normalize(),
                  lambda x, y: (x - y) / np.sqrt(((x - y) ** 2).sum(-1, keepdims=True))),
    "sum_components": (lambda x, y: (x * y).sum(-1), lambda x, y: (x * y).sum(-1, keepdims=True)),
    "sqdist": (lambda x, y: x.sqdist(y), lambda x, y: ((x - y) ** 2).sum(-1, keepdims=True)),
    "weightedsqnorm_diag": (lambda x, y: (x - y).weightedsqnorm(np.array([1.0, 2.0, 3.0])),
                            lambda x, y: ((x - y) ** 2 * [1, 2, 3]).sum(-1, keepdims=True)),
    "weightedsqdist_full": (
        lambda x, y: x.weightedsqdist(y, W9),
        lambda x, y: np.einsum("...a,ab,...b->...", x - y, W9.reshape(3, 3), x - y)[..., None]),
    "elem": (lambda x, y: x.elem(1) * y, lambda x, y: x[..., 1:2] * y),
    "getitem": (lambda x, y: x[2] + y[0:2].sum(-1),
                lambda x, y: x[..., 2:3] + y[..., 0:2].sum(-1, keepdims=True)),
    "extract": (lambda x, y: x.extract(1, 2) - y.extract(0, 2),
                lambda x, y: x[..., 1:3] - y[..., 0:2]),
    "concat": (lambda x, y: x.concat(y),
               lambda x, y: np.concatenate(np.broadcast_arrays(x, y), -1)),
    "clamp": (lambda x, y: (x - y).clamp(-0.2, 0.3),
              lambda x, y: np.clip(x - y, -0.2, 0.3)),
    "clampint": (lambda x, y: (4 * (x - y)).clamp(-1, 1), lambda x, y: np.clip(4 * (x - y), -1, 1)),
    "ifelse": (lambda x, y: (x - y).ifelse(x, y * 2),
               lambda x, y: np.where(x - y >= 0, x, y * 2)),
    "mod": (lambda x, y: (3 * x * y).mod(0.7, 0.1),
            lambda x, y: 3 * x * y - 0.7 * np.floor((3 * x * y - 0.1) / 0.7)),
    "compare": (lambda x, y: (x < y) + (x >= y) * 2,
                lambda x, y: (x < y) + (x >= y) * 2.0),
    "matvecmult": (lambda x, y: x.tensorprod(y).matvecmult(y),
                   lambda x, y: np.einsum("...a,...b,...b->...a", *np.broadcast_arrays(x, y, y))),
    "vecmatmult": (lambda x, y: x.vecmatmult(x.tensorprod(y)),
                   lambda x, y: np.einsum("...a,...a,...b->...b", *np.broadcast_arrays(x, x, y))),
    "onehot": (lambda x, y: (x.elem(0) * 3).onehot(4) * y.elem(1),
               lambda x, y: (np.round(x[..., :1] * 3) == np.arange(4)) * y[..., 1:2]),
}


@pytest.mark.parametrize("name", list(OPS))
def test_operation_matches_numpy(name):
    lazy, ref = OPS[name]
    x, y = arrays()
    x_i, y_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
    got = lazy(x_i, y_j).sum(dim=1)
    want = ref(x[:, None, :], y[None, :, :])
    want = np.broadcast_to(want, (NX, NY, want.shape[-1])).sum(1)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_lazytensor_equals_genred(dtype):
    x, y = arrays(dtype)
    b = np.random.default_rng(4).random((NY, 2)).astype(dtype)
    g = np.array([0.7], dtype)
    x_i, y_j, b_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :]), Vj(b)
    lazy = ((-Pm(g) * x_i.sqdist(y_j)).exp() * b_j).sum(dim=1)
    gen = Genred("Exp(-g * SqDist(x, y)) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)", "g = Pm(1)"],
                 axis=1)(x, y, b, g)
    assert lazy.dtype == np.dtype(dtype) and lazy.shape == gen.shape == (NX, 2)
    np.testing.assert_allclose(lazy, gen, rtol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("dim", [0, 1])
def test_reductions_of_lazytensor(dim):
    x, y = arrays()
    x_i, y_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
    D2 = x_i.sqdist(y_j)
    F = ((x[:, None] - y[None]) ** 2).sum(-1)[..., None]
    diff = x[:, None] - y[None]
    assert_same(D2.sum(dim=dim), reduce_np("Sum", F, dim), np.float64)
    assert_same(D2.min(dim=dim), reduce_np("Min", F, dim), np.float64)
    assert_same(D2.max(dim), reduce_np("Max", F, dim), np.float64)
    assert_same(D2.argmin(dim=dim), reduce_np("ArgMin", F, dim), np.float64)
    assert_same(D2.argmax(axis=dim), reduce_np("ArgMax", F, dim), np.float64)
    assert_same(D2.min_argmin(dim=dim), reduce_np("Min_ArgMin", F, dim), np.float64)
    assert_same(D2.max_argmax(dim=dim), reduce_np("Max_ArgMax", F, dim), np.float64)
    assert_same(D2.Kmin(4, dim=dim), reduce_np("KMin", F, dim, K=4), np.float64)
    assert_same(D2.argKmin(4, dim=dim), reduce_np("ArgKMin", F, dim, K=4), np.float64)
    assert_same((x_i - y_j).Kmin_argKmin(2, dim=dim), reduce_np("KMin_ArgKMin", diff, dim, K=2),
                np.float64)
    assert_same((-D2).logsumexp(dim=dim), reduce_np("LogSumExp", -F, dim), np.float64)
    G = np.broadcast_to(x[:, None] * 2, diff.shape)
    assert_same((-D2).sumsoftmaxweight(x_i * 2, dim=dim),
                reduce_np("SumSoftMaxWeight", -F, dim, G=G), np.float64)


def test_shape_conventions():
    x, y = arrays()
    assert LazyTensor(x[:, None, :]).shape == (NX, 1, D)
    assert LazyTensor(y[None, :, :]).shape == (1, NY, D)
    assert (LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])).shape == (NX, NY, D)
    assert LazyTensor(x[:, None, :]).sqdist(LazyTensor(y[None, :, :])).shape == (NX, NY)
    assert LazyTensor(x, axis=0).ni == NX and LazyTensor(y, axis=1).nj == NY
    assert Vi(x).ni == NX and Vj(y).nj == NY
    p = LazyTensor(np.array([1.0, 2.0]))
    assert p.ndim == 2 and p.ni is None and p.nj is None
    assert LazyTensor(np.ones((1, 1, 4))).ndim == 4
    assert Pm(2.0).ndim == 1 and LazyTensor(3).ndim == 1
    assert "a0=Vi(3)" in repr(Vi(x).sqnorm2())


def test_same_array_on_both_axes():
    x, _ = arrays()
    x_i, x_j = LazyTensor(x[:, None, :]), LazyTensor(x[None, :, :])
    idx = x_i.sqdist(x_j).argmin(dim=1)
    np.testing.assert_array_equal(idx[:, 0], np.arange(NX))  # each point is its own nearest


def test_unary_vs_reduction_axis():
    x, y = arrays()
    x_i, y_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
    assert isinstance((x_i * y_j).sum(), LazyTensor)  # default -1: sum of components
    assert isinstance((x_i * y_j).min(-1), LazyTensor)
    assert isinstance((x_i * y_j).argmax(axis=2), LazyTensor)
    assert isinstance((x_i * y_j).sum(dim=1), np.ndarray)


def test_numpy_array_on_the_left():
    x, y = arrays()
    x_i = LazyTensor(x[:, None, :])
    w = np.array([1.0, 2.0, 3.0])
    r1 = (w * x_i * LazyTensor(y[None, :, :])).sum(dim=1)
    r2 = (x_i * w * LazyTensor(y[None, :, :])).sum(dim=1)
    np.testing.assert_allclose(r1, r2)


def test_genred_cache_is_reused():
    from symred import lazytensor
    x, y = arrays()
    for _ in range(3):
        LazyTensor(x[:, None, :]).sqdist(LazyTensor(y[None, :, :])).sum(dim=1)
    n = len(lazytensor._cache)
    for _ in range(3):
        LazyTensor(x[:, None, :]).sqdist(LazyTensor(y[None, :, :])).sum(dim=1)
    assert len(lazytensor._cache) == n


def test_backend_keyword_passes_through():
    x, y = arrays()
    a = LazyTensor(x[:, None, :]).sqdist(LazyTensor(y[None, :, :]))
    np.testing.assert_allclose(a.sum(dim=1, backend="CPU"), a.sum(dim=1), rtol=1e-12)
    with pytest.raises(RuntimeError):
        a.sum(dim=1, backend="GPU")
    with pytest.raises(TypeError, match="unexpected keyword"):
        a.sum(dim=1, bogus=1)


def test_lazytensor_errors():
    x, y = arrays()
    x_i = LazyTensor(x[:, None, :])
    with pytest.raises(ValueError, match="axis=0"):
        LazyTensor(x)  # 2-D without axis
    with pytest.raises(ValueError, match=r"\(n,1,d\)"):
        LazyTensor(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="batch dimensions must have shape"):
        LazyTensor(np.ones((1, 2, 3, 4)))  # (B, n, m, d): neither i nor j
    with pytest.raises(TypeError, match="int64"):
        LazyTensor(np.ones((3, 1, 2), dtype=np.int64))
    with pytest.raises(TypeError, match="mixed dtypes"):
        x_i + LazyTensor(y.astype(np.float32)[None])
    with pytest.raises(ValueError, match="rows indexed by i"):
        x_i + LazyTensor(x[:3, None, :])
    with pytest.raises(ValueError, match="same dimension"):
        x_i + LazyTensor(np.ones((NY, 2))[None])
    with pytest.raises(ValueError, match="same dimension"):
        x_i | LazyTensor(np.ones((NY, 2))[None])
    with pytest.raises(ValueError, match="reduction dimension"):
        x_i.sqnorm2().sum(dim=3)
    with pytest.raises(ValueError, match="out of"):
        x_i.elem(3)
    with pytest.raises(ValueError, match="Vi expects"):
        Vi(x[:, 0])
    with pytest.raises(TypeError, match="symbolic"):
        Vi(0)
    with pytest.raises(ValueError, match="finite"):
        x_i * float("inf")
    with pytest.raises(ValueError):  # C: SumSoftMaxWeight needs a scalar formula
        (x_i - LazyTensor(y[None])).sumsoftmaxweight(x_i, dim=1)


# pykeops' *_reduction names against the reductions they name (and sum_reduction against NumPy).
@pytest.mark.parametrize("alias, call", [
    ("sum_reduction", lambda e, d: e.sum(dim=d)),
    ("min_reduction", lambda e, d: e.min(dim=d)),
    ("max_reduction", lambda e, d: e.max(dim=d)),
    ("argmin_reduction", lambda e, d: e.argmin(dim=d)),
    ("argmax_reduction", lambda e, d: e.argmax(dim=d)),
    ("min_argmin_reduction", lambda e, d: e.min_argmin(dim=d)),
    ("max_argmax_reduction", lambda e, d: e.max_argmax(dim=d)),
    ("logsumexp_reduction", lambda e, d: e.logsumexp(dim=d)),
])
@pytest.mark.parametrize("dim", [0, 1])
def test_reduction_aliases(alias, call, dim):
    x, y = arrays()
    e = ((LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])) ** 2).sum(-1)
    got, want = getattr(e, alias)(dim=dim), call(e, dim)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        np.testing.assert_array_equal(g, w)
    if alias == "sum_reduction":
        dense = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1).sum(axis=dim)
        np.testing.assert_allclose(got.ravel(), dense, rtol=1e-12)


@pytest.mark.parametrize("alias, call", [
    ("Kmin_reduction", lambda e: e.Kmin(K=3, dim=1)),
    ("argKmin_reduction", lambda e: e.argKmin(K=3, dim=1)),
    ("Kmin_argKmin_reduction", lambda e: e.Kmin_argKmin(K=3, dim=1)),
])
def test_k_reduction_aliases(alias, call):
    x, y = arrays()
    e = ((LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])) ** 2).sum(-1)
    got, want = getattr(e, alias)(K=3, dim=1), call(e)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        np.testing.assert_array_equal(g, w)


def test_sumsoftmaxweight_reduction_alias():
    x, y = arrays()
    e = -((LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])) ** 2).sum(-1)
    w = LazyTensor(y[None, :, :])
    np.testing.assert_array_equal(e.sumsoftmaxweight_reduction(weight=w, dim=1),
                                  e.sumsoftmaxweight(w, dim=1))
