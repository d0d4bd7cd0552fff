"""Checks an installed symred wheel where no C compiler can be found (scripts/test-wheel.sh).

    python wheel_check.py CHECKOUT [TEST-FILE...]

Run with the python of a virtual environment that has the wheel, numpy and pytest installed,
from a directory outside the checkout, with SYMRED_CC naming no file, no compiler on PATH,
SYMRED_LIB and PYTHONPATH unset and SYMRED_CACHE_DIR an empty directory. In order, it asserts
that:

1. no C compiler is reachable and nothing points symred at another library;
2. symred is imported from the environment's site-packages and its library is the one the
   wheel installed there (not the checkout's, not $SYMRED_LIB), as is libgomp, bundled in
   symred.libs/;
3. README.md's Python blocks (those test_doc_examples.py runs) run, and each Genred they leave
   says in its explanation that it runs on another backend because there is no C compiler;
4. a Gaussian mat-vec and a kNN equal NumPy's brute force;
5. nothing was compiled: the cache directory is still empty;

then runs pytest on the test files named, without their conftest.py (which would point the
tests at the checkout's library), and exits with pytest's status.
"""

import contextlib
import io
import os
import shutil
import sys
import sysconfig
from pathlib import Path

import numpy as np


def fail(msg):
    sys.exit(f"wheel_check: FAILED: {msg}")


def check(cond, msg):
    if not cond:
        fail(msg)
    print(f"wheel_check: ok: {msg}")


def inside(path, folder):
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


checkout = Path(sys.argv[1]).resolve()
test_files = sys.argv[2:]

# 1. No compiler, no library override.
for name in ("cc", "gcc", "clang", "tcc", "c99"):
    check(shutil.which(name) is None, f"no {name} on PATH")
cc = os.environ.get("SYMRED_CC", "")
check(cc and not os.path.exists(cc), f"SYMRED_CC={cc!r} names no file")
for var in ("SYMRED_LIB", "PYTHONPATH", "SYMRED_DEVICE", "LD_LIBRARY_PATH"):
    check(var not in os.environ, f"{var} is not set")
cache = Path(os.environ["SYMRED_CACHE_DIR"])
check(cache.is_dir() and not any(cache.iterdir()), f"the cache directory {cache} is empty")
check(not inside(os.getcwd(), checkout), f"running outside the checkout ({os.getcwd()})")

# 2. The package and its libraries come from the wheel's install.
import symred  # noqa: E402

site = Path(sysconfig.get_paths()["purelib"])
check(sys.prefix != sys.base_prefix and inside(site, sys.prefix),
      f"site-packages {site} is the virtual environment's")
check(inside(symred.__file__, site / "symred"), f"symred imported from {symred.__file__}")
check(Path(os.path.realpath(symred.lib_path)) == (site / "symred" / "libsymred.so").resolve(),
      f"the library loaded is the wheel's: {symred.lib_path}")
check(not inside(symred.lib_path, checkout), "the library is not the checkout's")
with open("/proc/self/maps") as f:
    gomp = {line.split()[-1] for line in f if "libgomp" in line}
check(gomp and all(inside(p, site / "symred.libs") for p in gomp),
      f"libgomp loaded from the wheel's symred.libs: {sorted(gomp)}")
with contextlib.redirect_stdout(io.StringIO()):
    rows = symred.info()
check("NOT FOUND" in rows["JIT compiler"], f"info() says: JIT compiler {rows['JIT compiler']}")
check(rows["library version"] == symred.__version__,
      f"library version {rows['library version']} is the package's {symred.__version__}")


def no_compiler_reason(genred):
    """The plan's fallback reason, when it blames the missing compiler."""
    why = genred.plan()["fallback"]
    return why if why and "compiler" in why else None


# 3. README.md's Python example, as test_doc_examples.py finds it.
sys.path.insert(0, str(checkout / "bindings" / "python" / "tests"))
from test_doc_examples import blocks  # noqa: E402

readme = [b for b in blocks(checkout / "README.md") if b[0] == "python" and b[3] is None]
check(readme, f"README.md has {len(readme)} Python block(s) to run")
ns = {"__name__": "__main__"}
for _, line, code, _, needs in readme:
    check(not needs, f"README.md:{line} needs only what the wheel brings ({needs or 'numpy'})")
    exec(compile("\n" * (line - 1) + code, str(checkout / "README.md"), "exec"), ns)
made = [v for v in ns.values() if isinstance(v, symred.Genred)]
check(made, f"README.md's example made {len(made)} Genred(s)")
for g in made:
    check(no_compiler_reason(g), f"README.md's {g.formula!r}: {no_compiler_reason(g)}")

# 4. Results.
rng = np.random.default_rng(0)
x, y, b = rng.random((300, 3)), rng.random((400, 3)), rng.random((400, 1))
gauss = symred.Genred("Exp(-g * SqDist(x, y)) * b",
                      ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)", "g = Pm(1)"], axis=1)
d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
np.testing.assert_allclose(gauss(x, y, b, np.array([2.0])), np.exp(-2.0 * d2) @ b, rtol=1e-10)
check(True, "the Gaussian mat-vec equals NumPy's")
knn = symred.Genred("SqDist(x, y)", ["x = Vi(3)", "y = Vj(3)"], reduction_op="ArgKMin", axis=1,
                    opt_arg=5)
np.testing.assert_array_equal(knn(x, y), np.argsort(d2, axis=1, kind="stable")[:, :5])
check(True, "the kNN equals NumPy's")
check(no_compiler_reason(knn), f"the kNN kernel: {no_compiler_reason(knn)}")

# 5. Nothing compiled.
check(not any(cache.iterdir()), f"nothing was compiled into {cache}")

if test_files:
    import pytest

    sys.exit(pytest.main(["-q", "--noconftest", "-p", "no:cacheprovider", *test_files]))
