"""Every bad input raises the documented exception with a message naming the problem; C
errors carry sr_ctx_error's text; nothing crashes."""

import time

import numpy as np
import pytest

from symred import Genred, KernelSolve, SymredError, SymredRuntimeError, SymredValueError

AL = ["x = Vi(3)", "y = Vj(3)"]


def xy(dtype=np.float64, nx=5, ny=6):
    rng = np.random.default_rng(0)
    return rng.random((nx, 3)).astype(dtype), rng.random((ny, 3)).astype(dtype)


def test_error_classes():
    assert issubclass(SymredValueError, ValueError) and issubclass(SymredValueError, SymredError)
    assert issubclass(SymredRuntimeError, RuntimeError)
    assert issubclass(SymredRuntimeError, SymredError)


@pytest.mark.parametrize("formula,status", [
    ("SqDist(x,", "EPARSE"),
    ("Frobnicate(x)", "EPARSE"),
    ("SqDist(x, z)", "EPARSE"),
    ("x + IntCst(1", "EPARSE"),
])
def test_parse_errors(formula, status):
    with pytest.raises(SymredValueError) as e:
        Genred(formula, AL)
    assert e.value.status_name == status
    assert formula in str(e.value)  # which formula failed
    assert len(str(e.value)) > len(formula) + 12  # and the C parser's own explanation


def test_dimension_error_names_dims():
    with pytest.raises(SymredValueError) as e:
        Genred("x + y", ["x = Vi(3)", "y = Vj(2)"])
    assert e.value.status_name == "EDIM"
    assert "3" in str(e.value) and "2" in str(e.value)


@pytest.mark.parametrize("aliases", [["x = Vk(3)"], ["x Vi(3)"], ["x = Vi(three)"]])
def test_bad_alias(aliases):
    with pytest.raises(ValueError):
        Genred("x", aliases)


def test_bad_construction_arguments():
    with pytest.raises(ValueError, match="Sum, Min"):
        Genred("SqDist(x,y)", AL, reduction_op="Average")
    with pytest.raises(ValueError, match="axis"):
        Genred("SqDist(x,y)", AL, axis=2)
    with pytest.raises(ValueError, match="opt_arg"):
        Genred("SqDist(x,y)", AL, reduction_op="ArgKMin")
    with pytest.raises(ValueError, match=">= 1"):
        Genred("SqDist(x,y)", AL, reduction_op="KMin", opt_arg=0)
    with pytest.raises(TypeError, match="int"):
        Genred("SqDist(x,y)", AL, reduction_op="KMin", opt_arg=2.5)
    with pytest.raises(ValueError, match="takes none"):
        Genred("SqDist(x,y)", AL, reduction_op="Sum", opt_arg=3)
    with pytest.raises(ValueError, match="formula2"):
        Genred("SqDist(x,y)", AL, reduction_op="SumSoftMaxWeight")
    with pytest.raises(ValueError, match="formula2"):
        Genred("SqDist(x,y)", AL, reduction_op="Sum", formula2="x")
    with pytest.raises(TypeError, match="formula"):
        Genred(3, AL)
    with pytest.raises(TypeError, match="aliases"):
        Genred("x", "x = Vi(3)")
    with pytest.raises(ValueError, match="NUL"):
        Genred("SqDist(x,y)\x00junk", AL)
    with pytest.raises(TypeError, match="dtype"):
        Genred("x", AL, dtype="int16")


def test_bad_accuracy_options():
    with pytest.raises(ValueError, match="dtype_acc"):
        Genred("x", AL, dtype_acc="float128")
    with pytest.raises(ValueError, match="contradicts"):
        Genred("x", AL, dtype_acc="float32", use_double_acc=True)
    with pytest.raises(ValueError, match="sum_scheme"):
        Genred("x", AL, sum_scheme="pairwise")
    with pytest.raises(ValueError, match="sum_scheme"):
        Genred("x", AL, reduction_op="Min", sum_scheme="kahan_scheme")
    x, y = xy()
    with pytest.raises(ValueError, match="float32"):
        Genred("x", AL, axis=1, dtype_acc="float32")(x, y)


def test_weight_of_softmax_needs_scalar_formula():
    with pytest.raises(SymredValueError, match="dimension"):
        x, y = xy()
        Genred("x - y", AL, "SumSoftMaxWeight", axis=1, formula2="y")(x, y)


def test_k_larger_than_reduced_count():
    x, y = xy(ny=3)
    f = Genred("SqDist(x,y)", AL, "ArgKMin", axis=1, opt_arg=4)
    with pytest.raises(SymredValueError, match="k = 4"):
        f(x, y)


def test_wrong_number_of_arrays():
    x, y = xy()
    with pytest.raises(ValueError, match="takes 2 arrays"):
        Genred("SqDist(x,y)", AL)(x)


@pytest.mark.parametrize("dtype", [np.int64, np.float128, np.complex128, np.bool_])
def test_unsupported_dtypes(dtype):
    x, y = xy()
    with pytest.raises(TypeError,
                       match=r"argument 0 \('x' = Vi\(3\)\).*float32, float64, float16 or bfloat16"):
        Genred("SqDist(x,y)", AL)(x.astype(dtype), y)


def test_mixed_dtypes():
    x, y = xy()
    with pytest.raises(TypeError, match="mixed dtypes"):
        Genred("SqDist(x,y)", AL)(x.astype(np.float32), y)


def test_dtype_option_enforced():
    x, y = xy(np.float32)
    with pytest.raises(TypeError, match="dtype=float64"):
        Genred("SqDist(x,y)", AL, dtype="float64")(x, y)


def test_wrong_shapes_name_argument_and_expected_shape():
    x, y = xy()
    f = Genred("SqDist(x,y)", AL)
    with pytest.raises(ValueError, match=r"argument 1 \('y' = Vj\(3\)\).*\(ny, 3\).*\(6, 2\)"):
        f(x, y[:, :2])
    with pytest.raises(ValueError, match=r"\(nx, 3\), got \(5,\)"):
        f(x[:, 0], y)
    h = Genred("SqDist(x,y) * u", AL + ["u = Vj(1)"])
    # A 1-D array for a variable of dimension 1 is read as (n, 1), as pykeops reads it.
    np.testing.assert_allclose(h(x, y, np.ones(6)), h(x, y, np.ones((6, 1))))
    with pytest.raises(ValueError, match=r"\(ny, 1\), got \(6, 2\)"):
        h(x, y, np.ones((6, 2)))
    g = Genred("SqDist(x,y) * p", AL + ["p = Pm(2)"])
    with pytest.raises(ValueError, match=r"argument 2 \('p' = Pm\(2\)\) must have shape \(2,\)"):
        g(x, y, np.ones(3))
    with pytest.raises(TypeError, match="NumPy array"):
        f(x.tolist(), y)


def test_inconsistent_rows():
    x, y = xy()
    f = Genred("SqDist(x,y) * u", AL + ["u = Vi(1)"], axis=1)
    with pytest.raises(ValueError, match="same number of rows"):
        f(x, y, np.ones((4, 1)))


def test_gpu_backend_raises_cleanly():
    x, y = xy()
    f = Genred("SqDist(x,y)", AL, axis=1)
    try:
        out = f(x, y, backend="GPU")
    except SymredRuntimeError as e:  # no GPU, or no CUDA backend in this build
        assert e.status_name == "ENODEV"
        msg = str(e).lower()
        assert "cuda" in msg or "gpu" in msg or "device" in msg, msg
        assert isinstance(e, RuntimeError)
    else:  # a machine with a GPU and a CUDA backend: then it must be right
        np.testing.assert_allclose(out, f(x, y), rtol=1e-6)
    # The Genred stays usable after a failed call.
    assert f(x, y).shape == (5, 1)


def test_unknown_backend_and_unsupported_options():
    x, y = xy()
    f = Genred("SqDist(x,y)", AL)
    with pytest.raises(ValueError, match="backend"):
        f(x, y, backend="TPU")
    with pytest.raises(ValueError, match="ranges"):
        f(x, y, ranges=(1, 2, 3, 4, 5, 6))
    with pytest.raises(ValueError, match="out must be a NumPy array of shape"):
        f(x, y, out=np.empty((5, 1)))
    with pytest.raises(ValueError, match="dtype float64"):
        f(x, y, out=np.empty((6, 1), dtype=np.float32))


def test_many_failures_leave_the_library_usable():
    x, y = xy()
    for _ in range(50):
        with pytest.raises(ValueError):
            Genred("Exp(x", AL)
    assert Genred("SqDist(x,y)", AL, axis=1)(x, y).shape == (5, 1)


def test_integers_wider_than_the_c_field():
    # ctypes would wrap them silently: K = 2**32 + 3 would make a K = 3 kernel, and
    # rows = (2**64 + 2, 2) would read rows 2-3.
    with pytest.raises(ValueError, match="opt_arg"):
        Genred("SqDist(x,y)", AL, reduction_op="KMin", opt_arg=2**32 + 3)
    f = Genred("SqDist(x,y)", AL)
    x, y = xy()
    for rows, cols in [((2**64 + 2, 2), (0, 1)), ((0, 1), (0, 2**63)), ((-2**63 - 1, 1), (0, 1))]:
        with pytest.raises(ValueError, match="outside"):
            f.eval_block(x, y, rows=rows, cols=cols)
    with pytest.raises(TypeError, match="rows"):
        f.eval_block(x, y, rows=(0.5, 1), cols=(0, 1))
    assert f.eval_block(x, y, rows=(1, 2), cols=(0, 3)).shape == (2, 3)
    # KernelSolve's max_iter is a C int: 2**32 + 5 would have been 5 iterations.
    ks = KernelSolve("Exp(-SqDist(x,y))*b", ["x=Vi(3)", "y=Vj(3)", "b=Vj(1)"], "b", axis=1)
    xs = np.random.default_rng(0).random((20, 3))
    for bad in (2**32 + 5, -1):
        with pytest.raises(ValueError, match="max_iter"):
            ks(xs, xs, np.ones((20, 1)), max_iter=bad)
    assert ks(xs, xs, np.ones((20, 1)), max_iter=200).shape == (20, 1)


def test_ctrl_c_during_a_hanging_compile(tmp_path):
    # Ctrl-C (SIGINT) while the JIT waits for a compiler that hangs: the call returns at once,
    # Python raises KeyboardInterrupt, and the compiler's process group is killed. Run in a
    # child process, as a KeyboardInterrupt would end pytest's own session.
    import os
    import subprocess
    import sys
    import textwrap
    cc = tmp_path / "hangcc"
    pidfile = tmp_path / "pid"
    cc.write_text("#!/bin/sh\ncase \"$1\" in --version) echo fakecc 1.0; exit 0;; esac\n"
                  f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}\nsleep 300\n")
    cc.chmod(0o700)
    script = textwrap.dedent(f"""
        import os, signal, threading, time
        import numpy as np
        from symred import Genred
        # Python leaves SIGINT ignored when it started so (a background job of a shell
        # without job control): Ctrl-C must raise here whatever the caller's disposition.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        def interrupt():
            while not os.path.exists({str(pidfile)!r}):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)
        threading.Thread(target=interrupt, daemon=True).start()
        try:
            Genred("SqDist(x,y)", ["x = Vi(3)", "y = Vj(3)"])(np.zeros((2, 3)), np.zeros((2, 3)))
            print("returned")
        except KeyboardInterrupt:
            print("KeyboardInterrupt")
    """)
    # The call waits for the compiler only when creation does (SYMRED_JIT=sync); in the default
    # async mode it would return on the tile interpreter (test_async_call_does_not_wait).
    env = dict(os.environ, SYMRED_CC=str(cc), SYMRED_CACHE_DIR="off", SYMRED_DEVICE="cpu",
               SYMRED_JIT="sync")
    env.pop("SYMRED_COMPILE_TIMEOUT", None)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.strip() == "KeyboardInterrupt", (r.stdout, r.stderr)
    pgid = int(pidfile.read_text())
    for _ in range(500):  # a killed orphan may take a moment to be reaped
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.01)
    else:
        raise AssertionError(f"the compiler's process group {pgid} is still there")


def test_async_call_does_not_wait(tmp_path):
    # The default mode with a compiler that hangs: the call returns on the tile interpreter with
    # the right values, and the process exits at once (its context's compile is killed).
    import os
    import subprocess
    import sys
    import textwrap
    import time
    cc = tmp_path / "hangcc"
    cc.write_text("#!/bin/sh\ncase \"$1\" in --version) echo fakecc 1.0; exit 0;; esac\n"
                  "sleep 300\n")
    cc.chmod(0o700)
    script = textwrap.dedent("""
        import numpy as np
        from symred import Genred
        x = np.arange(6.0).reshape(2, 3)
        y = np.ones((4, 3))
        out = Genred("SqDist(x,y)", ["x = Vi(3)", "y = Vj(3)"], "Sum", axis=1)(x, y)
        want = ((x[:, None, :] - y[None, :, :]) ** 2).sum(axis=(1, 2))[:, None]
        print("ok" if np.allclose(out, want) else ("wrong", out, want))
    """)
    env = dict(os.environ, SYMRED_CC=str(cc), SYMRED_DEVICE="cpu", SYMRED_JIT="async",
               SYMRED_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("SYMRED_COMPILE_TIMEOUT", None)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.strip() == "ok", (r.stdout, r.stderr)
    assert time.monotonic() - t0 < 20, "the process waited for the hanging compiler"
