"""examples/gp_hyperparameters.py against a dense torch computation of the exact marginal
likelihood and its gradient (torch.linalg), at small n."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import symred  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))
import gp_hyperparameters as gp  # noqa: E402

gp.BACKEND = "CPU"  # the JIT: the reference interpreter would take seconds per test here


def exact_mll(X, y, raw):
    """L = -1/2 y' A^-1 y - 1/2 log det A - n/2 log 2 pi, A built densely."""
    ell, var, noise = gp.hyper(raw)
    K = var * torch.exp(-torch.cdist(X, X) ** 2 / (2 * ell**2))
    A = K + noise * torch.eye(X.shape[0], dtype=X.dtype)
    Lc = torch.linalg.cholesky(A)
    alpha = torch.cholesky_solve(y, Lc)
    return (-0.5 * (y * alpha).sum() - torch.log(torch.diagonal(Lc)).sum()
            - 0.5 * X.shape[0] * math.log(2 * math.pi))


def grads(X, y, raw, Z, rank=0):
    r = raw.clone().requires_grad_()
    S, _, _ = gp.surrogate(X, y, r, Z, tol=1e-10, maxiter=2000, rank=rank)
    est, = torch.autograd.grad(S, r)
    r = raw.clone().requires_grad_()
    exact, = torch.autograd.grad(exact_mll(X, y, r), r)
    return est, exact


RAW = torch.tensor([math.log(0.3), math.log(1.2), math.log(0.1)], dtype=torch.float64)


@pytest.mark.parametrize("rank", [0, 30], ids=["cg", "pcg"])
def test_surrogate_gradient_with_exact_trace_is_the_mll_gradient(rank):
    # Probes Z = sqrt(n) I (E[z z'] = I, as for Rademacher probes) make the trace estimate
    # exact: the surrogate's gradient (through
    # symred.torch's backward, with respect to the kernel's parameter) must then equal the
    # exact gradient of the marginal likelihood.
    X, y, _, _ = gp.make_data(120, 1, torch.float64, seed=3)
    est, exact = grads(X, y, RAW, math.sqrt(120) * torch.eye(120, dtype=torch.float64), rank)
    torch.testing.assert_close(est, exact, rtol=1e-7, atol=1e-8)


def test_hutchinson_gradient_is_close():
    X, y, _, _ = gp.make_data(300, 1, torch.float64, seed=4)
    gen = torch.Generator().manual_seed(0)
    est, exact = grads(X, y, RAW, gp.rademacher(300, 64, torch.float64, gen))
    # Only the trace term is stochastic; 64 probes put it within a few percent here.
    assert torch.allclose(est, exact, rtol=0.1, atol=0.05 * exact.abs().max()), (est, exact)


def test_training_increases_the_exact_likelihood():
    X, y, _, _ = gp.make_data(300, 1, torch.float64, seed=5)
    gen = torch.Generator().manual_seed(1)
    raw, _, _ = gp.train(X, y, iters=40, lr=0.2, probes=8, tol=1e-3, cg_iters=50, gen=gen,
                         rank=50, log=lambda *a: None)
    start = torch.tensor([math.log(gp.START[k]) for k in ("lengthscale", "variance", "noise")],
                         dtype=torch.float64)
    # Dense optimum by gradient ascent with the exact gradient (torch.linalg), as yardstick.
    best = start.clone().requires_grad_()
    opt = torch.optim.Adam([best], lr=0.05)
    for _ in range(300):
        opt.zero_grad()
        (-exact_mll(X, y, best)).backward()
        opt.step()
    with torch.no_grad():
        l0, l1, lbest = (float(exact_mll(X, y, r)) for r in (start, raw, best))
    # The learned hyperparameters recover the likelihood gained by the exact optimum (seen:
    # L from -223.49 to -17.70, optimum -17.67) and land near it (within 2% here).
    assert l1 - l0 > 0.99 * (lbest - l0), (l0, l1, lbest)
    assert torch.allclose(raw, best.detach(), atol=0.1), (raw.exp(), best.detach().exp())


def test_example_runs_at_small_n():
    env = dict(os.environ, SYMRED_LIB=symred.lib_path,
               PYTHONPATH=str(EXAMPLES.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if env.pop("SYMRED_PYTEST_DEVICE_SET", None):
        env.pop("SYMRED_DEVICE", None)  # the example runs on the default backend
    r = subprocess.run([sys.executable, str(EXAMPLES / "gp_hyperparameters.py"), "--n", "300",
                        "--ntest", "100"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "learned vs true" in r.stdout and "test RMSE" in r.stdout, r.stdout
