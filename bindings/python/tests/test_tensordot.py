"""TensorDot and the other tensor ops against numpy.tensordot / einsum / kron, through Genred and
LazyTensor (keops_tensordot, keops_kron), on the JIT and on the reference interpreter."""

import numpy as np
import pytest

from symred import Genred, LazyTensor, SymredValueError

RNG = np.random.default_rng(7)
NX, NY = 9, 13


def rows(n, shape, dtype=np.float64):
    return RNG.uniform(-1, 1, (n,) + tuple(shape)).astype(dtype)


def pairwise_tensordot(x, y, ca, cb, perm=None):
    """sum_j of numpy.tensordot(x_i, y_j, (ca, cb)), with the kept axes permuted as KeOps does
    (kept axis k at output position perm[k]), flattened."""
    out = []
    for xi in x:
        acc = 0
        for yj in y:
            t = np.tensordot(xi, yj, axes=(list(ca), list(cb)))
            if perm is not None:
                t = np.transpose(t, np.argsort(perm))
            acc = acc + t
        out.append(np.reshape(acc, -1))
    return np.array(out)


@pytest.mark.parametrize("device", ["cpu", "reference"])
def test_matvec_as_tensordot(monkeypatch, device):
    monkeypatch.setenv("SYMRED_DEVICE", device)
    a, b = rows(NX, (4, 7)), rows(NY, (7,))
    A, B = LazyTensor(a.reshape(NX, 1, 28)), LazyTensor(b.reshape(1, NY, 7))
    got = A.keops_tensordot(B, (4, 7), (7,), (1,), (0,)).sum(dim=1)
    want = np.einsum("ikl,jl->ik", a, b)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmat_and_genred_text(dtype):
    a, b = rows(NX, (4, 7), dtype), rows(NY, (7, 2), dtype)
    g = Genred("TensorDot(a, b, [4,7], [7,2], [1], [0])", ["a = Vi(28)", "b = Vj(14)"],
               reduction_op="Sum", axis=1)
    got = g(a.reshape(NX, 28), b.reshape(NY, 14))
    want = np.einsum("ikl,jlm->ikm", a.astype(np.float64), b.astype(np.float64)).reshape(NX, 8)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", ["cpu", "reference"])
def test_pykeops_permute_case(monkeypatch, device):
    """pykeops' test_TensorDot_with_permute: three contracted pairs in scrambled order and a
    permutation of the five kept axes. (108 outputs of 16 terms each exceed the JIT's unrolling
    limit, so "cpu" runs the reference interpreter here; tests/diff.c checks the JIT's
    TensorDot, permutes included, against it.)"""
    monkeypatch.setenv("SYMRED_DEVICE", device)
    da, db = (2, 3, 2, 2, 4), (2, 4, 2, 3, 2, 3)
    ca, cb, perm = (4, 0, 2), (1, 4, 2), (4, 3, 2, 0, 1)
    x, y = rows(5, da), rows(4, db)
    X = LazyTensor(x.reshape(5, 1, -1))
    Y = LazyTensor(y.reshape(1, 4, -1))
    got = X.keops_tensordot(Y, da, db, ca, cb, perm).sum(dim=1)
    np.testing.assert_allclose(got, pairwise_tensordot(x, y, ca, cb, perm), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("perm", [None, (1, 2, 0), (2, 0, 1)])
def test_outer_product_permutations(perm):
    x, y = rows(NX, (2, 3)), rows(NY, (4,))
    X, Y = LazyTensor(x.reshape(NX, 1, 6)), LazyTensor(y.reshape(1, NY, 4))
    extra = () if perm is None else (perm,)
    got = X.keops_tensordot(Y, (2, 3), (4,), (), (), *extra).sum(dim=1)
    np.testing.assert_allclose(got, pairwise_tensordot(x, y, (), (), perm), rtol=1e-12,
                               atol=1e-12)


def test_full_contraction_is_a_scalar():
    x, y = rows(NX, (3, 4)), rows(NY, (4, 3))
    X, Y = LazyTensor(x.reshape(NX, 1, 12)), LazyTensor(y.reshape(1, NY, 12))
    t = X.keops_tensordot(Y, (3, 4), (4, 3), (0, 1), (1, 0))
    assert t.ndim == 1
    want = np.einsum("iab,jba->i", x, y)[:, None]
    np.testing.assert_allclose(t.sum(dim=1), want, rtol=1e-12, atol=1e-12)


def test_kron_matches_numpy():
    da, db = (2, 3), (3, 2)
    x, y = rows(NX, da), rows(NY, db)
    X, Y = LazyTensor(x.reshape(NX, 1, 6)), LazyTensor(y.reshape(1, NY, 6))
    got = X.keops_kron(Y, da, db).sum(dim=1)
    want = np.array([sum(np.kron(xi, yj).reshape(-1) for yj in y) for xi in x])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_tensordot_gradient_by_jacobian():
    """GradMatrix of a TensorDot that is linear in x is its matrix: the Jacobian of
    x -> tensordot(x, A) is A laid out row by row."""
    a = rows(1, (3, 2))[0]
    x = rows(NX, (3,))
    X, A = LazyTensor(x[:, None, :]), LazyTensor(a.reshape(1, 1, 6))
    y = LazyTensor(np.zeros((1, 1)), axis=1)  # one j so the Sum is the formula itself
    jac = (X.keops_tensordot(A, (3,), (3, 2), (0,), (0,)) + 0 * y).grad_matrix(X)
    got = jac.sum(dim=1)
    assert got.shape == (NX, 6)
    np.testing.assert_allclose(got, np.tile(a.T.reshape(-1), (NX, 1)), rtol=1e-12, atol=1e-12)


def test_bad_lists_raise():
    X = LazyTensor(rows(NX, (6,))[:, None, :])
    Y = LazyTensor(rows(NY, (3,))[None, :, :])
    with pytest.raises(ValueError, match="holds 5 components"):
        X.keops_tensordot(Y, (5,), (3,), (), ())
    with pytest.raises(ValueError, match="contracted axes"):
        X.keops_tensordot(Y, (2, 3), (3,), (1,), ())
    with pytest.raises(TypeError, match="ints"):
        X.keops_tensordot(Y, (2, 3.5), (3,), (1,), (0,))
    with pytest.raises(SymredValueError, match="size 2"):
        X.keops_tensordot(Y, (3, 2), (3,), (1,), (0,)).sum(dim=1)
    with pytest.raises(SymredValueError, match="permutation"):
        X.keops_tensordot(Y, (2, 3), (3,), (), (), (0, 0, 1)).sum(dim=1)


@pytest.mark.parametrize("name", ["BSpline(x, y, 2)", "SoftDTW_SqDist(x, y, x)"])
def test_keops_functions_symred_lacks(name):
    with pytest.raises(SymredValueError, match="KeOps function that symred does not support"):
        Genred(name, ["x = Vi(3)", "y = Vj(3)"])
