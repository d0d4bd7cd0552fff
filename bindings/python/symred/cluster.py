"""Helpers to build block-sparse ranges, with pykeops' names (``pykeops.numpy.cluster``).

Also importable as ``symred.numpy.cluster``. The usual recipe, for points x (N, D) and y (M, D)::

    from symred.numpy.cluster import (grid_cluster, sort_clusters, cluster_ranges_centroids,
                                      from_matrix)
    x_lab, y_lab = grid_cluster(x, eps), grid_cluster(y, eps)      # cubic cells of side eps
    ranges_x, cent_x, _ = cluster_ranges_centroids(x, x_lab)
    ranges_y, cent_y, _ = cluster_ranges_centroids(y, y_lab)
    x, x_lab = sort_clusters(x, x_lab)                              # clusters contiguous
    y, y_lab = sort_clusters(y, y_lab)
    d2 = ((cent_x[:, None, :] - cent_y[None, :, :]) ** 2).sum(-1)
    ranges = from_matrix(ranges_x, ranges_y, d2 < cutoff ** 2)      # keep near cluster pairs
    out = Genred(...)(x, y, ..., ranges=ranges)                     # rows in x's sorted order

Ranges are int32 arrays, as in pykeops (symred accepts any integer dtype). Unlike pykeops'
grid_cluster, this one works in any dimension.
"""

import numpy as np

__all__ = [
    "grid_cluster",
    "sort_clusters",
    "cluster_ranges",
    "cluster_centroids",
    "cluster_ranges_centroids",
    "from_matrix",
    "swap_axes",
]


def grid_cluster(x, size):
    """Labels in [0, C) of the cubic cells ("voxels") of side ``size`` (a number, or one per
    dimension) that hold the points x (N, D): x[i] and x[j] share a label iff they share a
    cell. Labels are numbered in the lexicographic order of the cells."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"grid_cluster: x must have shape (N, D), got {x.shape}")
    size = np.asarray(size, dtype=np.float64)
    if np.any(size <= 0):
        raise ValueError("grid_cluster: the cell size must be positive")
    cells = np.floor(x / size).astype(np.int64)
    if x.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    _, labels = np.unique(cells, axis=0, return_inverse=True)
    return labels.reshape(-1).astype(np.int64)


def sort_clusters(x, lab):
    """Sorts points (an array, or a tuple/list of arrays with the same first dimension) by
    label, so that each cluster is contiguous; returns (sorted x, sorted labels). The sort is
    stable: points of one cluster keep their order."""
    labels = np.asarray(lab).reshape(-1)
    perm = np.argsort(labels, kind="stable")
    if isinstance(x, tuple):
        xs = tuple(np.asarray(a)[perm] for a in x)
    elif isinstance(x, list):
        xs = [np.asarray(a)[perm] for a in x]
    else:
        xs = np.asarray(x)[perm]
    return xs, labels[perm]


def cluster_ranges(lab, Nlab=None):
    """The [start, end) rows (C, 2) of each cluster in points sorted by label
    (:func:`sort_clusters`); ``Nlab``: the points per label, if known."""
    if Nlab is None:
        Nlab = np.bincount(np.asarray(lab).reshape(-1))
    ends = np.cumsum(np.asarray(Nlab, dtype=np.int64))
    return np.stack((ends - np.asarray(Nlab, dtype=np.int64), ends), axis=1).astype(np.int32)


def cluster_centroids(x, lab, Nlab=None, weights=None, weights_c=None):
    """The (weighted) centroid (C, D) of each cluster; weights default to 1. A cluster of zero
    weight has a NaN centroid."""
    x = np.asarray(x)
    labels = np.asarray(lab).reshape(-1)
    C = int(labels.max()) + 1 if labels.size else 0
    w = np.ones(labels.shape[0]) if weights is None else np.asarray(weights).reshape(-1)
    if weights_c is None:
        weights_c = np.bincount(labels, weights=w, minlength=C)
    weights_c = np.asarray(weights_c, dtype=np.float64).reshape(-1)
    c = np.empty((C, x.shape[1]), dtype=x.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        for d in range(x.shape[1]):
            c[:, d] = np.bincount(labels, weights=x[:, d] * w, minlength=C) / weights_c
    return c


def cluster_ranges_centroids(x, lab, weights=None):
    """(ranges (C, 2), centroids (C, D), total weight (C,)) of the clusters of labels, the
    ranges in the order of :func:`sort_clusters`."""
    labels = np.asarray(lab).reshape(-1)
    Nlab = np.bincount(labels)
    w = np.ones(labels.shape[0]) if weights is None else np.asarray(weights).reshape(-1)
    w_c = np.bincount(labels, weights=w, minlength=Nlab.shape[0])
    return (cluster_ranges(labels, Nlab), cluster_centroids(x, labels, Nlab, w, w_c), w_c)


def from_matrix(ranges_i, ranges_j, keep):
    """pykeops' 6-tuple (ranges_i, slices_i, redranges_j, ranges_j, slices_j, redranges_i)
    from row clusters ranges_i (Ci, 2), column clusters ranges_j (Cj, 2) and a boolean
    (Ci, Cj) matrix ``keep``: the reduction of row cluster a runs over the column clusters b
    with keep[a, b] (and, for axis 0, the transpose)."""
    ranges_i = np.asarray(ranges_i)
    ranges_j = np.asarray(ranges_j)
    keep = np.asarray(keep, dtype=bool)
    if keep.shape != (ranges_i.shape[0], ranges_j.shape[0]):
        raise ValueError(f"from_matrix: keep must have shape ({ranges_i.shape[0]}, "
                         f"{ranges_j.shape[0]}) (row clusters, column clusters), got "
                         f"{keep.shape}")
    a, b = np.nonzero(keep)  # row-major: for each row cluster, its column clusters
    redranges_j = ranges_j[b]
    bt, at = np.nonzero(keep.T)
    redranges_i = ranges_i[at]
    slices_i = np.cumsum(keep.sum(axis=1))
    slices_j = np.cumsum(keep.sum(axis=0))
    i32 = np.int32
    return (ranges_i.astype(i32), slices_i.astype(i32), redranges_j.astype(i32).reshape(-1, 2),
            ranges_j.astype(i32), slices_j.astype(i32), redranges_i.astype(i32).reshape(-1, 2))


def swap_axes(ranges):
    """The ranges of the transposed reduction (the two triples swapped); None stays None."""
    if ranges is None:
        return None
    return (*ranges[3:6], *ranges[0:3])
