"""Stub written by sparkctl: SGLang's CLI parsing imports triton; nothing is compiled."""
__version__ = "0.0.0"


def jit(fn=None, **_):
    return fn if fn is not None else (lambda f: f)


def autotune(*_a, **_k):
    return lambda f: f


heuristics = autotune


class Config:
    def __init__(self, *_a, **_k):
        pass


from triton import language  # noqa: E402, F401  (torch._dynamo reads triton.language.dtype)
