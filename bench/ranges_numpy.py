"""Block-sparse ranges against the dense reduction: a Gaussian convolution on clustered 3-D
points, out_i = sum_j exp(-|x_i - y_j|^2 / (2 s^2)) b_j, in one process.

The points lie in well-separated blobs. Both clouds are cut into cubic cells (grid_cluster),
sorted by cell, and a pair of cells is kept when their centroids are closer than the cutoff
(from_matrix); the block-sparse reduction skips every other pair of cells. Printed: the dense
and block-sparse times (best of --reps), their ratio (and the ratio to the same dense kernel
at bandwidth 1, which has no tiny exponentials and runs at the dense path's full speed), the fraction of pairs kept, the time to
build the ranges, and the largest error of the block-sparse result relative to the largest
dense value (the truncation error of the cutoff). With SYMRED_BENCH_RECORD set, the figures are
appended to that file as data (bench/record.py).

    python3 bench/ranges_numpy.py [--n 200000] [--blobs 60] [--reps 3] [--dtype float32]

Needs a built library (SYMRED_LIB, or a build tree of the checkout) and NumPy.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings",
                                "python"))

from symred.numpy import Genred  # noqa: E402
from symred.numpy.cluster import (  # noqa: E402
    cluster_ranges_centroids,
    from_matrix,
    grid_cluster,
    sort_clusters,
)

from record import Record  # noqa: E402  (bench/record.py, beside this file)


def blobs(rng, n, centers, spread):
    lab = rng.integers(0, len(centers), size=n)
    return centers[lab] + spread * rng.standard_normal((n, 3))


def best(fn, reps):
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000, help="points per cloud (N = M)")
    ap.add_argument("--blobs", type=int, default=60)
    ap.add_argument("--sigma", type=float, default=0.05, help="kernel bandwidth s")
    ap.add_argument("--cell", type=float, default=0.2, help="grid_cluster cell side")
    ap.add_argument("--cutoff", type=float, default=0.6, help="centroid distance kept")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--sample", type=int, default=None,
                    help="rows of the dense run at bandwidth s (its time is scaled to N rows "
                         "and the error measured on them); default: all rows up to N = 50000, "
                         "else 4000")
    a = ap.parse_args()
    rec = Record("ranges_numpy")

    rng = np.random.default_rng(0)
    centers = rng.uniform(0, 10, size=(a.blobs, 3))
    x = blobs(rng, a.n, centers, 0.1).astype(a.dtype)
    y = blobs(rng, a.n, centers, 0.1).astype(a.dtype)
    b = rng.standard_normal((a.n, 1)).astype(a.dtype)

    t0 = time.perf_counter()
    xl, yl = grid_cluster(x, a.cell), grid_cluster(y, a.cell)
    rx, cx, _ = cluster_ranges_centroids(x, xl)
    ry, cy, _ = cluster_ranges_centroids(y, yl)
    x, xl = sort_clusters(x, xl)
    (y, b), yl = sort_clusters((y, b), yl)
    d2 = (cx ** 2).sum(1)[:, None] + (cy ** 2).sum(1)[None, :] - 2 * cx @ cy.T
    keep = d2 < a.cutoff ** 2
    ranges = from_matrix(rx, ry, keep)
    t_prep = time.perf_counter() - t0
    sizes_x, sizes_y = rx[:, 1] - rx[:, 0], ry[:, 1] - ry[:, 0]
    kept = float((sizes_x[:, None] * sizes_y[None, :] * keep).sum()) / (a.n * a.n)

    g = Genred("Exp(-SqDist(x, y) * c) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)",
                                               "c = Pm(1)"], axis=1)
    c = np.array([1 / (2 * a.sigma ** 2)], dtype=a.dtype)
    g(x[:10], y[:10], b[:10], c)  # compile outside the timings
    sample = a.sample if a.sample is not None else (a.n if a.n <= 50_000 else 4000)
    rows = np.sort(rng.choice(a.n, size=min(sample, a.n), replace=False))
    t_dense, dense = best(lambda: g(x[rows], y, b, c), a.reps)
    t_dense *= a.n / len(rows)
    # A second yardstick: the same dense kernel with a bandwidth of 1, where no exp argument is
    # large and negative. Both should run at the same speed since the JIT's Exp clamps its
    # argument (docs/semantics.md, "Exp's underflow"); before, the dense run above was ~25x
    # slower (most of its far pairs have exp(-|x-y|^2 / 2s^2) below float32's normal range).
    c1 = np.array([0.5], dtype=a.dtype)
    t_wide, _ = best(lambda: g(x, y, b, c1), a.reps)
    t_sparse, sparse = best(lambda: g(x, y, b, c, ranges=ranges), a.reps)
    err = float(np.abs(sparse[rows].astype(np.float64) - dense).max() / np.abs(dense).max())
    scaled = "" if len(rows) == a.n else f" (measured on {len(rows)} random rows, scaled to N)"

    print(f"Gaussian convolution, N = M = {a.n}, D = 3, {a.dtype}, {a.blobs} blobs, "
          f"s = {a.sigma}, cells {a.cell}, cutoff {a.cutoff}")
    print(f"clusters: {len(rx)} x {len(ry)}, cell pairs kept {keep.mean():.4f}, point pairs "
          f"kept {kept:.4f}; ranges built in {t_prep:.3f} s (NumPy)")
    print(f"dense:        {t_dense:.3f} s  ({a.n * a.n / t_dense / 1e9:.2f} G pairs/s){scaled}")
    print(f"dense, s = 1:  {t_wide:.3f} s  ({a.n * a.n / t_wide / 1e9:.2f} G pairs/s; the yardstick "
          f"without tiny exponentials)")
    print(f"block-sparse: {t_sparse:.3f} s  ({kept * a.n * a.n / t_sparse / 1e9:.2f} G kept "
          f"pairs/s)")
    print(f"speed-up dense/block-sparse: {t_dense / t_sparse:.1f}x; dense at s = 1 / block-sparse: "
          f"{t_wide / t_sparse:.1f}x")
    print(f"max |sparse - dense| / max |dense|: {err:.2e} (truncation at the cutoff)"
          + (f" on those {len(rows)} rows" if scaled else ""))
    rec.row(n=a.n, dtype=a.dtype, blobs=a.blobs, sigma=a.sigma, cell=a.cell, cutoff=a.cutoff,
            clusters=f"{len(rx)} x {len(ry)}", cell_pairs_kept=round(float(keep.mean()), 4),
            point_pairs_kept=round(kept, 4), ranges_s=round(t_prep, 3),
            dense_rows=len(rows), dense_s=round(t_dense, 3), dense_s1_s=round(t_wide, 3),
            sparse_s=round(t_sparse, 3), dense_over_sparse=round(t_dense / t_sparse, 2),
            dense_s1_over_sparse=round(t_wide / t_sparse, 2), max_rel_err=float(f"{err:.2e}"))
    rec.data["numpy"] = np.__version__
    rec.close()


if __name__ == "__main__":
    main()
