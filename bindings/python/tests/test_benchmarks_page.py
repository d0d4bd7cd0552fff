"""docs/benchmarks.md is what bench/tables.py makes of bench/records/, and its plots exist.

A record added without regenerating the page, or a page edited by hand, fails here. The only
part of the page that may differ is how many library commits have passed since each run's
commit ("the library has changed in N commits since"), which grows with every commit.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
AGE = re.compile(r" — the library has changed in \d+ commits? since")


def render():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import tables
        return tables.render(tables.load_records())
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_page_matches_the_records():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert AGE.sub("", page) == AGE.sub("", render()), \
        "docs/benchmarks.md is stale: run python3 bench/tables.py (and bench/plots.py)"


def test_age_pattern_matches_the_page():
    # The normalisation above must match what tables.py writes, or it would hide nothing.
    assert AGE.search(" — the library has changed in 3 commits since;")
    assert AGE.search(" — the library has changed in 1 commit since;")


def test_every_plot_linked_exists():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page)
    assert "scaling-knn.png" in images and "scaling-matvec.png" in images
    for image in images:
        assert (ROOT / "docs" / image).is_file(), image
