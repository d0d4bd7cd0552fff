"""pykeops' ``generic_sum``, ``generic_logsumexp``, ``generic_argmin`` and ``generic_argkmin``:
a Genred whose reduction axis (and K) comes from an output declaration ``"a = Vi(dim)"``
(one result per i: reduce over j) or ``"a = Vj(dim)"`` (one result per j: reduce over i).
``symred.numpy`` and ``symred.torch`` bind them to their own Genred."""

import re

_OUTPUT_RE = re.compile(r"\s*[A-Za-z_]\w*\s*=\s*(Vi|Vj)\s*\(\s*(\d+)\s*\)\s*$")


def _output(output, fname):
    """(axis, dim) of an output declaration; ValueError naming the function otherwise."""
    m = _OUTPUT_RE.match(output) if isinstance(output, str) else None
    if m is None:
        raise ValueError(f"{fname}: the output must be declared as 'name = Vi(dim)' (one "
                         f"result per i) or 'name = Vj(dim)' (one per j), not {output!r}")
    return (1 if m.group(1) == "Vi" else 0), int(m.group(2))


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
