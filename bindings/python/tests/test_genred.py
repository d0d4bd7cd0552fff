"""Genred: every reduction on both axes in float32 and float64 against NumPy brute force,
and the output shapes pykeops documents."""

import os
import threading

import numpy as np
import pytest
from helpers import assert_same, reduce_np

import symred
from symred import Genred

NX, NY = 9, 13
K = 3


def data(dtype, seed=0, dx=2):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((NX, dx)).astype(dtype)
    y = rng.standard_normal((NY, dx)).astype(dtype)
    b = rng.standard_normal((NY, 2)).astype(dtype)
    return x, y, b


# reduction -> (formula, formula2 or None, F(x, y, b) as (nx, ny, D), G(x, y, b) or None)
CASES = {
    "Sum": ("Exp(-SqDist(x,y)) * (x - y)", None,
            lambda x, y, b: np.exp(-((x[:, None] - y[None]) ** 2).sum(-1))[..., None]
            * (x[:, None] - y[None]), None),
    "Min": ("x - y", None, lambda x, y, b: x[:, None] - y[None], None),
    "Max": ("x - y", None, lambda x, y, b: x[:, None] - y[None], None),
    "ArgMin": ("x - y", None, lambda x, y, b: x[:, None] - y[None], None),
    "ArgMax": ("x - y", None, lambda x, y, b: x[:, None] - y[None], None),
    "Min_ArgMin": ("x - y", None, lambda x, y, b: x[:, None] - y[None], None),
    "Max_ArgMax": ("x - y", None, lambda x, y, b: x[:, None] - y[None], None),
    "KMin": ("x - y", None, lambda x, y, b: x[:, None] - y[None], None),
    "ArgKMin": ("SqDist(x,y)", None,
                lambda x, y, b: ((x[:, None] - y[None]) ** 2).sum(-1)[..., None], None),
    "KMin_ArgKMin": ("SqDist(x,y)", None,
                     lambda x, y, b: ((x[:, None] - y[None]) ** 2).sum(-1)[..., None], None),
    "LogSumExp": ("-SqDist(x,y) * IntCst(3)", None,
                  lambda x, y, b: -3 * ((x[:, None] - y[None]) ** 2).sum(-1)[..., None], None),
    "SumSoftMaxWeight": ("-SqDist(x,y)", "b * Elem(x, 0)",
                         lambda x, y, b: -((x[:, None] - y[None]) ** 2).sum(-1)[..., None],
                         lambda x, y, b: b[None] * x[:, None, :1]),
}
ALIASES = ["x = Vi(2)", "y = Vj(2)", "b = Vj(2)"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("red", list(CASES))
def test_reduction_matches_numpy(red, axis, dtype):
    formula, formula2, F, G = CASES[red]
    x, y, b = data(dtype)
    g = Genred(formula, ALIASES, reduction_op=red, axis=axis,
               opt_arg=K if "K" in red else None, formula2=formula2)
    got = g(x, y, b)
    x64, y64, b64 = (a.astype(np.float64) for a in (x, y, b))
    want = reduce_np(red, F(x64, y64, b64), axis, K=K,
                     G=G(x64, y64, b64) if G else None)
    if isinstance(want, tuple):
        want = tuple(w.astype(dtype) if w.dtype.kind == "f" else w for w in want)
    elif want.dtype.kind == "f":
        want = want.astype(dtype)
    assert_same(got, want, dtype)


def test_reductions_list_is_pykeops():
    assert symred.REDUCTIONS == (
        "Sum", "Min", "Max", "ArgMin", "ArgMax", "Min_ArgMin", "Max_ArgMax",
        "KMin", "ArgKMin", "KMin_ArgKMin", "LogSumExp", "SumSoftMaxWeight")


@pytest.mark.parametrize("axis,rows", [(0, NY), (1, NX)])
def test_axis_convention_is_pykeops(axis, rows):
    # pykeops: axis=0 reduces over i (one row per j), axis=1 over j (one row per i).
    x, y, _ = data(np.float64)
    out = Genred("SqDist(x,y)", ["x = Vi(2)", "y = Vj(2)"], axis=axis)(x, y)
    assert out.shape == (rows, 1)


def test_shapes_as_pykeops():
    x, y, _ = data(np.float32, dx=3)
    al = ["x = Vi(3)", "y = Vj(3)"]
    assert Genred("x - y", al, "Sum", axis=1)(x, y).shape == (NX, 3)
    assert Genred("x - y", al, "ArgMin", axis=1)(x, y).shape == (NX, 3)
    v, i = Genred("x - y", al, "Min_ArgMin", axis=0)(x, y)
    assert v.shape == (NY, 3) and i.shape == (NY, 3) and i.dtype == np.int64
    # K-reductions: (n, K, D), squeezed to (n, K) when D = 1.
    assert Genred("x - y", al, "KMin", axis=1, opt_arg=4)(x, y).shape == (NX, 4, 3)
    assert Genred("SqDist(x,y)", al, "KMin", axis=1, opt_arg=4)(x, y).shape == (NX, 4)
    assert Genred("SqDist(x,y)", al, "ArgKMin", axis=0, opt_arg=4)(x, y).shape == (NY, 4)
    v, i = Genred("x - y", al, "KMin_ArgKMin", axis=1, opt_arg=2)(x, y)
    assert v.shape == (NX, 2, 3) and i.shape == (NX, 2, 3)
    assert Genred("SqDist(x,y)", al, "LogSumExp", axis=1)(x, y).shape == (NX, 1)
    w = Genred("-SqDist(x,y)", al, "SumSoftMaxWeight", axis=1, formula2="y")(x, y)
    assert w.shape == (NX, 3)


def test_gaussian_matvec_with_parameter():
    rng = np.random.default_rng(1)
    x, y = rng.random((50, 3)), rng.random((40, 3))
    b = rng.random((40, 1))
    gamma = np.array([2.5])
    f = Genred("Exp(-g * SqDist(x, y)) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)", "g = Pm(1)"],
               reduction_op="Sum", axis=1)
    want = np.exp(-2.5 * ((x[:, None] - y[None]) ** 2).sum(-1)) @ b
    np.testing.assert_allclose(f(x, y, b, gamma), want, rtol=1e-12)
    # A Python scalar works for a Pm(1) argument too.
    np.testing.assert_allclose(f(x, y, b, 2.5), want, rtol=1e-12)


def test_explicit_indices_and_var_syntax():
    rng = np.random.default_rng(2)
    x, y = rng.random((6, 2)), rng.random((5, 2))
    a = Genred("SqDist(x, y)", ["y = Vj(1, 2)", "x = Vi(0, 2)"], axis=1)(x, y)
    b = Genred("SqDist(Var(0,2,0), Var(1,2,1))", [], axis=1)(x, y)
    np.testing.assert_allclose(a, b)
    np.testing.assert_allclose(a[:, 0], ((x[:, None] - y[None]) ** 2).sum(-1).sum(1))


def test_noncontiguous_and_byteswapped_inputs():
    rng = np.random.default_rng(3)
    x = np.asfortranarray(rng.random((8, 3)))
    ybig = rng.random((3, 7)).T  # a transposed view: not C-contiguous
    f = Genred("SqDist(x, y)", ["x = Vi(3)", "y = Vj(3)"], "Min", axis=1)
    want = f(np.ascontiguousarray(x), np.ascontiguousarray(ybig))
    np.testing.assert_array_equal(f(x, ybig), want)
    np.testing.assert_array_equal(f(x[::1], ybig.astype(">f8")), want)


def test_empty_reduction_gives_identity():
    x = np.ones((4, 1))
    y = np.ones((0, 1))
    assert np.all(Genred("x*y", ["x = Vi(1)", "y = Vj(1)"], "Sum", axis=1)(x, y) == 0)
    assert np.all(Genred("x*y", ["x = Vi(1)", "y = Vj(1)"], "ArgMin", axis=1)(x, y) == -1)
    assert Genred("x*y", ["x = Vi(1)", "y = Vj(1)"], "Sum", axis=0)(x, y).shape == (0, 1)


def test_kernel_cache_and_explain():
    f = Genred("SqDist(x, y)", ["x = Vi(2)", "y = Vj(2)"], "ArgKMin", axis=1, opt_arg=2)
    x, y, _ = data(np.float32)
    f(x, y)
    f(x, y)
    f(x.astype(np.float64), y.astype(np.float64))
    assert len(f._h.kernels) == 2  # one kernel per dtype, reused across calls
    text = f.explain()
    assert "SqDist" in text and "ArgKMin" in text, text
    assert "float64" in f.explain(dtype="float64")


def test_plan():
    """Genred.plan: sr_kernel_plan as a dict, per dtype and backend."""
    f = Genred("Exp(-SqDist(x, y)) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)"], "Sum", axis=1)
    ref = f.plan(backend="reference")
    first = {"strategy": "reference", "inner": "reference", "backend": "reference",
             "device": "reference", "tile_rows": 0, "tile_cols": 0, "threads": 1,
             "workspace_bytes": ref["workspace_bytes"],
             "workspace_per_thread": ref["workspace_bytes"], "tier": 0,
             "compiling": False, "fallback": None,
             "device_why": "the kernel's desc names it"}
    assert {key: ref[key] for key in first} == first, ref
    assert ref["workspace_bytes"] > 0
    # The second version's members: no module, no candidates, the simplified formula.
    assert ref["module"] is None and ref["plans"] == 0 and ref["acc"] is None, ref
    assert ref["simplified"] and "SqDist" in ref["formula"], ref
    assert ref["flops_per_pair"] > 0 and ref["eval_block"] == "reference", ref
    # The third version's: no tile product, no sum split weighed (F is no sum).
    assert ref["dot_dim"] == 0 and ref["b_padded"] == 0 and not ref["scale_in_exp"], ref
    assert ref["split_why"] is None and ref["split_parts"] == 0, ref
    assert ref["split_strategies"] == [] and ref["split_whole"] is None, ref
    cpu = f.plan(dtype="float64", backend="CPU")
    if cpu["backend"] == "cpu-jit":
        # Compiled code, or the tile interpreter while the module compiles (SYMRED_JIT=async).
        assert cpu["strategy"] == "direct" and cpu["device"] == "cpu", cpu
        assert cpu["tier"] == 1 or (cpu["tier"] == 0 and cpu["compiling"]), cpu
        assert cpu["tile_rows"] > 0 and cpu["tile_cols"] > 0 and cpu["fallback"] is None, cpu
    else:  # no C compiler: the tile interpreter, saying why
        assert cpu["backend"] == "tile interpreter" and cpu["strategy"] == "direct", cpu
        assert cpu["tier"] == 0 and cpu["fallback"], cpu
    assert len(f._h.kernels) == 2
    # backend="auto": the planner decides the device, and says how.
    auto = f.plan()
    if os.environ.get("SYMRED_DEVICE", "auto").lower() in ("auto", ""):
        assert auto["device_why"].startswith("the planner chose the CPU"), auto
    else:
        assert "SYMRED_DEVICE" in auto["device_why"], auto
    with pytest.raises(symred.SymredValueError):
        symred._lib.kernel_plan(None)


def test_accuracy_options_are_kept():
    f = Genred("x*y", ["x = Vi(1)", "y = Vj(1)"], axis=1, use_double_acc=True,
               sum_scheme="kahan_scheme")
    assert f.dtype_acc == "float64" and f.sum_scheme == "kahan_scheme"
    x = np.ones((3, 1), np.float32)
    np.testing.assert_array_equal(f(x, x), np.full((3, 1), 3, np.float32))


@pytest.mark.parametrize("red", ["Sum", "ArgKMin", "Min_ArgMin", "SumSoftMaxWeight"])
def test_default_cpu_backend_matches_reference(red):
    # backend="CPU" is the fastest CPU backend (the JIT where it is built), whatever
    # SYMRED_DEVICE says; the reference interpreter is the oracle.
    formula, formula2, _, _ = CASES[red]
    x, y, b = data(np.float32, seed=7)
    g = Genred(formula, ALIASES, reduction_op=red, axis=1,
               opt_arg=K if "K" in red else None, formula2=formula2)
    got, want = g(x, y, b, backend="CPU"), g(x, y, b, backend="reference")
    if not isinstance(want, tuple):
        got, want = (got,), (want,)
    for a, w in zip(got, want):
        assert a.shape == w.shape and a.dtype == w.dtype
        if w.dtype == np.int64:
            np.testing.assert_array_equal(a, w)
        else:
            np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5)


def test_backends_cpu_and_reference_agree():
    x, y, _ = data(np.float64)
    f = Genred("Exp(-SqDist(x, y))", ["x = Vi(2)", "y = Vj(2)"], axis=1)
    a = f(x, y, backend="CPU")
    np.testing.assert_allclose(f(x, y, backend="reference"), a, rtol=1e-12)
    np.testing.assert_allclose(f(x, y, backend="auto"), a, rtol=1e-12)


def test_threads_share_a_genred():
    x, y, _ = data(np.float64)
    f = Genred("Exp(-SqDist(x, y))", ["x = Vi(2)", "y = Vj(2)"], axis=1)
    want = f(x, y)
    results = []

    def work():
        for _ in range(5):
            results.append(f(x, y))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 20
    for r in results:
        np.testing.assert_array_equal(r, want)


def test_pykeops_import_path():
    from symred.numpy import Genred as G2, LazyTensor as L2
    assert G2 is Genred and L2 is symred.LazyTensor


@pytest.mark.parametrize("opts, mode", [
    ({}, None),
    ({"use_double_acc": True}, "f64"),
    ({"dtype_acc": "float64"}, "f64"),
    ({"sum_scheme": "kahan_scheme"}, "kahan"),
    ({"sum_scheme": "block_sum"}, "block"),
])
def test_accumulation_options_reach_the_kernel(opts, mode):
    """pykeops' accuracy options select the C kernel's accumulation mode: the CPU kernel's
    plan names it, and every mode gives the double-precision sum to float32 accuracy."""
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (3, 1)).astype(np.float32)
    y = rng.uniform(-3, 3, (20000, 1)).astype(np.float32)
    f = Genred("Exp(x*y)", ["x=Vi(1)", "y=Vj(1)"], reduction_op="Sum", axis=1, **opts)
    out = f(x, y, backend="CPU")
    exact = np.exp(x.astype(np.float64) * y.astype(np.float64).T).sum(1, keepdims=True)
    np.testing.assert_allclose(out, exact, rtol=2e-5)
    plan = f.plan(backend="CPU")
    if mode is not None and plan["backend"] == "cpu-jit":
        assert plan["acc"] == mode, (plan, f.explain(backend="CPU"))


def test_shard_rules_from_library():
    """The sharded front ends' table of partial states comes from the library's reductions."""
    from symred import _shard_rules
    assert _shard_rules.KIND == {
        "Sum": "sum", "LogSumExp": "lse", "SumSoftMaxWeight": "ssw",
        "Min": "min", "ArgMin": "min", "Min_ArgMin": "min",
        "Max": "max", "ArgMax": "max", "Max_ArgMax": "max",
        "KMin": "kmin", "ArgKMin": "kmin", "KMin_ArgKMin": "kmin",
    }
    assert _shard_rules.SELECT_RED == {"min": "Min_ArgMin", "max": "Max_ArgMax",
                                       "kmin": "KMin_ArgKMin"}
