"""symred.jax_sharding on four host devices (XLA_FLAGS=--xla_force_host_platform_device_count=4,
which JAX reads when it starts: jax_sharding_check.py runs once, in a process of its own, and
compares every sharded result with the same Genred on one device; the tests here assert what
it printed).

Covered: every reduction on both axes in float32 and float64 with the reduced rows and the
output rows both sharded (the ring) on 4 devices; the reduced rows sharded (collectives):
every reduction on axis 1, each kind of partial state on axis 0; the output rows only; a 2 x 2 mesh (output rows over one axis, reduced rows over the
other) and a ring over both axes; 1 and 2 devices; sizes that do not divide (11 output rows
and 5 reduced rows on 4 devices: blocks of 3, 3, 3, 2 and 2, 2, 1, 0, an empty one); exact
ties on an integer grid (indices equal); int32 indices without x64; an Auto mesh and the
user's own shard_map; jax.vmap over the sharded call; follow() under a plain jax.jit
(the layout read from the arrays' Explicit shardings) with its gradient; gradients (jax.grad in x, y and b) of Sum, LogSumExp,
SumSoftMaxWeight, Min, Max and KMin, and a jvp; the errors.
"""

import pytest

pytest.importorskip("jax")

from helpers import bad_rows as _bad, run_check  # noqa: E402

REDUCTIONS = ["Sum", "LogSumExp", "SumSoftMaxWeight", "Min", "Max", "ArgMin", "ArgMax",
              "Min_ArgMin", "Max_ArgMax", "KMin", "ArgKMin", "KMin_ArgKMin"]


@pytest.fixture(scope="module")
def results():
    return run_check("jax_sharding_check.py")


def test_values_and_indices_equal_one_device(results):
    forward = [r for r in results if " grad " not in r["case"] and r["kind"] != "error"]
    assert len(forward) > 120
    assert _bad(forward) == []


def test_every_reduction_both_axes_both_dtypes_on_the_ring(results):
    cases = {r["case"] for r in results}
    for red in REDUCTIONS:
        for axis in (0, 1):
            for dt in ("float32", "float64"):
                assert f"4 dev ring {red} axis={axis} {dt}" in cases
        assert f"4 dev reduced {red} axis=1 float64" in cases
    for red in ("Sum", "LogSumExp", "SumSoftMaxWeight", "Min_ArgMin", "Max_ArgMax",
                "KMin_ArgKMin"):
        assert f"4 dev reduced {red} axis=0 float64" in cases


def test_ties_give_the_lowest_global_index(results):
    ties = [r for r in results if r["case"].startswith("4 dev reduced ties")]
    assert len([r for r in ties if r["kind"] == "indices"]) == 4
    assert _bad(ties) == []


def test_nan_and_infinities_as_on_one_device(results):
    cases = [r for r in results if " nan inf " in r["case"]]
    assert len(cases) >= 2 * 11
    assert _bad(cases) == []


def test_one_two_and_four_devices_and_two_dimensional_meshes(results):
    cases = [r["case"] for r in results]
    for tag in ("1 dev ring", "2 dev ring", "2x2 rows a reduced b", "4 dev over (a, b) ring",
                "4 dev rows", "auto mesh ring", "int32 indices reduced", "user shard_map",
                "vmap over x ring", "vmap over y reduced",
                "follow reduced", "follow ring", "follow ring grad"):
        assert any(c.startswith(tag) for c in cases), tag


def test_gradients_equal_one_device(results):
    grads = [r for r in results if " grad " in r["case"] or " jvp " in r["case"]]
    assert len(grads) >= 3 * 11 + 1
    assert _bad(grads) == []


def test_errors(results):
    errs = {r["case"]: r for r in results if r["kind"] == "error"}
    expect = {
        "unknown mesh axis (sharded)": ("ValueError", "not an axis of the mesh"),
        "unknown mesh axis (reduce)": ("ValueError", "not a mesh axis of the enclosing"),
        "K too large": ("ValueError", "K = 6 exceeds the 5 reduced rows"),
        "numpy Genred": ("TypeError", "needs a symred.jax.Genred"),
        "nred too large": ("ValueError", "nred = 9"),
        "follow: one side sharded two ways": ("ValueError", "sharded differently"),
    }
    for case, (typ, text) in expect.items():
        assert errs[case]["type"] == typ, errs[case]
        assert text in errs[case]["message"], errs[case]
