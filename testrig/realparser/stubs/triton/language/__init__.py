"""Stub: see triton/__init__.py."""
constexpr = int


class dtype:
    pass
