"""Genred with Grad, GradFromPos and Diff in the formula, as pykeops.numpy accepts them,
against dense NumPy derivatives of the Gaussian kernel F_ij = exp(-g |x_i - y_j|^2) b_j."""

import numpy as np
import pytest

from symred import Genred, SymredValueError

NX, NY, D = 7, 5, 3
ALIASES = ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)", "g = Pm(1)"]
F = "Exp(-g * SqDist(x, y)) * b"


def data(seed=0):
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((NX, D)), rng.standard_normal((NY, D))
    b = rng.standard_normal((NY, 1))
    g = np.array([0.7])
    e, ej = rng.standard_normal((NX, 1)), rng.standard_normal((NY, 1))
    u = rng.standard_normal((NX, D))
    return x, y, b, g, e, ej, u


def dense(x, y, b, g):
    diff = x[:, None, :] - y[None, :, :]  # (nx, ny, D)
    Fij = np.exp(-g[0] * (diff**2).sum(-1)) * b[:, 0][None, :]  # (nx, ny)
    return diff, Fij


def close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_grad_wrt_vi_over_j():
    x, y, b, g, e, _, _ = data()
    got = Genred(f"Grad({F}, x, e)", ALIASES + ["e = Vi(1)"], axis=1)(x, y, b, g, e)
    diff, Fij = dense(x, y, b, g)
    close(got, (-2 * g[0] * diff * (Fij * e)[..., None]).sum(1))


def test_grad_wrt_vj_over_i():
    x, y, b, g, _, ej, _ = data()
    got = Genred(f"Grad({F}, y, e)", ALIASES + ["e = Vj(1)"], axis=0)(x, y, b, g, ej)
    diff, Fij = dense(x, y, b, g)
    close(got, (2 * g[0] * diff * (Fij * ej[:, 0][None, :])[..., None]).sum(0))


def test_grad_wrt_param_and_weight():
    x, y, b, g, e, _, _ = data()
    diff, Fij = dense(x, y, b, g)
    got = Genred(f"Grad({F}, g, e)", ALIASES + ["e = Vi(1)"], axis=1)(x, y, b, g, e)
    close(got[:, 0], (-(diff**2).sum(-1) * Fij * e).sum(1))  # one partial sum per row i
    got = Genred(f"Grad({F}, b, e)", ALIASES + ["e = Vi(1)"], axis=0)(x, y, b, g, e)
    close(got[:, 0], (Fij / b[:, 0][None, :] * e).sum(0))


@pytest.mark.parametrize("axis", [0, 1])
def test_gradfrompos_declares_the_output_category(axis):
    # KeOps: GradFromPos(F, v, I) = Grad(F, v, Var(I, dim(F), category of the output)).
    x, y, b, g, e, ej, _ = data()
    eta = e if axis == 1 else ej
    got = Genred(f"GradFromPos({F}, x, 4)", ALIASES, axis=axis)(x, y, b, g, eta)
    diff, Fij = dense(x, y, b, g)
    w = Fij * (e if axis == 1 else ej[:, 0][None, :])  # the new variable is Vi or Vj
    # Over j: d/dx_i per row i; over i: the pair terms summed per column j.
    close(got, (-2 * g[0] * diff * w[..., None]).sum(1 if axis == 1 else 0))
    with pytest.raises(ValueError, match="takes 5 arrays"):
        Genred(f"GradFromPos({F}, x, 4)", ALIASES, axis=axis)(x, y, b, g)


def test_gradfrompos_by_position():
    x, y, b, g, e, _, _ = data()
    want = Genred(f"Grad({F}, x, e)", ALIASES + ["e = Vi(1)"], axis=1)(x, y, b, g, e)
    got = Genred(f"GradFromPos({F}, 0, e)", ALIASES + ["e = Vi(1)"], axis=1)(x, y, b, g, e)
    close(got, want)


def test_diff_and_second_derivative():
    x, y, b, g, e, _, u = data()
    diff, Fij = dense(x, y, b, g)
    got = Genred(f"Diff({F}, x, u)", ALIASES + ["u = Vi(3)"], axis=1)(x, y, b, g, u)
    close(got[:, 0], (Fij * -2 * g[0] * (diff * u[:, None, :]).sum(-1)).sum(1))
    # Hessian of e F with respect to x, applied to u.
    got = Genred(f"Grad(Grad({F}, x, e), x, u)", ALIASES + ["e = Vi(1)", "u = Vi(3)"],
                 axis=1)(x, y, b, g, e, u)
    du = (diff * u[:, None, :]).sum(-1)
    hess_u = (Fij * e)[..., None] * (4 * g[0] ** 2 * diff * du[..., None]
                                     - 2 * g[0] * u[:, None, :])
    close(got, hess_u.sum(1))


def test_gradfrompos_nested():
    x, y, b, g, e, _, u = data()
    got = Genred(f"GradFromPos(GradFromPos({F}, x, 4), x, 5)", ALIASES, axis=1)(
        x, y, b, g, e, u)
    want = Genred(f"Grad(Grad({F}, x, e), x, u)", ALIASES + ["e = Vi(1)", "u = Vi(3)"],
                  axis=1)(x, y, b, g, e, u)
    close(got, want)


def test_pykeops_formula_simplification_case():
    # pykeops' test_numpy.py: a second derivative of a linear formula is zero, and the call
    # still takes the four arrays its Var()s declare.
    x, y = data()[:2]
    g = Genred("Grad(Grad(x + Var(1,3,1), x, Var(2,3,0)),x, Var(3,3,0))", ["x=Vi(0,3)"],
               reduction_op="Sum", axis=1)
    out = g(x, y, x, x)
    assert out.shape == (NX, D)
    assert not out.any()


def test_grad_errors():
    with pytest.raises(SymredValueError, match="(?i)dim"):
        Genred(f"Grad({F}, x, e)", ALIASES + ["e = Vi(2)"], axis=1)
    with pytest.raises(SymredValueError):
        Genred(f"Grad({F}, x + y, e)", ALIASES + ["e = Vi(1)"], axis=1)
