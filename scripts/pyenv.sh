#!/usr/bin/env bash
# pyenv.sh — creates (when missing) the cached virtual environment with the Python packages
# that the tests run against beside Debian's (PyTorch 2.x from PyPI, jax[cpu], GPyTorch,
# pykeops 2.3 for its test suite, and GeomLoss for bindings/python/tests/test_geomloss.py), and prints its path on stdout (progress goes to stderr).
#
# The environment is ${SYMRED_PYENV:-$HOME/.cache/symred-venv}, made with
# `/usr/bin/python3 -m venv --system-site-packages` so that Debian's NumPy and pytest stay
# visible. A stamp file in it records the requirement list it was installed with: when the
# stamp matches, the script only prints the path. An environment without a stamp (installed by
# hand) is accepted when its packages import at the required versions, and then gets the stamp;
# otherwise, or when the requirement list changed, pip installs the list again.
set -euo pipefail

venv=${SYMRED_PYENV:-$HOME/.cache/symred-venv}
python=$venv/bin/python
stamp=$venv/.symred-requirements
# The requirement list; `torch>=2` because Debian's torch 1.13 is visible through the system
# site packages and would otherwise satisfy `torch`.
requirements=("torch>=2" "jax[cpu]" "gpytorch" "pykeops==2.3" "geomloss")
wanted=$(printf '%s\n' "${requirements[@]}")

# packages_ok: the environment's python imports every package at the version asked for.
packages_ok() {
    "$python" - <<'EOF' >/dev/null 2>&1
import importlib.metadata as md
import geomloss, gpytorch, jax, torch  # noqa: F401
assert int(torch.__version__.split(".")[0]) >= 2, torch.__version__
assert md.version("pykeops") == "2.3"
assert md.version("keopscore") == "2.3"
EOF
}

if [ -x "$python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
    echo "$venv"
    exit 0
fi
if [ -x "$python" ] && [ ! -f "$stamp" ] && packages_ok; then
    echo "pyenv.sh: $venv already has the packages; stamping it" >&2
    printf '%s\n' "$wanted" >"$stamp"
    echo "$venv"
    exit 0
fi
if [ ! -x "$python" ]; then
    echo "pyenv.sh: creating $venv" >&2
    mkdir -p "$(dirname "$venv")"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
echo "pyenv.sh: installing ${requirements[*]} into $venv" >&2
rm -f "$stamp"
"$python" -m pip install --quiet "${requirements[@]}" >&2
if ! packages_ok; then
    echo "pyenv.sh: $venv does not import the packages after installing them" >&2
    exit 1
fi
printf '%s\n' "$wanted" >"$stamp"
echo "$venv"
