"""The comparisons of test_jax_sharding.py, run in a process of its own because JAX reads
XLA_FLAGS (four host devices) when it starts. Prints one JSON object per line:
{"case": ..., "kind": "values" | "indices" | "grad" | "error", ...}; the test asserts them.

Every sharded result is compared with the same Genred run on one device in this process:
values by the largest difference relative to the largest magnitude, indices exactly.
"""

import json
import os
import sys

assert "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, PartitionSpec as P  # noqa: E402

jax.config.update("jax_enable_x64", True)

from symred.jax import Genred  # noqa: E402
from symred.jax_sharding import follow, reduce, sharded  # noqa: E402

K = 3
# One reduction of each partial state (the others differ only in what they hand back).
COMBINED = ["Sum", "LogSumExp", "SumSoftMaxWeight", "Min_ArgMin", "Max_ArgMax", "KMin_ArgKMin"]


def emit(**kw):
    print(json.dumps(kw), flush=True)


_GENREDS = {}


def genreds(axis, dim_b=2):
    """Every reduction, on axis ``axis``: x the output side, y and b the reduced side (made
    once per process: each Genred owns its compiled kernels)."""
    if (axis, dim_b) in _GENREDS:
        return _GENREDS[axis, dim_b]
    o, r = ("Vi", "Vj") if axis == 1 else ("Vj", "Vi")
    al = [f"x = {o}(3)", f"y = {r}(3)", f"b = {r}({dim_b})"]
    # (name, formula, formula2, K): the selections of a vector formula (per coordinate).
    table = [("Sum", "Exp(-SqDist(x, y)) * b", None, None),
             ("LogSumExp", "-SqDist(x, y)", None, None),
             ("SumSoftMaxWeight", "-SqDist(x, y)", "b", None)]
    for red in ("Min", "Max", "ArgMin", "ArgMax", "Min_ArgMin", "Max_ArgMax"):
        table.append((red, "SqDist(x, y) * b", None, None))
    for red in ("KMin", "ArgKMin", "KMin_ArgKMin"):
        table.append((red, "SqDist(x, y) * b", None, K))
    table.append(("KMin_ArgKMin scalar", "SqDist(x, y)", None, K))
    gs = _GENREDS[axis, dim_b] = {
        name: Genred(f, al, reduction_op=name.split()[0], axis=axis, opt_arg=k, formula2=f2)
        for name, f, f2, k in table}
    return gs


def data(nout, nred, dt, seed=0, grid=False, special=False):
    ks = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(ks[0], (nout, 3), dt)
    y = jax.random.normal(ks[1], (nred, 3), dt)
    b = jax.random.uniform(ks[2], (nred, 2), dt, 0.5, 1.5)
    if grid:  # exact ties: integer points, equal weights
        x, y = jnp.round(2 * x), jnp.round(2 * y)
        b = jnp.ones_like(b)
    if special:  # reduced rows 0 and 3 NaN, 1, 2, 4 and 5 +inf (ties), the rest finite
        y = y.at[jnp.array([0, 3])].set(jnp.nan)
        b = b.at[jnp.array([1, 2, 4, 5])].set(jnp.inf)
    return x, y, b


def compare(case, out, ref, dt):
    outs, refs = jax.tree.leaves(out), jax.tree.leaves(ref)
    assert len(outs) == len(refs), case
    for o, r in zip(outs, refs):
        o, r = np.asarray(o), np.asarray(r)
        if o.shape != r.shape:
            emit(case=case, kind="shape", got=list(o.shape), want=list(r.shape))
        elif np.issubdtype(r.dtype, np.integer):
            emit(case=case, kind="indices", mismatches=int((o != r).sum()), dtype=str(o.dtype),
                 want_dtype=str(r.dtype))
        else:
            # NaN and infinities where one device has them, the rest relative to the largest
            same = (np.isnan(o) & np.isnan(r)) | (o == r)
            fin = np.isfinite(r) & np.isfinite(o)
            if not np.all(same | fin):
                emit(case=case, kind="values", rel=float("inf"), tol=0.0)
                continue
            scale = max(float(np.max(np.abs(r[fin]), initial=0.0)), 1e-300)
            diff = float(np.max(np.abs(o[fin] - r[fin]), initial=0.0))
            emit(case=case, kind="values", rel=diff / scale,
                 tol=1e-12 if dt == jnp.float64 else 1e-5)


def mesh_of(shape, names, explicit=True):
    n = int(np.prod(shape))
    types = (AxisType.Explicit if explicit else AxisType.Auto,) * len(shape)
    return jax.make_mesh(shape, names, axis_types=types, devices=jax.devices()[:n])


def forward(tag, mesh, rows, reduced, axis, dt, nout=11, nred=5, names=None, grid=False,
            special=False):
    """All the reductions (or ``names``) in one jitted program, against one device."""
    gs = genreds(axis)
    if names is not None:
        gs = {n: gs[n] for n in names}
    x, y, b = data(nout, nred, dt, grid=grid, special=special)
    fs = {n: sharded(g, mesh, rows=rows, reduced=reduced) for n, g in gs.items()}
    outs = jax.jit(lambda x, y, b: {n: f(x, y, b) for n, f in fs.items()})(x, y, b)
    for n, g in gs.items():
        compare(f"{tag} {n} axis={axis} {jnp.dtype(dt).name}", outs[n], g(x, y, b), dt)


def grads(tag, mesh, rows, reduced, axis, dt, names):
    """jax.grad in x, y and b of sum(out * w) for each reduction of ``names``, all in one
    jitted program, against one device; and a jvp of the Sum."""
    gs = genreds(axis)
    x, y, b = data(11, 5, dt, seed=1)
    fs = {n: sharded(gs[n], mesh, rows=rows, reduced=reduced) for n in names}
    ws = {n: jax.random.normal(jax.random.key(7), jax.eval_shape(gs[n], x, y, b).shape, dt)
          for n in names}

    def loss(fn, w):
        return lambda x, y, b: jnp.sum(fn(x, y, b) * w)

    got = jax.jit(lambda x, y, b: {n: jax.grad(loss(fs[n], ws[n]), argnums=(0, 1, 2))(x, y, b)
                                   for n in names})(x, y, b)
    for n in names:
        want = jax.grad(loss(gs[n], ws[n]), argnums=(0, 1, 2))(x, y, b)
        for name, a, c in zip("xyb", got[n], want):
            compare(f"{tag} grad {n} d/d{name} axis={axis} {jnp.dtype(dt).name}", a, c, dt)
    if "Sum" in names:  # forward mode too
        t = tuple(jnp.ones_like(a) for a in (x, y, b))
        got = jax.jit(lambda *p: jax.jvp(fs["Sum"], p, t)[1])(x, y, b)
        compare(f"{tag} jvp Sum axis={axis}", got, jax.jvp(gs["Sum"], (x, y, b), t)[1], dt)


def vmapped():
    """jax.vmap over the sharded call: over the output side on the ring, over the reduced
    side with the reduced rows sharded."""
    m4 = mesh_of((4,), ("d",))
    x, y, b = data(11, 5, jnp.float64, seed=2)
    xs, ys = jnp.stack([x, 2 * x]), jnp.stack([y, y[::-1]])
    g = genreds(1)["Sum"]
    f = sharded(g, m4, rows="d", reduced="d")
    compare("vmap over x ring Sum", jax.jit(jax.vmap(lambda x: f(x, y, b)))(xs),
            jax.vmap(lambda x: g(x, y, b))(xs), jnp.float64)
    g = genreds(1)["LogSumExp"]
    f = sharded(g, m4, reduced="d")
    compare("vmap over y reduced LogSumExp", jax.jit(jax.vmap(lambda y: f(x, y, b)))(ys),
            jax.vmap(lambda y: g(x, y, b))(ys), jnp.float64)


def followed():
    """follow(): a plain jax.jit on arrays whose Explicit shardings choose the layout, with
    the gradient; and arrays of one side sharded differently."""
    from jax.sharding import NamedSharding
    mesh = mesh_of((4,), ("d",))
    g = genreds(1)["SumSoftMaxWeight"]
    x, y, b = data(12, 8, jnp.float64, seed=3)
    f = follow(g)
    with jax.set_mesh(mesh):
        def put(a, spec):
            return jax.device_put(a, NamedSharding(mesh, spec))

        for tag, xa in (("reduced", put(x, P())), ("ring", put(x, P("d")))):
            ya, ba = put(y, P("d")), put(b, P("d"))
            compare(f"follow {tag} SumSoftMaxWeight", jax.jit(f)(xa, ya, ba), g(x, y, b),
                    jnp.float64)
            got = jax.jit(jax.grad(lambda x, y: f(x, y, ba).sum(), argnums=(0, 1)))(xa, ya)
            want = jax.grad(lambda x, y: g(x, y, b).sum(), argnums=(0, 1))(x, y)
            for name, a, c in zip("xy", got, want):
                compare(f"follow {tag} grad SumSoftMaxWeight d/d{name}", a, c, jnp.float64)
        try:
            jax.jit(f)(put(x, P()), put(y, P("d")), put(b, P()))
            emit(case="follow: one side sharded two ways", kind="error", type=None, message="")
        except ValueError as e:
            emit(case="follow: one side sharded two ways", kind="error", type="ValueError",
                 message=str(e))


def errors():
    mesh = mesh_of((4,), ("d",), explicit=False)
    g = genreds(1)["Sum"]
    x, y, b = data(11, 5, jnp.float64)
    cases = {
        "unknown mesh axis (sharded)": lambda: sharded(g, mesh, reduced="nope"),
        "unknown mesh axis (reduce)": lambda: jax.jit(jax.shard_map(
            lambda x, y, b: reduce(g, x, y, b, axis_name="nope"), mesh=mesh,
            in_specs=(P(), P("d"), P("d")), out_specs=P()))(x, y[:4], b[:4]),
        "K too large": lambda: sharded(Genred("SqDist(x, y)", ["x = Vi(3)", "y = Vj(3)"],
                                              reduction_op="KMin", axis=1, opt_arg=6),
                                       mesh, reduced="d")(x, y),
        "numpy Genred": lambda: sharded(__import__("symred").Genred(
            "SqDist(x, y)", ["x = Vi(3)", "y = Vj(3)"], axis=1), mesh, reduced="d"),
        "nred too large": lambda: jax.jit(jax.shard_map(
            lambda x, y, b: reduce(g, x, y, b, axis_name="d", nred=9), mesh=mesh,
            in_specs=(P(), P("d"), P("d")), out_specs=P()))(x, y[:4], b[:4]),
    }
    for case, f in cases.items():
        try:
            f()
        except Exception as e:  # noqa: BLE001 - the test checks type and message
            emit(case=case, kind="error", type=type(e).__name__, message=str(e))
        else:
            emit(case=case, kind="error", type=None, message="")


def inside_shard_map():
    """reduce() called by the user's own shard_map (Auto mesh), local sizes even."""
    mesh = mesh_of((4,), ("d",), explicit=False)
    g = genreds(1)["LogSumExp"]
    x, y, b = data(8, 12, jnp.float64)
    f = jax.jit(jax.shard_map(lambda x, y, b: reduce(g, x, y, b, axis_name="d",
                                                     out_axis_name="d"),
                              mesh=mesh, in_specs=(P("d"), P("d"), P("d")), out_specs=P("d")))
    compare("user shard_map ring LogSumExp", f(x, y, b), g(x, y, b), jnp.float64)


def main():
    what = sys.argv[1:] or ["all"]
    m4 = mesh_of((4,), ("d",))
    if "all" in what or "forward" in what:
        for dt in (jnp.float64, jnp.float32):
            for axis in (1, 0):
                forward("4 dev ring", m4, "d", "d", axis, dt)
        forward("4 dev reduced", m4, None, "d", 1, jnp.float64)
        forward("4 dev reduced", m4, None, "d", 0, jnp.float64, names=COMBINED)
        forward("4 dev rows", m4, "d", None, 1, jnp.float32,
                names=["Sum", "SumSoftMaxWeight", "ArgKMin"])
        forward("2x2 rows a reduced b", mesh_of((2, 2), ("a", "b")), "a", "b", 1, jnp.float64,
                names=COMBINED)
        forward("4 dev over (a, b) ring", mesh_of((2, 2), ("a", "b")), ("a", "b"), ("a", "b"),
                0, jnp.float64, names=["Sum", "LogSumExp", "Min_ArgMin", "KMin_ArgKMin"])
        for n in (1, 2):
            forward(f"{n} dev ring", mesh_of((n,), ("d",)), "d", "d", 1, jnp.float64,
                    names=["Sum", "SumSoftMaxWeight", "Max_ArgMax", "KMin_ArgKMin"])
        forward("4 dev reduced ties", m4, None, "d", 1, jnp.float64, nout=9, nred=13, grid=True,
                names=["Min_ArgMin", "ArgMax", "KMin_ArgKMin", "KMin_ArgKMin scalar"])
        forward("4 dev ring nan inf", m4, "d", "d", 1, jnp.float64, nred=7, special=True,
                names=COMBINED + ["KMin_ArgKMin scalar"])
        forward("4 dev reduced nan inf", m4, None, "d", 0, jnp.float32, nred=7, special=True,
                names=COMBINED + ["KMin_ArgKMin scalar"])
        forward("auto mesh ring", mesh_of((4,), ("d",), explicit=False), "d", "d", 1,
                jnp.float32, names=["Sum", "ArgKMin"])
    if "all" in what or "grad" in what:
        grads("4 dev ring", m4, "d", "d", 1, jnp.float64,
              ["Sum", "LogSumExp", "SumSoftMaxWeight", "Min", "Max", "KMin"])
        grads("4 dev reduced", m4, None, "d", 0, jnp.float64, ["Sum", "SumSoftMaxWeight", "KMin"])
        grads("2x2", mesh_of((2, 2), ("a", "b")), "a", "b", 1, jnp.float32, ["Sum", "LogSumExp"])
    if "all" in what or "errors" in what:
        errors()
        inside_shard_map()
        vmapped()
        followed()
    if "all" in what or "int32" in what:
        jax.config.update("jax_enable_x64", False)  # int32 indices
        forward("int32 indices reduced", m4, None, "d", 1, jnp.float32,
                names=["Min_ArgMin", "KMin_ArgKMin"])
    emit(case="done", kind="done")


if __name__ == "__main__":
    main()
