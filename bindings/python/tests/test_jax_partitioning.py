"""A plain jax.jit of symred.jax Genreds on arrays sharded over meshes of Auto axes: XLA
partitions symred's custom call (custom_partitioning) instead of gathering the arguments.
jax_partitioning_check.py runs once, in a process of its own with four host devices
(XLA_FLAGS, read when JAX starts), and compares every result with the same Genred on one
device; the tests here assert what it printed.

Covered: every reduction on axis 1 (and each kind of partial state, ArgMin and ArgKMin on
axis 0) in float64 with the output rows sharded, the reduced rows sharded, and both (the
reduced side gathered), 11 output rows and 5 reduced rows on 4 devices (blocks 3, 3, 3, 2 and
2, 2, 1, 0: an empty one); every reduction in float32 on 12 x 8 rows put on the devices; 1 and
2 devices; a 2 x 2 mesh; the compiled programs (no all-gather of the reduced side with the
output rows sharded, output sharded by rows; an all-reduce with the reduced rows sharded);
jax.grad in x, y and b and a jvp; jax.vmap (not partitioned, right); a Genred inside the
user's shard_map; GSPMD as well as Shardy; int32 indices.
"""

import pytest

pytest.importorskip("jax")

from helpers import bad_rows as _bad, run_check  # noqa: E402

REDUCTIONS = ["Sum", "LogSumExp", "SumSoftMaxWeight", "Min", "Max", "ArgMin", "ArgMax",
              "Min_ArgMin", "Max_ArgMax", "KMin", "ArgKMin", "KMin_ArgKMin"]


@pytest.fixture(scope="module")
def results():
    return run_check("jax_partitioning_check.py")


def test_values_and_indices_equal_one_device(results):
    forward = [r for r in results if r["kind"] in ("values", "indices", "shape")
               and " grad " not in r["case"] and " jvp " not in r["case"]]
    assert len(forward) > 150
    assert _bad(forward) == []


def test_every_reduction_every_layout(results):
    cases = {r["case"] for r in results}
    for red in REDUCTIONS:
        for layout in ("rows", "reduced", "both"):
            assert f"4 dev {layout} {red} axis=1 float64 11x5" in cases, (red, layout)
            assert f"4 dev {layout} {red} axis=1 float32 12x8" in cases, (red, layout)
    for red in ("Sum", "LogSumExp", "SumSoftMaxWeight", "Min_ArgMin", "Max_ArgMax",
                "KMin_ArgKMin", "ArgMin", "ArgKMin"):
        for layout in ("rows", "reduced", "both"):
            assert f"4 dev {layout} {red} axis=0 float64 11x5" in cases, (red, layout)


def test_one_two_devices_two_dimensional_mesh_gspmd_int32(results):
    cases = [r["case"] for r in results]
    for tag in ("1 dev reduced", "2 dev reduced", "2x2 rows a reduced b 2x2", "gspmd 4 dev rows",
                "gspmd 4 dev reduced", "int32 indices 4 dev", "user shard_map rows",
                "vmap over x reduced Sum", "vmap over x reduced ArgKMin"):
        assert any(c.startswith(tag) for c in cases), tag
    assert results[-1]["shardy"] is True


def _hlo(results, case):
    return next(r for r in results if r["case"] == case)


def test_rows_sharded_runs_per_shard_without_gathering_the_reduced_side(results):
    h = _hlo(results, "hlo rows 12x8")
    assert h["gathers"] == [] and not h["all_reduce"], h
    assert h["out_spec"] == "P('d',)", h
    # x = (12, 3) in blocks of 3 rows; y = (8, 3) and b = (8, 2) whole, already on every device.
    assert h["calls"] == [["3,3", "8,3", "8,2"]], h
    h = _hlo(results, "hlo rows 11x5")
    # blocks of 3 rows and the last of 2; the only gather is the jit's replicated output
    assert sorted(c[0] for c in h["calls"]) == ["2,3", "3,3"], h
    assert all(c[1:] == ["5,3", "5,2"] for c in h["calls"]), h
    assert h["gathers"] == ["12,2"] and not h["all_reduce"], h


def test_reduced_sharded_combines_partial_results(results):
    h = _hlo(results, "hlo reduced 12x8")
    assert h["all_reduce"] and h["gathers"] == [], h
    assert h["calls"] == [["12,3", "2,3", "2,2"]], h
    h = _hlo(results, "hlo reduced 11x5")
    assert h["all_reduce"] and h["gathers"] == [], h
    # blocks of 2, 2, 1 rows of y and an empty one (which runs no kernel)
    assert sorted(c[1] for c in h["calls"]) == ["1,3", "2,3"], h


def test_both_sharded_gathers_the_reduced_side(results):
    h = _hlo(results, "hlo both 12x8")
    assert h["calls"] == [["3,3", "8,3", "8,2"]], h
    assert sorted(h["gathers"]) == ["8,2", "8,3"], h
    assert h["out_spec"] == "P('d',)", h


def test_hlo_results_right(results):
    assert _bad([r for r in results if r["case"].startswith("hlo ")]) == []


def test_gradients_equal_one_device(results):
    grads = [r for r in results if " grad " in r["case"] or " jvp " in r["case"]]
    assert len(grads) >= 3 * (5 + 5 + 2) + 2
    for red in ("Sum", "LogSumExp", "SumSoftMaxWeight", "Min", "KMin"):
        for v in "xyb":
            assert f"4 dev rows grad {red} d/d{v} axis=1 float64" in {r["case"] for r in grads}
    assert _bad(grads) == []
