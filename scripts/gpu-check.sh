#!/usr/bin/env bash
# gpu-check.sh — everything symred checks on a machine with an NVIDIA GPU, in one call.
#
#   scripts/gpu-check.sh bundle     on a build machine: builds build-gpu/ (tests + benchmarks,
#                                   warnings as errors) and packs .gpu-bundle/: the GPU test and
#                                   benchmark programs plus every shared library they load that a
#                                   bare GPU machine may lack (Criterion and its dependencies,
#                                   BLIS), so that machine needs no package and no network.
#   scripts/gpu-check.sh run [DIR]  on the GPU machine: uses .gpu-bundle/ when it is there, else
#                                   builds (then Criterion must be installed); runs the NVRTC
#                                   compile tests, the CUDA differential suite, the same suite
#                                   under compute-sanitizer memcheck, the examples on the GPU, the
#                                   XLA FFI handlers of symred.jax on device buffers (test-xla-ffi,
#                                   no JAX needed; built where jaxlib's headers were found),
#                                   pykeops' own test suite on the GPU's torch (bundled from the
#                                   cached virtual environment) and the benchmarks. Logs go to DIR (default gpu-logs/, or $OUT
#                                   when set), one file per step, and a summary line per step.
#
# Every step runs even after a failure; the exit status is 0 only when all passed.
set -uo pipefail
cd "$(dirname "$0")/.."

mode=${1:-run}
bundle=.gpu-bundle

programs=(tests/test-cuda tests/test-nvrtc bench/bench-gpu gp-matvec knn)
# Built only where jaxlib's FFI headers are found (the GPU machine has no JAX: it runs the bundle).
optional_programs=(test-xla-ffi)

do_bundle() {
    local jobs
    jobs=$(nproc 2>/dev/null || echo 2)
    cmake -S . -B build-gpu -DSYMRED_WERROR=ON -DSYMRED_BUILD_BENCH=ON \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
        cmake --build build-gpu -j "$jobs" || return 1
    rm -rf "$bundle"
    mkdir -p "$bundle/bin" "$bundle/lib"
    local p libs
    for p in "${programs[@]}"; do
        cp "build-gpu/$p" "$bundle/bin/" || return 1
    done
    for p in "${optional_programs[@]}"; do
        if [ -e "build-gpu/$p" ]; then
            cp "build-gpu/$p" "$bundle/bin/"
        else
            echo "gpu-check: build-gpu/$p not built (no jaxlib FFI headers): not bundled"
        fi
    done
    cp build-gpu/libsymred.so* "$bundle/lib/"
    # Shared libraries the programs link, except the C library's own, which the GPU machine has
    # (a newer glibc runs programs built against an older one).
    libs=$(for p in "$bundle"/bin/*; do ldd "$p"; done | awk '/=> \// {print $3}' | sort -u |
        grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*)\.so')
    for p in $libs; do
        cp -L "$p" "$bundle/lib/"
    done
    # BLIS is dlopen()ed by name at run time (the gemm-epilogue path), so ldd does not list it.
    if [ -e /usr/lib/x86_64-linux-gnu/libblis.so.4 ]; then
        cp -L /usr/lib/x86_64-linux-gnu/libblis.so.4 "$bundle/lib/"
    fi
    # pykeops 2.3's own test suite, copied from the package in the cached virtual environment
    # (scripts/pyenv.sh) when it is there: its GPU tests run on the GPU machine's torch through
    # the name-mapping shim, as scripts/pykeops-suite.sh runs the CPU ones.
    local venv=${SYMRED_PYENV:-$HOME/.cache/symred-venv} suite
    if suite=$("$venv/bin/python" -c 'import importlib.util, os
print(os.path.join(os.path.dirname(importlib.util.find_spec("pykeops").origin), "test"))' 2>/dev/null); then
        mkdir -p "$bundle/pykeops-test"
        cp "$suite"/*.py "$bundle/pykeops-test/" && rm -f "$bundle/pykeops-test/__init__.py"
    else
        echo "gpu-check: no pykeops in $venv (scripts/pyenv.sh makes it): its suite not bundled"
    fi
    du -sh "$bundle"
}

# step NAME TIMEOUT COMMAND...: runs COMMAND with its output in $logs/NAME.log.
step() {
    local name=$1 limit=$2
    shift 2
    echo "==== gpu-check: $name"
    local t0=$SECONDS rc
    timeout "$limit" "$@" >"$logs/$name.log" 2>&1
    rc=$?
    tail -n 15 "$logs/$name.log"
    if [ "$rc" -eq 0 ]; then
        passed+=("$name")
        echo "==== gpu-check: $name ok ($((SECONDS - t0)) s)"
    else
        failed+=("$name")
        echo "==== gpu-check: $name FAILED rc=$rc ($((SECONDS - t0)) s)"
    fi
}

do_run() {
    logs=${1:-${OUT:-gpu-logs}}
    mkdir -p "$logs"
    passed=()
    failed=()
    local bin
    if [ -d "$bundle/bin" ]; then
        bin=$bundle/bin
        export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    else
        cmake -S . -B build-gpu -DSYMRED_WERROR=ON -DSYMRED_BUILD_BENCH=ON >/dev/null &&
            cmake --build build-gpu -j "$(nproc)" >"$logs/build.log" 2>&1 ||
            { echo "gpu-check: build failed (build.log)"; return 1; }
        mkdir -p build-gpu/flat
        for p in "${programs[@]}"; do ln -sf "$PWD/build-gpu/$p" build-gpu/flat/; done
        for p in "${optional_programs[@]}"; do
            [ -e "build-gpu/$p" ] && ln -sf "$PWD/build-gpu/$p" build-gpu/flat/
        done
        bin=build-gpu/flat
    fi
    # A cache of this run's own, so no kernel compiled elsewhere is reused.
    export SYMRED_CACHE_DIR=${SYMRED_CACHE_DIR:-$(mktemp -d)}
    nvidia-smi >"$logs/nvidia-smi.log" 2>&1
    head -n 12 "$logs/nvidia-smi.log"
    # Limits keep the whole run inside ten minutes; GPU_CHECK_BENCH_ARGS narrows the benchmark
    # (for example "--max 1000000"; "skip" leaves it out), GPU_CHECK_TORCH_ARGS bench/gpu_torch.py.
    step nvrtc 120 "$bin/test-nvrtc" --jobs 1 --verbose
    step cuda 240 "$bin/test-cuda" --jobs 1 --verbose
    step example-gp 60 "$bin/gp-matvec" --check --device cuda 20011 30011
    step example-knn 60 "$bin/knn" --check --device cuda 10007 2003 16 --k 10
    # The CUDA handler of symred.jax on device buffers and a real stream, against the CPU
    # handler. Where nvidia-smi lists a GPU, --require-gpu makes a GPU part that cannot open it a
    # failure; elsewhere the harness skips that part and runs its host checks.
    if [ -x "$bin/test-xla-ffi" ]; then
        local need=()
        nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && need=(--require-gpu)
        step xla-ffi 120 "$bin/test-xla-ffi" "${need[@]}"
    else
        echo "==== gpu-check: xla-ffi skipped (test-xla-ffi not built: no jaxlib FFI headers)"
    fi
    # shellcheck disable=SC2086
    [ "${GPU_CHECK_BENCH_ARGS:-}" = skip ] || step bench 200 "$bin/bench-gpu" --json "$logs/bench-gpu.json" ${GPU_CHECK_BENCH_ARGS:-}
    # PyTorch on the same card, through the Python binding (torch is on the GPU machines).
    local lib
    lib=$(ls "$PWD/$bundle/lib/libsymred.so" "$PWD/build-gpu/libsymred.so" 2>/dev/null | head -n 1)
    if python3 -c 'import torch, numpy' >/dev/null 2>&1; then
        SYMRED_LIB=$lib step torch-bench 300 python3 bench/gpu_torch.py \
            --json "$logs/gpu-torch.json" ${GPU_CHECK_TORCH_ARGS:-}
        if [ -d bindings/python/tests ]; then
            # The Python tests that use the GPU (test_torch_cuda.py, and every test whose name
            # says cuda or gpu); none selected (exit 5) is not a failure.
            SYMRED_LIB=$lib step pytest-gpu 300 bash -c 'python3 -m pytest -q -rs -k "cuda or gpu" \
                bindings/python/tests; rc=$?; [ "$rc" -eq 5 ] && rc=0; exit "$rc"'
        fi
        if [ -d "$bundle/pykeops-test" ] && python3 -c 'import torch; assert torch.cuda.is_available()' \
            >/dev/null 2>&1; then
            # pykeops' own suite with the GPU: every test runs (the GPU-only ones no longer skip).
            local repo=$PWD
            SYMRED_LIB=$lib step pykeops-suite-gpu 300 bash -c "cd '$bundle/pykeops-test' &&
                PYTHONPATH='$repo/bindings/python/pykeops_shim:$repo/bindings/python' \
                python3 -m pytest -p pykeops_shim -p no:cacheprovider -q -rfEs ."
        else
            echo "==== gpu-check: pykeops-suite-gpu skipped (no bundled suite or no CUDA torch)"
        fi
    fi
    if command -v compute-sanitizer >/dev/null 2>&1; then
        # Criterion forks a child per test; the sanitizer follows it (--target-processes all).
        SYMRED_TEST_NO_FAULTS=1 step memcheck 400 compute-sanitizer --tool memcheck --target-processes all \
            --error-exitcode 99 "$bin/test-cuda" --jobs 1
    fi
    echo
    echo "gpu-check: passed: ${passed[*]:-none}"
    echo "gpu-check: failed: ${failed[*]:-none}"
    [ "${#failed[@]}" -eq 0 ]
}

case "$mode" in
bundle) do_bundle ;;
run) do_run "${2:-}" ;;
*)
    echo "usage: $0 bundle | run [LOGDIR]" >&2
    exit 2
    ;;
esac
