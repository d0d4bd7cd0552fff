"""pykeops' ``generic_sum``, ``generic_logsumexp``, ``generic_argmin`` and ``generic_argkmin``:
a Genred whose reduction axis (and K) comes from an output declaration ``"a = Vi(dim)"``
(one result per i: reduce over j) or ``"a = Vj(dim)"`` (one result per j: reduce over i).
``symred.numpy`` and ``symred.torch`` bind them to their own Genred."""

from ._lib import SR_CAT_I, SR_CAT_J, SymredValueError, declared_vars


def _output(output, fname):
    """(axis, dim) of an output declaration, as the C parser reads it; ValueError naming the
    function otherwise."""
    table = None
    if isinstance(output, str) and "\x00" not in output:
        try:
            table = declared_vars([output])
        except SymredValueError:
            pass
    if not table or len(table) != 1 or table[0][2] not in (SR_CAT_I, SR_CAT_J):
        raise ValueError(f"{fname}: the output must be declared as 'name = Vi(dim)' (one "
                         f"result per i) or 'name = Vj(dim)' (one per j), not {output!r}")
    _, dim, cat, _ = table[0]
    return (1 if cat == SR_CAT_I else 0), dim


def bind(genred_cls):
    """The four functions, returning instances of ``genred_cls``."""

    def generic_sum(formula, output, *aliases, **kwargs):
        """``Genred(formula, aliases, "Sum", axis)``, the axis from ``output``."""
        axis, _ = _output(output, "generic_sum")
        return genred_cls(formula, list(aliases), reduction_op="Sum", axis=axis, **kwargs)

    def generic_logsumexp(formula, output, *aliases, **kwargs):
        """``Genred(formula, aliases, "LogSumExp", axis)``, the axis from ``output``."""
        axis, _ = _output(output, "generic_logsumexp")
        return genred_cls(formula, list(aliases), reduction_op="LogSumExp", axis=axis,
                          **kwargs)

    def generic_argmin(formula, output, *aliases, **kwargs):
        """``Genred(formula, aliases, "ArgMin", axis)``, the axis from ``output``."""
        axis, _ = _output(output, "generic_argmin")
        return genred_cls(formula, list(aliases), reduction_op="ArgMin", axis=axis, **kwargs)

    def generic_argkmin(formula, output, *aliases, **kwargs):
        """``Genred(formula, aliases, "ArgKMin", axis, opt_arg=K)``, the axis from
        ``output`` and K its dimension (``"a = Vi(K)"``)."""
        axis, k = _output(output, "generic_argkmin")
        return genred_cls(formula, list(aliases), reduction_op="ArgKMin", axis=axis,
                          opt_arg=k, **kwargs)

    return generic_sum, generic_logsumexp, generic_argmin, generic_argkmin
