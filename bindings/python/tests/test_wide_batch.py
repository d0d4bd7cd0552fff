"""Wide outputs with leading batch dimensions: formulas of more than 64 values per pair that are
no fused two-product run in the CPU JIT's loop mode (docs/wide.md), batched as one launch with
block-diagonal ranges; against the reference backend and against a loop over the batches."""

import numpy as np
import pytest

from symred.numpy import Genred

ALIASES = ["x = Vi(3)", "y = Vj(3)", "u = Vi(W)", "v = Vj(W)", "p = Pm(1)"]


def aliases(W):
    return [a.replace("W", str(W)) for a in ALIASES]


@pytest.mark.parametrize("red,W,axis,dtype", [
    ("Sum", 65, 1, "float32"),
    ("LogSumExp", 100, 0, "float64"),
    ("Max_ArgMax", 255, 1, "float64"),
    ("KMin", 70, 0, "float32"),
])
def test_wide_batched_matches_reference_and_loop(red, W, axis, dtype):
    rng = np.random.default_rng(W)
    B, M, N = 3, 13, 29
    x, y = rng.random((B, M, 3)).astype(dtype), rng.random((B, N, 3)).astype(dtype)
    u, v = rng.random((B, M, W)).astype(dtype), rng.random((B, N, W)).astype(dtype)
    p = (rng.random((B, 1)) + 0.5).astype(dtype)
    g = Genred("Exp(-SqDist(x, y) * p) * v + Cos(u - v)", aliases(W), reduction_op=red, axis=axis,
               opt_arg=3 if red == "KMin" else None)
    ex, plan = g.explain(dtype=dtype, backend="CPU"), g.plan(dtype=dtype, backend="CPU")
    assert plan["backend"] == "cpu-jit" and plan["fallback"] is None, ex
    assert plan["loop_mode"], ex
    out = g(x, y, u, v, p, backend="CPU")
    ref = g(x, y, u, v, p, backend="reference")
    loop = [g(x[k], y[k], u[k], v[k], p[k], backend="CPU") for k in range(B)]
    tol = 1e-12 if dtype == "float64" else 3e-5
    if red == "Max_ArgMax":
        np.testing.assert_allclose(out[0], ref[0], rtol=tol)
        np.testing.assert_array_equal(out[1], ref[1])
        np.testing.assert_array_equal(out[1], np.stack([o[1] for o in loop]))
    else:
        np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(out, np.stack(loop), rtol=tol, atol=tol)
