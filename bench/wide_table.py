"""Writes the measured tables of docs/wide.md from the records of bench/bench_wide.py.

    python3 bench/wide_table.py [docs/wide/records.jsonl] [docs/wide.md]

Replaces the text between the markers <!-- wide-tables --> and <!-- /wide-tables --> of the
document with one table per record (newest last), each headed by the record's commit, CPU,
threads, date, load average and command.
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- wide-tables -->", "<!-- /wide-tables -->"


def table(rec):
    out = [f"**{rec['date']}**, commit `{rec['commit']}`, {rec['cpu']}, {rec['threads']} "
           f"thread{'s' if rec['threads'] != 1 else ''}, load average {rec['loadavg_1min']:.1f}, "
           f"torch {rec.get('torch', '?')}: `{rec['command']}`", "",
           "| job | N = M | D | R | symred (s) | strategy | baseline | baseline (s) | ratio |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rec["rows"]:
        out.append(f"| {r['job']} | {r['n']} | {r['d']} | {r['r']} | {r['symred_s']:.4f} | "
                   f"{r['strategy']} | {r['baseline']} | {r['base_s']:.4f} | "
                   f"{r['ratio']:.2f} |")
    return "\n".join(out)


def main():
    rec_path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "wide" / "records.jsonl"
    doc_path = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs" / "wide.md"
    recs = [json.loads(line) for line in rec_path.read_text().splitlines() if line.strip()]
    body = "\n\n".join(table(r) for r in recs)
    doc = doc_path.read_text()
    a, b = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    doc_path.write_text(doc[:a] + "\n" + body + "\n" + doc[b:])


if __name__ == "__main__":
    main()
