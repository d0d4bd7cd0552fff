"""symred.jax's custom call, partitioned by XLA: the lowering of every symred.jax kernel run
goes through ``jax.experimental.custom_partitioning``, so that a plain ``jax.jit`` over arrays
sharded on a mesh (of ``Auto`` axes, or any NamedSharding) runs the reduction where the data
lies instead of gathering every argument onto every device.

The layout is read from the shardings XLA proposes for the arguments: the mesh axes of the
rows of the output side's arrays (the ``Vi`` arrays of a reduction over j) and those of the
reduced side's. Output rows sharded: every device runs the kernel on its rows, no
communication. Reduced rows sharded: every device reduces its block and the partial results
combine by the reduction's rule (:func:`combine`), inside the partitioned function, through
``jax.lax`` collectives over the mesh axes. Both sides sharded over the same axes (or
overlapping ones): the reduced side is gathered, then as the output rows only (a gather, not
the ring of symred.jax_sharding: one collective that XLA schedules, with the same transfer
volume as the ring, where a ring inside one custom call would serialise P kernel runs with
their transfers; the cost is the reduced side's memory on every device, which
``symred.jax_sharding.sharded(..., rows=, reduced=)`` avoids). Feature dimensions and
parameters are replicated.

Rows that do not divide: XLA gives every device a block of ceil(n / P) rows, the last ones
padded; a device runs its kernel on its real rows only (a ``lax.switch`` over the few block
sizes, as in symred.jax_sharding), so padded rows never enter a reduction. Calls with
block-sparse ranges (``ranges=``, and ``jax.vmap``'s batched calls, which are ranged) are not
partitioned: XLA gathers their arguments, as for any custom call.

Under Shardy (``jax_use_shardy_partitioner``, the default of recent JAX) the rule given to
XLA is a ``sharding_rule`` (a factor for the output rows, one for the reduced rows, one for
each feature dimension); under GSPMD, ``infer_sharding_from_operands``. Both end in the same
``partition``.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from . import _shard_rules as _rules
from . import jax as _sjax
from ._lib import SR_CAT_I, SR_CAT_J

_SHARED = {}


def companion(genred, red, k=None, formula2="same"):
    """A symred.jax Genred of the same formula with reduction ``red``: ``genred`` itself, or
    one per process for each formula and reduction (each Genred owns a context and its
    compiled kernels)."""
    f2 = genred.formula2 if formula2 == "same" else formula2
    if red == genred.reduction_op and k == genred.opt_arg and f2 == genred.formula2:
        return genred
    key = (genred.formula, tuple(genred.aliases), genred.axis, red, k, f2, genred.dtype,
           genred.dtype_acc, genred.sum_scheme)
    g = _SHARED.get(key)
    if g is None:
        g = _SHARED[key] = _sjax.Genred(genred.formula, genred.aliases, reduction_op=red,
                                        axis=genred.axis, dtype=genred.dtype, opt_arg=k,
                                        formula2=f2, dtype_acc=genred.dtype_acc,
                                        sum_scheme=genred.sum_scheme)
    return g


def big(dtype):
    """The index of a padding candidate: after every real one."""
    return jnp.iinfo(dtype).max


def merge(kind, K, vals, idx, idx_dtype):
    """The selection of the stacked candidates ``(B, n, k, d)`` with their global indices:
    the first ``K`` (1 for Min/Max) in symred's order (Min/Max: NaN first, then by value;
    K-min: by value, NaN after +inf; ties by the lower global index; padding last)."""
    B, n, k, d = vals.shape
    k_out = 1 if kind != "kmin" else K
    v = jnp.moveaxis(vals, 0, 2).reshape(n, k * B, d)  # block order keeps indices ordered
    i = jnp.moveaxis(idx, 0, 2).reshape(n, k * B, d)
    v = jnp.moveaxis(v, 1, 2)
    i = jnp.moveaxis(i, 1, 2)  # (n, d, B*k)
    key = lax.stop_gradient(v)
    nan = jnp.isnan(key)
    pad = i == big(idx_dtype)
    if kind == "kmin":
        cls = jnp.where(pad, 2, jnp.where(nan, 1, 0))
    else:
        cls = jnp.where(pad, 2, jnp.where(nan, 0, 1))
    key = jnp.where(nan | pad, 0, key if kind != "max" else -key) + 0.0  # -0 == 0
    iota = lax.broadcasted_iota(jnp.int32, key.shape, 2)
    perm = lax.sort((cls.astype(jnp.int32), key, i, iota), dimension=2, num_keys=3)[3]
    perm = perm[:, :, :k_out]
    v = jnp.take_along_axis(v, perm, axis=2)
    i = jnp.take_along_axis(i, perm, axis=2)
    return jnp.moveaxis(v, 2, 1), jnp.moveaxis(i, 2, 1)  # (n, k_out, d)


def combine(kind, K, state, names, idx_dtype, to_invarying=True):
    """The partial states of the devices along the mesh axes ``names``, combined: Sum by
    ``psum``; LogSumExp and SumSoftMaxWeight shifted by the ``pmax`` of the blocks'
    LogSumExp (a constant of the derivative); the selections by an ``all_gather`` of every
    block's candidates, then :func:`merge`."""
    ax = names if len(names) > 1 else names[0]
    if kind == "sum":
        return (lax.psum(state[0], ax),)
    if kind in ("lse", "ssw"):
        lse = state[-1]
        m = lax.pmax(lax.stop_gradient(lse), ax)
        m = jnp.where(jnp.isfinite(m), m, 0)
        w = jnp.exp(lse - m)
        if kind == "lse":
            return (m + jnp.log(lax.psum(w, ax)),)
        tot = lax.psum(w, ax)
        return (lax.psum(w * state[0], ax) / tot, m + jnp.log(tot))
    # Invariant over the axes afterwards: every device merges the same candidates.
    kw = {"to": "invarying"} if to_invarying else {}
    vals = lax.all_gather(state[0], ax, **kw)
    idx = lax.all_gather(state[1], ax, **kw)
    return merge(kind, K, vals, idx, idx_dtype)


def valid(total, per, parts):
    """The real rows of each of ``parts`` blocks of ``per`` rows holding ``total`` rows."""
    return [int(min(max(total - p * per, 0), per)) for p in range(parts)]


# ---- the partitioned kernel run ---------------------------------------------------------


def _spec(names):
    return None if not names else names[0] if len(names) == 1 else tuple(names)


def _rows_axes(sharding):
    """The mesh axes over which the rows (first dimension) of an array are sharded."""
    spec = getattr(sharding, "spec", None)
    if not spec:
        return ()
    first = spec[0]
    if first is None:
        return ()
    return tuple(first) if isinstance(first, (tuple, list)) else (first,)


class _Layout:
    """How one kernel run is split over a mesh: the mesh axes of the output rows and of the
    reduced rows, from the shardings proposed for its arguments (the first sharded array of
    each side decides; the others are resharded to match)."""

    def __init__(self, call, mesh, shardings, result_shardings=()):
        kern = call.kern
        self.call, self.kern, self.mesh = call, kern, mesh
        self.cats = [kern.vars.get(i, (None,))[0] for i in range(kern.nargs)]
        self.out_cat = SR_CAT_I if kern.axis == 1 else SR_CAT_J
        self.red_cat = SR_CAT_J if kern.axis == 1 else SR_CAT_I
        named = isinstance(mesh, jax.sharding.Mesh) and not mesh.empty
        if not named:  # shardings without a mesh to name their axes: nothing is split
            devices = next(getattr(s, "_device_assignment", None) for s in shardings)
            self.mesh = jax.sharding.Mesh(np.array(devices), ("symred_replicated",))

        def side(cat, extra=()):
            for s, c in list(zip(shardings, self.cats)) + [(r, cat) for r in extra]:
                if c == cat and named and isinstance(s, NamedSharding):
                    axes = _rows_axes(s)
                    if axes:
                        return axes
            return ()

        self.out_axes = side(self.out_cat, result_shardings)
        self.red_axes = side(self.red_cat)
        if set(self.out_axes) & set(self.red_axes):
            self.red_axes = ()  # both sides over the same axes: the reduced side gathered

    def size(self, names):
        return int(np.prod([self.mesh.shape[n] for n in names])) if names else 1

    def sharding(self, names):
        return NamedSharding(self.mesh, PartitionSpec(_spec(names), None))

    def arg_shardings(self, arg_shapes):
        out = []
        for a, cat in zip(arg_shapes, self.cats):
            if cat == self.out_cat and len(a.shape) == 2:
                out.append(self.sharding(self.out_axes))
            elif cat == self.red_cat and len(a.shape) == 2:
                out.append(self.sharding(self.red_axes))
            else:
                out.append(NamedSharding(self.mesh, PartitionSpec()))
        return tuple(out)

    def result_shardings(self, n):
        return tuple(self.sharding(self.out_axes) for _ in range(n))


def _kind(kern):
    return _rules.KIND[kern.red]


def _selection_kernel(kern, k):
    """The kernel that gives a block's candidates, values and indices, with ``k`` of them."""
    kind = _kind(kern)
    red = _rules.SELECT_RED[kind]
    K = kern.owner.opt_arg if kind == "kmin" else None
    if kern.red == red and k == (K or 1):
        return kern
    return companion(kern.owner, red, k if kind == "kmin" else None)._jax_kernel(*kern.make)


class _Shard:
    """The per-device function of one partitioned kernel run."""

    def __init__(self, layout):
        self.lay, self.call, self.kern = layout, layout.call, layout.kern
        self.kind = _kind(self.kern)
        self.idx_dtype = _sjax._index_dtype()
        kern = self.kern
        self.dt = jnp.float64 if kern.desc[0] == _sjax.SR_F64 else jnp.float32
        self.K = kern.owner.opt_arg if self.kind == "kmin" else 1
        self.d = kern.out_dim // self.K  # values per candidate

    def identity(self, so):
        kind, d, dt = self.kind, self.kern.out_dim, self.dt
        if kind == "sum":
            return (jnp.zeros((so, d), dt),)
        if kind == "lse":
            return (jnp.full((so, d), -jnp.inf, dt),)
        if kind == "ssw":
            return (jnp.zeros((so, d), dt), jnp.full((so, 1), -jnp.inf, dt))
        fill = jnp.inf if kind != "max" else -jnp.inf
        shape = (so, self.K, self.d)
        return (jnp.full(shape, fill, dt), jnp.full(shape, big(self.idx_dtype), self.idx_dtype))

    def run(self, kern, args, vo, vr):
        nx, ny = (vo, vr) if kern.axis == 1 else (vr, vo)
        return _sjax._ffi(_sjax._Call(kern, nx, ny), list(args[: kern.nargs]))

    def block(self, args, so, vo, vr, offset):
        """The partial state of ``vo`` real output rows against ``vr`` real reduced rows (the
        latter from global row ``offset``), padded to ``so`` output rows."""
        ident = self.identity(so)
        if vo == 0 or vr == 0:
            return ident
        lay = self.lay
        a = [x[:vo] if c == lay.out_cat and x.ndim == 2 else
             x[:vr] if c == lay.red_cat and x.ndim == 2 else x
             for x, c in zip(args, lay.cats)]
        if self.kind in ("sum", "lse"):
            state = (self.run(self.kern, a, vo, vr)[0],)
        elif self.kind == "ssw":
            state = (self.run(self.kern, a, vo, vr)[0],
                     self.run(self.kern.logsumexp(), a, vo, vr)[0])
        else:
            k = min(self.K, vr)
            v, i = self.run(_selection_kernel(self.kern, k), a, vo, vr)
            v, i = v.reshape(vo, k, self.d), i.reshape(vo, k, self.d)
            i = jnp.where(i >= 0, i + offset.astype(i.dtype), i)
            if k < self.K:  # a block shorter than K: padded with the identity
                pad = ((0, 0), (0, self.K - k), (0, 0))
                v = jnp.pad(v, pad, constant_values=ident[0][0, 0, 0])
                i = jnp.pad(i, pad, constant_values=big(self.idx_dtype))
            state = (v, i)
        if vo < so:
            state = tuple(jnp.concatenate([s, e[vo:]], axis=0) for s, e in zip(state, ident))
        return state

    def __call__(self, *args):
        lay, call = self.lay, self.call
        po, pr = lay.size(lay.out_axes), lay.size(lay.red_axes)
        nout, nred = call.nout, call.nred
        so, sr = -(-nout // po), -(-nred // pr)
        vo_tab, vr_tab = valid(nout, so, po), valid(nred, sr, pr)
        io = lax.axis_index(_spec(lay.out_axes)) if lay.out_axes else 0
        ir = lax.axis_index(_spec(lay.red_axes)) if lay.red_axes else 0
        table = [(vo, vr) for vo in vo_tab for vr in vr_tab]
        combos = sorted(set(table))
        offset = jnp.asarray(ir * sr)
        if len(combos) == 1:
            state = self.block(args, so, *combos[0], offset)
        else:
            which = jnp.asarray([combos.index(c) for c in table], jnp.int32)[io * pr + ir]
            branches = [lambda a, off, c=c: self.block(list(a), so, c[0], c[1], off)
                        for c in combos]
            state = lax.switch(which, branches, tuple(args), offset)
        if lay.red_axes:
            state = combine(self.kind, self.K, state, lay.red_axes, self.idx_dtype,
                            to_invarying=False)
        return self.results(state, so)

    def results(self, state, so):
        red = self.kern.red
        if self.kind in ("sum", "lse", "ssw"):
            return (state[0],)
        v, i = (s.reshape(so, self.K * self.d) for s in state)
        return (i,) if red in _sjax._INDEX_ONLY else (v, i)


def _partition(call, mesh, arg_shapes, result_shape):
    lay = _Layout(call, mesh, [a.sharding for a in arg_shapes],
                  [r.sharding for r in result_shape])
    return (lay.mesh, _Shard(lay), lay.result_shardings(len(result_shape)),
            lay.arg_shardings(arg_shapes))


def _infer(call, mesh, arg_shapes, result_shape):
    lay = _Layout(call, mesh, [a.sharding for a in arg_shapes])
    return lay.result_shardings(len(result_shape))


def _rule(call, mesh, operand_types, result_types):
    """Shardy's rule: ``i`` the output rows, ``j`` the reduced rows, a factor of its own for
    every other dimension (those must stay replicated)."""
    kern = call.kern
    out_cat = SR_CAT_I if kern.axis == 1 else SR_CAT_J
    own, ops = [], []
    for n, t in enumerate(operand_types):
        cat = kern.vars.get(n, (None,))[0]
        dims = []
        for d in range(len(t.shape)):
            if d == 0 and len(t.shape) == 2 and cat in (SR_CAT_I, SR_CAT_J):
                dims.append("i" if cat == out_cat else "j")
            else:
                own.append(f"f{len(own)}")
                dims.append(own[-1])
        ops.append(" ".join(dims) if dims else "")
    res = []
    for _ in result_types:
        own.append(f"f{len(own)}")
        res.append(f"i {own[-1]}")
    rule = ", ".join(ops) + " -> " + ", ".join(res)
    return rule, {"need_replication_factors": tuple(own)}


def _body(call, *args):
    return _sjax._ffi(call, args)


_run = custom_partitioning(_body, static_argnums=(0,))
_run.def_partition(partition=_partition, infer_sharding_from_operands=_infer,
                   sharding_rule=_rule)


def partitioned(call, args):
    """One kernel run (the custom call) that XLA partitions by the rules above; a call with
    block-sparse ranges is the custom call alone."""
    if call.ranges is not None:
        return _sjax._ffi(call, args)
    return tuple(_run(call, *args))
