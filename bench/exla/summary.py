#!/usr/bin/python3
"""Tables of an eXLA run: times, peak RSS, ratios peer / symred (SGPR: seconds per
iteration, RMSE, NLPD), and the issue's targets.

    python3 bench/exla/summary.py [DIR/results.json]      # default bench/exla/out/results.json

Prints Markdown (the README's tables are its output). A ratio > 1 means symred was faster.
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def cell(r):
    if r is None:
        return "—"
    if r.get("status") == "timeout" and r.get("timeout_used"):
        return f"timeout ({r['timeout_used']:.0f} s)"
    if r.get("status") != "ok":
        return r.get("status", "?")
    return f"{r['seconds']:.3g} s"


def beaten(peer, mine):
    """Whether symred (mine) was faster than peer at a point: both ran and symred took less
    time, or the peer timed out after longer than symred's whole process (start-up, data and
    warm-up included) took."""
    if not peer or not mine or mine.get("status") != "ok":
        return False
    if peer.get("status") == "ok":
        return mine["seconds"] < peer["seconds"]
    if peer.get("status") == "timeout":
        return float(mine.get("wall_seconds", float("inf"))) < float(peer.get("timeout_used", 0))
    return False


def ratio(peer, mine):
    if not peer or not mine or peer.get("status") != "ok" or mine.get("status") != "ok":
        return "—"
    return f"{peer['seconds'] / mine['seconds']:.2f}×"


def mem_tables(recs):
    recs = [r for r in recs if r["experiment"] == "mem"]
    if not recs:
        return []
    systems = [s for s in ("symred", "numpy", "jax", "pykeops")
               if any(r["system"] == s for r in recs)]
    peers = [s for s in systems if s != "symred"]
    by = {(r["system"], r["n"]): r for r in recs}
    ns = sorted({r["n"] for r in recs})
    lines = ["| n | " + " | ".join(systems) + " | " + " | ".join(f"{p} / symred" for p in peers)
             + " | peak RSS symred / numpy / jax (MB) |",
             "|---" * (1 + len(systems) + len(peers) + 1) + "|"]
    for n in ns:
        me = by.get(("symred", n))
        rss = " / ".join(
            f"{by[(s, n)]['peak_rss_bytes'] / 1e6:.0f}" if by.get((s, n), {}).get("status") == "ok"
            else by.get((s, n), {}).get("status", "—") for s in ("symred", "numpy", "jax"))
        lines.append(f"| {n:,} | " + " | ".join(cell(by.get((s, n))) for s in systems) + " | "
                     + " | ".join(ratio(by.get((p, n)), me) for p in peers) + f" | {rss} |")
    # Targets.
    ok = lambda s, n: by.get((s, n), {}).get("status") == "ok"  # noqa: E731
    dense = [n for n in ns if ok("numpy", n) and ok("jax", n)]
    big = max(dense) if dense else None
    all_symred = all(ok("symred", n) for n in ns)
    reach = max((n for n in ns if ok("symred", n)), default=None)
    lines.append("")
    if big:
        j = by[("jax", big)]["seconds"] / by[("symred", big)]["seconds"] if ok("symred", big) else 0
        lines.append(f"- largest n where NumPy and JAX both run: {big:,}; symred ran every n "
                     f"of the grid: {'yes' if all_symred else 'no'}, up to {reach:,} = "
                     f"{reach / big:.0f}× that (target ≥ 10×: "
                     f"{'met' if reach >= 10 * big and all_symred else 'not met'})")
        lines.append(f"- at n = {big:,}, JAX / symred = {j:.2f}× (target ≥ 2×: "
                     f"{'met' if j >= 2 else 'not met'})")
    return lines


def knn_tables(recs):
    recs = [r for r in recs if r["experiment"] == "knn"]
    if not recs:
        return []
    systems = [s for s in ("symred", "numpy", "jax", "pykeops", "faiss")
               if any(r["system"] == s for r in recs)]
    peers = [s for s in systems if s != "symred"]
    by = {(r["system"], r["dataset"], r["n"], r["m"], r["d"], r["distance"]): r for r in recs}
    points = sorted({(r["dataset"], r["n"], r["m"], r["d"], r["distance"]) for r in recs},
                    key=lambda p: (p[0] != "random", p[3], p[1], p[4]))
    lines = ["| data | n | m | d | distance | " + " | ".join(systems) + " | "
             + " | ".join(f"{p} / symred" for p in peers)
             + " | recall symred / jax / pykeops / faiss |",
             "|---" * (5 + len(systems) + len(peers) + 1) + "|"]
    beat_all, recall_one, lost, missed = True, True, [], []
    for p in points:
        me = by.get(("symred",) + p)
        rc = []
        for s in ("symred", "jax", "pykeops", "faiss"):
            r = by.get((s,) + p)
            v = r.get("recall") if r and r.get("status") == "ok" else None
            rc.append(("1" if v == 1.0 else f"{v:.5f}") if isinstance(v, float) else "—")
        lines.append(f"| {p[0]} | {p[1]:,} | {p[2]:,} | {p[3]} | {p[4]} | "
                     + " | ".join(cell(by.get((s,) + p)) for s in systems) + " | "
                     + " | ".join(ratio(by.get((q,) + p), me) for q in peers) + " | "
                     + " / ".join(rc) + " |")
        name = f"{p[0]} n={p[1]:,} d={p[3]} {p[4]}"
        for q in ("jax", "pykeops"):
            r = by.get((q,) + p)
            if r and r.get("status") in ("ok", "timeout") and not beaten(r, me):
                beat_all = False
                lost.append(f"{q} at {name}")
        if not me or me.get("status") != "ok" or me.get("recall") != 1.0:
            recall_one = False
            missed.append(f"{name} ({me.get('recall') if me else 'not run'})")
    lines.append("")
    lines.append(f"- faster than JAX and pykeops at every point where they ran or timed out "
                 f"(a timeout counts when symred's whole run was shorter than it): "
                 f"{'met' if beat_all else 'not met: ' + ', '.join(lost)}")
    lines.append(f"- symred recall 1.0 at every point: "
                 f"{'met' if recall_one else 'not met at ' + ', '.join(missed)}")
    for q in ("jax", "pykeops", "faiss", "numpy"):
        won = [f"{p[0]} n={p[1]:,} d={p[3]} {p[4]}" for p in points
               if by.get((q,) + p, {}).get("status") == "ok"
               and not beaten(by.get((q,) + p), by.get(("symred",) + p))]
        if won:
            lines.append(f"- {q} as fast or faster than symred at: {', '.join(won)}")
    return lines


def sgpr_tables(recs):
    recs = [r for r in recs if r["experiment"] == "sgpr"]
    if not recs:
        return []
    lines = ["| system | n | M | budget | status | s / iteration | iterations (evaluations) "
             "| test RMSE | test NLPD | lengthscale | noise var. | peak RSS | dense need (2nM·8) |",
             "|---" * 13 + "|"]
    order = {"symred": 0, "dense": 1, "gpflow": 2}
    for r in sorted(recs, key=lambda r: (r["n"], r["limit_bytes"], r["M"],
                                         order.get(r["system"], 9))):
        ok = r.get("status") == "ok"
        reason = "" if ok else f" ({' '.join(str(r.get('reason', '')).split())[:70]})"
        num = (lambda k, f: f.format(r[k]) if ok and isinstance(r.get(k), (int, float))  # noqa: E731
               else "")
        rss = f"{r['peak_rss_bytes'] / 1e6:.0f} MB" if r.get("peak_rss_bytes") else "—"
        lines.append(
            f"| {r['system']} | {r['n']:,} | {r['M']:,} | {r['limit_bytes'] / 2**20:.0f} MB "
            f"| {'ok' if ok else '**' + r.get('status', '?') + '**'}{reason} "
            f"| {num('seconds_per_iter', '{:.3g}')} "
            f"| {(str(r['iterations']) + ' (' + str(r.get('evaluations')) + ')') if ok else ''} "
            f"| {num('rmse', '{:.4f}')} | {num('nlpd', '{:.3f}')} | {num('lengthscale', '{:.3f}')} "
            f"| {num('noise_variance', '{:.4f}')} | {rss} "
            f"| {2 * r['n'] * r['M'] * 8 / 1e9:.2f} GB |")
    by = {(r["system"], r["n"], r["M"], r["limit_bytes"]): r for r in recs}
    top = max((k for k in by if k[0] == "symred"), key=lambda k: k[2], default=None)
    lines.append("")
    if top:
        me, dense = by[top], by.get(("dense",) + top[1:])
        met = (me.get("status") == "ok" and top[2] >= 10_000 and top[3] <= 2**30
               and (dense is None or dense.get("status") != "ok"))
        lines.append(f"- largest M symred trained: {top[2]:,} (n = {top[1]:,}, budget "
                     f"{top[3] / 2**20:.0f} MB): {me.get('status')}; dense there: "
                     f"{dense.get('status') if dense else 'not run'} (needs "
                     f"{2 * top[1] * top[2] * 8 / 1e9:.1f} GB); target M = 10 000 under 1 GB "
                     f"where the dense bound needs more: {'met' if met else 'not met'}")
    return lines


def main():
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "out" / "results.json"
    with open(path) as f:
        recs = json.load(f)
    for title, lines in (("mem", mem_tables(recs)), ("knn", knn_tables(recs)),
                         ("sgpr", sgpr_tables(recs))):
        if lines:
            print(f"### {title}\n")
            print("\n".join(lines))
            print()


if __name__ == "__main__":
    main()
