"""What the sharded front ends (symred.jax_sharding, symred.distributed) share, whatever the
array library: the partial state each reduction combines, the kernel that computes it for a
selection, and the user's results from a combined state. The combine rules themselves are
those of the MPI layer (mpi/combine.c, docs/scale-out.md)."""

import ctypes

from ._lib import lib

# sr_combine's values (include/symred.h), as the kinds of partial state the front ends combine.
_COMBINE_KINDS = ("sum", "min", "max", "kmin", "lse", "ssw")


def _rules():
    """KIND: the kind of partial state of each reduction, by name ("sum", "lse", "ssw", or
    "min" / "max" / "kmin": candidates with global indices); SELECT_RED: for each selecting
    kind, the reduction whose outputs carry its partial state (values and indices both). Both
    from the library's reduction table (sr_reduction_combine)."""
    kind, select = {}, {}
    r = 0
    while True:
        name = lib.sr_reduction_name(r)
        if name is None:
            return kind, select
        how, partial = ctypes.c_int(), ctypes.c_int()
        if lib.sr_reduction_combine(r, ctypes.byref(how), ctypes.byref(partial)) != 0:
            raise RuntimeError(f"sr_reduction_combine refused reduction {name.decode()}")
        k = _COMBINE_KINDS[how.value]
        kind[name.decode()] = k
        if k in ("min", "max", "kmin"):
            select[k] = lib.sr_reduction_name(partial.value).decode()
        r += 1


KIND, SELECT_RED = _rules()


def finish(red, state):
    """The results of reduction ``red`` from its combined state, shaped as a Genred's: the
    candidates are (n, k, d) arrays of values and indices."""
    kind = KIND[red]
    if kind in ("sum", "lse", "ssw"):
        return state[0]
    v, i = state
    if kind == "kmin":
        if v.shape[2] == 1:
            v, i = v[:, :, 0], i[:, :, 0]
    else:
        v, i = v[:, 0, :], i[:, 0, :]
    if red in ("Min", "Max", "KMin"):
        return v
    if red in ("ArgMin", "ArgMax", "ArgKMin"):
        return i
    return v, i
