"""symred.torch.KernelSolve and LazyTensor.solve: the solution against torch.linalg.solve of the
dense matrix, gradients against autograd through it, gradcheck, and the errors."""

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import symred  # noqa: E402
from symred.torch import KernelSolve, LazyTensor, Vi, Vj  # noqa: E402

FORMULA = "Exp(-g * SqDist(x, y)) * b"
G, ALPHA = 2.0, 0.5
F64 = torch.float64


def aliases(nb, axis=1):
    i, j = ("Vi", "Vj") if axis == 1 else ("Vj", "Vi")
    return [f"x = {i}(2)", f"y = {j}(2)", f"b = {j}({nb})", "g = Pm(1)"]


def data(n, nb, dtype=F64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, dtype=dtype, generator=gen) * 2 - 1
    b = torch.rand(n, nb, dtype=dtype, generator=gen) * 2 - 1
    return x, b, torch.tensor([G], dtype=dtype)


def dense_solve(x, b, g, alpha=ALPHA):
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    A = torch.exp(-g * d2) + alpha * torch.eye(len(x), dtype=x.dtype)
    return torch.linalg.solve(A, b)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("nb", [1, 3])
def test_solution_matches_torch_linalg(axis, nb):
    x, b, g = data(61, nb)
    a = KernelSolve(FORMULA, aliases(nb, axis), "b", axis=axis)(x, x, b, g, alpha=ALPHA,
                                                                eps=1e-11)
    assert a.shape == b.shape and a.dtype == F64
    ref = dense_solve(x, b, g)
    torch.testing.assert_close(a, ref, rtol=0, atol=1e-8 * ref.abs().max().item())


def test_float32():
    x, b, g = data(61, 2, torch.float32, seed=3)
    a = KernelSolve(FORMULA, aliases(2), "b", axis=1)(x, x, b, g, alpha=ALPHA, eps=1e-5)
    assert a.dtype == torch.float32
    ref = dense_solve(x.double(), b.double(), g.double())
    assert (a.double() - ref).abs().max() <= 2e-3 * ref.abs().max()


@pytest.mark.parametrize("axis", [0, 1])
def test_gradients_match_dense_autograd(axis):
    x, b, g = data(23, 2, seed=1)
    x.requires_grad_(), b.requires_grad_(), g.requires_grad_()
    w = torch.rand(b.shape, dtype=F64, generator=torch.Generator().manual_seed(5))
    Kinv = KernelSolve(FORMULA, aliases(2, axis), "b", axis=axis)
    # x given for both x_i and x_j: autograd adds the two gradients, as for the dense K.
    got = torch.autograd.grad((Kinv(x, x, b, g, alpha=ALPHA, eps=1e-12) * w).sum(), [x, b, g])
    want = torch.autograd.grad((dense_solve(x, b, g) * w).sum(), [x, b, g])
    for name, u, v in zip("xbg", got, want):
        torch.testing.assert_close(u, v, rtol=0, atol=1e-9 * v.abs().max().item(),
                                   msg=lambda m, name=name: f"d/d{name}: {m}")


def test_gradcheck_b_x_and_parameter():
    x, b, g = data(10, 2, seed=2)
    Kinv = KernelSolve(FORMULA, aliases(2), "b", axis=1)

    def f(x, b, g):
        return Kinv(x, x, b, g, alpha=ALPHA, eps=1e-13)

    inputs = (x.requires_grad_(), b.requires_grad_(), g.requires_grad_())
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradcheck(lambda b: f(x.detach(), b, g.detach()), (b,))
    assert torch.autograd.gradgradcheck(f, inputs)


def test_lazytensor_solve():
    x, b, g = data(40, 3, seed=4)
    x.requires_grad_()
    K = (-G * Vi(x).sqdist(Vj(x))).exp()
    a = K.solve(b, alpha=ALPHA, eps=1e-11)
    ref = dense_solve(x, b, g)
    torch.testing.assert_close(a, ref, rtol=0, atol=1e-8 * ref.abs().max().item())
    # The right-hand side as a Vi LazyTensor, as in pykeops' examples, and its gradient.
    a2 = K.solve(LazyTensor(b[:, None, :]), alpha=ALPHA, eps=1e-11)
    torch.testing.assert_close(a, a2, rtol=0, atol=0)
    gx = torch.autograd.grad(a.sum(), x)[0]
    gx_ref = torch.autograd.grad(ref.sum(), x)[0]
    torch.testing.assert_close(gx, gx_ref, rtol=0, atol=1e-8 * gx_ref.abs().max().item())


def test_no_convergence_is_raised():
    x, b, g = data(50, 1)
    with pytest.raises(symred.SymredRuntimeError) as e:
        KernelSolve(FORMULA, aliases(1), "b", axis=1)(x, x, b, g, alpha=0.1, max_iter=1)
    assert e.value.status_name == "ENOCONV"
    assert "no convergence after 1 iterations" in str(e.value)


def test_errors():
    x, b, g = data(30, 1)
    Kinv = KernelSolve(FORMULA, aliases(1), "b", axis=1)
    y = torch.rand(30, 2, dtype=F64, generator=torch.Generator().manual_seed(9))
    with pytest.raises(ValueError, match="not symmetric"):
        Kinv(x, y, b, g, alpha=ALPHA)
    # A formula that is not symmetric in x_i, x_j (the same data on both sides).
    asym = KernelSolve("Exp(-g * SqDist(x, y) - Sum(x)) * b", aliases(1), "b", axis=1)
    with pytest.raises(ValueError, match="not symmetric"):
        asym(x, x, b, g, alpha=ALPHA)
    with pytest.raises(ValueError, match="square"):
        Kinv(x, x[:20], b[:20], g)
    with pytest.raises(ValueError, match="batch dimensions are not supported"):
        Kinv(x.expand(2, 30, 2), x, b, g)
    with pytest.raises(ValueError, match="ranges"):
        Kinv(x, x, b, g, ranges=(None,) * 6)
    with pytest.raises(ValueError, match="CPU tensors only"):
        Kinv(x, x, b, g, backend="GPU")
    with pytest.raises(ValueError, match="varinvalias"):
        KernelSolve(FORMULA, aliases(1), "c", axis=1)
    with pytest.raises(TypeError, match="mixed dtypes"):
        Kinv(x, x, b.float(), g)


@pytest.mark.parametrize("axis", [0, 1])
def test_forward_mode_matches_dense(axis):
    # da = (alpha I + K)^-1 (db - dK a): the tangent kernel and one more solve, against the
    # dense solve's forward-mode derivative (torch.autograd.forward_ad: PyTorch 1.13 too).
    import torch.autograd.forward_ad as fwAD

    x, b, g = data(47, 2)
    gen = torch.Generator().manual_seed(4)
    dx, db = torch.randn(x.shape, dtype=F64, generator=gen), torch.randn(b.shape, dtype=F64,
                                                                         generator=gen)
    dg = torch.tensor([0.3], dtype=F64)
    Kinv = KernelSolve(FORMULA, aliases(2, axis), "b", axis=axis)
    with fwAD.dual_level():
        xd, bd, gd = fwAD.make_dual(x, dx), fwAD.make_dual(b, db), fwAD.make_dual(g, dg)
        got = fwAD.unpack_dual(Kinv(xd, xd, bd, gd, alpha=ALPHA, eps=1e-12)).tangent
        want = fwAD.unpack_dual(dense_solve(xd, bd, gd)).tangent
    torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-8)
