"""eXLA experiment 3: sparse GP regression (SGPR, Titsias' collapsed bound) with a growing number
M of inducing points under a memory limit; test RMSE, NLPD and time per L-BFGS iteration.

Systems (each run in its own process by bench/exla/run.py; details in docs/sgpr.md):
- ``symred``: the n-sized sums (K_uf K_fu, its derivative, K_uf y) from symred, in blocks of n
  sized from the budget ``limit_bytes`` (sr_kernel_eval_block) and symred reductions;
- ``dense``: the same bound, algebra and optimiser with K_uf and its derivative (M x n each)
  materialised in NumPy;
- ``gpflow``: GPflow's SGPR (TensorFlow), trained by gpflow.optimizers.Scipy (L-BFGS-B).

Every system runs under the same address-space limit, set in run() once the process is warm:
RLIMIT_AS = its virtual size then + an allowance for the M x M algebra that every system needs
(:func:`mm_allowance`) + ``limit_bytes``, so ``limit_bytes`` is what the n-sized terms may use
(GPflow gets TF_SLACK more: TensorFlow reserves address space it does not touch).
"""

import math
import os
import resource
import time

import common

SYSTEMS = ("symred", "dense", "gpflow")
N_TEST_FRACTION = 0.1


def configs(quick):
    """quick: n = 10 000, M up to 400, 10 iterations, a 16 MB budget (3 minutes with GPflow).
    Full: n = 200 000 (3droad has 434 874 points), M from 100 to 10 000, a 1 GB budget; 20
    L-BFGS iterations up to M = 1000, 10 at M = 2000, 5 at M = 5000 and 3 at M = 10 000 (one
    evaluation there is 6e13 flops of GEMM over n and 9e12 of M x M algebra: 7-13 minutes on
    the 2-core VM; docs/sgpr.md)."""
    if quick:
        n, Ms, budget, timeout = 10_000, (50, 100, 200, 400), 16 << 20, 120
        its = {M: 10 for M in Ms}
    else:
        n, Ms, budget, timeout = (200_000, (100, 200, 500, 1000, 2000, 5000, 10_000), 1 << 30,
                                  6 * 3600)
        its = {M: 20 if M <= 1000 else 10 if M <= 2000 else 5 if M <= 5000 else 3 for M in Ms}
    # rlimit_in_run: run() sets RLIMIT_AS itself (once warm), so a child killed by a signal
    # (TensorFlow aborts or segfaults when an allocation fails) is recorded as "oom".
    return [{"experiment": "sgpr", "system": s, "n": n, "M": M, "d": 3, "limit_bytes": budget,
             "n_test": int(n * N_TEST_FRACTION), "iterations": its[M], "timeout": timeout,
             "rlimit_in_run": True}
            for M in Ms for s in SYSTEMS]


def mm_allowance(M):
    """Bytes allowed for the M x M algebra, whatever the system: 10 float64 M x M matrices
    and 16 MB (sgpr_model.bound_and_grad keeps five at its peak, the predictions three; 40
    and 64 MB before the algebra was written in place, when it peaked at about 30)."""
    return 10 * M * M * 8 + (16 << 20)


def child_env(env):
    """The SGPR runs are M x M algebra and GEMMs over n (BLAS-bound, float64): every SGPR child
    (symred, dense, GPflow alike) loads the OpenBLAS of setup.sh (common.blas_env)."""
    return common.blas_env(env)


def _vm_size():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


# TensorFlow reserves address space well beyond what it touches (measured: its virtual size grew
# by 150 MB while GPflow trained with an 8 MB K_uf), so GPflow's limit has this much slack: the
# limit favours GPflow by up to this many bytes.
TF_SLACK = 512 << 20


def _limit_address_space(config, slack=0):
    """RLIMIT_AS = now + mm_allowance(M) + limit_bytes + slack. Returns the fields to record."""
    base = _vm_size()
    limit = base + mm_allowance(config["M"]) + int(config["limit_bytes"]) + slack
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return {"rlimit_as_bytes": limit, "base_vm_bytes": base,
            "mm_allowance_bytes": mm_allowance(config["M"]), "rlimit_slack_bytes": slack}


def _data(config):
    import sgpr_model as sm
    X, y, Xs, ys = sm.make_data(config["n"], config["n_test"])
    return sm, X, y, Xs, ys, sm.inducing_points(X, config["M"])


def _oom(e):
    text = str(e).lower()
    return any(w in text for w in ("allocate", "allocating", "out of memory", "bad_alloc",
                                   "resource_exhausted", "budget"))


def run(config):
    os.environ.setdefault("SYMRED_MEM_LIMIT", str(int(config["limit_bytes"])))
    sm, X, y, Xs, ys, Z = _data(config)
    out = {"rmse_floor": sm.NOISE_STD,
           "nlpd_floor": 0.5 * math.log(2 * math.pi * sm.NOISE_STD ** 2) + 0.5,
           "dense_need_bytes": 2 * config["n"] * config["M"] * 8}
    try:
        if config["system"] == "gpflow":
            out.update(_run_gpflow(config, sm, X, y, Xs, ys, Z))
        else:
            out.update(_run_bound(config, sm, X, y, Xs, ys, Z))
    except (RuntimeError, ValueError) as e:
        if _oom(e):
            text = str(e)
            raise MemoryError(text[max(0, text.find("can't allocate")):][:300]) from e
        raise
    return out


def _run_bound(config, sm, X, y, Xs, ys, Z):
    def terms(X_, y_, Z_):
        if config["system"] == "symred":
            return sm.SymredTerms(X_, y_, Z_, int(config["limit_bytes"]))
        return sm.DenseTerms(X_, y_, Z_)

    # Warm-up on a tiny problem (the JIT compile of symred's kernels, the BLAS thread pools),
    # so that the address-space limit starts from a process that is ready.
    sm.train(terms(X[:64], y[:64], Z[:8]), X[:64], y[:64], Xs[:16], ys[:16], 1)
    out = _limit_address_space(config)
    t = terms(X, y, Z)
    if config["system"] == "symred":
        out["block_columns"] = t.block
        out["block_bytes"] = sm.SymredTerms.bytes_needed(config["n"], config["M"],
                                                         int(config["limit_bytes"]))
    out.update(sm.train(t, X, y, Xs, ys, config["iterations"], log=True))
    out["blas"] = common.blas_loaded()
    out["blas_env"] = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OMP_NUM_THREADS")}
    return out


def _run_gpflow(config, sm, X, y, Xs, ys, Z):
    import gpflow
    import numpy as np
    import tensorflow as tf

    def model(X_, y_, Z_):
        m = gpflow.models.SGPR(
            (X_, y_[:, None]),
            gpflow.kernels.SquaredExponential(variance=sm.INIT["variance"],
                                              lengthscales=sm.INIT["lengthscale"]),
            inducing_variable=Z_.copy(), noise_variance=sm.INIT["noise_variance"])
        gpflow.set_trainable(m.inducing_variable, False)
        return m

    def fit(m, iterations):
        return gpflow.optimizers.Scipy().minimize(
            m.training_loss, m.trainable_variables, method="L-BFGS-B",
            options={"maxiter": iterations})

    fit(model(X[:64], y[:64], Z[:8]), 1)  # warm-up: TensorFlow's thread pools, tf.function
    out = _limit_address_space(config, TF_SLACK)
    m = model(X, y, Z)
    t0 = time.perf_counter()
    res = fit(m, config["iterations"])
    seconds = time.perf_counter() - t0
    mean, var = m.predict_y(Xs)
    mean, var = mean.numpy()[:, 0], var.numpy()[:, 0]
    rmse = float(np.sqrt(np.mean((mean - ys) ** 2)))
    nlpd = float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * (ys - mean) ** 2 / var))
    out.update({"seconds": seconds, "iterations": int(res.nit), "evaluations": int(res.nfev),
                "seconds_per_iter": seconds / max(int(res.nit), 1),
                "seconds_per_eval": seconds / max(int(res.nfev), 1), "rmse": rmse,
                "nlpd": nlpd, "bound": float(m.elbo()),
                "lengthscale": float(m.kernel.lengthscales.numpy()),
                "variance": float(m.kernel.variance.numpy()),
                "noise_variance": float(m.likelihood.variance.numpy()),
                "tensorflow": tf.__version__, "gpflow": gpflow.__version__})
    return out


COLORS = {"symred": "tab:blue", "dense": "tab:orange", "gpflow": "tab:green"}


def plot(records, path):
    """Three panels as in the eXLA paper's SGPR figure: test RMSE, test NLPD and seconds per
    L-BFGS iteration against M, one line per system and (n, budget); runs that failed (oom,
    timeout, error) are crosses on the lower edge, labelled with their status."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    groups = {}
    for r in records:
        groups.setdefault((r.get("system"), r.get("n"), r.get("limit_bytes")), []).append(r)
    fields = (("rmse", "test RMSE"), ("nlpd", "test NLPD"), ("seconds_per_iter", "s / iteration"))
    floors = {}
    for (system, n, limit), rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        rs = sorted(rs, key=lambda r: r.get("M") or 0)
        ok = [r for r in rs if r.get("status") == "ok"]
        bad = [r for r in rs if r.get("status") not in ("ok", "skipped")]
        if not ok and not bad:
            continue
        label = f"{system} (n={n}, budget {(limit or 0) / 2**20:.0f} MB)"
        color = COLORS.get(system)
        for ax, (f, name) in zip(axes, fields):
            xs = [r["M"] for r in ok if isinstance(r.get(f), (int, float))]
            ys_ = [r[f] for r in ok if isinstance(r.get(f), (int, float))]
            if xs:
                ax.plot(xs, ys_, "o-", color=color, label=label)
            for r in bad:
                ax.plot([r["M"]], [0], "x", color=color, markersize=10, clip_on=False,
                        transform=ax.get_xaxis_transform())
                ax.annotate(r["status"], (r["M"], 0.03), xycoords=("data", "axes fraction"),
                            color=color, fontsize=7, rotation=90)
        for r in ok:
            floors["rmse"], floors["nlpd"] = r.get("rmse_floor"), r.get("nlpd_floor")
    Ms = sorted({r["M"] for r in records if isinstance(r.get("M"), int)})
    for ax, (f, name) in zip(axes, fields):
        ax.set_xscale("log")
        if Ms:
            ax.set_xticks(Ms)
            ax.set_xticklabels([str(M) for M in Ms])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("inducing points M")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
        if floors.get(f) is not None:
            ax.axhline(floors[f], color="gray", ls="--", lw=1, label="noise floor")
    axes[2].set_yscale("log")
    skipped = sorted({f"{r.get('system')}: {str(r.get('reason', ''))[:60]}" for r in records
                      if r.get("status") == "skipped"})
    if skipped:
        fig.text(0.01, 0.01, "skipped: " + "; ".join(skipped), fontsize=7)
    axes[0].legend(fontsize=7)
    fig.suptitle("SGPR (collapsed bound, SE kernel, L-BFGS): synthetic 3-D data, "
                 "noise std 0.1; crosses: runs that failed (oom = over the memory limit)")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
