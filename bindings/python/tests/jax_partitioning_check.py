"""The comparisons of test_jax_partitioning.py: plain ``jax.jit`` of symred.jax Genreds on
arrays sharded over meshes of Auto axes (XLA partitions symred's custom call through
custom_partitioning), run in a process of its own because JAX reads XLA_FLAGS (four host
devices) when it starts. Prints one JSON object per line; the test asserts them.

Every result is compared with the same Genred on one device in this process: values by the
largest difference relative to the largest magnitude, indices exactly.
"""

import os
import re
import sys

assert "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

jax.config.update("jax_enable_x64", True)

from jax_sharding_check import COMBINED, compare, data, emit, genreds  # noqa: E402

wsc = jax.lax.with_sharding_constraint


def mesh_of(shape, names):
    n = int(np.prod(shape))
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape),
                         devices=jax.devices()[:n])


LAYOUTS = {"rows": (P("d"), P()), "reduced": (P(), P("d")), "both": (P("d"), P("d"))}


def sharded_fn(fn, mesh, specs, put):
    """``fn`` of (x, y, b) under a plain jax.jit, with x sharded as specs[0] and y, b as
    specs[1]: device_put when the rows divide, else a sharding constraint inside the jit
    (XLA pads the last blocks)."""
    sx, sy = (NamedSharding(mesh, s) for s in specs)
    if put:
        return jax.jit(fn), lambda x, y, b: (jax.device_put(x, sx), jax.device_put(y, sy),
                                             jax.device_put(b, sy))
    return (jax.jit(lambda x, y, b: fn(wsc(x, sx), wsc(y, sy), wsc(b, sy))),
            lambda x, y, b: (x, y, b))


def forward(tag, mesh, layout, axis, dt, nout, nred, names=None):
    """All the reductions (or ``names``) in one jitted program, against one device."""
    gs = genreds(axis)
    if names is not None:
        gs = {n: gs[n] for n in names}
    x, y, b = data(nout, nred, dt)
    n = mesh.size
    put = nout % n == 0 and nred % n == 0
    f, prep = sharded_fn(lambda x, y, b: {k: g(x, y, b) for k, g in gs.items()}, mesh,
                         LAYOUTS[layout], put)
    outs = f(*prep(x, y, b))
    for k, g in gs.items():
        compare(f"{tag} {layout} {k} axis={axis} {jnp.dtype(dt).name} {nout}x{nred}", outs[k],
                g(x, y, b), dt)


def gathers(txt):
    """The shapes of the all-gathers of a compiled HLO text."""
    return re.findall(r"= \w+\[([\d,]*)\][^ ]* all-gather(?:-start)?\(", txt)


def hlo():
    """The compiled programs, with the operand shapes of every FFI call and the shapes of the
    all-gathers: rows sharded, a block of x against all of y, no all-gather (divisible sizes)
    or only of the output (11 rows: the jit's output is replicated); reduced rows sharded,
    all of x against a block of y, an all-reduce; both sharded, y gathered."""
    mesh = mesh_of((4,), ("d",))
    g = genreds(1)["Sum"]
    for nout, nred in ((12, 8), (11, 5)):
        put = nout % 4 == 0
        for layout in ("rows", "reduced", "both")[: 3 if put else 2]:
            x, y, b = data(nout, nred, jnp.float64)
            f, prep = sharded_fn(g, mesh, LAYOUTS[layout], put)
            args = prep(x, y, b)
            out = f(*args)
            txt = f.lower(*args).compile().as_text()
            calls = [re.findall(r"\[([\d,]*)\]", c) for c in re.findall(
                r"custom_call_target=\"symred_reduce\", operand_layout_constraints=\{(.*?)\}\}",
                txt)]
            emit(case=f"hlo {layout} {nout}x{nred}", kind="hlo", gathers=gathers(txt),
                 all_reduce="all-reduce" in txt, calls=calls,
                 out_spec=str(out.sharding.spec) if put else None)
            compare(f"hlo {layout} Sum {nout}x{nred}", out, g(x, y, b), jnp.float64)


def grads(tag, mesh, layout, axis, dt, names, nout=11, nred=5):
    """jax.grad in x, y and b of sum(out * w), all in one jitted program, against one device;
    and a jvp of the Sum."""
    gs = genreds(axis)
    x, y, b = data(nout, nred, dt, seed=1)
    ws = {n: jax.random.normal(jax.random.key(7), jax.eval_shape(gs[n], x, y, b).shape, dt)
          for n in names}
    sx, sy = (NamedSharding(mesh, s) for s in LAYOUTS[layout])

    def loss(n):
        return lambda x, y, b: jnp.sum(gs[n](wsc(x, sx), wsc(y, sy), wsc(b, sy)) * ws[n])

    got = jax.jit(lambda x, y, b: {n: jax.grad(loss(n), argnums=(0, 1, 2))(x, y, b)
                                   for n in names})(x, y, b)
    for n in names:
        want = jax.grad(lambda x, y, b: jnp.sum(gs[n](x, y, b) * ws[n]),
                        argnums=(0, 1, 2))(x, y, b)
        for name, a, c in zip("xyb", got[n], want):
            compare(f"{tag} {layout} grad {n} d/d{name} axis={axis} {jnp.dtype(dt).name}", a, c,
                    dt)
    if "Sum" in names:
        t = tuple(jnp.ones_like(a) for a in (x, y, b))
        g = gs["Sum"]
        got = jax.jit(lambda *p: jax.jvp(lambda x, y, b: g(wsc(x, sx), wsc(y, sy), wsc(b, sy)),
                                         p, t)[1])(x, y, b)
        compare(f"{tag} {layout} jvp Sum axis={axis}", got, jax.jvp(g, (x, y, b), t)[1], dt)


def vmapped():
    """jax.vmap over x under a jit with y sharded: the batched call is ranged, not
    partitioned (XLA gathers its arguments), and still right."""
    mesh = mesh_of((4,), ("d",))
    x, y, b = data(11, 8, jnp.float64, seed=2)
    xs = jnp.stack([x, 2 * x])
    ya, ba = (jax.device_put(a, NamedSharding(mesh, P("d"))) for a in (y, b))
    for n in ("Sum", "ArgKMin"):
        g = genreds(1)[n]
        compare(f"vmap over x reduced {n}", jax.jit(jax.vmap(lambda x: g(x, ya, ba)))(xs),
                jax.vmap(lambda x: g(x, y, b))(xs), jnp.float64)


def inside_shard_map():
    """A plain Genred call inside the user's shard_map: the local shards' reduction."""
    mesh = mesh_of((4,), ("d",))
    g = genreds(1)["LogSumExp"]
    x, y, b = data(8, 12, jnp.float64)
    f = jax.jit(jax.shard_map(lambda x, y, b: g(x, y, b), mesh=mesh,
                              in_specs=(P("d"), P(), P()), out_specs=P("d")))
    compare("user shard_map rows LogSumExp", f(x, y, b), g(x, y, b), jnp.float64)


def main():
    m4 = mesh_of((4,), ("d",))
    for axis, names in ((1, None), (0, COMBINED + ["ArgMin", "ArgKMin"])):
        for layout in LAYOUTS:
            forward("4 dev", m4, layout, axis, jnp.float64, 11, 5, names)
    for layout in LAYOUTS:
        forward("4 dev", m4, layout, 1, jnp.float32, 12, 8)
    for n in (1, 2):
        forward(f"{n} dev", mesh_of((n,), ("d",)), "reduced", 1, jnp.float64, 7, 5,
                ["Sum", "SumSoftMaxWeight", "KMin_ArgKMin"])
    hlo()
    grads("4 dev", m4, "rows", 1, jnp.float64, ["Sum", "LogSumExp", "SumSoftMaxWeight",
                                                 "Min", "KMin"])
    grads("4 dev", m4, "reduced", 1, jnp.float64, ["Sum", "LogSumExp", "SumSoftMaxWeight",
                                                    "Max", "KMin"])
    grads("4 dev", m4, "reduced", 0, jnp.float32, ["Sum", "SumSoftMaxWeight"])
    vmapped()
    inside_shard_map()
    # A 2 x 2 mesh: output rows over one axis, reduced rows over the other.
    mesh = mesh_of((2, 2), ("a", "b"))
    LAYOUTS["2x2"] = (P("a"), P("b"))
    forward("2x2 rows a reduced b", mesh, "2x2", 1, jnp.float64, 11, 5,
            ["Sum", "LogSumExp", "Min_ArgMin", "KMin_ArgKMin"])
    del LAYOUTS["2x2"]
    # GSPMD, the partitioner before Shardy: infer_sharding_from_operands, same partition.
    jax.config.update("jax_use_shardy_partitioner", False)
    for layout in ("rows", "reduced"):
        forward("gspmd 4 dev", m4, layout, 1, jnp.float64, 11, 5,
                ["Sum", "SumSoftMaxWeight", "ArgKMin"])
    jax.config.update("jax_use_shardy_partitioner", True)
    jax.config.update("jax_enable_x64", False)  # int32 indices
    forward("int32 indices 4 dev", m4, "reduced", 1, jnp.float32, 11, 5,
            ["Min_ArgMin", "KMin_ArgKMin"])
    emit(case="done", kind="done", shardy=bool(jax.config.jax_use_shardy_partitioner))


if __name__ == "__main__":
    sys.exit(main())
