"""NumPy brute-force references: build the full (nx, ny, D) tensor F[i, j] and reduce it.

With F laid out as (nx, ny, D), pykeops' axis convention is NumPy's: axis=0 reduces over i
(one row per j), axis=1 over j (one row per i).
"""

import numpy as np

TOL = {np.float32: dict(rtol=2e-5, atol=1e-6), np.float64: dict(rtol=1e-10, atol=1e-12)}


def tol(dtype):
    return TOL[np.dtype(dtype).type]


def reduce_np(red, F, axis, K=None, G=None):
    """The reduction of F (nx, ny, D) over axis, as symred returns it (pykeops shapes)."""
    F = F.astype(np.float64)
    Fa = np.moveaxis(F, axis, 1)  # (nout, nred, D)
    if red == "Sum":
        return Fa.sum(1)
    if red == "Min":
        return Fa.min(1)
    if red == "Max":
        return Fa.max(1)
    if red == "ArgMin":
        return Fa.argmin(1)
    if red == "ArgMax":
        return Fa.argmax(1)
    if red == "Min_ArgMin":
        return Fa.min(1), Fa.argmin(1)
    if red == "Max_ArgMax":
        return Fa.max(1), Fa.argmax(1)
    if red in ("KMin", "ArgKMin", "KMin_ArgKMin"):
        order = np.argsort(Fa, axis=1, kind="stable")[:, :K, :]  # (nout, K, D)
        vals = np.take_along_axis(Fa, order, axis=1)
        if F.shape[2] == 1:
            vals, order = vals[:, :, 0], order[:, :, 0]
        return {"KMin": vals, "ArgKMin": order, "KMin_ArgKMin": (vals, order)}[red]
    if red == "LogSumExp":
        m = Fa.max(1, keepdims=True)
        return (m + np.log(np.exp(Fa - m).sum(1, keepdims=True)))[:, 0, :]
    if red == "SumSoftMaxWeight":
        Ga = np.moveaxis(G.astype(np.float64), axis, 1)
        w = np.exp(Fa - Fa.max(1, keepdims=True))  # (nout, nred, 1)
        return (w * Ga).sum(1) / w.sum(1)
    raise AssertionError(red)


def assert_same(got, want, dtype):
    """Values close for the dtype; index arrays (int64) equal; tuples elementwise."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), (type(got), got)
        for g, w in zip(got, want):
            assert_same(g, w, dtype)
        return
    assert got.shape == want.shape, (got.shape, want.shape)
    if np.issubdtype(want.dtype, np.integer):
        assert got.dtype == np.int64, got.dtype
        np.testing.assert_array_equal(got, want)
    else:
        assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
        np.testing.assert_allclose(got, want, **tol(dtype))


def run_check(script, devices=4):
    """The JSON rows printed by ``script`` (a file of this folder comparing sharded results
    with one device's), run in a process of its own with ``devices`` host devices (JAX reads
    XLA_FLAGS when it starts); fails unless it ends with its "done" row."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import symred

    here = Path(__file__).resolve().parent
    env = dict(os.environ, SYMRED_LIB=symred.lib_path,
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               PYTHONPATH=str(here.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(here / script)], env=env, capture_output=True,
                       text=True, timeout=600)
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and rows and rows[-1]["kind"] == "done", (
        f"{script} failed (status {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    return rows


def bad_rows(rows):
    """The rows of a check whose values differ beyond their tolerance, whose indices or index
    dtype differ, or whose shapes differ."""
    bad = []
    for r in rows:
        if r["kind"] == "values" and not r["rel"] <= r["tol"]:
            bad.append(r)
        elif r["kind"] == "indices" and (r["mismatches"] or r["dtype"] != r["want_dtype"]):
            bad.append(r)
        elif r["kind"] == "shape":
            bad.append(r)
    return bad
