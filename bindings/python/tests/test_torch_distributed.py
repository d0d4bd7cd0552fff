"""symred.distributed with gloo on the CPU at 1, 2 and 3 ranks (torch.multiprocessing, one
process tree for the module: torch_distributed_check.py does the comparisons with the
single-process symred.torch result and each rank writes what it found; the tests assert it).

Covered: every reduction on both axes in float32 and float64, rows split unevenly (at 3
ranks: output rows 5, 0, 5 and reduced rows 2, 5, 1, so an empty block and blocks shorter
than K = 3); exact ties (lowest global index); NaN and +inf among the reduced rows (NaN first
for Min/Max, after +inf in K-lists, ties of infinities by index); gradients with respect to the output side,
the reduced side and a parameter (summed over the ranks) of Sum, LogSumExp,
SumSoftMaxWeight, Min, Max and KMin; LazyTensor (a kNN, and a Gaussian sum and its gradient);
K too large raising ValueError on every rank.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed without gloo", allow_module_level=True)

import symred  # noqa: E402

HERE = Path(__file__).resolve().parent
WORLDS = (1, 2, 3)
REDUCTIONS = ["Sum", "LogSumExp", "SumSoftMaxWeight", "Min", "Max", "ArgMin", "ArgMax",
              "Min_ArgMin", "Max_ArgMax", "KMin", "ArgKMin", "KMin_ArgKMin"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    outdir = tmp_path_factory.mktemp("torch_distributed")
    env = dict(os.environ, SYMRED_LIB=symred.lib_path, SYMRED_NUM_THREADS="1",
               PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(HERE / "torch_distributed_check.py"), str(outdir)]
                       + [str(w) for w in WORLDS], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"torch_distributed_check.py failed:\n{r.stdout[-3000:]}\n" \
                              f"{r.stderr[-5000:]}"
    rows = {}
    for w in WORLDS:
        for rank in range(w):
            path = outdir / f"w{w}-rank{rank}.jsonl"
            rows[w, rank] = [json.loads(line) for line in path.read_text().splitlines()]
            assert rows[w, rank][-1]["kind"] == "done"
    return rows


def _bad(rows):
    return [r for r in rows if (r["kind"] == "values" and not r["rel"] <= r["tol"])
            or (r["kind"] == "indices" and r["mismatches"]) or r["kind"] == "shape"]


@pytest.mark.parametrize("world", WORLDS)
def test_every_reduction_equals_one_process(results, world):
    for rank in range(world):
        rows = results[world, rank]
        cases = {r["case"] for r in rows}
        for red in REDUCTIONS:
            for axis in (0, 1):
                for dt in ("float32", "float64"):
                    assert f"w{world} {red} axis={axis} {dt}" in cases
        assert _bad([r for r in rows if " grad " not in r["case"]]) == []


@pytest.mark.parametrize("world", WORLDS)
def test_gradients_across_ranks(results, world):
    for rank in range(world):
        grads = [r for r in results[world, rank] if " grad " in r["case"]]
        assert len(grads) >= 8
        assert _bad(grads) == []


def test_nan_and_infinities_as_on_one_process(results):
    for (world, rank), rows in results.items():
        cases = [r for r in rows if " nan inf " in r["case"]]
        assert len(cases) >= 2 * 12, (world, rank)
        assert _bad(cases) == [], (world, rank)


def test_lazytensor_reductions(results):
    for (world, rank), rows in results.items():
        lazy = [r for r in rows if " lazy " in r["case"]]
        assert len(lazy) >= 2 and _bad(lazy) == [], (world, rank, lazy)


def test_ties_and_errors_on_every_rank(results):
    for (world, rank), rows in results.items():
        ties = [r for r in rows if " ties " in r["case"] and r["kind"] == "indices"]
        assert len(ties) == 3 and _bad(ties) == [], (world, rank)
        err = [r for r in rows if r["kind"] == "error"]
        assert len(err) == 1 and err[0]["type"] == "ValueError", (world, rank, err)
        assert "exceeds the 8 reduced rows of all ranks" in err[0]["message"]


def test_gp_example():
    """The exact-GP example (bindings/python/examples/gp_distributed.py) on two gloo ranks with
    unequal shares of the training rows: it exits 0 only when the sharded mat-vec equals one
    process's (relative 1e-12), the predictions agree (1e-6) and beat predicting the mean."""
    example = HERE.parent / "examples" / "gp_distributed.py"
    env = dict(os.environ, SYMRED_LIB=symred.lib_path, SYMRED_NUM_THREADS="1",
               PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(example), "--ranks", "2", "--n", "200", "--ntest",
                        "30", "--noise", "0.3"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "on 2 ranks" in r.stdout and "mat-vec K y" in r.stdout, r.stdout
