"""Build-time layout of the wheel (everything else is in pyproject.toml).

The shipped data lives at the top of the repository, one copy of each file: profiles/, inventory/, images/
(Dockerfile templates), patches/, playbooks/, grafana/. The wheel carries each as ``sparkctl/data/<name>/`` through
setuptools' own ``package_dir`` mapping (no copying, no generated files), and sparkctl.resources reads them
there when installed, or from the top of the checkout in an editable install (``pip install -e .``, as
bin/_bootstrap does) and when the tests import the checkout. The names match sparkctl.resources.SHIPPED_DIRS
(tests/unit/test_resources.py checks it). Packages are declared here rather than in pyproject.toml because a
``[tool.setuptools.packages]`` table cannot both discover the code and add the mapped data directories.
"""
from setuptools import find_namespace_packages, setup

SHIPPED_DIRS = ("profiles", "inventory", "images", "patches", "playbooks", "grafana")
DATA = {f"sparkctl.data.{name}": name for name in SHIPPED_DIRS}

setup(
    packages=find_namespace_packages(include=["sparkctl", "sparkctl.*"], exclude=["*.__pycache__"]) + list(DATA),
    package_dir=DATA,
    package_data={
        # JSON dialects, bench prompts ... inside the code's own packages
        "": ["*.json", "*.yml", "*.yaml", "*.txt", "*.j2", "*.md"],
        # every file of a shipped directory, subdirectories included (playbooks/roles/..., patches/<series>/)
        **{package: ["**/*"] for package in DATA},
    },
    exclude_package_data={
        "": ["__pycache__/*", "*.pyc"],
        # a user's own real inventory kept in a checkout (`./inventory/sparks.yml`, git-ignored) is not shipped
        "sparkctl.data.inventory": ["sparks.yml"],
    },
)
