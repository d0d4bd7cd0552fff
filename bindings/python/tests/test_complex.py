"""Complex numbers: ComplexLazyTensor on NumPy and torch arrays against dense NumPy / torch
complex arithmetic, the complex ops through Genred on interleaved (re, im) reals, gradients with
respect to complex inputs, and the errors."""

import numpy as np
import pytest

from symred import ComplexLazyTensor, Genred, LazyTensor, SymredValueError

M, N, D = 7, 5, 3


def cplx(shape, dtype=np.complex128, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)).astype(dtype)


def real(shape, dtype=np.float64, seed=1):
    return np.random.default_rng(seed).uniform(0.5, 1.5, shape).astype(dtype)


def close(got, want, rtol=1e-10, atol=1e-12):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_complex_arrays_make_complex_lazytensors():
    z = LazyTensor(cplx((M, 1, D)))
    assert isinstance(z, ComplexLazyTensor) and z.is_complex
    assert z.shape == (M, 1, D)  # complex components, as pykeops reports them
    assert z.ndim == 2 * D  # interleaved reals
    assert not LazyTensor(real((M, 1, D))).is_complex
    with pytest.raises(TypeError, match="complex64 or complex128"):
        ComplexLazyTensor(real((M, 1, D)))


# (name, LazyTensor expression, the same on dense NumPy arrays): x (M,1,D) and y (1,N,D) complex,
# r (1,N,D) real, s (M,1,1) real.
CASES = [
    ("mult", lambda x, y, r, s: x * y),
    ("add", lambda x, y, r, s: x + y),
    ("sub", lambda x, y, r, s: x - y),
    ("div", lambda x, y, r, s: x / (y + 2)),
    ("real operand", lambda x, y, r, s: x * r + r - x / r),
    ("real scalar", lambda x, y, r, s: s * y * 2),
    ("reflected real", lambda x, y, r, s: 3 - x + r * y),
    ("python complex", lambda x, y, r, s: (0.5 - 2j) * x + 1j + y),
    ("conj", lambda x, y, r, s: x.conj() * y),
    ("exp", lambda x, y, r, s: (x * y).exp()),
    ("neg", lambda x, y, r, s: -(x * y)),
    ("real imag", lambda x, y, r, s: (x * y).real + 1j * (x - y).imag),
    ("abs angle", lambda x, y, r, s: (x * y).abs() * ((x + y).angle() * 1j).exp()),
]


def dense(fn, x, y, r, s):
    def ang(z):
        return np.angle(z) if isinstance(z, np.ndarray) else z.angle()

    class W:  # numpy arrays with the LazyTensor method names
        def __init__(self, a):
            self.a = a

        def __getattr__(self, k):
            return {"conj": lambda: W(np.conj(self.a)), "exp": lambda: W(np.exp(self.a)),
                    "abs": lambda: W(np.abs(self.a)), "angle": lambda: W(ang(self.a)),
                    "real": W(np.real(self.a)), "imag": W(np.imag(self.a))}[k]

        def _o(self, o):
            return o.a if isinstance(o, W) else o

        def __add__(self, o): return W(self.a + self._o(o))
        def __radd__(self, o): return W(self._o(o) + self.a)
        def __sub__(self, o): return W(self.a - self._o(o))
        def __rsub__(self, o): return W(self._o(o) - self.a)
        def __mul__(self, o): return W(self.a * self._o(o))
        def __rmul__(self, o): return W(self._o(o) * self.a)
        def __truediv__(self, o): return W(self.a / self._o(o))
        def __neg__(self): return W(-self.a)

    return fn(W(x), W(y), W(r), W(s)).a


@pytest.mark.parametrize("name,fn", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("axis", [0, 1])
def test_lazytensor_against_numpy(name, fn, axis):
    x, y, r, s = cplx((M, 1, D)), cplx((1, N, D), seed=2), real((1, N, D)), real((M, 1, 1), seed=3)
    got = fn(LazyTensor(x), LazyTensor(y), LazyTensor(r), LazyTensor(s)).sum(dim=axis)
    want = np.broadcast_to(dense(fn, x, y, r, s), (M, N, D)).sum(axis)
    assert got.dtype == np.complex128 and got.shape == want.shape
    close(got, want)


def test_vector_sum_is_complexsum_and_complex64():
    x, y = cplx((M, 1, D), np.complex64), cplx((1, N, D), np.complex64, seed=2)
    K = (LazyTensor(x) * LazyTensor(y)).sum(-1)
    assert isinstance(K, ComplexLazyTensor) and K.ndim == 2 and K.shape == (M, N)
    got = K.sum(dim=1)
    assert got.dtype == np.complex64 and got.shape == (M, 1)
    close(got[:, 0], (x * y).sum(-1).sum(1), rtol=1e-5, atol=1e-5)


def test_pykeops_complex_numpy_example():
    """pykeops' test_complex_numpy: ((x * y) * y.real + x + x.real).sum(axis=2).sum(axis=0)."""
    x, y = cplx((M, 1, D), np.complex64), cplx((1, N, D), np.complex64, seed=2)
    X, Y = LazyTensor(x), LazyTensor(y)
    got = ((X * Y) * Y.real + X + X.real).sum(axis=2).sum(axis=0)
    want = ((x * y) * y.real + x + x.real).sum(axis=2).sum(axis=0)
    close(got.reshape(-1), want, rtol=1e-5, atol=1e-5)


def test_real_to_complex_and_matmul():
    p, f = real((1, N, 1)), real((M, 1, 1), seed=4)
    v, w = cplx((N,), seed=5), real((N, 2), seed=6)
    K = (-2j * np.pi * LazyTensor(p) * LazyTensor(f)).exp()  # a Fourier matrix
    Kd = np.exp(-2j * np.pi * p * f)[..., 0]
    close(K @ v, Kd @ v)
    close(K @ w, Kd @ w)
    close(LazyTensor(p).exp1j().sum(dim=0), np.exp(1j * p).sum(0))
    close((LazyTensor(p).imag2complex() + LazyTensor(f).real2complex()).sum(dim=1),
          (f + 1j * p).sum(1))


def test_genred_on_interleaved_reals():
    """Genred sees a complex vector of dimension d as 2d reals: complex arrays go in through
    real views, and ComplexSum's output is an ordinary Sum of a real vector."""
    x, y = cplx((M, D)), cplx((N, D), seed=2)
    g = Genred("ComplexSum(ComplexMult(x,Conj(y)))", ["x=Vi(6)", "y=Vj(6)"], axis=1)
    got = g(x.view(np.float64), y.view(np.float64)).view(np.complex128)
    close(got[:, 0], (x[:, None, :] * np.conj(y)[None]).sum((1, 2)))
    h = Genred("ComplexSumT(ComplexSum(ComplexScal(Real2Complex(b),ComplexSum(x))),4)",
               ["x=Vi(6)", "b=Vj(2)"], axis=1)
    b = real((N, 2))
    got = h(x.view(np.float64), b).view(np.complex128)
    assert got.shape == (M, 2)
    close(got, np.broadcast_to((x.sum(1) * b.sum())[:, None], (M, 2)))


def test_complex128_matches_float64_precision():
    x, y = cplx((M, 1, D)), cplx((1, N, D), seed=2)
    got = ((LazyTensor(x) / LazyTensor(y)).abs()).sum(dim=1)
    close(got, np.abs(x / y).sum(1), rtol=1e-13)


def test_errors():
    X, Y = LazyTensor(cplx((M, 1, 2))), LazyTensor(cplx((1, N, 3)))
    with pytest.raises(ValueError, match="same dimension or one complex component"):
        X * Y
    with pytest.raises(ValueError, match="Sum reduction only"):
        X.min(dim=1)
    with pytest.raises(TypeError, match="not defined for complex"):
        X | X
    with pytest.raises(ValueError, match="cannot be applied to a complex"):
        X.real2complex()
    with pytest.raises(SymredValueError, match="even"):
        Genred("ComplexMult(x,y)", ["x=Vi(3)", "y=Vj(3)"])


def test_torch_forward_and_gradient():
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    import symred.torch as st

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, N, D, dtype=torch.complex128, generator=gen).requires_grad_()
    p = torch.rand(1, N, D, dtype=torch.float64, generator=gen).requires_grad_()
    f = torch.rand(M, 1, D, dtype=torch.float64, generator=gen)
    res = []
    for keops in (True, False):
        X, P, Fq = (st.LazyTensor(x), st.LazyTensor(p), st.LazyTensor(f)) if keops else (x, p, f)
        out = (X * (-2j * np.pi * P * Fq).exp()).sum(dim=0)
        assert out.dtype == torch.complex128 and out.shape == (N, D)
        loss = (out.real ** 2 + out.imag ** 2).sum() + (out * out).imag.sum()
        res.append((out.detach(), *torch.autograd.grad(loss, [x, p])))
    for got, want in zip(res[0], res[1]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
