"""mem: the squared-exponential kernel mat-vec K(x, x) @ v under a memory limit (eXLA, Fig. 3).

x and v of shape (n, 1), float64, K_ij = exp(-(x_i - x_j)^2 / 2) (unit lengthscale and
variance, as GPflow's SquaredExponential() in the paper's exp_mem.py). Every system runs under
RLIMIT_AS = LIMIT + common.RLIMIT_ALLOWANCE; symred also under its own workspace budget
(SYMRED_MEM_LIMIT = BUDGET, recorded as budget_bytes). Systems:

- symred: Genred "Exp(-SqDist(x,y)*g)*b", Sum over j; the kernel is compiled on a tiny input
  first (compile_seconds), then the full mat-vec is timed.
- numpy: the dense matrix in one n x n buffer (in-place operations), then K @ v.
- jax: jax.jit of exp(-0.5 (x - x^T)^2) @ v on the CPU, float64 (jax_enable_x64); the XLA
  compile is timed separately (compile_seconds).
- jax_symred: JAX + symred, a jax.jit-compiled program whose mat-vec is symred.jax's Genred
  (one XLA custom call running the symred kernel on XLA's buffers), float64, under the same
  RLIMIT_AS and the same workspace budget as symred; the XLA compile is compile_seconds.
- pykeops: pykeops.numpy.Genred with the same formula on the CPU (its build folder under
  $EXLA_OUT/keops-build); first call on a tiny input = compile_seconds.

Each run also checks 16 rows against a float64 NumPy evaluation (max_rel_err).
EXLA_MEM_SIZES (comma-separated n) replaces the grid, EXLA_MEM_SYSTEMS the systems (tests).
"""

import os

LIMIT = 10**9  # bytes of RLIMIT_AS beyond the allowance, every system
BUDGET = 10**8  # symred's workspace budget (SYMRED_MEM_LIMIT)
SYSTEMS = ("symred", "numpy", "jax", "jax_symred", "pykeops")
FULL = (1000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000)
QUICK = (1000, 10_000, 30_000, 100_000)
SEED = 0


def configs(quick):
    sizes = QUICK if quick else FULL
    if os.environ.get("EXLA_MEM_SIZES"):
        sizes = [int(float(s)) for s in os.environ["EXLA_MEM_SIZES"].split(",")]
    systems = SYSTEMS
    if os.environ.get("EXLA_MEM_SYSTEMS"):
        systems = [s.strip() for s in os.environ["EXLA_MEM_SYSTEMS"].split(",")]
    out = []
    for n in sizes:
        for system in systems:
            c = {"experiment": "mem", "system": system, "n": n, "d": 1, "dtype": "float64",
                 "limit_bytes": LIMIT, "rlimit": True}
            if system in ("symred", "jax_symred"):
                c["budget_bytes"] = BUDGET
            if quick:
                c["reps"], c["max_seconds"] = 3, 4.0
                # pykeops' CPU backend needs about a minute per run at n = 1e5 here.
                if system == "pykeops" and n >= 100_000:
                    c["timeout"] = 20
            out.append(c)
    return out


def _data(n):
    import numpy as np
    rng = np.random.default_rng(SEED)
    return rng.standard_normal((n, 1)), rng.standard_normal((n, 1))


def _check(x, v, out):
    """Max relative error of 16 rows of `out` against a float64 NumPy evaluation, one row at a
    time (a few n-vectors: the check must not show in the run's peak RSS)."""
    import numpy as np
    got = np.asarray(out).reshape(-1)
    err = 0.0
    for i in np.linspace(0, len(x) - 1, 16).astype(int):
        ref = float(np.exp(-0.5 * (x[i, 0] - x[:, 0]) ** 2) @ v[:, 0])
        err = max(err, abs(got[i] - ref) / max(abs(ref), 1e-300))
    return err


def _symred(x, v, cfg):
    import common
    import numpy as np
    os.environ["SYMRED_MEM_LIMIT"] = str(cfg["budget_bytes"])
    symred = common.import_symred()
    f = symred.Genred("Exp(-SqDist(x,y)*g)*b", ["x = Vi(1)", "y = Vj(1)", "b = Vj(1)",
                                                 "g = Pm(1)"], reduction_op="Sum", axis=1)
    g = np.array([0.5])
    fields, out = common.best_of(lambda: f(x, x, v, g), warmup=lambda: f(x[:64], x[:64], v[:64], g),
                                 reps=cfg.get("reps", 3), max_seconds=cfg.get("max_seconds", 30))
    fields["compile_seconds"] = fields["first_seconds"]
    fields["strategy"] = common.strategy(f)
    return fields, out


def _numpy(x, v, cfg):
    import common
    import numpy as np

    def dense():
        k = np.subtract(x, x.T)  # the one n x n buffer
        np.square(k, out=k)
        k *= -0.5
        np.exp(k, out=k)
        return k @ v

    fields, out = common.best_of(dense, reps=cfg.get("reps", 3),
                                 max_seconds=cfg.get("max_seconds", 30))
    fields["compile_seconds"] = 0.0
    return fields, out


def _jax(x, v, cfg):
    import common
    jax = common.jax_cpu()
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    def matvec(x, v):
        return jnp.exp(-0.5 * (x - x.T) ** 2) @ v

    return common.best_of_jit(matvec, (jnp.asarray(x), jnp.asarray(v)), cfg)


def _jax_symred(x, v, cfg):
    import common
    os.environ["SYMRED_MEM_LIMIT"] = str(cfg["budget_bytes"])
    jax = common.jax_cpu()
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    common.import_symred()
    import symred.jax as sjax
    f = sjax.Genred("Exp(-SqDist(x,y)*g)*b", ["x = Vi(1)", "y = Vj(1)", "b = Vj(1)",
                                              "g = Pm(1)"], reduction_op="Sum", axis=1)
    g = jnp.asarray([0.5])
    fields, out = common.best_of_jit(lambda x, v: f(x, x, v, g), (jnp.asarray(x), jnp.asarray(v)),
                                     cfg)
    fields["strategy"] = common.strategy(f)
    return fields, out


def _pykeops(x, v, cfg):
    import common
    import numpy as np
    import pykeops
    pykeops.set_verbose(False)
    pykeops.set_build_folder(os.path.join(os.environ.get("EXLA_OUT", "/tmp"), "keops-build"))
    from pykeops.numpy import Genred
    f = Genred("Exp(-SqDist(x,y)*g)*b", ["x = Vi(1)", "y = Vj(1)", "b = Vj(1)", "g = Pm(1)"],
               reduction_op="Sum", axis=1)
    g = np.array([0.5])
    fields, out = common.best_of(lambda: f(x, x, v, g, backend="CPU"),
                                 warmup=lambda: f(x[:64], x[:64], v[:64], g, backend="CPU"),
                                 reps=cfg.get("reps", 3), max_seconds=cfg.get("max_seconds", 30))
    fields["compile_seconds"] = fields["first_seconds"]
    return fields, out


RUNNERS = {"symred": _symred, "numpy": _numpy, "jax": _jax, "jax_symred": _jax_symred,
           "pykeops": _pykeops}


def run(cfg):
    n = cfg["n"]
    need = 8 * n * n
    x, v = _data(n)
    try:
        fields, out = RUNNERS[cfg["system"]](x, v, cfg)
    except Exception as e:
        name = getattr(e, "status_name", None)
        if name in ("EBUDGET", "ENOMEM"):
            return {"status": "oom", "reason": f"symred {name}: {e}"[-400:]}
        raise
    fields["max_rel_err"] = _check(x, v, out)
    fields["dense_matrix_bytes"] = need
    fields["gpairs_per_s"] = n * n / fields["seconds"] / 1e9
    return fields


# ---- plot ---------------------------------------------------------------------------------------

STYLE = {  # system: (label, colour, marker)
    "symred": ("symred (100 MB budget)", "tab:red", "o"),
    "numpy": ("NumPy dense", "tab:blue", "s"),
    "jax": ("JAX/XLA (CPU)", "tab:green", "^"),
    "jax_symred": ("JAX + symred (jit, FFI)", "tab:orange", "D"),
    "pykeops": ("pykeops (CPU)", "tab:purple", "v"),
}


def plot(records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9})
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(8.4, 3.4))
    systems = [s for s in STYLE if any(r["system"] == s for r in records)]
    systems += sorted({r["system"] for r in records} - set(systems))
    for si, s in enumerate(systems):
        label, colour, marker = STYLE.get(s, (s, None, "x"))
        rs = sorted((r for r in records if r["system"] == s), key=lambda r: r["n"])
        ok = [r for r in rs if r.get("status") == "ok"]
        ax_t.plot([r["n"] for r in ok], [r["seconds"] for r in ok], marker=marker, color=colour,
                  label=label, markersize=4)
        ax_m.plot([r["n"] for r in ok], [r["peak_rss_bytes"] / 1e6 for r in ok], marker=marker,
                  color=colour, label=label, markersize=4)
        for r in rs:
            if r.get("status") in ("oom", "timeout"):
                mark = "X" if r["status"] == "oom" else "|"
                for ax in (ax_t, ax_m):
                    ax.plot([r["n"]], [0.96 - 0.05 * si], transform=ax.get_xaxis_transform(),
                            marker=mark,
                            color=colour, markersize=7, linestyle="none")
    lim = next((r["limit_bytes"] for r in records), None)
    if lim:
        ax_m.axhline(lim / 1e6, color="grey", linestyle=":", linewidth=1)
        ax_m.text(0.02, lim / 1e6, f"RLIMIT_AS: {lim / 1e9:g} GB + allowance",
                  transform=ax_m.get_yaxis_transform(), va="bottom", fontsize=7, color="grey")
    for ax, ylabel in ((ax_t, "time, s (best of runs)"), (ax_m, "peak RSS, MB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (x, v of shape (n, 1), float64)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", linestyle=":", linewidth=0.5)
        ax.spines["right"].set_visible(False)
        ax.spines["top"].set_visible(False)
    ax_t.set_title("K(x, x) @ v: time", fontsize=9)
    ax_m.set_title("peak RSS (X at the top: out of memory; |: timed out)", fontsize=9)
    ax_t.legend(loc="upper left", fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
