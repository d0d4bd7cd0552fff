"""float16 and bfloat16 through the bindings: NumPy float16, bfloat16 through ml_dtypes (and
the error naming it when it is missing), torch.float16 and torch.bfloat16 with autograd,
LazyTensor, eval_block and batches. Each result is compared with the float32 computation on
the same (widened) values, within the dtype's tolerance of docs/semantics.md: float32's plus
two units in the last place of the output."""

import numpy as np
import pytest

import symred
from symred import Genred, LazyTensor
from symred import genred as _genred

ALIASES = ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)", "g = Pm(1)"]
F = "Exp(-g * SqDist(x, y)) * b"
# float32's tolerance (2e-4) plus two units in the last place of the dtype's output
RTOL = {"float16": 2e-4 + 2.0**-9, "bfloat16": 2e-4 + 2.0**-6}


def _data(dtype, nx=131, ny=257, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (nx, 3)).astype(dtype)
    y = rng.uniform(-1, 1, (ny, 3)).astype(dtype)
    b = rng.uniform(0, 1, (ny, 2)).astype(dtype)
    g = np.array([0.5], dtype=dtype)
    return x, y, b, g


def _close(got, want, name):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=RTOL[name], atol=RTOL[name] * np.abs(want).max())


def _np_dtypes():
    out = [pytest.param(np.float16, id="float16")]
    try:
        import ml_dtypes
    except ImportError:
        out.append(pytest.param(None, id="bfloat16",
                                marks=pytest.mark.skip(reason="ml_dtypes is not installed")))
    else:
        out.append(pytest.param(ml_dtypes.bfloat16, id="bfloat16"))
    return out


@pytest.mark.parametrize("dtype", _np_dtypes())
@pytest.mark.parametrize("backend", ["reference", "CPU"])
def test_numpy_sum_in_the_input_dtype(dtype, backend):
    name = np.dtype(dtype).name
    x, y, b, g = _data(dtype)
    gr = Genred(F, ALIASES, reduction_op="Sum", axis=1)
    out = gr(x, y, b, g, backend=backend)
    assert out.dtype == np.dtype(dtype) and out.shape == (131, 2)
    want = gr(*(a.astype(np.float32) for a in (x, y, b, g)), backend=backend)
    _close(out, want, name)
    # the dtype option, and arrays of another dtype refused
    gd = Genred(F, ALIASES, reduction_op="Sum", axis=1, dtype=name)
    assert gd(x, y, b, g, backend=backend).dtype == np.dtype(dtype)
    with pytest.raises(TypeError, match=name):
        gd(*(a.astype(np.float32) for a in (x, y, b, g)))


@pytest.mark.parametrize("dtype", _np_dtypes())
def test_numpy_argkmin_lazytensor_eval_block_and_batches(dtype):
    name = np.dtype(dtype).name
    x, y, b, g = _data(dtype, nx=40, ny=3001, seed=1)
    # ArgKMin: the neighbours of the widened values (more rows than float16 counts exactly)
    gk = Genred("SqDist(x, y)", ALIASES[:2], reduction_op="KMin_ArgKMin", axis=1, opt_arg=4)
    v, i = gk(x, y, backend="CPU")
    v32, i32 = gk(x.astype(np.float32), y.astype(np.float32), backend="CPU")
    assert v.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(i, i32)
    _close(v, v32, name)
    # LazyTensor: the reduction's result in the dtype
    X, Y = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
    lt = (-((X - Y) ** 2).sum(2)).exp().sum(1)
    assert lt.dtype == np.dtype(dtype)
    X32, Y32 = LazyTensor(x.astype(np.float32)[:, None, :]), LazyTensor(y.astype(np.float32)[None])
    _close(lt, (-((X32 - Y32) ** 2).sum(2)).exp().sum(1), name)
    # eval_block: F's values rounded to the dtype
    gs = Genred(F, ALIASES, reduction_op="Sum", axis=1)
    blk = gs.eval_block(x, y, b, g, rows=(3, 10), cols=(100, 50))
    assert blk.dtype == np.dtype(dtype) and blk.shape == (10, 50, 2)
    _close(blk, gs.eval_block(*(a.astype(np.float32) for a in (x, y, b, g)), rows=(3, 10),
                              cols=(100, 50)), name)
    # leading batch dimensions
    xb, yb = np.stack([x, x[::-1]]), np.stack([y[:500], y[500:1000]])
    bb = np.stack([b[:500], b[500:1000]])
    out = gs(xb, yb, bb, g)
    assert out.dtype == np.dtype(dtype) and out.shape == (2, 40, 2)
    _close(out, gs(*(a.astype(np.float32) for a in (xb, yb, bb, g))), name)


def test_bfloat16_without_ml_dtypes_names_it(monkeypatch):
    monkeypatch.setattr(_genred, "_ml_dtypes", None)
    with pytest.raises(TypeError, match="ml_dtypes"):
        Genred(F, ALIASES, reduction_op="Sum", axis=1, dtype="bfloat16")


def test_unsupported_dtype_lists_the_supported_ones():
    x = np.zeros((3, 3), dtype=np.int32)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        Genred("SqDist(x, y)", ALIASES[:2], reduction_op="Sum", axis=1)(x, x)


# ---- torch ---------------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch", reason="torch is not installed")


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("red", ["Sum", "Min", "LogSumExp"])
def test_torch_forward_and_autograd_in_the_input_dtype(name, red):
    torch = _torch()
    import symred.torch as st

    dt = getattr(torch, name)
    gen = torch.Generator().manual_seed(3)
    # 3001 reduced rows: more than float16 (2048) or bfloat16 (256) count exactly, so the
    # selected indices of Min's gradient must not go through the dtype
    x = torch.rand(60, 3, generator=gen).to(dt).requires_grad_()
    y = torch.rand(3001, 3, generator=gen).to(dt).requires_grad_()
    formula = "SqDist(x, y)" if red == "Min" else "-SqDist(x, y)"
    gr = st.Genred(formula, ALIASES[:2], reduction_op=red, axis=1)
    out = gr(x, y, backend="CPU")
    assert out.dtype == dt
    x32 = x.detach().float().requires_grad_()
    y32 = y.detach().float().requires_grad_()
    out32 = gr(x32, y32, backend="CPU")
    _close(out.detach().float().numpy(), out32.detach().numpy(), name)
    w = torch.rand(out.shape, generator=gen)
    (out.float() * w).sum().backward()
    (out32 * w).sum().backward()
    assert x.grad.dtype == dt and y.grad.dtype == dt
    for got, want in ((x.grad, x32.grad), (y.grad, y32.grad)):
        want = want.numpy()
        # the gradient kernel's sums of the dtype's inputs: the same tolerance, relative to
        # the largest component (components cancel)
        np.testing.assert_allclose(got.float().numpy(), want, rtol=RTOL[name],
                                   atol=4 * RTOL[name] * np.abs(want).max())


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_torch_lazytensor(name):
    torch = _torch()
    from symred.torch import LazyTensor as TL

    dt = getattr(torch, name)
    x = torch.rand(50, 3).to(dt)
    y = torch.rand(400, 3).to(dt)
    r = (-((TL(x[:, None, :]) - TL(y[None, :, :])) ** 2).sum(2)).exp().sum(1)
    assert r.dtype == dt
    r32 = (-((TL(x.float()[:, None, :]) - TL(y.float()[None, :, :])) ** 2).sum(2)).exp().sum(1)
    _close(r.float().numpy(), r32.numpy(), name)


def test_symred_has_the_dtype_codes():
    assert (symred._lib.SR_F16, symred._lib.SR_BF16) == (2, 3)
