#!/bin/sh
# check-layers.sh — keeps the module layering of docs/architecture.md true:
#
#     expr  <-  formulas  <-  core  <-  jit  <-  cpu
#
# A module may use its own folder and the folders to its left, never one to its right. Two
# checks, both run by ctest (tests/CMakeLists.txt, test "layers"):
#   1. includes: no file of src/<module> includes "../<higher module>/...";
#   2. symbols (when object files are given): no object of src/<module> refers to a symbol that
#      only an object of a higher module defines. This catches what includes cannot: a call to a
#      public sr_* function (declared in include/symred.h, which every module includes) that a
#      higher module defines. The one exception is core's backend registry (registry.c), which
#      names each backend's interface object listed in SR_BACKEND_MAP (src/core/core.h).
#
# usage: check-layers.sh SRC_DIR [OBJECT...]    (OBJECTs: the library's object files)
# Prints every violation and exits 1 when there is one; 0 otherwise.
set -eu

LAYERS="expr formulas core jit cpu"

[ $# -ge 1 ] || {
    echo "usage: $0 SRC_DIR [OBJECT...]" >&2
    exit 2
}
src=$1
shift

rank() {
    r=0
    for l in $LAYERS; do
        [ "$l" = "$1" ] && {
            echo $r
            return
        }
        r=$((r + 1))
    done
    echo -1
}

bad=0
nfiles=0

# 1. Includes.
for dir in "$src"/*/; do
    mod=$(basename "$dir")
    mr=$(rank "$mod")
    if [ "$mr" -lt 0 ]; then
        echo "check-layers: src/$mod is not a known layer (add it to LAYERS and docs/architecture.md)"
        bad=1
        continue
    fi
    for f in "$dir"*.c "$dir"*.h; do
        [ -f "$f" ] || continue
        nfiles=$((nfiles + 1))
        # Lines such as: #include "../core/core.h"
        for to in $(sed -n 's|^[[:space:]]*#[[:space:]]*include[[:space:]]*"\.\./\([^/"]*\)/.*|\1|p' "$f"); do
            tr=$(rank "$to")
            if [ "$tr" -lt 0 ] || [ "$tr" -gt "$mr" ]; then
                echo "check-layers: src/$mod/$(basename "$f") includes ../$to/: $mod may only use $(echo "$LAYERS" | cut -d' ' -f1-$((mr + 1)))"
                bad=1
            fi
        done
    done
done
if [ "$nfiles" -eq 0 ]; then
    echo "check-layers: no sources under $src"
    exit 1
fi

# 2. Symbols.
if [ $# -gt 0 ]; then
    # The backend objects the registry may name: the second field of each X(...) row of
    # SR_BACKEND_MAP.
    registry=$(sed -n '/#define SR_BACKEND_MAP/,/^$/s/.*X(\([A-Z_]*\), *\([a-z_0-9]*\),.*/\2/p' \
        "$src/core/core.h" | tr '\n' ' ')
    [ -n "$registry" ] || {
        echo "check-layers: no SR_BACKEND_MAP rows found in $src/core/core.h"
        exit 1
    }
    for o in "$@"; do
        [ -f "$o" ] || {
            echo "check-layers: no object file $o"
            exit 1
        }
    done
    defs=$(mktemp)
    trap 'rm -f "$defs" "$defs.use"' EXIT
    for o in "$@"; do
        mod=$(echo "$o" | sed -n 's|.*/src/\([^/]*\)/[^/]*$|\1|p')
        nm -g --defined-only "$o" | awk -v m="$mod" -v o="$(basename "$o")" 'NF == 3 { print $3, m, o }'
    done >"$defs"
    for o in "$@"; do
        mod=$(echo "$o" | sed -n 's|.*/src/\([^/]*\)/[^/]*$|\1|p')
        mr=$(rank "$mod")
        obj=$(basename "$o")
        # Each undefined symbol that a module defines (the others are the C library, OpenMP,
        # ...): "symbol module object".
        nm -u "$o" | awk 'NR == FNR { def[$1] = $2 " " $3; next } ($NF in def) { print $NF, def[$NF] }' \
            "$defs" - >"$defs.use"
        while read -r sym to defobj; do
            tr=$(rank "$to")
            [ "$tr" -le "$mr" ] && continue
            if [ "$mod" = core ] && [ "${obj%%.*}" = registry ] &&
                echo " $registry " | grep -q " $sym "; then
                continue
            fi
            echo "check-layers: src/$mod/${obj%.o} uses $sym, defined in src/$to/$defobj"
            bad=1
        done <"$defs.use"
    done
fi

if [ "$bad" -ne 0 ]; then
    echo "check-layers: FAILED (the layers and the rule: docs/architecture.md)"
    exit 1
fi
echo "check-layers: ok ($nfiles sources${1:+, $# objects}; $LAYERS)"
