"""The bounds of the config's value policy (sparkctl/config/values.py), in a module of their own: the CLI's number
options (cli/bounds.py) check the same bounds without loading pydantic and the config loader, which keeps
`import sparkctl.cli.main` (`sparkctl --help`, completion, usage errors) at 0.09 s instead of 0.18 s."""
from __future__ import annotations

INT_MAX = 2**31 - 1          # every count fits a C int (SGLang passes many to CUDA/NCCL)
SECONDS_MAX = 7 * 86400.0    # a week bounds every timeout
