"""symred.jax_sharding: symred.jax reductions on arrays sharded over a JAX device mesh.

    from symred.jax import Genred
    from symred.jax_sharding import reduce, sharded

Two ways in:

- :func:`reduce` is called **inside** ``jax.shard_map`` on the local shards, with the names of
  the mesh axes over which the rows are sharded; it returns the results of the local output
  rows, reduced over the reduced rows of every shard.
- :func:`sharded` wraps a Genred into a function of the **global** arrays that runs that
  ``shard_map`` itself over a given mesh (padding the rows to equal shards and cropping the
  result), usable eagerly and under ``jax.jit``.
- :func:`follow` does the same with the layout read from the arguments' types (meshes of
  ``Explicit`` axes), so that a plain ``jax.jit`` partitions the reduction as the data lies.

The collective follows from the reduction's combine rule (the rules of the MPI layer,
docs/scale-out.md): output rows sharded, reduced rows replicated: no communication; reduced
rows sharded: every device reduces its own block and the partial results are combined (Sum:
``psum``; LogSumExp: shift by the maximum, ``pmax`` then ``psum``; SumSoftMaxWeight: the
blocks' averages weighted by their normalisers, with the LogSumExp of the same formula;
Min, Max, ArgMin, ArgMax, the K-min family: ``all_gather`` of every block's candidates with
global indices, then a merge); both sharded over the same mesh axis: a ring of ``ppermute``
transfers of the reduced rows, each block's partial result folded in as it passes.

Uneven shards (decision: padding at the end). ``shard_map`` hands every device a block of
the same size, so rows that do not divide by the number of devices are padded at the end;
``nout`` and ``nred`` tell :func:`reduce` how many rows are real, and a device then runs
its kernel on its real rows only (a ``lax.switch`` over the few block sizes that occur: full,
the partial last one, empty), so padded rows never enter a reduction or a gradient. Block p
holds global rows [p * s, p * s + s) of a side with s rows per shard, and indices are
global positions in that order. :func:`sharded` does the padding.

Gradients: every step is a symred.jax kernel run or a differentiable JAX operation, so
``jax.grad``, ``jax.vjp`` and ``jax.jvp`` work on sharded inputs (the combine rules' shifts
are constants of the derivative). Leading batch dimensions, ``ranges`` and KernelSolve are
not supported sharded.
"""

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from . import _jax_partition as _part
from . import _shard_rules as _rules
from . import jax as _sjax
from ._lib import SR_CAT_I, SR_CAT_J

__all__ = ["follow", "reduce", "sharded"]

# The partial state each user reduction needs, and the kernels that compute it.


def _names(axis):
    """A mesh axis name or a tuple of them, as a tuple (empty for None)."""
    if axis is None:
        return ()
    if isinstance(axis, (tuple, list)):
        return tuple(axis)
    return (axis,)


def _axis_size(names, what):
    name = names if len(names) > 1 else names[0]
    try:
        return int(lax.axis_size(name))
    except NameError as e:
        raise ValueError(f"symred.jax_sharding.reduce: {what}={name!r} is not a mesh axis of "
                         f"the enclosing shard_map ({e})") from None


def _axis_index(names):
    return lax.axis_index(names if len(names) > 1 else names[0])


_companion = _part.companion
_big = _part.big


def _qual(obj):
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class _Plan:
    """What one sharded call needs: the Genred, the categories of its arguments, the local
    and global row counts and the partial-state kind."""

    def __init__(self, genred, args, nout, nred, backend="auto"):
        if not isinstance(genred, _sjax.Genred) or isinstance(genred, _sjax.KernelSolve):
            raise TypeError(f"symred.jax_sharding needs a symred.jax.Genred, not {_qual(genred)}")
        self.g = genred
        self.backend = backend
        self.red = genred.reduction_op
        self.kind = _rules.KIND[self.red]
        self.K = genred.opt_arg
        if genred._batch_shape(list(args)) is not None:
            raise ValueError("symred.jax_sharding: leading batch dimensions are not supported "
                             "sharded; use (n, d) arrays")
        _, dt, nx, ny = genred._prepare(list(args))
        self.dtype = np.dtype(dt)
        self.out_cat = SR_CAT_I if genred.axis == 1 else SR_CAT_J
        self.red_cat = SR_CAT_J if genred.axis == 1 else SR_CAT_I
        self.cats = [genred._args[i].cat if i in genred._args else None
                     for i in range(genred.nargs)]
        self.so, self.sr = (nx, ny) if genred.axis == 1 else (ny, nx)
        self.nout, self.nred = nout, nred
        self.idx_dtype = _sjax._index_dtype()

    # ---- one block ------------------------------------------------------------------

    def slice_args(self, args, vo, vr):
        out = []
        for a, cat in zip(args, self.cats):
            if cat == self.out_cat:
                a = a[:vo]
            elif cat == self.red_cat:
                a = a[:vr]
            out.append(a)
        return out

    def template(self, args):
        """The shapes of the partial state for ``so`` output rows (values per candidate: d)."""
        if self.kind in ("min", "max", "kmin"):
            g = _companion(self.g, "Min_ArgMin" if self.kind != "max" else "Max_ArgMax")
            v, _ = jax.eval_shape(lambda *a: g(*a), *args)
            return v.shape[1]
        if self.kind == "ssw":
            s = jax.eval_shape(lambda *a: self.g(*a), *args)
            return s.shape[1]
        s = jax.eval_shape(lambda *a: self.g(*a), *args)
        return s.shape[1]

    def identity(self, d):
        so, dt = self.so, self.dtype
        if self.kind == "sum":
            return (jnp.zeros((so, d), dt),)
        if self.kind == "lse":
            return (jnp.full((so, d), -jnp.inf, dt),)
        if self.kind == "ssw":
            return (jnp.zeros((so, d), dt), jnp.full((so, 1), -jnp.inf, dt))
        k = 1 if self.kind != "kmin" else self.K
        fill = jnp.inf if self.kind != "max" else -jnp.inf
        return (jnp.full((so, k, d), fill, dt),
                jnp.full((so, k, d), _big(self.idx_dtype), self.idx_dtype))

    def block(self, args, vo, vr, offset, d):
        """The partial state of ``vo`` real output rows against ``vr`` real reduced rows, the
        latter starting at global row ``offset``, padded to ``so`` output rows."""
        ident = self.identity(d)
        if vo == 0 or vr == 0:
            return ident
        a = self.slice_args(args, vo, vr)
        if self.kind in ("sum", "lse"):
            state = (self.g(*a, backend=self.backend).reshape(vo, d),)
        elif self.kind == "ssw":
            lse = _companion(self.g, "LogSumExp", formula2=None)
            state = (self.g(*a, backend=self.backend).reshape(vo, d),
                     lse(*a, backend=self.backend).reshape(vo, 1))
        else:
            k = 1 if self.kind != "kmin" else min(self.K, vr)
            g = _companion(self.g, _rules.SELECT_RED[self.kind],
                           k if self.kind == "kmin" else None)
            v, i = g(*a, backend=self.backend)
            v, i = v.reshape(vo, k, d), i.reshape(vo, k, d)
            i = jnp.where(i >= 0, i + offset.astype(i.dtype), i)
            if k < ident[0].shape[1]:  # a block shorter than K: padded with the identity
                pad = ((0, 0), (0, ident[0].shape[1] - k), (0, 0))
                v = jnp.pad(v, pad, constant_values=ident[0][0, 0, 0])
                i = jnp.pad(i, pad, constant_values=_big(self.idx_dtype))
            state = (v, i)
        if vo < self.so:
            state = tuple(jnp.concatenate([s, e[vo:]], axis=0) for s, e in zip(state, ident))
        return state

    def switch(self, table, index, args, offset, d):
        """The partial state of the block whose (real output rows, real reduced rows) is
        ``table[index]``: a ``lax.switch`` over the distinct pairs (usually one to three)."""
        combos = sorted(set(table))
        if len(combos) == 1:
            return self.block(args, *combos[0], offset, d)
        which = jnp.asarray([combos.index(c) for c in table], dtype=jnp.int32)[index]
        # The operands vary over the same axes before the switch: a cast inside a branch would
        # transpose to a psum that only the devices taking that branch run (a deadlock).
        axes = frozenset().union(*(_varying(a) for a in list(args) + [offset]))
        args = [_vary(a, axes) for a in args]

        def branch(a, off, c):  # every branch's results vary over the same mesh axes
            return tuple(_vary(s, axes) for s in self.block(list(a), c[0], c[1], off, d))

        branches = [lambda a, off, c=c: branch(a, off, c) for c in combos]
        return lax.switch(which, branches, tuple(args), offset)

    # ---- combining ---------------------------------------------------------------------

    def merge(self, vals, idx):
        """The selection of the stacked candidates ``(B, n, k, d)`` with their global indices
        (symred._jax_partition.merge)."""
        return _part.merge(self.kind, self.K, vals, idx, self.idx_dtype)

    def combine_collective(self, state, names):
        """The partial states of the devices along the mesh axes ``names``, combined."""
        return _part.combine(self.kind, self.K, state, names, self.idx_dtype)

    def combine_pair(self, a, b):
        """Two partial states folded into one (the ring's running state)."""
        if a is None:
            return b
        if self.kind == "sum":
            return (a[0] + b[0],)
        if self.kind in ("lse", "ssw"):
            la, lb = a[-1], b[-1]
            m = lax.stop_gradient(jnp.maximum(la, lb))
            m = jnp.where(jnp.isfinite(m), m, 0)
            wa, wb = jnp.exp(la - m), jnp.exp(lb - m)
            lse = m + jnp.log(wa + wb)
            if self.kind == "lse":
                return (lse,)
            return ((wa * a[0] + wb * b[0]) / (wa + wb), lse)
        return self.merge(jnp.stack([a[0], b[0]]), jnp.stack([a[1], b[1]]))

    def finish(self, state):
        """The user's results from the combined state, shaped as the Genred's."""
        return _rules.finish(self.red, state)

def _varying(x):
    """The mesh axes over which ``x`` varies inside shard_map."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)
    return frozenset(mat.varying) if mat is not None else frozenset(getattr(aval, "vma", ()))


def _vary(x, axes):
    missing = tuple(sorted(axes - _varying(x)))
    return lax.pcast(x, missing, to="varying") if missing else x


_valid = _part.valid


def reduce(genred, *args, axis_name=None, out_axis_name=None, nred=None, nout=None,
           backend="auto"):
    """Runs ``genred`` (a :class:`symred.jax.Genred`) inside ``jax.shard_map`` on the local
    shards ``args`` (alias-index order, as a Genred call) and returns the results of the
    local output rows, reduced over the reduced rows of all shards, shaped as the Genred's.

    ``axis_name``: the mesh axis (or tuple of axes) over which the rows of the **reduced**
    side are sharded (the ``Vj`` arrays for ``axis=1``), or None when every device holds all
    of them. ``out_axis_name``: the mesh axis over which the rows of the **output** side are
    sharded, or None; when it is the same as ``axis_name`` the reduced rows travel around a
    ring of the devices (``ppermute``). ``nred`` / ``nout``: the number of real rows of the
    reduced / output side in all (the shards are padded at the end to equal blocks; None:
    every row is real). Indices are global: block p of a side with s rows per shard holds
    rows p * s ... p * s + s - 1.

    Raises ValueError for a mesh axis that the enclosing ``shard_map`` does not have, for
    ``nred`` / ``nout`` larger than the padded rows, K larger than ``nred``, and batch
    dimensions; TypeError when ``genred`` is not a symred.jax Genred."""
    args = [jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
    red_names, out_names = _names(axis_name), _names(out_axis_name)
    pr = _axis_size(red_names, "axis_name") if red_names else 1
    po = _axis_size(out_names, "out_axis_name") if out_names else 1
    plan = _Plan(genred, args, nout, nred, backend)
    so, sr = plan.so, plan.sr
    nred = pr * sr if nred is None else int(nred)
    nout = po * so if nout is None else int(nout)
    if not 0 <= nred <= pr * sr:
        raise ValueError(f"nred = {nred}: the reduced side has {pr} shards of {sr} rows")
    if not 0 <= nout <= po * so:
        raise ValueError(f"nout = {nout}: the output side has {po} shards of {so} rows")
    if plan.kind == "kmin" and plan.K > nred:
        raise ValueError(f"{plan.red}: K = {plan.K} exceeds the {nred} reduced rows")
    if plan.kind in ("min", "max") and nred == 0:
        raise ValueError(f"{plan.red} over no rows: the reduced side is empty")
    ring = bool(red_names) and red_names == out_names
    if red_names and out_names and not ring and set(red_names) & set(out_names):
        raise ValueError(f"the output rows (mesh axes {out_names}) and the reduced rows "
                         f"({red_names}) must be sharded over the same mesh axes or over "
                         f"disjoint ones")
    d = plan.template(args)
    vo_tab, vr_tab = _valid(nout, so, po), _valid(nred, sr, pr)
    io = _axis_index(out_names) if out_names else 0
    if not ring:
        ir = _axis_index(red_names) if red_names else 0
        table = [(vo, vr) for vo in vo_tab for vr in vr_tab]
        index = io * pr + ir if pr > 1 else io
        state = plan.switch(table, index, args, jnp.asarray(ir * sr), d)
        if red_names:
            state = plan.combine_collective(state, red_names)
        return plan.finish(state)
    # The ring: at step t this device holds the reduced rows of shard (io - t) mod P.
    ax = red_names if len(red_names) > 1 else red_names[0]
    perm = [(p, (p + 1) % pr) for p in range(pr)]
    held = list(args)
    running = None
    for t in range(pr):
        src = (io - t) % pr
        table = [(vo_tab[r], vr_tab[(r - t) % pr]) for r in range(pr)]
        nxt = held
        if t + 1 < pr:  # issued before this step's kernel, so the transfer can overlap it
            nxt = [lax.ppermute(a, ax, perm) if c == plan.red_cat else a
                   for a, c in zip(held, plan.cats)]
        state = plan.switch(table, io, held, src * sr, d)
        running = plan.combine_pair(running, state)
        held = nxt
    return plan.finish(running)


def sharded(genred, mesh, *, rows=None, reduced=None, backend="auto"):
    """``genred`` as a function of the **global** arrays, run over ``mesh`` with the rows of
    the output side sharded over the mesh axis ``rows`` and those of the reduced side over
    ``reduced`` (either may be None: replicated). The rows are padded at the end to equal
    shards and the result cropped; parameters are replicated. Usable eagerly and inside
    ``jax.jit`` / ``jax.grad``; returns the Genred's results on the global rows."""
    if not isinstance(genred, _sjax.Genred):
        raise TypeError(f"symred.jax_sharding.sharded needs a symred.jax.Genred, not "
                        f"{_qual(genred)}")
    for what, names in (("rows", _names(rows)), ("reduced", _names(reduced))):
        for n in names:
            if n not in mesh.shape:
                raise ValueError(f"{what}={n!r} is not an axis of the mesh (axes: "
                                 f"{', '.join(map(repr, mesh.axis_names))})")

    def size(names):
        return int(np.prod([mesh.shape[n] for n in names])) if names else 1

    def spec(names):
        return PartitionSpec(names if len(names) > 1 else names[0]) if names else PartitionSpec()

    def call(*args):
        args = [jnp.asarray(a) for a in args]
        plan = _Plan(genred, args, None, None)
        nout, nred = plan.so, plan.sr
        names = {plan.out_cat: _names(rows), plan.red_cat: _names(reduced)}
        blocks = {plan.out_cat: -(-nout // size(names[plan.out_cat])),
                  plan.red_cat: -(-nred // size(names[plan.red_cat]))}
        padded, specs = [], []
        for a, cat in zip(args, plan.cats):
            if cat in names:
                rows_to = blocks[cat] * size(names[cat])
                if rows_to > a.shape[0]:
                    a = jnp.pad(a, ((0, rows_to - a.shape[0]), (0, 0)))
                s = spec(names[cat])
            else:
                s = PartitionSpec()
            padded.append(jax.sharding.reshard(a, NamedSharding(mesh, s))
                          if _explicit(mesh) else a)
            specs.append(s)
        out_spec = spec(names[plan.out_cat])
        two = plan.red in ("Min_ArgMin", "Max_ArgMax", "KMin_ArgKMin")
        body = jax.shard_map(
            lambda *a: reduce(genred, *a, axis_name=reduced, out_axis_name=rows, nred=nred,
                              nout=nout, backend=backend),
            mesh=mesh, in_specs=tuple(specs), out_specs=(out_spec, out_spec) if two else out_spec)
        out = body(*padded)

        def crop(o):
            if o.shape[0] == nout:
                return o
            if _explicit(mesh):  # an explicitly sharded array cannot be cut unevenly
                o = jax.sharding.reshard(o, NamedSharding(mesh, PartitionSpec()))
            return o[:nout]

        return tuple(crop(o) for o in out) if two else crop(out)

    return call


def _explicit(mesh):
    types = getattr(mesh, "axis_types", ())
    return any(t == jax.sharding.AxisType.Explicit for t in types)


def follow(genred):
    """``genred`` as a function that follows the shardings of its arguments' types: on a mesh
    of ``Explicit`` axes (``jax.make_mesh``'s default; under ``jax.set_mesh``), where every
    array's type carries its sharding, the mesh axis over which the rows of the output side's
    arrays are sharded and the one of the reduced side's are read at trace time and the call
    runs as :func:`sharded` with them; with no sharded rows, as ``genred`` itself. So a plain
    ``jax.jit`` of a function that calls it partitions by the inputs' shardings. The arrays of
    one side must be sharded alike (ValueError otherwise)."""
    if not isinstance(genred, _sjax.Genred):
        raise TypeError(f"symred.jax_sharding.follow needs a symred.jax.Genred, not "
                        f"{_qual(genred)}")

    def call(*args, backend="auto"):
        args = [jnp.asarray(a) for a in args]
        plan = _Plan(genred, args, None, None, backend)
        axes, mesh = {plan.out_cat: set(), plan.red_cat: set()}, None
        for a, cat in zip(args, plan.cats):
            if cat not in axes:
                continue
            sh = getattr(jax.typeof(a), "sharding", None)
            spec = tuple(sh.spec) if sh is not None else ()
            first = spec[0] if spec else None
            axes[cat].add(tuple(first) if isinstance(first, (tuple, list)) else first)
            if first is not None:
                mesh = sh.mesh
            if any(s is not None for s in spec[1:]):
                raise ValueError("symred.jax_sharding.follow: only the rows (first dimension) "
                                 "of an array may be sharded")
        for cat, found in axes.items():
            if len(found) > 1:
                side = "output" if cat == plan.out_cat else "reduced"
                raise ValueError(f"symred.jax_sharding.follow: the {side} side's arrays are "
                                 f"sharded differently ({sorted(map(str, found))})")
        rows = next(iter(axes[plan.out_cat]), None)
        reduced = next(iter(axes[plan.red_cat]), None)
        if mesh is None:
            return genred(*args, backend=backend)
        return sharded(genred, mesh, rows=rows, reduced=reduced, backend=backend)(*args)

    return call
