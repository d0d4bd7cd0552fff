"""symred.torch: Genred and LazyTensor on torch tensors, their gradients against dense torch
formulas, gradcheck/gradgradcheck, zero-copy passing, and the optional import."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import symred  # noqa: E402
import symred.torch as st  # noqa: E402
from symred.torch import Genred, LazyTensor, Pm, Vi, Vj  # noqa: E402

NX, NY, D, E, K = 6, 5, 3, 2, 2
ALIASES = ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)", "g = Pm(1)"]
F = "Exp(-g * SqDist(x, y)) * b"  # (nx, ny, 2)


def inputs(dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(NX, D, dtype=dtype, generator=gen)
    y = torch.randn(NY, D, dtype=dtype, generator=gen)
    b = torch.randn(NY, E, dtype=dtype, generator=gen)
    g = torch.tensor([0.6], dtype=dtype)
    return [t.requires_grad_() for t in (x, y, b, g)]


def dense_F(x, y, b, g):
    return torch.exp(-g * ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))[..., None] * b[None]


def dense_reduce(red, Fd, axis, W=None):
    """pykeops' axis: 1 reduces over j (dim 1 of the (nx, ny, D) tensor), 0 over i."""
    if red == "Sum":
        return Fd.sum(axis)
    if red == "LogSumExp":
        return torch.logsumexp(Fd, axis)
    if red == "Min":
        return Fd.min(axis).values
    if red == "Max":
        return Fd.max(axis).values
    if red == "KMin":
        v = torch.topk(Fd, K, dim=axis, largest=False).values  # sorted ascending
        v = v.movedim(axis, 1)  # (nout, K, D)
        return v[:, :, 0] if v.shape[2] == 1 else v
    if red == "SumSoftMaxWeight":
        return (torch.softmax(Fd, axis) * W).sum(axis)
    raise AssertionError(red)


CASES = ["Sum", "LogSumExp", "Min", "Max", "KMin", "SumSoftMaxWeight"]


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("red", CASES)
def test_gradients_match_dense_torch(red, axis):
    x, y, b, g = inputs()
    if red == "SumSoftMaxWeight":
        formula, formula2 = "-g * SqDist(x, y)", "b * Sum(x)"
        fn = Genred(formula, ALIASES, reduction_op=red, axis=axis, formula2=formula2)
        Fd = -g * ((x[:, None] - y[None]) ** 2).sum(-1, keepdim=True)
        want = dense_reduce(red, Fd, axis, W=b[None] * x.sum(-1)[:, None, None])
    else:
        fn = Genred(F, ALIASES, reduction_op=red, axis=axis, opt_arg=K if red == "KMin" else None)
        want = dense_reduce(red, dense_F(x, y, b, g), axis)
    got = fn(x, y, b, g)
    assert isinstance(got, torch.Tensor) and got.shape == want.shape, (got.shape, want.shape)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    G = torch.randn_like(want)
    grads = torch.autograd.grad((got * G).sum(), (x, y, b, g))
    wants = torch.autograd.grad((want * G).sum(), (x, y, b, g))
    for name, gr, w in zip("xybg", grads, wants):  # Vi, Vj, Vj and Pm variables
        torch.testing.assert_close(gr, w, rtol=1e-9, atol=1e-11, msg=f"d/d{name}")


@pytest.mark.parametrize("red", ["Sum", "LogSumExp", "SumSoftMaxWeight", "Min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_gradcheck_and_gradgradcheck(red, axis):
    x, y, b, g = inputs()
    if red == "SumSoftMaxWeight":
        fn = Genred("-g * SqDist(x, y)", ALIASES, reduction_op=red, axis=axis,
                    formula2="b * Elem(x, 0)")
    else:
        fn = Genred(F, ALIASES, reduction_op=red, axis=axis)
    assert torch.autograd.gradcheck(fn, (x, y, b, g))
    assert torch.autograd.gradgradcheck(fn, (x, y, b, g))


def test_arg_reductions_have_zero_gradient_and_int64_indices():
    x, y, b, g = inputs()
    fn = Genred(F, ALIASES, reduction_op="Min_ArgMin", axis=1)
    vals, idx = fn(x, y, b, g)
    assert idx.dtype == torch.int64 and not idx.requires_grad
    Fd = dense_F(x, y, b, g)
    assert torch.equal(idx, Fd.argmin(1))
    gx, = torch.autograd.grad(vals.sum(), x)
    want, = torch.autograd.grad(Fd.min(1).values.sum(), x)
    torch.testing.assert_close(gx, want)
    idx = Genred(F, ALIASES, reduction_op="ArgKMin", axis=0, opt_arg=2)(x, y, b, g)
    assert idx.shape == (NY, 2, E) and idx.dtype == torch.int64


def test_hessian_vector_product_by_double_backward():
    # d/dx <grad_x sum_ij K_ij b_j, v>, K Gaussian: the backward of a backward.
    x, y, b, g = inputs()
    v = torch.randn(NX, D, dtype=torch.float64)
    fn = Genred(F, ALIASES, reduction_op="Sum", axis=1)
    gx, = torch.autograd.grad(fn(x, y, b, g).sum(), x, create_graph=True)
    hv, = torch.autograd.grad((gx * v).sum(), x)
    gxd, = torch.autograd.grad(dense_F(x, y, b, g).sum(), x, create_graph=True)
    want, = torch.autograd.grad((gxd * v).sum(), x)
    torch.testing.assert_close(hv, want)


def test_float32_on_the_jit():
    x, y, b, g = inputs(torch.float32)
    fn = Genred(F, ALIASES, reduction_op="Sum", axis=1)
    out = fn(x, y, b, g, backend="CPU")
    assert out.dtype == torch.float32
    gx, gy = torch.autograd.grad(out.sum(), (x, y))
    Fd = dense_F(x, y, b, g)
    wx, wy = torch.autograd.grad(Fd.sum(1).sum(), (x, y))
    torch.testing.assert_close(gx, wx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gy, wy, rtol=1e-4, atol=1e-5)


def test_lazytensor_matches_pykeops_torch_usage():
    x, y, b, g = inputs()
    x_i, y_j, b_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :]), LazyTensor(b[None])
    K_ij = (-Pm(g) * x_i.sqdist(y_j)).exp()
    for dim in (0, 1):
        out = (K_ij * b_j).sum(dim=dim)
        want = dense_F(x, y, b, g).sum(dim)
        torch.testing.assert_close(out, want)
    out = (K_ij * b_j).sum(axis=1, backend="CPU")
    gx, gg = torch.autograd.grad(out.sum(), (x, g))
    wx, wg = torch.autograd.grad(dense_F(x, y, b, g).sum(), (x, g))
    torch.testing.assert_close(gx, wx)
    torch.testing.assert_close(gg, wg)
    D_ij = Vi(x).sqdist(Vj(y))
    assert D_ij.shape == (NX, NY)
    idx = D_ij.argKmin(2, dim=1)
    assert idx.shape == (NX, 2) and idx.dtype == torch.int64
    lse = (-D_ij).logsumexp(dim=1)
    torch.testing.assert_close(lse, torch.logsumexp(-((x[:, None] - y[None]) ** 2).sum(-1), 1)[:, None])
    assert "float64" in repr(D_ij)


def test_contiguous_tensors_are_passed_without_copy(monkeypatch):
    seen = []
    real = st._pointer

    def spy(t):
        seen.append(real(t))
        return real(t)

    monkeypatch.setattr(st, "_pointer", spy)
    x, y, b, g = (t.detach() for t in inputs())
    Genred(F, ALIASES, axis=1)(x, y, b, g)
    for t in (x, y, b, g):
        assert t.data_ptr() in seen
    # A non-contiguous tensor is copied, and gives the same values.
    yt = y.t().contiguous().t()
    assert not yt.is_contiguous()
    torch.testing.assert_close(Genred(F, ALIASES, axis=1)(x, yt, b, g),
                               Genred(F, ALIASES, axis=1)(x, y, b, g))


def test_errors():
    x, y, b, g = inputs()
    fn = Genred(F, ALIASES, axis=1)
    with pytest.raises(TypeError, match="float32, float64, float16 or bfloat16"):
        fn(x.to(torch.int32), y, b, g)
    with pytest.raises(TypeError, match="mixed dtypes"):
        fn(x.float(), y, b, g)
    with pytest.raises(ValueError, match="CUDA tensors"):
        fn(x, y, b, g, backend="GPU")
    with pytest.raises(TypeError, match="torch tensor"):
        fn(x.detach().numpy(), y, b, g)
    with pytest.raises(ValueError, match=r"shape \(ny, 3\)"):
        fn(x, y[:, :2], b, g)


def test_import_symred_without_torch():
    # A meta-path finder that refuses torch: symred and symred.numpy import and run; only
    # symred.torch fails, with a message saying what to install.
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked")
sys.meta_path.insert(0, Block())
import numpy as np, symred
from symred.numpy import Genred
print(Genred("SqDist(x,y)", ["x=Vi(1)", "y=Vj(1)"], axis=1)(np.zeros((2, 1)), np.ones((3, 1))).sum())
assert "torch" not in sys.modules
try:
    import symred.torch
except ImportError as e:
    print("ImportError:", e)
"""
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(symred.__file__)))
    env = dict(os.environ, SYMRED_LIB=symred.lib_path,
               PYTHONPATH=pkg_root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "6.0"
    assert "python3-torch" in r.stdout


@pytest.mark.skipif(st._gomp is None, reason="libgomp not loadable")
def test_kernels_use_symreds_threads_not_torchs():
    # torch sets OpenMP's thread count to its own intra-op count (1 on 2-core VMs); symred's
    # kernels are planned and run with their own count inside _omp_threads, and torch's is
    # given back afterwards.
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with st._omp_threads():
            assert st._gomp.omp_get_max_threads() == max(1, st._THREADS)
        assert st._gomp.omp_get_max_threads() == 1
    finally:
        torch.set_num_threads(saved)
