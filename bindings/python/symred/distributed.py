"""symred.distributed: symred.torch reductions on tensors sharded across a torch.distributed
process group (gloo on CPUs, NCCL on GPUs), differentiable by autograd across the ranks.

    import torch.distributed as dist
    from symred.distributed import Genred, Vi, Vj

    dist.init_process_group("gloo")            # torchrun sets the rank and world size
    knn = (Vi(x_mine) - Vj(y_mine)).sqnorm2().argKmin(5, dim=1)   # LazyTensor: the same
    f = Genred("Exp(-g * SqDist(x, y)) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)",
               "g = Pm(1)"], reduction_op="Sum", axis=1)
    out_mine = f(x_mine, y_mine, b_mine, g)      # out_mine has x_mine's rows

What it computes (the semantics of symred.mpi): each rank passes its own rows of every ``Vi``
and ``Vj`` tensor (any number, 0 included; nothing has to divide) and gets the results of its
own rows (``axis=1``: the rows of its ``Vi`` tensors; ``axis=0``: of its ``Vj`` tensors),
reduced over the rows of the other side of **all** ranks. Indices are global: the position in
the concatenation of the ranks' blocks in rank order. Parameters (``Pm``) are each rank's own
and must be equal on every rank.

How: the reduced side's blocks travel around a ring of the ranks (``batch_isend_irecv``,
posted before each step's kernel runs, so that the transfer overlaps it); every step's partial
result is folded into a running state with the reduction's combine rule (Sum: add;
LogSumExp: shift by the maximum; SumSoftMaxWeight: the blocks' averages weighted by their
normalisers, with the LogSumExp of the same formula; Min, Max and the K-min family: the merge
of the candidates with their global indices, NaN and ties ordered as on one process).

Autograd: the ring's transfers are autograd Functions whose backward sends the gradient of a
block back to the rank it came from, so ``loss.backward()`` gives each rank the gradient of
the **sum of all ranks' losses** (each a function of its own results) with respect to its own
tensors: complete for the ``Vi`` and ``Vj`` rows a rank holds; for a parameter, the rank's
own share (sum ``g.grad`` over the ranks with ``all_reduce``, as for any data-parallel
parameter). Every call, and every backward through it, is collective: all ranks of the group
make it, in the same order, with the same formula and the same ``requires_grad`` flags.

NCCL: the tensors are on each rank's GPU; symred runs on the GPU that
``SYMRED_CUDA_DEVICE`` names (set it to the local rank before symred first uses CUDA).
"""

import torch
import torch.distributed as dist

from . import _shard_rules as _rules
from . import lazytensor as _lazy
from . import torch as _storch
from ._lib import SR_CAT_I, SR_CAT_J

__all__ = ["Genred", "LazyTensor", "Vi", "Vj", "Pm"]

_BIG = torch.iinfo(torch.int64).max


class _Transfer:
    """One ring step's messages: this rank's block to the next rank, the previous rank's
    block into a buffer; ``wait`` before the buffer is read."""

    def __init__(self, send, recv, nxt, prv, group):
        ops = []
        if send is not None and send.numel():
            ops.append(dist.P2POp(dist.isend, send, _global(nxt, group), group))
        if recv is not None and recv.numel():
            ops.append(dist.P2POp(dist.irecv, recv, _global(prv, group), group))
        self.works = dist.batch_isend_irecv(ops) if ops else []

    def wait(self):
        for w in self.works:
            w.wait()
        self.works = []


def _global(rank, group):
    if group is None:
        return rank
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, rank)


class _Pass(torch.autograd.Function):
    """The ring's step: returns the buffer that the previous rank's block arrives in (filled
    once ``transfer.wait()`` has run); backward sends the gradient of that block back to the
    previous rank and receives the gradient of this rank's block from the next."""

    @staticmethod
    def forward(ctx, held, rows_in, ring):
        buf = held.new_empty((rows_in, held.shape[1]))
        ring.last = _Transfer(held.detach(), buf, ring.next, ring.prev, ring.group)
        ctx.ring, ctx.rows_out = ring, held.shape[0]
        return buf

    @staticmethod
    def backward(ctx, grad):
        ring = ctx.ring
        out = grad.new_empty((ctx.rows_out, grad.shape[1]))
        # The reverse direction: to the previous rank, from the next one.
        _Transfer(grad.contiguous(), out, ring.prev, ring.next, ring.group).wait()
        return out, None, None


class _Tie(torch.autograd.Function):
    """``value`` unchanged, made to depend on ``blocks``: every received block then takes
    part in the backward on every rank (a rank whose kernel did not read a block must still
    send its gradient, zero, back along the ring), and a rank whose result depends on nothing
    (no output rows) can still call backward, as every rank must."""

    @staticmethod
    def forward(ctx, value, *blocks):
        ctx.shapes = [(b.shape, b.dtype, b.device) for b in blocks]
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        return (grad,) + tuple(torch.zeros(s, dtype=d, device=v) for s, d, v in ctx.shapes)


class _Ring:
    __slots__ = ("next", "prev", "group", "last")

    def __init__(self, rank, size, group):
        self.next, self.prev, self.group, self.last = (rank + 1) % size, (rank - 1) % size, \
            group, None


class Genred:
    """``symred.torch.Genred`` over the ranks of a process group: the same arguments
    (formula, aliases, reduction_op, axis, opt_arg, formula2, dtype, accuracy options) plus
    ``group`` (None: the default group). Called on each rank with its own rows (see the
    module's documentation); returns the results of its own rows, shaped as symred.torch's.

    Raises RuntimeError when torch.distributed is not initialised, ValueError for K larger
    than the reduced rows of all ranks together (on every rank: the row counts are exchanged
    first), for leading batch dimensions and for block-sparse ranges (not supported here)."""

    def __init__(self, formula, aliases, reduction_op="Sum", axis=0, opt_arg=None,
                 formula2=None, group=None, **kwargs):
        self._g = _storch.Genred(formula, aliases, reduction_op=reduction_op, axis=axis,
                                 opt_arg=opt_arg, formula2=formula2, **kwargs)
        self._kwargs = dict(kwargs)
        self.group = group
        self.reduction_op, self.axis, self.opt_arg = reduction_op, axis, opt_arg
        self.kind = _rules.KIND[reduction_op]

    def _companion(self, red, k=None, formula2="same"):
        f2 = self._g.formula2 if formula2 == "same" else formula2
        if red == self.reduction_op and k == self.opt_arg and f2 == self._g.formula2:
            return self._g
        return _shared(self._g, red, k, f2, self._kwargs)

    def __call__(self, *args, backend="auto", ranges=None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("symred.distributed.Genred needs torch.distributed initialised "
                               "(dist.init_process_group)")
        if ranges is not None:
            raise ValueError("symred.distributed.Genred: block-sparse ranges are not supported "
                             "across ranks")
        g = self._g
        args = list(args)
        if len(args) != g.nargs:
            raise ValueError(f"this Genred takes {g.nargs} tensors, {len(args)} were given")
        cats = [g._args[i].cat if i in g._args else None for i in range(g.nargs)]
        out_cat = SR_CAT_I if self.axis == 1 else SR_CAT_J
        red_cat = SR_CAT_J if self.axis == 1 else SR_CAT_I
        for a, c in zip(args, cats):
            if c in (SR_CAT_I, SR_CAT_J) and (not isinstance(a, torch.Tensor) or a.dim() != 2):
                raise ValueError("symred.distributed.Genred: every Vi and Vj argument must be "
                                 "a 2-D tensor (rows, dim); batch dimensions are not supported")
        rank, size = dist.get_rank(self.group), dist.get_world_size(self.group)
        nout = _rows(args, cats, out_cat)
        nred = _rows(args, cats, red_cat)
        dev = next(a.device for a, c in zip(args, cats) if c in (SR_CAT_I, SR_CAT_J))
        dtype = next(a.dtype for a, c in zip(args, cats) if c in (SR_CAT_I, SR_CAT_J))
        counts = torch.tensor([nout, nred], dtype=torch.int64, device=dev)
        gathered = [torch.empty_like(counts) for _ in range(size)]
        dist.all_gather(gathered, counts, group=self.group)
        red_rows = [int(c[1]) for c in gathered]
        total = sum(red_rows)
        offsets = [sum(red_rows[:p]) for p in range(size)]
        if self.kind == "kmin" and self.opt_arg > total:
            raise ValueError(f"{self.reduction_op}: K = {self.opt_arg} exceeds the {total} "
                             f"reduced rows of all ranks")
        if self.kind in ("min", "max") and total == 0:
            raise ValueError(f"{self.reduction_op} over no rows: every rank's reduced side is "
                             f"empty")
        red_idx = [i for i, c in enumerate(cats) if c == red_cat]
        widths = [args[i].shape[1] for i in red_idx]
        block = (torch.cat([args[i] for i in red_idx], dim=1) if red_idx
                 else torch.empty((nred, 0), dtype=dtype, device=dev))
        d = self._out_dim(args, cats, red_cat, nout)
        ring = _Ring(rank, size, self.group)
        held, running, received = block, None, []
        for t in range(size):
            src = (rank - t) % size
            nxt = None
            if t + 1 < size:  # posted before this step's kernel: the transfer overlaps it
                nxt = _Pass.apply(held, red_rows[(src - 1) % size], ring)
                transfer = ring.last
            local = list(args)
            for i, part in zip(red_idx, torch.split(held, widths, dim=1) if red_idx else []):
                local[i] = part
            state = self._block(local, nout, held.shape[0], offsets[src], d, dtype, dev,
                                backend)
            running = state if running is None else self._combine(running, state)
            if nxt is not None:
                transfer.wait()
                held = nxt
                received.append(held)
        # Tied to every received block and to the caller's tensors that require a gradient,
        # so that every rank's result has a backward (a rank without output rows included).
        own = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        return self._tie(self._finish(running), received + own)

    # ---- pieces --------------------------------------------------------------------------

    def _out_dim(self, args, cats, red_cat, nout):
        """The values per result row and candidate (d), from a one-row run of the kernel."""
        one = [a[:1] if c in (SR_CAT_I, SR_CAT_J) else a for a, c in zip(args, cats)]
        if any(c in (SR_CAT_I, SR_CAT_J) and a.shape[0] == 0 for a, c in zip(args, cats)):
            one = [a.new_zeros((1,) + tuple(a.shape[1:])) if c in (SR_CAT_I, SR_CAT_J) else a
                   for a, c in zip(args, cats)]
        with torch.no_grad():
            if self.kind in ("min", "max", "kmin"):
                red = "Max_ArgMax" if self.kind == "max" else "Min_ArgMin"
                return self._companion(red)(*one)[0].shape[1]
            return self._g(*one).shape[1]

    def _identity(self, n, d, dtype, dev):
        if self.kind == "sum":
            return (torch.zeros((n, d), dtype=dtype, device=dev),)
        if self.kind == "lse":
            return (torch.full((n, d), -float("inf"), dtype=dtype, device=dev),)
        if self.kind == "ssw":
            return (torch.zeros((n, d), dtype=dtype, device=dev),
                    torch.full((n, 1), -float("inf"), dtype=dtype, device=dev))
        k = self.opt_arg if self.kind == "kmin" else 1
        fill = -float("inf") if self.kind == "max" else float("inf")
        return (torch.full((n, k, d), fill, dtype=dtype, device=dev),
                torch.full((n, k, d), _BIG, dtype=torch.int64, device=dev))

    def _block(self, local, nout, nb, offset, d, dtype, dev, backend):
        """The partial state of this rank's output rows against a block of nb reduced rows
        starting at global row ``offset``."""
        if nout == 0 or nb == 0:
            return self._identity(nout, d, dtype, dev)
        if self.kind in ("sum", "lse"):
            return (self._g(*local, backend=backend).reshape(nout, d),)
        if self.kind == "ssw":
            lse = self._companion("LogSumExp", formula2=None)
            return (self._g(*local, backend=backend).reshape(nout, d),
                    lse(*local, backend=backend).reshape(nout, 1))
        k = min(self.opt_arg, nb) if self.kind == "kmin" else 1
        g = self._companion(_rules.SELECT_RED[self.kind], k if self.kind == "kmin" else None)
        v, i = g(*local, backend=backend)
        v, i = v.reshape(nout, k, d), i.reshape(nout, k, d)
        i = torch.where(i >= 0, i + offset, i)
        kk = self.opt_arg if self.kind == "kmin" else 1
        if k < kk:
            ident = self._identity(nout, d, dtype, dev)
            v = torch.cat([v, ident[0][:, k:]], dim=1)
            i = torch.cat([i, ident[1][:, k:]], dim=1)
        return (v, i)

    def _combine(self, a, b):
        if self.kind == "sum":
            return (a[0] + b[0],)
        if self.kind in ("lse", "ssw"):
            la, lb = a[-1], b[-1]
            m = torch.maximum(la, lb).detach()
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            wa, wb = torch.exp(la - m), torch.exp(lb - m)
            lse = m + torch.log(wa + wb)
            if self.kind == "lse":
                return (lse,)
            return ((wa * a[0] + wb * b[0]) / (wa + wb), lse)
        return self._merge(torch.cat([a[0], b[0]], dim=1), torch.cat([a[1], b[1]], dim=1))

    def _merge(self, v, i):
        """The first K (1 for Min/Max) of the candidates (n, c, d) in symred's order: Min/Max
        NaN first, the K-min family NaN after +inf; then by value, ties by the lower global
        index; padding last. Lexicographic by stable sorts, the last key first."""
        k_out = self.opt_arg if self.kind == "kmin" else 1
        key = v.detach()
        nan = torch.isnan(key)
        pad = i == _BIG
        if self.kind == "kmin":
            cls = torch.where(pad, 2, torch.where(nan, 1, 0))
        else:
            cls = torch.where(pad, 2, torch.where(nan, 0, 1))
        key = torch.where(nan | pad, torch.zeros_like(key), -key if self.kind == "max" else key)
        key = key + 0.0  # -0.0 and 0.0 are equal values
        perm = torch.sort(i, dim=1, stable=True)[1]
        for k in (key, cls):
            perm = torch.gather(perm, 1, torch.sort(torch.gather(k, 1, perm), dim=1,
                                                    stable=True)[1])
        perm = perm[:, :k_out]
        return torch.gather(v, 1, perm), torch.gather(i, 1, perm)

    def _finish(self, state):
        """The user's results from the combined state, shaped as the Genred's."""
        return _rules.finish(self.reduction_op, state)

    def _tie(self, out, received):
        needs = [b for b in received if b.requires_grad]
        if not needs:
            return out
        if isinstance(out, tuple):
            return (_Tie.apply(out[0], *needs), out[1])
        if out.is_floating_point():
            return _Tie.apply(out, *needs)
        return out


class LazyTensor(_storch.LazyTensor):
    """``symred.torch.LazyTensor`` whose reductions run across the ranks of the default process
    group, as :class:`Genred` (each rank's ``Vi`` / ``Vj`` tensors are its own rows). Complex
    LazyTensors and ``solve`` are not supported across ranks."""

    _GENRED = Genred
    _KERNELSOLVE = None


def Vi(x):
    """A variable indexed by i from this rank's ``(n, d)`` rows: ``LazyTensor(x, axis=0)``."""
    return _lazy._vi_vj(LazyTensor, x, 0)


def Vj(x):
    """A variable indexed by j from this rank's ``(m, d)`` rows: ``LazyTensor(x, axis=1)``."""
    return _lazy._vi_vj(LazyTensor, x, 1)


def Pm(x):
    """A parameter (equal on every rank): a ``(d,)`` or 0-D tensor, a list of numbers, or a
    number."""
    return _lazy._pm(LazyTensor, x)


_SHARED = {}


def _shared(g, red, k, f2, kwargs):
    """The symred.torch Genred of ``g``'s formula with another reduction, one per process
    for each formula (each Genred owns a context and its compiled kernels)."""
    key = (g.formula, tuple(g.aliases), g.axis, red, k, f2, tuple(sorted(kwargs.items())))
    c = _SHARED.get(key)
    if c is None:
        c = _SHARED[key] = _storch.Genred(g.formula, g.aliases, reduction_op=red, axis=g.axis,
                                          opt_arg=k, formula2=f2, **kwargs)
    return c


def _rows(args, cats, cat):
    rows = {a.shape[0] for a, c in zip(args, cats) if c == cat}
    if len(rows) > 1:
        raise ValueError(f"the {'Vi' if cat == SR_CAT_I else 'Vj'} tensors have different row "
                         f"counts: {sorted(rows)}")
    if not rows:
        raise ValueError(f"symred.distributed.Genred needs at least one "
                         f"{'Vi' if cat == SR_CAT_I else 'Vj'} tensor")
    return rows.pop()
