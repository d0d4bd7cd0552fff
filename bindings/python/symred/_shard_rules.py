"""What the sharded front ends (symred.jax_sharding, symred.distributed) share, whatever the
array library: the partial state each reduction combines, the kernel that computes it for a
selection, and the user's results from a combined state. The combine rules themselves are
those of the MPI layer (mpi/combine.c, docs/scale-out.md)."""

# The partial state of each reduction: "sum" (a sum), "lse" (a LogSumExp), "ssw" (a softmax
# average and its LogSumExp), "min" / "max" / "kmin" (candidates with global indices).
KIND = {
    "Sum": "sum", "LogSumExp": "lse", "SumSoftMaxWeight": "ssw",
    "Min": "min", "ArgMin": "min", "Min_ArgMin": "min",
    "Max": "max", "ArgMax": "max", "Max_ArgMax": "max",
    "KMin": "kmin", "ArgKMin": "kmin", "KMin_ArgKMin": "kmin",
}
# The kernel run per block for a selection: values and indices both.
SELECT_RED = {"min": "Min_ArgMin", "max": "Max_ArgMax", "kmin": "KMin_ArgKMin"}


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
