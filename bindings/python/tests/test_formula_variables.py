"""How the bindings learn a formula's variables: from the C parser (sr_parse_ex's variable
table), whatever the spelling of the aliases and of Var(...), GradFromPos and nested Grad in the
formula; and how LazyTensor writes its formulas."""

import numpy as np
import pytest

from symred import Genred, LazyTensor, SymredValueError
from symred.numpy import generic_argkmin, generic_sum

NX, NY = 6, 4
rng = np.random.default_rng(3)
X, Y = rng.standard_normal((NX, 3)), rng.standard_normal((NY, 3))
B, G = rng.standard_normal((NY, 1)), np.array([0.5])


def table(g):
    return {i: (a.cat, a.dim, a.name) for i, a in g._args.items()}


def gauss():
    return (np.exp(-G[0] * ((X[:, None] - Y[None]) ** 2).sum(-1)) * B[:, 0]).sum(1)[:, None]


def test_aliases_with_spaces_and_explicit_indices():
    al = ["  x  =  Vi ( 3 ) ", "b=Vj( 2 ,1)", "y =Vj(1, 3)", " g= Var ( 3 , 1 , 2 )"]
    g = Genred("Exp(-g*SqDist(x,y))*b", al, axis=1)
    assert table(g) == {0: (0, 3, "'x'"), 1: (1, 3, "'y'"), 2: (1, 1, "'b'"),
                        3: (2, 1, "'g'")}
    np.testing.assert_allclose(g(X, Y, B, G), gauss(), rtol=1e-12)
    with pytest.raises(ValueError, match=r"argument 1 \('y' = Vj\(3\)\)"):
        g(X, Y[:, :2], B, G)


def test_var_calls_in_the_formula():
    g = Genred("Exp(-Var( 3,1 ,2 )*SqDist(x, Var(1, 3, 1))) * Var(2,1,1)", ["x = Vi(3)"],
               axis=1)
    assert table(g) == {0: (0, 3, "'x'"), 1: (1, 3, "Var(1,3,1)"), 2: (1, 1, "Var(2,1,1)"),
                        3: (2, 1, "Var(3,1,2)")}
    np.testing.assert_allclose(g(X, Y, B, G), gauss(), rtol=1e-12)
    # Vi(index, dim) written in the formula is a variable of the call as well.
    g = Genred("SqDist(x, Vj(1, 3))", ["x = Vi(3)"], reduction_op="Min", axis=1)
    assert table(g)[1][:2] == (1, 3)
    with pytest.raises(ValueError, match="takes 2 arrays"):
        g(X)


def test_an_index_declared_twice_differently_is_refused():
    with pytest.raises(SymredValueError, match="alias 1 declares it as Vi of dimension 3"):
        Genred("Var(0, 2, 0)", ["x = Vi(3)"], axis=1)


@pytest.mark.parametrize("axis", [0, 1])
def test_gradfrompos_spelled_with_spaces_and_in_formula2(axis):
    f = "Exp(-g*SqDist(x,y))*b"
    al = ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)", "g = Pm(1)"]
    spaced = Genred(f"GradFromPos ( {f} ,  x , 4 )", al, axis=axis)
    written = Genred(f"Grad({f}, x, Var(4, 1, {1 - axis}))", al, axis=axis)
    assert table(spaced)[4] == (1 - axis, 1, "Var(4,1,%d)" % (1 - axis))
    eta = rng.standard_normal((NX if axis == 1 else NY, 1))
    np.testing.assert_allclose(spaced(X, Y, B, G, eta), written(X, Y, B, G, eta), rtol=1e-12)
    # The weight of SumSoftMaxWeight declares its gradient input the same way.
    s = Genred("-SqDist(x,y)", al, reduction_op="SumSoftMaxWeight", axis=axis,
               formula2=f"GradFromPos({f}, y, 4)")
    assert table(s)[4][:2] == (1 - axis, 1)
    assert s(X, Y, B, G, eta).shape == (NX if axis == 1 else NY, 3)


def test_nested_grad_and_gradfrompos():
    f = "Exp(-SqDist(x,y))"
    al = ["x = Vi(3)", "y = Vj(3)", "e = Vi(1)", "u = Vi(3)"]
    e, u = rng.standard_normal((NX, 1)), rng.standard_normal((NX, 3))
    want = Genred(f"Grad(Grad({f}, x, e), x, u)", al, axis=1)(X, Y, e, u)
    mixed = Genred(f"Grad(GradFromPos({f}, x, 2), x, Var(3,3,0))", al[:2], axis=1)
    assert sorted(table(mixed)) == [0, 1, 2, 3]
    np.testing.assert_allclose(mixed(X, Y, e, u), want, rtol=1e-12)
    # Second derivatives of a linear formula vanish; their Var()s still count as arguments.
    zero = Genred("Grad(Grad(x + Var(1,3,1), x, Var(2,3,0)), x, Var(3,3,0))", ["x=Vi(0,3)"],
                  axis=1)
    assert sorted(table(zero)) == [0, 1, 2, 3]


def test_batched_parameter_keeps_its_alias():
    # A parameter with batch dimensions becomes a variable of its own alias (found by position).
    g = Genred("Exp(-g*SqDist(x,y))*b", [" x=Vi(3)", "y = Vj(3)", "b=Vj(1)", "g  =  Pm(1)"],
               axis=1)
    gb = np.array([[0.5], [1.5]])
    got = g(X, Y, B, gb)
    for k in range(2):
        np.testing.assert_allclose(got[k], g(X, Y, B, gb[k]), rtol=1e-12)


def test_generic_output_declarations():
    assert generic_sum("SqDist(x,y)", "  s =Vi( 1 )", "x = Vi(3)", "y = Vj(3)").axis == 1
    assert generic_argkmin("SqDist(x,y)", "a = Vj(2)", "x = Vi(3)", "y = Vj(3)").opt_arg == 2
    for bad in ("s = Pm(1)", "s = Vi(3", "s", "s = Vi(2, 1)"):
        with pytest.raises(ValueError, match="the output must be declared"):
            generic_sum("SqDist(x,y)", bad, "x = Vi(3)", "y = Vj(3)")


def test_lazytensor_formula_text():
    x, y = LazyTensor(X[:, None, :]), LazyTensor(Y[None, :, :])
    d = x.sqdist(y)
    K = (-d).exp()
    assert (K * K).formula == "(Exp((-SqDist(a0,a1)))*Exp((-SqDist(a0,a1))))"
    # Variables are named in order of appearance, wherever they were made.
    assert (y - x).formula == "(a0-a1)"
    assert "variables: a0=Vj(3), a1=Vi(3)" in repr(y - x)
    assert x.keops_tensordot(y, (3,), (3,), (0,), (0,)).formula == \
        "TensorDot(a0,a1,[3],[3],[0],[0])"
    # The transpose swaps the categories of the same variables, shared subtrees included.
    t = (K * x.sum(-1)).t()
    assert t.formula == (K * x.sum(-1)).formula
    want = (np.exp(-((X[:, None] - Y[None]) ** 2).sum(-1)) * X.sum(1)[:, None]).sum(1)
    np.testing.assert_allclose(t.sum(dim=0)[:, 0], want, rtol=1e-12)
