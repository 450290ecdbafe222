"""SGLang's own request router in front of replicas: `sglang-router` 0.3.2 (the `smg` gateway's code, as the PyPI
release that ships aarch64 wheels and is inside the lmsysorg/sglang images).

replicas.py a profile's `replicas: K` rendered as K TP groups, and the `RouterSpec` in front of them
spec.py     what to run: `RouterSpec` -> the argv (a list), for a local process or a container from the engine image
process.py  the router as a local process (embedded cluster): start, wait ready, stop by PID
container.py the router as a container from the engine image on rank 0's node (docker runtime): docker over SSH
launch.py   which of the two, by the inventory's runtime; the one interface (`Router`) the replicated deploy calls
client.py   its HTTP API: worker add / list / remove (`/workers`), bounded drain, /liveness and /readiness
metrics.py  its Prometheus text (`smg_*`) -> per-worker health, selections and outcomes
"""
import re

from sparkctl.errors import DeployError

_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def strip_colour(text: str) -> str:
    """The router's log without its colour codes (sglang-router 0.3.2 colours it even with NO_COLOR set)."""
    return _COLOUR.sub("", text)


class RouterError(DeployError):
    """The router refused, failed or did not converge within its bound; the message names the call and the worker."""
