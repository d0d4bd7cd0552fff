"""knn: exact k-nearest neighbours, k = 10, L2 / L1 / cosine (eXLA, the kNN experiment).

Points and queries are float32: random (uniform in [0, 1)^d, seeds 0 and 1) or Fashion-MNIST
(the first n training images as points, the first m test images as queries, pixels / 255).
Every system runs under RLIMIT_AS = LIMIT + common.RLIMIT_ALLOWANCE. Distances: L2 = squared
Euclidean, L1 = sum of |x - y|, cosine = 1 - <x, y> / (|x| |y|). Systems:

- exact: the ground truth, not a contestant (not plotted, no memory limit): float64 distances
  with torch on every core over chunks of queries (torch.cdist of the differences when d <= 8
  for L2 and cosine, else a GEMM; L1 by torch.cdist), torch.topk. Its neighbours and each
  query's k-th distance are saved under $EXLA_OUT/knn-truth/ for every system's recall; it
  runs first at each point, with its own timeout (TRUTH_TIMEOUT), so the others' recall does
  not depend on the slowest peer finishing.
- numpy: the plain NumPy baseline, in float64 over chunks of queries (L2 and cosine with BLAS,
  or explicit differences when d <= 8; L1 by broadcasting), argpartition + sort; one run, no
  warm-up.
- symred: Genred ArgKMin over j of "SqDist(q,p)", "Sum(Abs(q-p))" or
  "SqDist(Normalize(q),Normalize(p))" (= 2 - 2 cos: the same order as 1 - cos, and in float32
  free of the cancellation of 1 - cos near 0, which costs every system here recall at d = 3);
  the kernel is compiled on a tiny input first.
- jax: jax.jit of the full m x n distance matrix + jax.lax.top_k, as the paper's exp_knn.py
  (L2 as |x|^2 - 2<x,y> + |y|^2, L1 by broadcasting, cosine as 1 - <x,y> / (|x| |y|)); XLA
  compile timed apart.
- pykeops: LazyTensor argKmin (CPU); cosine as |x - y|^2 of rows normalised beforehand (the
  normalisation is timed), the same formulation as symred's.
- faiss: IndexFlatL2; cosine = IndexFlatIP on normalised rows; L1 = IndexFlat(d, METRIC_L1).
  The index build (a copy) and the normalisation are timed with the search.

Children load the OpenBLAS of setup.sh (common.blas_env), as the NumPy and faiss-cpu wheels
bring an optimised BLAS: Debian's default here is BLIS with generic kernels. symred does not use
it; each record lists the BLAS its process loaded.

recall: the fraction of the m*k returned neighbours whose float64 distance to the query is at
most the true k-th distance (relative tolerance 1e-5), i.e. the neighbour sets up to exact ties.
"""

import os

LIMIT = 4 * 10**9
K = 10
SYSTEMS = ("exact", "numpy", "symred", "jax", "pykeops", "faiss")  # exact first: the truth
TRUTH_TIMEOUT = 3 * 3600  # seconds: the truth must finish whatever --timeout the peers get
DISTANCES = ("L2", "L1", "cosine")
RTOL = 1e-5


def _points(quick):
    """(dataset, n, m, d, distances) of the grid."""
    if quick:
        # Small enough that the whole quick run stays in its time budget: pykeops compiles
        # each (distance, d) for 10-25 s here, and NumPy's exact baseline is the slowest run.
        return [("random", 50_000, 1000, 3, DISTANCES), ("random", 50_000, 1000, 100, ("L2",)),
                ("fashion-mnist", 10_000, 500, 784, ("L2",))]
    pts = [("random", n, 10_000, d, DISTANCES) for n in (10_000, 100_000, 1_000_000)
           for d in (3, 10, 100)]
    return pts + [("fashion-mnist", 60_000, 10_000, 784, DISTANCES)]


def configs(quick):
    out = []
    for dataset, n, m, d, distances in _points(quick):
        for distance in distances:
            for system in SYSTEMS:
                c = {"experiment": "knn", "system": system, "dataset": dataset, "n": n, "m": m,
                     "d": d, "k": K, "distance": distance, "dtype": "float32",
                     "limit_bytes": LIMIT, "rlimit": True}
                if system == "exact":
                    c["rlimit"] = False
                    c["timeout"] = TRUTH_TIMEOUT
                if quick:
                    c["reps"], c["max_seconds"] = 5, 2.0
                out.append(c)
    return out


def _data(cfg):
    import common
    if cfg["dataset"] == "fashion-mnist":
        return common.fashion_mnist(cfg["n"], cfg["m"])
    return (common.random_points(cfg["n"], cfg["d"], seed=0),
            common.random_points(cfg["m"], cfg["d"], seed=1))


def _truth_path(cfg):
    name = f"{cfg['dataset']}-n{cfg['n']}-m{cfg['m']}-d{cfg['d']}-k{cfg['k']}-{cfg['distance']}"
    return os.path.join(os.environ.get("EXLA_OUT", "/tmp"), "knn-truth", name + ".npz")


def _dist64(x, q, idx, distance):
    """float64 distances from each query q[i] to its points x[idx[i]], shape idx.shape."""
    import numpy as np
    xs = x[idx].astype(np.float64)  # (m, k, d)
    qs = q.astype(np.float64)[:, None, :]
    if distance == "L2":
        return ((xs - qs) ** 2).sum(-1)
    if distance == "L1":
        return np.abs(xs - qs).sum(-1)
    num = (xs * qs).sum(-1)
    return 1.0 - num / (np.linalg.norm(xs, axis=-1) * np.linalg.norm(qs, axis=-1))


def child_env(env):
    import common
    return common.blas_env(env)


# ---- systems: each returns (timing fields, (m, k) int64 indices) ---------------------------------


def _exact(x, q, cfg):
    import time

    import numpy as np
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    k, distance = cfg["k"], cfg["distance"]
    t0 = time.perf_counter()
    x64 = torch.from_numpy(x).double()
    if distance == "cosine":
        x64 = x64 / x64.norm(dim=1, keepdim=True)
    n, d = x64.shape
    x2 = (x64 ** 2).sum(1) if distance == "L2" and d > 8 else None
    chunk = max(1, min(len(q), (256 << 20) // (8 * n)))
    idx = np.empty((len(q), k), dtype=np.int64)
    for i in range(0, len(q), chunk):
        qc = torch.from_numpy(q[i:i + chunk]).double()
        if distance == "cosine":
            qc = qc / qc.norm(dim=1, keepdim=True)
        if distance == "L1":
            dist = torch.cdist(qc, x64, p=1)
        elif d <= 8:
            # Differences, not a GEMM (cancellation); the Euclidean distance, same order.
            dist = torch.cdist(qc, x64, p=2, compute_mode="donot_use_mm_for_euclid_dist")
        elif distance == "L2":
            dist = torch.addmm(x2[None, :], qc, x64.T, alpha=-2.0)  # |x|^2 - 2<q, x>
        else:
            dist = -(qc @ x64.T)  # unit rows: the order of 1 - cos
        idx[i:i + chunk] = torch.topk(dist, k, dim=1, largest=False, sorted=True)[1].numpy()
    return {"seconds": time.perf_counter() - t0, "reps": 1, "compile_seconds": 0.0,
            "threads": torch.get_num_threads()}, idx


def _numpy(x, q, cfg):
    import time

    import numpy as np
    k, distance = cfg["k"], cfg["distance"]
    x64 = x.astype(np.float64)
    if distance == "cosine":
        x64 /= np.linalg.norm(x64, axis=1, keepdims=True)
    x2 = (x64 ** 2).sum(1)
    n, d = x.shape
    # Chunks of queries: an L2/cosine chunk is (c, n) float64, an L1 chunk (c, n-block, d).
    chunk = max(1, min(len(q), (256 << 20) // (8 * n)))

    def block(qc):
        """Distances of a chunk of queries, or values in the same order per query:
        -2<q, x> + |x|^2 for L2, -<q, x> of unit rows for cosine (|q - x|^2 when d <= 8)."""
        q64 = qc.astype(np.float64)
        if distance == "cosine":
            q64 /= np.linalg.norm(q64, axis=1, keepdims=True)
        if d <= 8 and distance != "L1":
            # Few coordinates: sum of squared differences, one pass per coordinate (the
            # system BLAS is slow for an inner dimension this small).
            dist = np.zeros((len(q64), n))
            for c in range(d):
                diff = np.subtract(q64[:, c:c + 1], x64[None, :, c])
                np.square(diff, out=diff)
                dist += diff
            return dist
        if distance == "L2":
            dist = q64 @ x64.T
            dist *= -2.0
            dist += x2[None, :]
            return dist
        if distance == "cosine":
            dist = q64 @ x64.T
            np.negative(dist, out=dist)
            return dist
        out = np.empty((len(q64), n))
        step = max(1, (64 << 20) // (8 * d * len(q64)))
        for j in range(0, n, step):
            out[:, j:j + step] = np.abs(q64[:, None, :] - x64[None, j:j + step, :]).sum(-1)
        return out

    def knn():
        idx = np.empty((len(q), k), dtype=np.int64)
        for i in range(0, len(q), chunk):
            dist = block(q[i:i + chunk])
            part = np.argpartition(dist, k - 1, axis=1)[:, :k]
            order = np.argsort(np.take_along_axis(dist, part, 1), axis=1, kind="stable")
            idx[i:i + chunk] = np.take_along_axis(part, order, 1)
        return idx

    # One run, no warm-up (nothing to compile; it is the slowest system and the ground truth).
    t0 = time.perf_counter()
    idx = knn()
    return {"seconds": time.perf_counter() - t0, "reps": 1, "compile_seconds": 0.0}, idx


def _symred(x, q, cfg):
    import common
    symred = common.import_symred()
    d, k = cfg["d"], cfg["k"]
    formula = {"L2": "SqDist(q,p)", "L1": "Sum(Abs(q-p))",
               "cosine": "SqDist(Normalize(q),Normalize(p))"}[cfg["distance"]]
    f = symred.Genred(formula, [f"q = Vi({d})", f"p = Vj({d})"], reduction_op="ArgKMin",
                      axis=1, opt_arg=k)
    fields, idx = common.best_of(lambda: f(q, x), warmup=lambda: f(q[:8], x[:64]),
                                 reps=cfg.get("reps", 3), max_seconds=cfg.get("max_seconds", 30))
    fields["compile_seconds"] = fields["first_seconds"]
    fields["strategy"] = common.strategy(f)
    return fields, idx.reshape(len(q), k)


def _jax(x, q, cfg):
    import common
    jax = common.jax_cpu()
    import jax.numpy as jnp
    import numpy as np
    k, distance = cfg["k"], cfg["distance"]

    def knn(x, q):
        if distance == "L2":
            dist = (jnp.sum(q ** 2, -1)[:, None] - 2.0 * q @ x.T + jnp.sum(x ** 2, -1)[None, :])
        elif distance == "L1":
            dist = jnp.sum(jnp.abs(q[:, None, :] - x[None, :, :]), -1)
        else:
            norms = jnp.sqrt(jnp.sum(q ** 2, -1)[:, None] * jnp.sum(x ** 2, -1)[None, :])
            dist = 1.0 - (q @ x.T) / norms
        return jax.lax.top_k(-dist, k)[1]

    fields, idx = common.best_of_jit(knn, (jnp.asarray(x), jnp.asarray(q)), cfg)
    return fields, idx.astype(np.int64)


def _normalised(a):
    import numpy as np
    return np.ascontiguousarray(a / np.linalg.norm(a, axis=1, keepdims=True), dtype=np.float32)


def _pykeops(x, q, cfg):
    import common
    import numpy as np
    import pykeops
    pykeops.set_verbose(False)
    pykeops.set_build_folder(os.path.join(os.environ.get("EXLA_OUT", "/tmp"), "keops-build"))
    from pykeops.numpy import LazyTensor
    k, distance = cfg["k"], cfg["distance"]

    def knn(x, q):
        if distance == "cosine":
            x, q = _normalised(x), _normalised(q)
        qi, xj = LazyTensor(q[:, None, :]), LazyTensor(x[None, :, :])
        if distance == "L2":
            dist = ((qi - xj) ** 2).sum(-1)
        elif distance == "L1":
            dist = (qi - xj).abs().sum(-1)
        else:
            dist = ((qi - xj) ** 2).sum(-1)  # rows normalised above: 2 - 2 cos
        return dist.argKmin(K=k, dim=1, backend="CPU")

    fields, idx = common.best_of(lambda: knn(x, q), warmup=lambda: knn(x[:64], q[:8]),
                                 reps=cfg.get("reps", 3), max_seconds=cfg.get("max_seconds", 30))
    fields["compile_seconds"] = fields["first_seconds"]
    return fields, np.asarray(idx, dtype=np.int64).reshape(len(q), k)


def _faiss(x, q, cfg):
    import common
    import faiss
    import numpy as np
    d, k, distance = cfg["d"], cfg["k"], cfg["distance"]
    if distance == "L1" and not hasattr(faiss, "METRIC_L1"):
        raise ImportError(f"faiss {faiss.__version__} has no METRIC_L1")

    def knn():
        if distance == "L2":
            index, data, queries = faiss.IndexFlatL2(d), x, q
        elif distance == "cosine":
            index, data, queries = faiss.IndexFlatIP(d), _normalised(x), _normalised(q)
        else:
            index, data, queries = faiss.IndexFlat(d, faiss.METRIC_L1), x, q
        index.add(data)
        return index.search(queries, k)[1]

    fields, idx = common.best_of(knn, reps=cfg.get("reps", 3),
                                 max_seconds=cfg.get("max_seconds", 30))
    fields["compile_seconds"] = 0.0
    fields["threads"] = faiss.omp_get_max_threads()
    return fields, np.asarray(idx, dtype=np.int64)


RUNNERS = {"exact": _exact, "numpy": _numpy, "symred": _symred, "jax": _jax, "pykeops": _pykeops,
           "faiss": _faiss}


def recall(x, q, idx, truth_idx, truth_kth, distance):
    """Fraction of returned neighbours within the true k-th distance (ties count as found)."""
    import numpy as np
    m, k = truth_idx.shape
    if idx.shape != (m, k) or idx.min() < 0 or idx.max() >= len(x):
        return 0.0
    d = _dist64(x, q, idx, distance)
    tol = RTOL * np.maximum(np.abs(truth_kth), 1e-12)
    good = d <= (truth_kth + tol)[:, None]
    # A neighbour returned twice counts once.
    dup = np.zeros_like(good)
    s = np.sort(idx, axis=1)
    dup[:, 1:] = s[:, 1:] == s[:, :-1]
    return float((good.sum() - dup.sum()) / (m * k))


def run(cfg):
    import numpy as np
    x, q = _data(cfg)
    fields, idx = RUNNERS[cfg["system"]](x, q, cfg)
    path = _truth_path(cfg)
    if cfg["system"] == "exact":
        kth = _dist64(x, q, idx[:, -1:], cfg["distance"])[:, 0]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.savez(path + ".tmp.npz", idx=idx, kth=kth)
        os.replace(path + ".tmp.npz", path)
        fields["truth"] = path
    elif os.path.exists(path):
        t = np.load(path)
        fields["recall"] = recall(x, q, idx, t["idx"], t["kth"], cfg["distance"])
    else:
        fields["recall"] = None
        fields["note"] = "no ground truth (the exact run of this point did not finish)"
    fields["dense_matrix_bytes"] = 4 * cfg["n"] * cfg["m"]
    import common
    fields["blas"] = common.blas_loaded()
    return fields


# ---- plot ---------------------------------------------------------------------------------------

COLOURS = {"symred": "tab:red", "numpy": "tab:blue", "jax": "tab:green", "pykeops": "tab:purple",
           "faiss": "tab:orange"}


def plot(records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    plt.rcParams.update({"font.size": 8})
    points = sorted({(r["dataset"], r["n"], r["m"], r["d"]) for r in records},
                    key=lambda p: (p[0] != "random", p[3], p[1]))
    # Per distance, only the points that were run with it.
    systems = [s for s in COLOURS if any(r["system"] == s for r in records)]
    per = {dist: [p for p in points if any(r["distance"] == dist and
                                           (r["dataset"], r["n"], r["m"], r["d"]) == p
                                           for r in records)] for dist in DISTANCES}
    shown = [dist for dist in DISTANCES if per[dist]]
    # One row per distance (the full grid has 10 points per distance).
    widest = max(len(per[t]) for t in shown)
    fig, axes = plt.subplots(len(shown), 1, figsize=(1.6 + 1.15 * widest, 2.9 * len(shown)),
                             sharey=True, squeeze=False)
    axes = axes[:, 0]
    width = 0.8 / max(1, len(systems))
    for ax, distance in zip(axes, shown):
        pts = per[distance]
        for si, s in enumerate(systems):
            for pi, p in enumerate(pts):
                r = next((r for r in records if r["system"] == s and r["distance"] == distance
                          and (r["dataset"], r["n"], r["m"], r["d"]) == p), None)
                xpos = pi + (si - (len(systems) - 1) / 2) * width
                if r is None:
                    continue
                if r.get("status") == "ok":
                    ax.bar(xpos, r["seconds"], width, color=COLOURS[s],
                           label=s if pi == 0 else None)
                    rec = r.get("recall")
                    if isinstance(rec, float) and rec < 1.0:
                        ax.text(xpos, r["seconds"], f"{rec:.5g}", rotation=90, fontsize=5,
                                ha="center", va="bottom")
                else:
                    ax.text(xpos, 0.02, {"oom": "OOM", "timeout": "T/O", "skipped": "n/a",
                                         "error": "ERR"}.get(r.get("status"), "?"),
                            transform=ax.get_xaxis_transform(), rotation=90, fontsize=6,
                            ha="center", va="bottom", color=COLOURS[s])
                    if pi == 0:
                        ax.bar(xpos, np.nan, width, color=COLOURS[s], label=s)
        ax.set_yscale("log")
        ax.set_xlim(-0.6, widest - 0.4)
        ax.set_xticks(range(len(pts)))
        ax.set_xticklabels([("F-MNIST" if p[0] != "random" else "random")
                            + f"\nn={p[1]:.0e}\nm={p[2]:.0e}\nd={p[3]}" for p in pts],
                           fontsize=6)
        ax.set_title(f"k = {K}, {distance}", fontsize=9)
        ax.grid(True, axis="y", which="both", linestyle=":", linewidth=0.5)
        ax.spines["right"].set_visible(False)
        ax.spines["top"].set_visible(False)
    for ax in axes:
        ax.set_ylabel("time, s (best of runs)\nrecall printed when < 1")
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=7, frameon=False,
               loc="upper center", ncol=len(systems), bbox_to_anchor=(0.5, 1.06))
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
