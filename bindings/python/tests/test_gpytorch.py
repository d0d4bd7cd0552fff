"""symred.gpytorch: exact GP regression trained with each kernel (RBF, Matern 1/2, 3/2, 5/2,
periodic; ARD) against the same model on GPyTorch's dense kernels: the marginal log
likelihood and its gradient with respect to every hyperparameter at each training step, and
the predictive mean and variance, to 1e-4 of each quantity's scale in float64. Both models run GPyTorch's
conjugate-gradient path (max_cholesky_size 0) with the same random probe vectors, so they
do the same arithmetic on kernel products that come from symred in one model and from dense
torch in the other; the symred products are counted. Also: kernel-matrix products with batch
shapes, and `import symred` without gpytorch. Needs gpytorch (the CI venv has it)."""

import contextlib
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
gpytorch = pytest.importorskip("gpytorch", reason="gpytorch is not installed")

import symred  # noqa: E402
import symred.gpytorch as sg  # noqa: E402

DT = torch.float64
N, NTEST, D = 150, 20, 2

KERNELS = {
    "rbf": (sg.RBFKernel, gpytorch.kernels.RBFKernel, {}),
    "matern05": (sg.MaternKernel, gpytorch.kernels.MaternKernel, {"nu": 0.5}),
    "matern15": (sg.MaternKernel, gpytorch.kernels.MaternKernel, {"nu": 1.5}),
    "matern25": (sg.MaternKernel, gpytorch.kernels.MaternKernel, {"nu": 2.5}),
    "periodic": (sg.PeriodicKernel, gpytorch.kernels.PeriodicKernel, {}),
}


@pytest.fixture
def products(monkeypatch):
    """Counts the kernel-matrix products that symred computes."""
    count = [0]
    real = sg._SymbolicKernelMatrix.__matmul__

    def counting(self, rhs):
        count[0] += 1
        return real(self, rhs)

    monkeypatch.setattr(sg._SymbolicKernelMatrix, "__matmul__", counting)
    return count


def data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(N, D, dtype=DT, generator=gen) * 4
    y = torch.sin(2 * x[:, 0]) * torch.cos(x[:, 1]) + 0.1 * torch.randn(N, dtype=DT, generator=gen)
    xt = torch.rand(NTEST, D, dtype=DT, generator=gen) * 4
    return x, y, xt


class GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, base):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(base)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                         self.covar_module(x))


def models(name):
    S, G, kw = KERNELS[name]
    x, y, xt = data()
    ms = GP(x, y, S(ard_num_dims=D, **kw)).to(DT)
    md = GP(x, y, G(ard_num_dims=D, **kw)).to(DT)
    assert ms.state_dict().keys() == md.state_dict().keys()  # a drop-in: the same parameters
    md.load_state_dict(ms.state_dict())
    return ms, md, xt


def converged_cg():
    """CG run to a residual of 1e-4 in training (GPyTorch's default stops at 1) and 1e-7 in
    prediction, so that the two models' results agree to about that, whichever iteration
    each CG stops at."""
    stack = contextlib.ExitStack()
    for setting in (gpytorch.settings.cg_tolerance(1e-4), gpytorch.settings.eval_cg_tolerance(1e-7),
                    gpytorch.settings.max_cg_iterations(400)):
        stack.enter_context(setting)
    return stack


def close(a, b, rtol=1e-4):
    torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * float(b.abs().max()))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_exact_gp_training_and_prediction(name, products):
    ms, md, xt = models(name)
    opts = [torch.optim.Adam(m.parameters(), lr=0.1) for m in (ms, md)]
    with gpytorch.settings.max_cholesky_size(0), converged_cg():
        for step in range(2):
            losses, grads = [], []
            for m, opt in zip((ms, md), opts):
                m.train()
                opt.zero_grad()
                torch.manual_seed(step)  # the same probe vectors for both models
                mll = gpytorch.mlls.ExactMarginalLogLikelihood(m.likelihood, m)
                loss = -mll(m(*m.train_inputs), m.train_targets)
                loss.backward()
                losses.append(loss.detach())
                grads.append({k: p.grad.clone() for k, p in m.named_parameters()})
                opt.step()
            close(losses[0], losses[1])
            # One gradient vector: a small component (the constant mean's) is a difference of
            # large terms, so its error is relative to the vector's scale, as CG's residual.
            close(*[torch.cat([g[k].flatten() for k in sorted(g)]) for g in grads])
        used = products[0]
        assert used > 0  # the symred model's kernel products came from symred
        preds = []
        for m in (ms, md):
            m.eval()
            torch.manual_seed(10)
            with torch.no_grad():
                p = m.likelihood(m(xt))
                preds.append((p.mean, p.variance))
        assert products[0] > used  # and so did its predictions
    close(preds[0][0], preds[1][0])
    close(preds[0][1], preds[1][1])


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_batched_kernel_products_and_gradients(name, products):
    S, G, kw = KERNELS[name]
    batch = torch.Size([2])
    ks = S(ard_num_dims=3, batch_shape=batch, **kw).to(DT)
    kd = G(ard_num_dims=3, batch_shape=batch, **kw).to(DT)
    with torch.no_grad():  # different hyperparameters in each batch
        for p in ks.parameters():
            p.add_(torch.rand(p.shape, dtype=DT, generator=torch.Generator().manual_seed(1)))
    kd.load_state_dict(ks.state_dict())
    gen = torch.Generator().manual_seed(2)
    x1 = torch.randn(2, 40, 3, dtype=DT, generator=gen)
    x2 = torch.randn(2, 30, 3, dtype=DT, generator=gen)
    v = torch.randn(2, 30, 4, dtype=DT, generator=gen)
    with gpytorch.settings.max_cholesky_size(0):
        out = ks(x1, x2) @ v
        want = kd(x1, x2).to_dense() @ v
        assert products[0] == 1
        close(out, want, 1e-10)
        out.square().sum().backward()
        want.square().sum().backward()
        for p, q in zip(ks.parameters(), kd.parameters()):
            close(p.grad, q.grad, 1e-10)
        close(ks(x1, x1, diag=True), kd(x1, x1, diag=True), 1e-9)


def close_to_autograd(op, grads, ks, kd, x, x2, left, right):
    """The bilinear derivative grads of operator op = ks(x, x2), as the gradient of the raw
    lengthscale, against autograd through GPyTorch's dense kernel kd: the gradient of
    sum_ij <L_i, R_j> K_ij."""
    args = [a for a in op.representation() if a.requires_grad]
    got = torch.autograd.grad(args, ks.raw_lengthscale,
                              [g if g is not None else torch.zeros_like(a)
                               for a, g in zip(args, grads)])[0]
    loss = (left * (kd(x, x2).to_dense() @ right)).sum()
    want = torch.autograd.grad(loss, kd.raw_lengthscale)[0]
    close(got, want, 1e-6)  # GPyTorch's dense distances: |x|^2 + |y|^2 - 2 <x, y>


@pytest.mark.parametrize("name", ["rbf", "matern05", "matern25", "periodic"])
@pytest.mark.parametrize("symmetric", [True, False])
def test_bilinear_derivative(name, symmetric, products):
    # The gradient of sum_ij <L_i, R_j> K_ij that the marginal likelihood's backward asks for:
    # for K(x, x) one symred gradient reduction and no product K R (periodic, whose
    # lengthscale is an argument of its own, and K(x, x') take GPyTorch's way), against
    # autograd through GPyTorch's dense kernel, as the gradient of the raw lengthscale.
    S, G, kw = KERNELS[name]
    ks, kd = S(ard_num_dims=D, **kw).to(DT), G(ard_num_dims=D, **kw).to(DT)
    kd.load_state_dict(ks.state_dict())
    x = data()[0]
    x2 = x if symmetric else x.clone()
    gen = torch.Generator().manual_seed(3)
    left, right = (torch.randn(N, 3, dtype=DT, generator=gen) for _ in range(2))
    with gpytorch.settings.max_cholesky_size(0):
        op = ks(x, x2).evaluate_kernel()
        grads = op._bilinear_derivative(left, right)
    close_to_autograd(op, grads, ks, kd, x, x2, left, right)
    fast = symmetric and name != "periodic"
    assert (grads[1] is None) == fast
    assert (products[0] == 0) == fast


@pytest.mark.parametrize("name", ["rbf", "matern15", "matern25"])
def test_symmetric_products_and_derivative(name, products):
    # K(x, x) with more rows than one tile of the CPU JIT's symmetric driver (256): the product
    # and the reduction of the bilinear derivative plan it (explain) and match the reference
    # interpreter when run on the CPU JIT; through GPyTorch (on the suite's device), the
    # product and the derivative match GPyTorch's dense kernel.
    S, G, kw = KERNELS[name]
    ks, kd = S(ard_num_dims=D, **kw).to(DT), G(ard_num_dims=D, **kw).to(DT)
    kd.load_state_dict(ks.state_dict())
    gen = torch.Generator().manual_seed(5)
    n = 601
    x = torch.rand(n, D, dtype=DT, generator=gen) * 4
    v = torch.randn(n, 11, dtype=DT, generator=gen)  # CG's width: y and 10 probe vectors
    left, right = (torch.randn(n, 3, dtype=DT, generator=gen) for _ in range(2))
    kind = "rbf" if name == "rbf" else ("matern", kw["nu"])
    c = torch.cat([torch.ones(n, 1, dtype=DT), x, torch.zeros(n, 1, dtype=DT)], -1)
    for g, args in ((sg._genred(kind, D, 11), (x, x, v)),
                    (sg._genred_radial(kind, D, 3), (x, x, left, right, left, right, c))):
        plan = g.plan(dtype="float64", backend="CPU")
        assert plan["inner"] == "symmetric fused two-product", plan
        close(g(*args, backend="CPU"), g(*args, backend="reference"), 1e-10)
    with gpytorch.settings.max_cholesky_size(0):
        op = ks(x, x).evaluate_kernel()
        close(op @ v, kd(x, x).to_dense() @ v, 1e-10)
        grads = op._bilinear_derivative(left, right)
    assert products[0] == 1
    close_to_autograd(op, grads, ks, kd, x, x, left, right)


def test_small_blocks_stay_dense(products):
    # Below max_cholesky_size (GPyTorch's default 800) the matrix is dense, as with KeOps.
    k = sg.RBFKernel()
    x = torch.randn(50, 2)
    k(x, x).to_dense()
    assert products[0] == 0


def test_matern_nu_checked():
    with pytest.raises(RuntimeError, match="nu expected"):
        sg.MaternKernel(nu=2.0)


def test_import_symred_needs_no_gpytorch():
    code = ("import sys; sys.modules['gpytorch'] = None; import symred, symred.torch; "
            "assert 'gpytorch' not in [m for m in sys.modules if sys.modules[m]]\n"
            "try:\n import symred.gpytorch\nexcept ImportError as e:\n print(e)")
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(symred.__file__)))
    env = dict(os.environ, SYMRED_LIB=symred.lib_path,
               PYTHONPATH=pkg_root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert "needs GPyTorch" in out.stdout


def test_example_trains_with_symred():
    # n = 1000 > max_cholesky_size: GPyTorch runs CG on symred's products.
    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
    env = dict(os.environ, SYMRED_LIB=symred.lib_path,
               PYTHONPATH=os.path.join(examples, "..") + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    if env.pop("SYMRED_PYTEST_DEVICE_SET", None):
        env.pop("SYMRED_DEVICE", None)  # the examples run on the default backend
    r = subprocess.run([sys.executable, os.path.join(examples, "gpytorch_exact.py"), "--n",
                        "1000", "--ntest", "50", "--iters", "3", "--kernel", "matern"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RMSE" in r.stdout and "iter   3" in r.stdout, r.stdout
