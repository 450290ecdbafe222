"""Stub of SGLang's CUDA kernel package, written by sparkctl's testrig into a CPU-only venv.

Why: SGLang 0.5.23 imports ``sgl_kernel`` at module level even on CPU (first in
``sglang/kernels/ops/kvcache/cache_move.py``) and PyPI has no CPU build. Imports must succeed;
a call must fail loudly, never compute something wrong. So every attribute, at any depth, and every
submodule (``sgl_kernel.kvcacheio``...) is a placeholder that raises when called.
"""
import importlib.abc
import importlib.machinery
import sys

__version__ = "0.0.0+sparkctl.stub"


class StubKernelCalled(NotImplementedError):
    """A kernel of the stub was called: this code path needs the real sgl_kernel (a GPU build)."""


class _Placeholder:
    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise StubKernelCalled(f"{self._name} called: sgl_kernel is a stub here (no CPU build on PyPI)")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._name}.{name}")

    def __repr__(self):
        return f"<sgl_kernel stub {self._name}>"


def _module_getattr(prefix):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{prefix}.{name}")
    return __getattr__


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = _module_getattr(module.__name__)


sys.meta_path.append(_Finder())
__getattr__ = _module_getattr(__name__)
