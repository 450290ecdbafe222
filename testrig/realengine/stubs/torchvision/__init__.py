"""Inert torchvision, written by sparkctl's testrig into the CPU-only real-engine venv.

Why: ``sglang.srt.configs`` (and transformers' image processors) import torchvision unconditionally,
and PyPI's torchvision fails beside the CPU torch 2.13.0 ("operator torchvision::nms does not exist").
A text-only model never calls it, so every attribute and submodule is an inert placeholder class.
Chosen over the op-schema import hook because the real server boots with it and it installs nothing."""
import importlib.abc
import importlib.machinery
import sys

__version__ = "0.0.0"


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, key):
        return cls


def _placeholder(name):
    return _Meta(name.rsplit(".", 1)[-1], (), {"__qualname__": name, "__module__": __name__})


def _module_getattr(prefix):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{prefix}.{name}")
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
