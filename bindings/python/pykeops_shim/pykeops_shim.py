"""pykeops_shim: makes ``import pykeops...`` import symred, for running pykeops' own test suite
against symred (scripts/pykeops-suite.sh).

It only maps module names: ``pykeops`` is ``symred``, ``pykeops.X.Y`` is ``symred.X.Y``
(``pykeops.numpy`` -> ``symred.numpy``, ``pykeops.torch`` -> ``symred.torch``,
``pykeops.torch.cluster`` -> ``symred.torch.cluster``, ...). Every name the suite uses must
exist in symred itself; this module holds no feature code.

Use it as a pytest plugin (``pytest -p pykeops_shim``) or call :func:`install`.
"""

import importlib
import importlib.abc
import importlib.util
import sys

ALIAS, TARGET = "pykeops", "symred"


def _target_name(name):
    return TARGET + name[len(ALIAS):]


def _mirror():
    """Registers every loaded ``symred.*`` module under its ``pykeops.*`` name too: symred.numpy
    and symred.torch are modules that register their submodules in sys.modules, and Python looks
    there before it asks a finder for a submodule of a module that is not a package."""
    for name, module in list(sys.modules.items()):
        if name == TARGET or name.startswith(TARGET + "."):
            sys.modules.setdefault(ALIAS + name[len(TARGET):], module)


class _AliasLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = importlib.import_module(_target_name(spec.name))
        _mirror()
        return module

    def exec_module(self, module):
        pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != ALIAS and not name.startswith(ALIAS + "."):
            return None
        if importlib.util.find_spec(_target_name(name)) is None:
            return None
        return importlib.util.spec_from_loader(name, _AliasLoader())


def install():
    """Puts the name-mapping finder first on sys.meta_path (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
    for name in [n for n in sys.modules if n == ALIAS or n.startswith(ALIAS + ".")]:
        if not (sys.modules[name].__name__ or "").startswith(TARGET):
            del sys.modules[name]


install()
