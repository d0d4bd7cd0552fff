"""``symred.torch.cluster``: :mod:`symred.cluster` (pykeops' cluster helpers) on torch tensors,
as in ``pykeops.torch.cluster``. The work is done by the NumPy versions on the CPU; the results
are tensors on the device of the first tensor argument (ranges: int32, as in pykeops)."""

import functools

import numpy as np
import torch

from . import cluster as _np

__all__ = list(_np.__all__)


def _wrap(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        devices = [a.device for a in list(args) + list(kwargs.values())
                   if isinstance(a, torch.Tensor)]
        device = devices[0] if devices else torch.device("cpu")

        def to_np(a):
            if isinstance(a, torch.Tensor):
                return a.detach().cpu().numpy()
            if isinstance(a, (tuple, list)):
                return type(a)(to_np(b) for b in a)
            return a

        def to_torch(a):
            if isinstance(a, np.ndarray):
                return torch.from_numpy(np.ascontiguousarray(a)).to(device)
            if isinstance(a, (tuple, list)):
                return type(a)(to_torch(b) for b in a)
            return a

        return to_torch(fn(*[to_np(a) for a in args], **{k: to_np(v) for k, v in kwargs.items()}))

    return call


for _name in _np.__all__:
    globals()[_name] = _np.swap_axes if _name == "swap_axes" else _wrap(getattr(_np, _name))
