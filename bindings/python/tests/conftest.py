"""Makes the tests find the package and the library without installing anything.

SYMRED_LIB is taken from the environment when set; otherwise it is the checkout's
build-ci/libsymred.so (the test script builds there), else build/libsymred.so, else the most
recently built build*/libsymred.so. Set SYMRED_LIB to test another build.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PKG_ROOT = HERE.parent  # bindings/python
REPO = PKG_ROOT.parent.parent

sys.path.insert(0, str(PKG_ROOT))

if not os.environ.get("SYMRED_LIB"):
    for preferred in ("build-ci", "build"):
        if (REPO / preferred / "libsymred.so").is_file():
            os.environ["SYMRED_LIB"] = str(REPO / preferred / "libsymred.so")
            break
    else:
        candidates = [p for p in REPO.glob("build*/libsymred.so") if p.is_file()]
        if candidates:
            newest = max(candidates, key=lambda p: p.stat().st_mtime)
            os.environ["SYMRED_LIB"] = str(newest)

# Most tests check the bindings' plumbing (shapes, axes, dtypes, errors) against NumPy, and
# creating ~150 kernels through the CPU JIT costs a compiler run each on a cold cache. They
# run on the reference interpreter (the oracle) unless SYMRED_DEVICE says otherwise; the tests
# marked for it, and the examples, use the default backends explicitly.
if "SYMRED_DEVICE" not in os.environ:
    os.environ["SYMRED_DEVICE"] = "reference"
    os.environ["SYMRED_PYTEST_DEVICE_SET"] = "1"


def pytest_report_header(config):
    return (f"symred library: {os.environ.get('SYMRED_LIB', '(search)')}, "
            f"SYMRED_DEVICE={os.environ.get('SYMRED_DEVICE')}")
