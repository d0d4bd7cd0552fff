#!/usr/bin/env python3
"""Time per exact-GP training iteration in GPyTorch: symred.gpytorch's kernel against
GPyTorch + pykeops (gpytorch.kernels.keops) and GPyTorch's dense kernel, in one process.

The model is what a new user writes: ExactGP, ConstantMean, ScaleKernel(RBFKernel), Gaussian
likelihood, Adam (lr 0.1), float32, GPyTorch's defaults (conjugate gradients above
max_cholesky_size = 800). One iteration = zero_grad, -mll forward, backward, step. Each
backend gets a fresh model with the same data and initial hyperparameters, one untimed
warm-up iteration (pykeops and symred compile their kernels there), then --iters timed ones;
the median is reported with the ratios. A backend that fails (pykeops without a working
compiler, dense out of memory) is reported with its error and skipped.

    SYMRED_LIB=build/libsymred.so PYTHONPATH=bindings/python \\
        /root/.cache/symred-venv/bin/python bench/gpytorch_iter.py            # n = 20 000
    ... bench/gpytorch_iter.py --n 5000 --iters 2 --backends symred,dense

Writes a JSON record (commit, CPU model, threads, load, date, command, figures) to
bench/results/gpytorch_iter-<UTC date>.json unless --json names another file.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import gpytorch

HERE = Path(__file__).resolve().parent


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def commit():
    try:
        return subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def base_kernel(backend, dim):
    if backend == "symred":
        import symred.gpytorch as sg
        return sg.RBFKernel(ard_num_dims=dim)
    if backend == "pykeops":
        import pykeops  # noqa: F401  (gpytorch's keops kernels fall back to dense without it)
        return gpytorch.kernels.keops.RBFKernel(ard_num_dims=dim)
    return gpytorch.kernels.RBFKernel(ard_num_dims=dim)


class GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, base):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(base)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x),
                                                         self.covar_module(x))


def time_backend(backend, x, y, iters, seed):
    model = GP(x, y, base_kernel(backend, x.shape[1]))
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    times, losses = [], []
    for it in range(iters + 1):
        torch.manual_seed(seed + it)  # the same probe vectors for every backend
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if it > 0:
            times.append(dt)
        print(f"  {backend:8s} iter {it}{' (warm-up)' if it == 0 else ''}: {dt:8.2f} s  "
              f"loss {loss.item():.5f}", flush=True)
    return {"median_s": statistics.median(times), "times_s": times,
            "losses": losses}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="training points (default 20000)")
    ap.add_argument("--dim", type=int, default=3, help="input dimension (default 3)")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations (default 3)")
    ap.add_argument("--backends", default="symred,pykeops,dense")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="the record's path (default bench/results/...)")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    x = torch.rand(args.n, args.dim)
    y = torch.sin(6 * x).sum(-1) + 0.1 * torch.randn(args.n)
    load_before = os.getloadavg()
    print(f"exact GP training iteration, n = {args.n}, d = {args.dim}, float32, "
          f"{cpu_model()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"gpytorch {gpytorch.__version__}, load {load_before[0]:.2f}", flush=True)
    results = {}
    for backend in args.backends.split(","):
        try:
            results[backend] = time_backend(backend, x, y, args.iters, args.seed)
        except Exception as e:  # noqa: BLE001 - any failure of a peer is reported, not fatal
            results[backend] = {"error": f"{type(e).__name__}: {e}"[:500]}
            print(f"  {backend}: failed: {results[backend]['error']}", flush=True)
    print("median time per iteration:")
    for backend, r in results.items():
        print(f"  {backend:8s} " + (f"{r['median_s']:8.2f} s" if "median_s" in r
                                    else "failed"))
    ratios = {}
    if "median_s" in results.get("symred", {}):
        for peer in ("pykeops", "dense"):
            if "median_s" in results.get(peer, {}):
                ratios[f"{peer}/symred"] = results[peer]["median_s"] / results["symred"]["median_s"]
                print(f"  {peer} / symred = {ratios[f'{peer}/symred']:.2f}")
    now = datetime.datetime.now(datetime.timezone.utc)
    record = {
        "benchmark": "gpytorch_iter", "date": now.isoformat(timespec="seconds"),
        "commit": commit(), "cpu": cpu_model(), "cpus": os.cpu_count(),
        "load_before": load_before, "load_after": os.getloadavg(),
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                                               "SYMRED_NUM_THREADS", "SYMRED_DEVICE")},
        "torch": torch.__version__, "gpytorch": gpytorch.__version__,
        "n": args.n, "dim": args.dim, "iters": args.iters, "results": results,
        "ratios": ratios,
    }
    path = Path(args.json) if args.json else (
        HERE / "results" / f"gpytorch_iter-{now.strftime('%Y%m%dT%H%M%SZ')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
