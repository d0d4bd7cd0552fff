"""The SGPR experiment of bench/exla (exp_sgpr.py, sgpr_model.py) and the eval_block binding it
uses: symred's blockwise bound, gradient and predictions against dense torch ones (float64)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import symred  # noqa: E402
import symred.torch as srt  # noqa: E402

BENCH = Path(__file__).resolve().parents[3] / "bench" / "exla"
sys.path.insert(0, str(BENCH))
import exp_sgpr  # noqa: E402
import sgpr_model as sm  # noqa: E402

ALIASES = ["z=Vi(3)", "x=Vj(3)", "g=Pm(1)"]


def gauss(z, x, g):
    return np.exp(-g * ((z[:, None, :] - x[None, :, :]) ** 2).sum(-1))


# ---- the eval_block binding ---------------------------------------------------------------------


def test_eval_block_values_and_out():
    rng = np.random.default_rng(0)
    z, x, g = rng.random((7, 3)), rng.random((11, 3)), np.array([2.5])
    f = symred.Genred("Exp(-g*SqDist(z,x))", ALIASES, axis=1)
    full = gauss(z, x, g[0])
    blk = f.eval_block(z, x, g, rows=(2, 4), cols=(3, 5))
    assert blk.shape == (4, 5) and blk.dtype == np.float64
    np.testing.assert_allclose(blk, full[2:6, 3:8], rtol=1e-14)
    out = np.full((7, 11), np.nan)
    assert f.eval_block(z, x, g, rows=(0, 7), cols=(0, 11), out=out) is out
    np.testing.assert_allclose(out, full, rtol=1e-14)


def test_eval_block_vector_formula_and_torch():
    rng = np.random.default_rng(1)
    z, x = rng.random((5, 3)), rng.random((6, 3))
    f = symred.Genred("z-x", ["z=Vi(3)", "x=Vj(3)"], axis=1)
    np.testing.assert_allclose(f.eval_block(z, x, rows=(1, 3), cols=(2, 4)),
                               (z[:, None] - x[None])[1:4, 2:6], rtol=1e-15)
    ft = srt.Genred("Exp(-g*SqDist(z,x))", ALIASES, axis=1)
    zt, xt = torch.from_numpy(z), torch.from_numpy(x)
    out = torch.empty(5, 6, dtype=torch.float64)
    ft.eval_block(zt, xt, torch.tensor([1.5], dtype=torch.float64), rows=(0, 5), cols=(0, 6),
                  out=out)
    np.testing.assert_allclose(out.numpy(), gauss(z, x, 1.5), rtol=1e-14)


def test_eval_block_errors():
    rng = np.random.default_rng(2)
    z, x, g = rng.random((4, 3)), rng.random((5, 3)), np.array([1.0])
    f = symred.Genred("Exp(-g*SqDist(z,x))", ALIASES, axis=1)
    with pytest.raises(ValueError, match="not inside"):
        f.eval_block(z, x, g, rows=(2, 3), cols=(0, 5))
    with pytest.raises(ValueError, match="out must be"):
        f.eval_block(z, x, g, rows=(0, 4), cols=(0, 5), out=np.empty((4, 5), np.float32))
    with pytest.raises(ValueError, match="Sum Genred"):
        symred.Genred("SqDist(z,x)", ["z=Vi(3)", "x=Vj(3)"], "Min", axis=1).eval_block(
            z, x, rows=(0, 1), cols=(0, 1))


# ---- the SGPR model -----------------------------------------------------------------------------


def problem(n=700, M=30, n_test=50):
    X, y, Xs, ys = sm.make_data(n, n_test, seed=3)
    return X, y, Xs, ys, sm.inducing_points(X, M)


def reference(X, y, Z, theta):
    """GPflow's form of the bound (sm.collapsed_bound) on a dense K_uf, torch autograd through
    everything: the bound and its gradient with respect to the log-parameters theta."""
    th = torch.tensor(list(theta), dtype=torch.float64, requires_grad=True)
    l, v, s = torch.exp(th)
    g = 0.5 / (l * l)
    Xt, yt, Zt = map(torch.from_numpy, (X, y, Z))
    Kuf = v * torch.exp(-g * sm.sqdist(Zt, Xt))
    n = X.shape[0]
    b = sm.collapsed_bound(Kuf @ Kuf.T, Kuf @ yt, float(yt @ yt), n, n * v, sm.kuu(Zt, g, v), s)
    b.backward()
    return float(b), th.grad.numpy()


THETA = [math.log(0.25), math.log(0.8), math.log(0.05)]


def symred_terms(X, y, Z, columns):
    """SymredTerms whose budget holds `columns` columns of n per block."""
    return sm.SymredTerms(X, y, Z, budget=2 * Z.shape[0] * 8 * columns)


def test_symred_bound_and_gradient_equal_reference():
    X, y, Xs, ys, Z = problem()
    s = symred_terms(X, y, Z, 160)  # 700 = 4 x 160 + a partial block of 60
    assert s.block == 160
    # Every block, the partial one too, lives in the two budgeted buffers.
    widths = []
    for E, D in s.blocks(2.0, derivative=True):
        assert E.ctypes.data == s._bufs[0].ctypes.data
        assert D.ctypes.data == s._bufs[1].ctypes.data
        widths.append(E.shape[1])
    assert widths == [160] * 4 + [60]
    bref, gref = reference(X, y, Z, THETA)
    for t in (s, sm.DenseTerms(X, y, Z)):
        b, grad = sm.evaluate(t, THETA)
        assert abs(b - bref) <= 1e-8 * abs(bref), (t.name, b, bref)
        assert np.allclose(grad, gref, rtol=1e-7, atol=0), (t.name, grad, gref)


def test_gradient_where_k_uu_is_ill_conditioned():
    # Many inducing points close together: K_uu's condition number nears 1 / jitter. The
    # whitened algebra must still match autograd through GPflow's form and central
    # differences.
    X, y, Xs, ys, Z = problem(n=3000, M=400)
    theta = [math.log(0.3), 0.0, math.log(0.1)]
    g, v, _ = sm.unpack(theta)
    K = sm.kernel_np(Z, g) * v + sm.JITTER * np.eye(400)
    assert np.linalg.cond(K) > 1e7
    t = symred_terms(X, y, Z, 1000)
    b, grad = sm.evaluate(t, theta)
    bref, gref = reference(X, y, Z, theta)
    assert abs(b - bref) <= 1e-7 * abs(bref), (b, bref)  # both lose digits to the condition
    assert np.allclose(grad, gref, rtol=1e-5, atol=0), (grad, gref)
    # The bound carries ~1e-8 relative rounding noise here (the condition amplifies it), which
    # a difference quotient divides by 2h: at h = 1e-4 that is ~2e-4 of the gradient, the
    # tolerance itself (it failed once the JIT stopped contracting into FMAs, another rounding);
    # at h = 1e-3, 2e-5, with a truncation error of 1e-7.
    assert_central_differences(t, theta, grad, h=1e-3, rtol=1e-4)


def assert_central_differences(terms, theta, grad, h, rtol):
    """grad against central differences of the bound, one log-parameter at a time."""
    for k in range(3):
        e = np.zeros(3)
        e[k] = h
        fd = (sm.evaluate(terms, np.add(theta, e), grad=False)[0]
              - sm.evaluate(terms, np.subtract(theta, e), grad=False)[0]) / (2 * h)
        assert abs(fd - grad[k]) <= rtol * max(1.0, abs(fd)), (k, fd, grad[k])


def test_symred_gradient_matches_finite_differences():
    X, y, Xs, ys, Z = problem(n=400, M=20)
    s = symred_terms(X, y, Z, 96)
    _, grad = sm.evaluate(s, THETA)
    assert_central_differences(s, THETA, grad, h=1e-5, rtol=1e-5)


def test_predictions_equal_dense():
    X, y, Xs, ys, Z = problem()
    g, v, s2 = sm.unpack(THETA)
    n = X.shape[0]
    out = []
    for t in (symred_terms(X, y, Z, 16), sm.DenseTerms(X, y, Z)):  # 50 test points: 4 blocks
        F, f = sm.bound_and_grad(t(g, grad=False), Z, g, v, s2, n, float(y @ y), grad=False)
        out.append(sm.predict(t, Xs, v, s2, f, g))
    (ms, vs), (md, vd) = out
    assert np.allclose(ms, md, rtol=1e-9, atol=1e-12)
    assert np.allclose(vs, vd, rtol=1e-9, atol=1e-12)
    # The dense predictive mean and variance written out (GPflow's SGPR.predict_y).
    Kuf = v * gauss(Z, X, g)
    Ksu = v * gauss(Xs, Z, g)
    K = v * gauss(Z, Z, g) + sm.JITTER * np.eye(Z.shape[0])
    S = s2 * K + Kuf @ Kuf.T
    mean = Ksu @ np.linalg.solve(S, Kuf @ y)
    var = (v - np.einsum("ij,ji->i", Ksu, np.linalg.solve(K, Ksu.T))
           + s2 * np.einsum("ij,ji->i", Ksu, np.linalg.solve(S, Ksu.T)) + s2)
    assert np.allclose(ms, mean, rtol=1e-8, atol=1e-10)
    assert np.allclose(vs, var, rtol=1e-6, atol=1e-8)


def test_training_improves_and_systems_agree():
    X, y, Xs, ys, Z = problem(n=600, M=40, n_test=200)
    rs = sm.train(symred_terms(X, y, Z, 250), X, y, Xs, ys, 4)
    rd = sm.train(sm.DenseTerms(X, y, Z), X, y, Xs, ys, 4)
    assert rs["iterations"] == rd["iterations"] == 4
    for k in ("bound", "rmse", "nlpd", "lengthscale", "noise_variance"):
        assert rs[k] == pytest.approx(rd[k], rel=1e-6), k
    init = [math.log(sm.INIT[k]) for k in ("lengthscale", "variance", "noise_variance")]
    b0, _ = sm.evaluate(symred_terms(X, y, Z, 250), init, grad=False)
    assert rs["bound"] > b0 + 10, (b0, rs["bound"])


# ---- the experiment module ----------------------------------------------------------------------


def test_configs():
    for quick in (True, False):
        cs = exp_sgpr.configs(quick)
        assert {c["system"] for c in cs} == set(exp_sgpr.SYSTEMS)
        for c in cs:
            assert c["experiment"] == "sgpr" and c["d"] == 3 and c["limit_bytes"] > 0
    assert max(c["M"] for c in exp_sgpr.configs(False)) == 10_000
    assert all(c["iterations"] >= 3 for c in exp_sgpr.configs(False))


def test_child_env_gives_the_sgpr_runs_openblas(monkeypatch, tmp_path):
    monkeypatch.setattr(exp_sgpr.common, "OPENBLAS", str(tmp_path))
    env = exp_sgpr.child_env({"LD_LIBRARY_PATH": "/x"})
    assert env["LD_LIBRARY_PATH"].split(os.pathsep) == [str(tmp_path), "/x"]
    assert int(env["OMP_NUM_THREADS"]) >= 1
    monkeypatch.setattr(exp_sgpr.common, "OPENBLAS", str(tmp_path / "absent"))
    env = exp_sgpr.child_env({"OMP_NUM_THREADS": "1"})
    assert "LD_LIBRARY_PATH" not in env and env["OMP_NUM_THREADS"] == "1"


def run_child(config):
    """exp_sgpr.run in a process of its own (it sets RLIMIT_AS), with the interpreter that
    bench/exla/run.py gives its children (common.child_python, not this test's: a PyPI NumPy's
    OpenBLAS allocates its buffers after the limit is set and gives up)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import exp_sgpr\n"
            "try:\n    r = exp_sgpr.run(json.loads(sys.argv[2]))\n"
            "except MemoryError as e:\n    r = {'status': 'oom', 'reason': str(e)}\n"
            "print(json.dumps(r))")
    p = subprocess.run([exp_sgpr.common.child_python(), "-c", code, str(BENCH),
                        json.dumps(config)],
                       capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_run_under_the_limit_symred_fits_dense_does_not():
    # The dense E and D of n = 20 000, M = 400 need 2 x 64 MB; the limit leaves 4 MB for them.
    cfg = {"experiment": "sgpr", "n": 20_000, "M": 400, "d": 3, "limit_bytes": 4 << 20,
           "n_test": 100, "iterations": 1}
    dense = run_child(dict(cfg, system="dense"))
    assert dense.get("status") == "oom", dense
    small = dict(cfg, n=2_000)  # symred at the same M and budget, smaller n to stay fast
    r = run_child(dict(small, system="symred"))
    assert r.get("status", "ok") == "ok", r
    assert r["block_bytes"] <= 4 << 20 and r["iterations"] == 1 and r["rmse"] < 1.0


def test_run_predictions_stay_in_the_budget():
    # 256 MB of blocks (b = 167 772 columns at M = 100) and 30 000 test points: predictions
    # that solve in a new M x 30 000 array (24 MB) beside the full buffers go past the limit's
    # 16 MB + 10 M^2 doubles of slack (a first version of the in-place algebra copied its
    # blocks and failed at M = 500 and 1000 under the 1 GB budget).
    cfg = {"experiment": "sgpr", "system": "symred", "n": 170_000, "M": 100, "d": 3,
           "limit_bytes": 256 << 20, "n_test": 30_000, "iterations": 1}
    r = run_child(cfg)
    assert r.get("status", "ok") == "ok", r
    assert r["block_columns"] == (256 << 20) // (2 * 100 * 8) and r["rmse"] < 1.0


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    recs = []
    for s in exp_sgpr.SYSTEMS:
        for M in (50, 100):
            recs.append({"experiment": "sgpr", "system": s, "n": 1000, "M": M,
                         "limit_bytes": 1 << 20, "status": "ok", "rmse": 0.2 - M / 1e3,
                         "nlpd": 0.1, "seconds_per_iter": 0.01 * M, "rmse_floor": 0.1,
                         "nlpd_floor": -0.88})
    recs.append(dict(recs[-1], M=200, status="oom"))
    recs.append({"experiment": "sgpr", "system": "gpflow", "status": "skipped", "M": 400,
                 "reason": "cannot import a peer: No module named 'gpflow'"})
    path = tmp_path / "sgpr.png"
    exp_sgpr.plot(recs, str(path))
    assert path.stat().st_size > 10_000
