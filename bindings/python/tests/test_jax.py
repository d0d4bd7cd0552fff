"""symred.jax against dense jax.numpy in float64: every reduction on both axes, eagerly and
under jax.jit; gradients (check_grads to second order); vmap as one custom call; errors at
trace time and at run time. Kernels run on the reference interpreter (conftest.py)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import symred  # noqa: E402
from symred.jax import Genred, LazyTensor, Vi, Vj  # noqa: E402

ALIASES = ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)", "g = Pm(1)"]
F = "Exp(-g * SqDist(x, y))"


def data(nx=7, ny=6, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.normal(size=(nx, 3))), jnp.asarray(rng.normal(size=(ny, 3))),
            jnp.asarray(rng.normal(size=(ny, 2))), jnp.asarray([0.7]))


def dense_f(x, y, g):
    """F_ij, (nx, ny)."""
    return jnp.exp(-g[0] * ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))


def reduce_dense(red, Fm, axis, K=3, W=None):
    """The reduction of the (nx, ny, d) matrix Fm over j (axis 1) or i (axis 0)."""
    if axis == 0:
        Fm = jnp.swapaxes(Fm, 0, 1)
        W = jnp.swapaxes(W, 0, 1) if W is not None else None
    if red == "Sum":
        return Fm.sum(1)
    if red in ("Min", "Max"):
        return getattr(Fm, red.lower())(1)
    if red in ("ArgMin", "ArgMax"):
        return getattr(jnp, red.lower())(Fm, axis=1)
    if red in ("Min_ArgMin", "Max_ArgMax"):
        r = red.split("_")[0]
        return getattr(Fm, r.lower())(1), getattr(jnp, "arg" + r.lower())(Fm, axis=1)
    if red in ("KMin", "ArgKMin", "KMin_ArgKMin"):
        order = jnp.argsort(Fm[:, :, 0], axis=1)[:, :K]
        vals = jnp.take_along_axis(Fm[:, :, 0], order, axis=1)
        return {"KMin": vals, "ArgKMin": order, "KMin_ArgKMin": (vals, order)}[red]
    if red == "LogSumExp":
        return jax.scipy.special.logsumexp(Fm, axis=1)
    if red == "SumSoftMaxWeight":
        w = jax.nn.softmax(Fm[:, :, 0], axis=1)
        return (w[:, :, None] * W).sum(1)
    raise AssertionError(red)


def assert_close(a, b, tol=1e-12):
    if isinstance(b, tuple):
        assert isinstance(a, tuple) and len(a) == len(b)
        for u, v in zip(a, b):
            assert_close(u, v, tol)
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    if b.dtype.kind in "iu":
        assert a.dtype == np.int64
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("red", symred.REDUCTIONS)
def test_reductions_match_dense(red, axis):
    x, y, b, g = data()
    # A scalar F for the selections (a KMin of a vector F would need a per-component sort);
    # a 2-vector F for the others.
    scalar = red in ("ArgMin", "ArgMax", "Min_ArgMin", "Max_ArgMax", "KMin", "ArgKMin",
                     "KMin_ArgKMin", "SumSoftMaxWeight")
    formula = "SqDist(x, y) * g" if scalar else F + " * b"
    formula2 = "b" if red == "SumSoftMaxWeight" else None
    K = 3 if "KMin" in red else None
    gr = Genred(formula, ALIASES, reduction_op=red, axis=axis, opt_arg=K, formula2=formula2)
    sq = g[0] * ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    Fm = sq[:, :, None] if scalar else dense_f(x, y, g)[:, :, None] * b[None, :, :]
    W = jnp.broadcast_to(b[None, :, :], (x.shape[0],) + b.shape)
    want = reduce_dense(red, Fm, axis, W=W)
    assert_close(gr(x, y, b, g), want)
    assert_close(jax.jit(gr)(x, y, b, g), want)


@pytest.mark.parametrize("axis", [0, 1])
def test_weighted_logsumexp(axis):
    # LogSumExp with formula2 (pykeops' weighted LogSumExp): log sum exp(F) w componentwise in
    # w, its value and gradient against dense jax.numpy, eagerly and under jax.jit. The weight
    # is a variable of the reduced index.
    x, y, b, g = data()
    if axis == 0:
        b = jnp.asarray(np.random.default_rng(1).normal(size=(x.shape[0], 2)))
    cat = "Vj" if axis == 1 else "Vi"
    gr = Genred("-g * SqDist(x, y)", ["x = Vi(3)", "y = Vj(3)", f"b = {cat}(2)", "g = Pm(1)"],
                reduction_op="LogSumExp", axis=axis, formula2="Exp(b)")

    def dense(x, y, b, g):
        Fm = -g[0] * ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
        w = jnp.exp(b)[None] if axis == 1 else jnp.exp(b)[:, None]
        return jnp.log((jnp.exp(Fm)[..., None] * w).sum(axis))

    args = (x, y, b, g)
    np.testing.assert_allclose(gr(*args), dense(*args), rtol=1e-12)
    np.testing.assert_allclose(jax.jit(gr)(*args), dense(*args), rtol=1e-12)

    def loss(f):
        return lambda *a: (f(*a) ** 2).sum()

    for got, want in zip(jax.grad(loss(gr), (0, 1, 2, 3))(*args),
                         jax.grad(loss(dense), (0, 1, 2, 3))(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_float32_and_int32_indices_without_x64():
    x, y, b, g = data()
    with jax.enable_x64(False):
        gr = Genred("SqDist(x, y) * g", ALIASES, reduction_op="Min_ArgMin", axis=1)
        x32, y32, b32, g32 = (a.astype(jnp.float32) for a in (x, y, b, g))
        vals, idx = jax.jit(gr)(x32, y32, b32, g32)
        assert vals.dtype == jnp.float32 and idx.dtype == jnp.int32
    sq = g[0] * ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    np.testing.assert_allclose(np.asarray(vals)[:, 0], np.asarray(sq.min(1)), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(idx)[:, 0], np.asarray(sq.argmin(1)))


def gaussian_sum(axis):
    return Genred(F + " * b", ALIASES, reduction_op="Sum", axis=axis)


@pytest.mark.parametrize("axis", [0, 1])
def test_grad_matches_dense(axis):
    x, y, b, g = data()
    gr = gaussian_sum(axis)

    def dense(x, y, b, g):
        Fm = dense_f(x, y, g)[:, :, None] * b[None, :, :]
        return Fm.sum(axis)

    def loss(fn):
        return lambda *a: (jnp.sin(fn(*a)) ** 2).sum()

    want = jax.grad(loss(dense), argnums=(0, 1, 2, 3))(x, y, b, g)
    got = jax.jit(jax.grad(loss(gr), argnums=(0, 1, 2, 3)))(x, y, b, g)
    for u, v in zip(got, want):
        assert_close(u, v, 1e-10)


@pytest.mark.parametrize("red,formula", [
    ("Sum", F + " * b"),
    ("LogSumExp", "-g * SqDist(x, y) + Sum(b)"),
    ("SumSoftMaxWeight", "-g * SqDist(x, y)"),
    ("Min", "SqDist(x, y) * g"),
    ("KMin", "SqDist(x, y) * g"),
])
@pytest.mark.parametrize("axis", [0, 1])
def test_check_grads_second_order(red, formula, axis):
    x, y, b, g = data(5, 4)
    gr = Genred(formula, ALIASES, reduction_op=red, axis=axis,
                opt_arg=2 if red == "KMin" else None,
                formula2="b" if red == "SumSoftMaxWeight" else None)
    check_grads(gr, (x, y, b, g), order=2, modes=["fwd", "rev"], atol=1e-5, rtol=1e-5)


def test_arg_reduction_gradient_is_zero():
    x, y, b, g = data()
    gr = Genred("SqDist(x, y) * g", ALIASES, reduction_op="ArgMin", axis=1)
    dx = jax.grad(lambda x: gr(x, y, b, g).astype(x.dtype).sum())(x)
    assert_close(dx, jnp.zeros_like(x))


def hlo_custom_calls(fn, *args):
    return jax.jit(fn).lower(*args).as_text().count("custom_call")


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("in_axes", [(0, None, None, None), (None, 0, None, None),
                                     (0, 0, 0, None), (None, None, 0, None)])
def test_vmap_is_one_call(in_axes, axis):
    x, y, b, g = data()
    B = 4
    rng = np.random.default_rng(1)
    args = [jnp.asarray(rng.normal(size=(B,) + a.shape)) if ax == 0 else a
            for a, ax in zip((x, y, b, g), in_axes)]
    gr = gaussian_sum(axis)

    def dense(x, y, b, g):
        return (dense_f(x, y, g)[:, :, None] * b[None, :, :]).sum(axis)

    want = jax.vmap(dense, in_axes)(*args)
    assert_close(jax.vmap(gr, in_axes)(*args), want)
    assert_close(jax.jit(jax.vmap(gr, in_axes))(*args), want)
    assert hlo_custom_calls(jax.vmap(gr, in_axes), *args) == 1


@pytest.mark.parametrize("axis", [0, 1])
def test_vmap_over_a_parameter_is_one_call(axis):
    """A batched parameter becomes a variable of the output index (one value per row), in the
    forward and in the gradient kernels."""
    x, y, b, _ = data()
    gs = jnp.asarray([[0.3], [0.7], [1.5]])
    gr = gaussian_sum(axis)

    def dense(g):
        return (dense_f(x, y, g)[:, :, None] * b[None]).sum(axis)

    def fn(g):
        return gr(x, y, b, g)

    assert_close(jax.vmap(fn)(gs), jax.vmap(dense)(gs))
    assert hlo_custom_calls(jax.vmap(fn), gs) == 1
    grad = jax.vmap(jax.grad(lambda g: (fn(g) ** 2).sum()))
    assert_close(grad(gs), jax.vmap(jax.grad(lambda g: (dense(g) ** 2).sum()))(gs), 1e-10)
    assert hlo_custom_calls(grad, gs) == 2
    # A parameter declared by Var() cannot be promoted: the batches loop, with the same values.
    gv = Genred("Exp(-Var(3, 1, 2) * SqDist(x, y)) * b", ALIASES[:3], axis=axis)
    assert_close(jax.vmap(lambda g: gv(x, y, b, g))(gs), jax.vmap(dense)(gs))


@pytest.mark.parametrize("red", ["ArgMin", "Min_ArgMin", "ArgKMin"])
def test_vmap_indices_are_per_batch(red):
    _, _, b, g = data()
    rng = np.random.default_rng(2)
    xb, yb = jnp.asarray(rng.normal(size=(3, 7, 3))), jnp.asarray(rng.normal(size=(3, 6, 3)))
    gr = Genred("SqDist(x, y) * g", ALIASES, reduction_op=red, axis=1,
                opt_arg=2 if red == "ArgKMin" else None)
    got = jax.vmap(gr, (0, 0, None, None))(xb, yb, b, g)
    ref = symred.Genred("SqDist(x, y) * g", ALIASES, reduction_op=red, axis=1,
                        opt_arg=2 if red == "ArgKMin" else None)
    for k in range(3):
        want = ref(*(np.asarray(a) for a in (xb[k], yb[k], b, g)))
        one = tuple(o[k] for o in got) if isinstance(got, tuple) else got[k]
        assert_close(one, want)


def test_vmap_of_grad_and_grad_of_vmap():
    x, y, b, g = data()
    xb = jnp.asarray(np.random.default_rng(3).normal(size=(4,) + x.shape))
    gr = gaussian_sum(1)

    def dense(x, y, b, g):
        return (dense_f(x, y, g)[:, :, None] * b[None]).sum(1)

    def loss(fn):
        return lambda x: (fn(x, y, b, g) ** 2).sum()

    assert_close(jax.vmap(jax.grad(loss(gr)))(xb), jax.vmap(jax.grad(loss(dense)))(xb), 1e-10)
    assert_close(jax.grad(lambda xb: jax.vmap(loss(gr))(xb).sum())(xb),
                 jax.grad(lambda xb: jax.vmap(loss(dense))(xb).sum())(xb), 1e-10)
    # The backward of the batched call is batched too: one call per kernel.
    assert hlo_custom_calls(jax.vmap(jax.grad(loss(gr))), xb) == 2


def test_nested_vmap():
    _, y, b, g = data()
    xbb = jnp.asarray(np.random.default_rng(4).normal(size=(2, 3, 7, 3)))
    gr = gaussian_sum(1)
    want = jax.vmap(jax.vmap(lambda x: (dense_f(x, y, g)[:, :, None] * b[None]).sum(1)))(xbb)
    fn = jax.vmap(jax.vmap(lambda x: gr(x, y, b, g)))
    assert_close(fn(xbb), want)
    assert hlo_custom_calls(fn, xbb) == 1


def test_lazytensor_under_jit_and_grad():
    x, y, b, _ = data()

    def f(x):
        K = (-Vi(x).sqdist(Vj(y))).exp()
        return (K * Vj(b)).sum(dim=1)

    def dense(x):
        return dense_f(x, y, jnp.asarray([1.0])) @ b

    assert_close(jax.jit(f)(x), dense(x))
    assert_close(jax.grad(lambda x: (jax.jit(f)(x) ** 2).sum())(x),
                 jax.grad(lambda x: (dense(x) ** 2).sum())(x), 1e-10)
    idx = (LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])).sqnorm2().argKmin(2, dim=1)
    want = jnp.argsort(((x[:, None] - y[None]) ** 2).sum(-1), axis=1)[:, :2]
    assert_close(idx, want)


def test_bad_input_raises_at_trace_time():
    x, y, b, g = data()
    with pytest.raises(symred.SymredValueError, match="SqDistt"):
        Genred("SqDistt(x, y)", ALIASES)
    gr = gaussian_sum(1)
    with pytest.raises(ValueError, match=r"'y' = Vj\(3\)\) must have shape \(ny, 3\)"):
        jax.jit(gr).lower(x, y[:, :2], b, g)
    with pytest.raises(ValueError, match="same number of rows"):
        jax.jit(gr).lower(x, y[:4], b, g)
    kmin = Genred("SqDist(x, y)", ALIASES[:2], reduction_op="KMin", axis=1, opt_arg=9)
    with pytest.raises(ValueError, match="K = 9 exceeds the 6 reduced rows"):
        jax.jit(kmin).lower(x, y)
    with pytest.raises(TypeError, match="mixed dtypes"):
        gr(x.astype(jnp.float32), y, b, g)


def test_runtime_failure_is_a_python_exception():
    x, y, b, g = data()
    gr = gaussian_sum(1)
    # A row block past the end of the rows: only the C library checks the values, when the
    # call runs.
    bad = (np.array([[0, 99]]), np.array([1]), np.array([[0, 6]]),
           np.array([[0, 6]]), np.array([1]), np.array([[0, 7]]))
    fn = jax.jit(lambda x: gr(x, y, b, g, ranges=bad))
    with pytest.raises(RuntimeError, match=r"symred: ranges: ranges_i\[0\] = \[0, 99\)"):
        jax.block_until_ready(fn(x))
    # The process and the kernel are fine afterwards.
    good = (np.array([[0, 7]]), np.array([1]), np.array([[0, 6]]),
            np.array([[0, 6]]), np.array([1]), np.array([[0, 7]]))
    assert_close(jax.jit(lambda x: gr(x, y, b, g, ranges=good))(x), gr(x, y, b, g))


def test_import_symred_does_not_import_jax():
    code = "import sys, symred; assert 'jax' not in sys.modules, 'jax imported'; print('ok')"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_doc_example():
    """The Python block of docs/jax.md (test_doc_examples.py skips it: it needs jax)."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "jax.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    ns = {}
    exec(compile(code, "docs/jax.md", "exec"), ns)
    assert ns["knn"].shape == (1000, 5) and ns["batched"].shape == (2, 1000, 1)
    assert ns["dx"].shape == (1000, 3) and ns["dg"].shape == (1,)


def test_grad_of_a_linear_loss_runs_only_the_gradient_kernel():
    x, y, b, g = data()
    ct = jnp.ones((x.shape[0], 2))
    gr = gaussian_sum(1)
    assert hlo_custom_calls(jax.grad(lambda x: (gr(x, y, b, g) * ct).sum()), x) == 1


def test_batch_dimensions_with_a_batched_parameter_are_one_call():
    """pykeops-style batch dimensions: a (B, 1) parameter becomes a variable of the output
    index, so even a batched parameter is one call (and differentiable)."""
    _, y, b, _ = data()
    rng = np.random.default_rng(5)
    xb = jnp.asarray(rng.normal(size=(3, 7, 3)))
    gb = jnp.asarray([[0.3], [0.7], [1.5]])
    gr = gaussian_sum(1)

    def dense(x, g):
        return (dense_f(x, y, g)[:, :, None] * b[None]).sum(1)

    assert_close(gr(xb, y, b, gb), jax.vmap(dense)(xb, gb))
    assert hlo_custom_calls(lambda xb, gb: gr(xb, y, b, gb), xb, gb) == 1
    assert_close(jax.grad(lambda gb: (gr(xb, y, b, gb) ** 2).sum())(gb),
                 jax.grad(lambda gb: (jax.vmap(dense)(xb, gb) ** 2).sum())(gb), 1e-10)


@pytest.mark.parametrize("form", ["symred", "midpoint"])
def test_sgpr_bound_through_symred_matches_dense(form):
    """bench/exla/sgpr_jax.py: the collapsed SGPR bound with K_uf K_fu and K_uf y from
    symred.jax (the M-wide Sum over the points, or the Gaussian sum at the M^2 midpoints)
    equals the one with K_uf materialised in jax.numpy, value and gradient."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench" / "exla"))
    import sgpr_jax

    rng = np.random.default_rng(6)
    X = jnp.asarray(rng.random((300, 3)))
    y = jnp.asarray(np.sin(6 * X[:, 0]) + 0.1 * rng.standard_normal(300))
    Z = X[:12]
    theta = jnp.log(jnp.asarray([0.3, 1.2, 0.1]))
    vs, gs = jax.value_and_grad(sgpr_jax.bound)(theta, X, y, Z, sgpr_jax.TERMS[form])
    vd, gd = jax.value_and_grad(sgpr_jax.bound)(theta, X, y, Z, sgpr_jax.terms_dense)
    assert_close(vs, vd, 1e-9)
    assert_close(gs, gd, 1e-7)
    assert bool(jnp.all(jnp.abs(gd) > 1e-3))  # every hyperparameter moves the bound here


def test_hessian_forward_over_reverse_and_reverse_over_reverse():
    """jax.hessian (forward over reverse: tangent kernels of the gradient kernels) and
    jacrev(grad) (two levels of gradient kernels) against the dense Hessian."""
    x, y, b, g = data(4, 3)
    gr = gaussian_sum(1)

    def loss(fn):
        return lambda x, g: (fn(x, y, b, g) ** 2).sum()

    def dense(x, y, b, g):
        return (dense_f(x, y, g)[:, :, None] * b[None]).sum(1)

    want = jax.hessian(loss(dense), argnums=(0, 1))(x, g)
    got = jax.jit(jax.hessian(loss(gr), argnums=(0, 1)))(x, g)
    for i in range(2):
        for j in range(2):
            assert_close(got[i][j], want[i][j], 1e-9)
    assert_close(jax.jacrev(jax.grad(loss(gr)))(x, g), want[0][0], 1e-9)


@pytest.mark.parametrize("red", ["Sum", "LogSumExp", "Min", "SumSoftMaxWeight", "KMin_ArgKMin"])
@pytest.mark.parametrize("axis", [0, 1])
def test_jvp_against_dense(red, axis):
    """jax.jvp: the tangent kernel along all four tangents, against jax's jvp of the dense
    computation (KMin of a vector formula, which selects per component: against central
    differences of symred's values); one custom call for the values and one for the
    tangent (SumSoftMaxWeight: and one for its log-normalizer)."""
    args = data()
    rng = np.random.default_rng(9)
    dargs = tuple(jnp.asarray(rng.normal(size=a.shape)) for a in args)
    ssmw = red == "SumSoftMaxWeight"
    gr = Genred(F if ssmw else F + " * b", ALIASES, reduction_op=red, axis=axis,
                opt_arg=2 if red.startswith("K") else None, formula2="b" if ssmw else None)

    def ours(*a):
        out = gr(*a)
        return out[0] if red == "KMin_ArgKMin" else out

    def dense(x, y, b, g):
        Fm = dense_f(x, y, g)
        if ssmw:
            W = jnp.broadcast_to(b[None], Fm.shape + (2,))  # W_ij = b_j
            return reduce_dense(red, Fm[:, :, None], axis, W=W)
        return reduce_dense(red, Fm[:, :, None] * b[None], axis)

    got = jax.jvp(ours, args, dargs)
    if red == "KMin_ArgKMin":
        eps = 1e-6
        plus = ours(*[a + eps * d for a, d in zip(args, dargs)])
        minus = ours(*[a - eps * d for a, d in zip(args, dargs)])
        assert_close(got[1], (plus - minus) / (2 * eps), 1e-6)
    else:
        want = jax.jvp(dense, args, dargs)
        assert_close(got[0], want[0], 1e-10)
        assert_close(got[1], want[1], 1e-9)
    assert hlo_custom_calls(lambda *a: jax.jvp(ours, a, dargs), *args) == (3 if ssmw else 2)


def test_jacfwd_each_argument_is_one_call():
    """jax.jacfwd is a vmap of the JVP: the tangent kernel's batching rule, one call, also for
    a batched tangent of an unbatched parameter (the two promoted together)."""
    x, y, b, g = data()
    gr = gaussian_sum(1)

    def dense(x, y, b, g):
        return (dense_f(x, y, g)[:, :, None] * b[None]).sum(1)

    for argnum in range(4):
        assert_close(jax.jacfwd(gr, argnums=argnum)(x, y, b, g),
                     jax.jacfwd(dense, argnums=argnum)(x, y, b, g), 1e-10)
    # One call: the batched tangent kernel (jacfwd does not return the values, so XLA drops
    # the forward).
    assert hlo_custom_calls(jax.jacfwd(gr, argnums=3), x, y, b, g) == 1


def test_genred_made_while_tracing_outlives_its_python_object():
    """A Genred created while tracing (a LazyTensor reduction inside jax.jit) is gone from
    Python after the trace, but the compiled function still calls its kernel: the executable
    holds the Genred's keeper, so the kernel is still there on later calls."""
    import gc

    import symred.jax as sjax

    x, y, _, _ = data(9, 8)
    symred.lazytensor._cache.clear()
    gc.collect()
    base = sjax.keepers_alive()
    f = jax.jit(lambda x, s: (-(Vi(x) - Vj(y)).sqnorm2() * s).exp().sum(dim=1))
    s = jnp.asarray(1.3)
    first = f(x, s)
    symred.lazytensor._cache.clear()  # the LazyTensor formula cache holds the Genred too
    gc.collect()
    assert sjax.keepers_alive() == base + 1  # held by the executable alone
    want = jnp.exp(-((x[:, None] - y[None]) ** 2).sum(-1) * s).sum(1, keepdims=True)
    assert_close(f(x, s), first)
    assert_close(f(x, s), want)


def test_many_distinct_formulas_are_freed():
    """Genreds that are gone, and whose executables JAX has dropped, free their contexts and
    kernels: creating many distinct formulas does not keep them all."""
    import gc

    import symred.jax as sjax

    x, y, _, _ = data(6, 5)
    jax.clear_caches()
    gc.collect()
    base = sjax.keepers_alive()
    for i in range(12):
        K = Genred(f"Exp(-SqDist(x, y) * {i + 1})", ["x = Vi(3)", "y = Vj(3)"], axis=1)
        jax.jit(K)(x, y).block_until_ready()
        jax.grad(lambda x: K(x, y).sum())(x).block_until_ready()
    assert sjax.keepers_alive() >= base + 11  # still held by JAX's compiled executables
    del K
    jax.clear_caches()
    gc.collect()
    assert sjax.keepers_alive() <= base


def test_complex_is_refused():
    """symred.jax has no complex LazyTensor: complex arrays and complex operands are refused."""
    with pytest.raises(TypeError, match="complex64 is not supported"):
        LazyTensor(jnp.ones((5, 1, 2), dtype=jnp.complex64))
    y = LazyTensor(jnp.ones((5, 1, 2), dtype=jnp.float32))
    with pytest.raises(TypeError, match="not supported by symred.jax"):
        y * 1j
    with pytest.raises(TypeError, match="not supported by symred.jax"):
        y.exp1j()


def solve_data(B=None, n=25, seed=3):
    rng = np.random.default_rng(seed)
    lead = () if B is None else (B,)
    return (jnp.asarray(rng.random(lead + (n, 3))), jnp.asarray(rng.normal(size=lead + (n, 2))),
            jnp.asarray([2.0]))


def dense_solve(x, b, g, alpha):
    K = dense_f(x, x, g)
    return jnp.linalg.solve(alpha * jnp.eye(x.shape[0]) + K, b)


SOLVE = ("Exp(-g * SqDist(x, y)) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)", "g = Pm(1)"])


def test_kernel_solve_matches_dense_under_jit_and_grad():
    """KernelSolve: (alpha I + K) a = b by conjugate gradients on the Genred, against
    jnp.linalg.solve; its gradient in b, x and g (implicit: further solves) against the dense
    solve's; LazyTensor.solve."""
    from symred.jax import KernelSolve
    x, b, g = solve_data()
    ks = KernelSolve(*SOLVE, "b", axis=1)

    def solve(x, b, g):
        return ks(x, x, b, g, alpha=0.5, eps=1e-13)

    want = dense_solve(x, b, g, 0.5)
    assert_close(solve(x, b, g), want, 1e-9)
    assert_close(jax.jit(solve)(x, b, g), want, 1e-9)
    loss = lambda fn: lambda x, b, g: (fn(x, b, g) ** 3).sum()  # noqa: E731
    got = jax.grad(loss(solve), argnums=(0, 1, 2))(x, b, g)
    ref = jax.grad(loss(lambda x, b, g: dense_solve(x, b, g, 0.5)), argnums=(0, 1, 2))(x, b, g)
    assert_close(got, ref, 1e-7)
    lt = (-Vi(x).sqdist(Vj(x)) * g[0]).exp()
    assert_close(lt.solve(b, alpha=0.5, eps=1e-13), want, 1e-9)


@pytest.mark.parametrize("in_axes", [(0, 0), (None, 0), (0, None)])
def test_kernel_solve_vmap_is_one_call_per_iteration(in_axes):
    """KernelSolve under jax.vmap (over the data, the right-hand side or both): each batch
    against its dense solve, and the lowered program has the custom calls and loops of the
    unbatched solve (every product runs all batches as one call; no loop over batches)."""
    from symred.jax import KernelSolve
    B = 3
    xs, bs, g = solve_data(B)
    x1, b1, _ = solve_data()
    args = [xs if in_axes[0] == 0 else x1, bs if in_axes[1] == 0 else b1]
    ks = KernelSolve(*SOLVE, "b", axis=1)

    def solve(x, b):
        return ks(x, x, b, g, alpha=0.5, eps=1e-13)

    got = jax.jit(jax.vmap(solve, in_axes))(*args)
    want = jax.vmap(lambda x, b: dense_solve(x, b, g, 0.5), in_axes)(*args)
    assert_close(got, want, 1e-9)
    batched = jax.jit(jax.vmap(solve, in_axes)).lower(*args).as_text()
    single = jax.jit(solve).lower(x1, b1).as_text()
    assert batched.count("custom_call") == single.count("custom_call") >= 1
    assert batched.count("while") == single.count("while")
    # the products take the B batches laid end to end (symred's batch dimensions)
    assert f"tensor<{B * 25}x3xf64>" in batched or in_axes[0] is None
