"""``symred.torch.cluster``: pykeops' cluster helpers on torch tensors (``pykeops.torch.cluster``),
with its signatures, dtypes and devices: labels are int32, ``cluster_ranges`` gives int64,
centroids have the points' dtype, total weights the weights' dtype (float32 counts without
weights), and every result lies on the device of the input. As in pykeops, the centroids and
weights carry no gradient (they are bin counts). See :mod:`symred.cluster` for the recipe;
unlike pykeops' grid_cluster, this one works in any dimension.
"""

import torch

from .cluster import __all__ as _NAMES
from .cluster import swap_axes

__all__ = list(_NAMES)  # the same names as symred.numpy.cluster


def grid_cluster(x, size):
    """Labels (M,) int32 in [0, C) of the cubic cells of side ``size`` (a number or a (D,)
    tensor) that hold the points x (M, D), the grid starting at the points' lowest corner:
    x[i] and x[j] share a label iff they share a cell. Labels follow the lexicographic order
    of the cells."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"grid_cluster: x must be a tensor of shape (M, D), got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    size = torch.as_tensor(size, dtype=x.dtype, device=x.device)
    if bool((size <= 0).any()):
        raise ValueError("grid_cluster: the cell size must be positive")
    with torch.no_grad():
        if x.shape[0] == 0:
            return torch.zeros(0, dtype=torch.int32, device=x.device)
        cells = ((x - x.min(dim=0, keepdim=True).values) / size).floor().to(torch.int64)
        _, lab = torch.unique(cells, dim=0, return_inverse=True)
    return lab.reshape(-1).to(torch.int32)


def sort_clusters(x, lab):
    """Points (a tensor, or a tuple/list of tensors with the same first dimension) sorted by
    label so that each cluster is contiguous, and the sorted labels. Points of one cluster
    keep their order."""
    lab, perm = torch.sort(lab.reshape(-1), stable=True)
    if isinstance(x, tuple):
        return tuple(a[perm] for a in x), lab
    if isinstance(x, list):
        return [a[perm] for a in x], lab
    return x[perm], lab


def cluster_ranges(lab, Nlab=None):
    """The [start, end) rows (C, 2) int64 of each cluster in points sorted by label;
    ``Nlab``: the points per label, if known."""
    if Nlab is None:
        Nlab = torch.bincount(lab.reshape(-1).long())
    ends = torch.as_tensor(Nlab).reshape(-1).to(torch.int64).cumsum(0)
    starts = torch.cat((torch.zeros(1, dtype=torch.int64, device=ends.device), ends[:-1]))
    return torch.stack((starts, ends), dim=1)


def cluster_centroids(x, lab, Nlab=None, weights=None, weights_c=None):
    """The (weighted) centroid (C, D) of each cluster, of x's dtype; weights default to 1. A
    cluster of zero weight has a NaN centroid."""
    lab = lab.reshape(-1).long()
    if Nlab is None:
        Nlab = torch.bincount(lab).to(x.dtype)
    C = len(Nlab)
    if weights is not None and weights_c is None:
        weights_c = torch.bincount(lab, weights=weights.reshape(-1), minlength=C)
    c = torch.zeros((C, x.shape[1]), dtype=x.dtype, device=x.device)
    with torch.no_grad():
        for d in range(x.shape[1]):
            if weights is None:
                c[:, d] = torch.bincount(lab, weights=x[:, d], minlength=C) / Nlab
            else:
                c[:, d] = (torch.bincount(lab, weights=x[:, d] * weights.reshape(-1),
                                          minlength=C) / weights_c.reshape(-1))
    return c


def cluster_ranges_centroids(x, lab, weights=None, min_weight=1e-9):
    """(ranges (C, 2) int64, centroids (C, D), total weight (C,)) of the clusters of ``lab``,
    the ranges in the order of :func:`sort_clusters`. Weights at or below ``min_weight`` are
    raised to it first (as pykeops, for the centroids' sake); without weights the totals are
    the counts, as float32."""
    lab = lab.reshape(-1).long()
    Nlab = torch.bincount(lab).float()
    if weights is None:
        return cluster_ranges(lab, Nlab), cluster_centroids(x, lab, Nlab), Nlab
    weights = weights.reshape(-1).clone()
    weights[weights <= min_weight] = min_weight
    w_c = torch.bincount(lab, weights=weights, minlength=len(Nlab))
    return (cluster_ranges(lab, Nlab),
            cluster_centroids(x, lab, Nlab, weights=weights, weights_c=w_c), w_c)


def from_matrix(ranges_i, ranges_j, keep):
    """pykeops' 6-tuple (ranges_i, slices_i, redranges_j, ranges_j, slices_j, redranges_i)
    from row clusters ranges_i (Ci, 2), column clusters ranges_j (Cj, 2) and a boolean
    (Ci, Cj) tensor ``keep``: row cluster a reduces over the column clusters b with
    keep[a, b] (and, for axis 0, the transpose). Slices are int64; the ranges keep their
    dtype."""
    keep = torch.as_tensor(keep).to(torch.bool)
    if tuple(keep.shape) != (ranges_i.shape[0], ranges_j.shape[0]):
        raise ValueError(f"from_matrix: keep must have shape ({ranges_i.shape[0]}, "
                         f"{ranges_j.shape[0]}) (row clusters, column clusters), got "
                         f"{tuple(keep.shape)}")
    _, b = torch.nonzero(keep, as_tuple=True)  # row-major: each row cluster's columns
    _, a = torch.nonzero(keep.t(), as_tuple=True)
    redranges_j = ranges_j[b].reshape(-1, 2)
    redranges_i = ranges_i[a].reshape(-1, 2)
    slices_i = keep.sum(1).cumsum(0).to(torch.int64)
    slices_j = keep.sum(0).cumsum(0).to(torch.int64)
    return (ranges_i, slices_i, redranges_j, ranges_j, slices_j, redranges_i)
