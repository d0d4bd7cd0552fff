"""Every C and Python code block of README.md and docs/*.md runs, so the documentation cannot
drift from the API.

A file's Python blocks run in order in one namespace, in a fresh interpreter (a later block may
use the names an earlier one defined). A C block that defines `main` is compiled against the
checkout's header and the library under test, and run. A block that cannot run on its own (a
fragment of a larger example, or one that needs a GPU, MPI or a data set) is marked on the line
before its fence with `<!-- not run: REASON -->`; the reason must be given. A Python block
marked `<!-- needs: MODULE, ... -->` runs where those modules import (the test script runs the
tests under Debian's Python and under the virtual environment with PyTorch 2.x, jax and
GPyTorch, so every such block runs in one of them) and is left out elsewhere. Blocks in other
languages (sh, cmake) are not run here: the commands they show are exercised by the test
script itself, the install test and the benchmarks.
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w+)\s*$")
SKIP = re.compile(r"^<!--\s*not run:(.*)-->\s*$")
NEEDS = re.compile(r"^<!--\s*needs:(.*)-->\s*$")


def blocks(path):
    """(language, first line number, code, skip reason or None, needed modules) for each
    fenced block."""
    out, lines, i = [], path.read_text().split("\n"), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        skip = SKIP.match(lines[i - 1]) if i > 0 else None
        needs = NEEDS.match(lines[i - 1]) if i > 0 else None
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        reason = skip.group(1).strip() if skip else None
        mods = [n.strip() for n in needs.group(1).split(",") if n.strip()] if needs else []
        out.append((m.group(1), i + 2, "\n".join(lines[i + 1:j]), reason, mods))
        i = j + 1
    return out


def cases(lang):
    """The files with at least one block of lang not marked 'not run'."""
    found = []
    for path in DOCS:
        bs = [b for b in blocks(path) if b[0] == lang]
        if any(b[3] is None for b in bs):
            found.append(pytest.param(path, bs, id=str(path.relative_to(REPO))))
    return found


def test_skip_markers_give_reasons():
    for path in DOCS:
        for lang, line, _, reason, _ in blocks(path):
            assert reason is None or reason, f"{path}:{line}: 'not run:' without a reason"


def test_documentation_has_examples():
    # The README's two examples at least: a test that found nothing would pass vacuously.
    langs = [b[0] for b in blocks(REPO / "README.md") if b[3] is None]
    assert "c" in langs and "python" in langs


@pytest.mark.parametrize("path,bs", cases("python"))
def test_python_blocks(path, bs, tmp_path):
    runnable = [(line, code, mods) for _, line, code, reason, mods in bs if reason is None]
    name = path.relative_to(REPO)
    script = textwrap.dedent(f"""\
        import importlib.util, sys, traceback
        blocks = {runnable!r}
        ns = {{"__name__": "__main__"}}
        for line, code, mods in blocks:
            missing = [m for m in mods if importlib.util.find_spec(m) is None]
            if missing:
                print(f"{name}:{{line}}: left out here: needs {{', '.join(missing)}}")
                break  # later blocks may use what this one defines
            try:
                exec(compile("\\n" * (line - 1) + code, {str(name)!r}, "exec"), ns)
            except Exception:
                traceback.print_exc()
                sys.exit(f"{name}:{{line}}: this block failed")
        """)
    (tmp_path / "run.py").write_text(script)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO / "bindings" / "python")] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    # The documentation shows the default backends, not the tests' reference interpreter.
    if os.environ.get("SYMRED_PYTEST_DEVICE_SET"):
        env.pop("SYMRED_DEVICE", None)
    r = subprocess.run([sys.executable, str(tmp_path / "run.py")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.parametrize("path,bs", cases("c"))
def test_c_blocks(path, bs, tmp_path):
    lib = Path(os.environ["SYMRED_LIB"])
    libdir = lib if lib.is_dir() else lib.parent
    programs = [(line, code) for _, line, code, reason, _ in bs
                if reason is None and re.search(r"\bint\s+main\s*\(", code)]
    fragments = [line for _, line, code, reason, _ in bs
                 if reason is None and not re.search(r"\bint\s+main\s*\(", code)]
    assert not fragments, (f"{path}: C blocks at lines {fragments} have no main and no "
                           "'<!-- not run: REASON -->' marker")
    env = dict(os.environ)
    if os.environ.get("SYMRED_PYTEST_DEVICE_SET"):
        env.pop("SYMRED_DEVICE", None)
    for line, code in programs:
        src, exe = tmp_path / f"block{line}.c", tmp_path / f"block{line}"
        src.write_text(f'#line {line} "{path.relative_to(REPO)}"\n' + code + "\n")
        cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-I", str(REPO / "include"),
                             str(src), "-o", str(exe), "-L", str(libdir), "-lsymred",
                             f"-Wl,-rpath,{libdir}", "-lm"], capture_output=True, text=True)
        assert cc.returncode == 0, f"{path}:{line}: does not compile:\n{cc.stderr}"
        r = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{path}:{line}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"


def test_api_reference_is_current():
    # docs/api.md is generated from include/symred.h: a header change must regenerate it.
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "api-reference.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
