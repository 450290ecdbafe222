"""The ``--json`` outputs of the read-only and image commands, as pydantic models.

Each command builds its model from the library's result and prints ``model_dump_json``: the keys are the same in
every outcome (null where they do not apply) and ``sparkctl schema NAME`` prints each one's JSON Schema.
Models are strict about their own keys (``extra="forbid"``): a library change that adds a key fails here first.
A model that is the JSON view of a library object is named after it with ``Out`` (``PatchResultOut`` is the view of
`sparkctl.images.patchapply.PatchResult`, which stays a stdlib dataclass: it runs inside the image build, and its
bytes are part of the image tag; ``NodeFactsOut`` is `sparkctl facts`' summary, not preflight's raw
`sparkctl.nodes.node_facts.NodeFacts`; ``RankSpecOut`` the render view of `LaunchSpec`), so one name is one model.
"""
from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field, RootModel

from sparkctl.doctor.collect import DoctorReport
from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RankSpecOut(_Out):
    rank: int
    node: str
    argv: list[str] = Field(description="The engine's exact argv (secrets as ***).")
    env: dict[str, str] = Field(description="Environment the engine gets (secrets as ***).")


class RenderOutput(_Out):
    """`sparkctl render --json`."""
    profile: str
    engine: str = Field(description="The profile's engine: sglang or vllm.")
    engine_version: str = Field(description="Its release (the flag dialect the argv is spelt in).")
    sglang_version: str | None = Field(description="The SGLang release for engine sglang, else null.")
    inventory: str
    emulated: bool
    ranks: list[RankSpecOut]
    warnings: list[str]


class ReplicaRenderOut(_Out):
    index: int
    nodes: list[str] = Field(description="The replica's nodes, its rank 0 first.")
    url: str = Field(description="The replica's own API (a worker of the router).")
    ranks: list[RankSpecOut]


class RouterRenderOut(_Out):
    node: str = Field(description="The node whose address the router serves on (the cluster's rank 0).")
    url: str = Field(description="The endpoint handed off: the router, as the controller reaches it.")
    runs: str = Field(description="Where the router runs: a process on this machine, or a container of the "
                                  "engine image on the node.")
    policy: str
    argv: list[str] = Field(description="The router's argv (inside the container on the docker runtime).")


class RenderReplicatedOutput(_Out):
    """`sparkctl render --json` of a profile with replicas: K (one object: every replica and the router)."""
    profile: str
    engine: str = Field(description="The profile's engine: sglang or vllm.")
    engine_version: str = Field(description="Its release (the flag dialect the argv is spelt in).")
    sglang_version: str | None = Field(description="The SGLang release for engine sglang, else null.")
    inventory: str
    emulated: bool
    replicas: list[ReplicaRenderOut]
    router: RouterRenderOut
    warnings: list[str]


class ProfileEntry(_Out):
    name: str
    description: str
    path: str
    renders: bool = Field(description="The profile renders against the inventory (validated, nothing started).")
    problem: str | None = Field(description="Why it does not render there (null when it does).")


class ProfilesOutput(_Out):
    """`sparkctl profiles --json`."""
    inventory: str
    emulated: bool
    profiles: list[ProfileEntry]


class ImageSide(_Out):
    tag: str | None = Field(description="Content-addressed tag; null while an input is unresolved.")
    inputs: JSONObject = Field(description="What the tag is computed from (unresolved inputs are null).")
    inputs_sha256: str | None


class ImagePlanOutput(_Out):
    """`sparkctl image plan --json`."""
    profile: str
    builder: str = Field(description="The node that builds (rank 0).")
    resolved: bool = Field(description="Every input is known, so both tags are computed.")
    unresolved: list[str] = Field(description="Inputs not known yet, e.g. engine.inputs.base_digest.")
    reason: str | None = Field(description="Why an input is unresolved (null when resolved).")
    engine: ImageSide
    launch: ImageSide


class BuildStepOut(_Out):
    role: str
    tag: str
    image_id: str
    built: bool
    seconds: float
    reason: str


class LayerMoveOut(_Out):
    digest: str
    size: int
    sent: bool


class TransferOut(_Out):
    node: str
    image: str
    skipped: str | None
    layers: list[LayerMoveOut]
    rx_bytes: int
    seconds: float
    via: str = "registry"      # registry (missing layers) | stream (whole images, docker save | docker load)


class ImageBuildOutput(ImagePlanOutput):
    """`sparkctl image build --json`: the plan, then what was built, copied and verified (--no-copy: no transfers,
    no ids)."""
    steps: list[BuildStepOut]
    transfers: list[TransferOut]
    ids: dict[str, dict[str, str]] = Field(description="{image tag: {node: image ID}} after the copy.")


class ReplicaImagePlan(ImagePlanOutput):
    index: int = Field(description="The replica (its images are built on its own rank 0, the builder).")
    nodes: list[str]


class ImagePlanReplicatedOutput(_Out):
    """`sparkctl image plan --json` of a profile with replicas: K (each replica's launch image is its own)."""
    profile: str
    replicas: list[ReplicaImagePlan]


class ReplicaImageBuild(ImageBuildOutput):
    index: int = Field(description="The replica (built on its own rank 0, copied to its own nodes).")
    nodes: list[str]


class ImageBuildReplicatedOutput(_Out):
    """`sparkctl image build --json` of a profile with replicas: K."""
    profile: str
    replicas: list[ReplicaImageBuild]


class ImageRow(_Out):
    node: str
    id: str
    tags: list[str]
    role: str | None
    size: int | None
    created: str | None
    labels: dict[str, str]


class ImageListOutput(RootModel[list[ImageRow]]):
    """`sparkctl image ls --json`: one row per image per node."""


class ImageVerifyOutput(RootModel[dict[str, dict[str, str]]]):
    """`sparkctl image verify --json`: {image tag: {node: image ID}}."""


class PrunedImage(ImageRow):
    error: str | None = None


class RegistryCachePrune(_Out):
    removed: list[str]
    freed: int


class ImagePruneOutput(_Out):
    """`sparkctl image prune --json`."""
    images: list[PrunedImage]
    registry_caches: dict[str, RegistryCachePrune]


class PatchResultOut(_Out):
    patch: str
    status: str
    files: list[str]
    file: str | None = None
    hunk_index: int | None = None
    hunk: str | None = None
    reason: str | None = None


class SeriesReportOut(_Out):
    series: str
    engine: str                  # sglang | vllm: the series file's first entry names it
    sglang_version: str          # the engine's release the series is for (named when SGLang was the only engine)
    wheel: str                   # the released source checked against: a wheel's name, or an installed package dir
    ok: bool
    patches: list[PatchResultOut]


class PatchesCheckOutput(RootModel[list[SeriesReportOut]]):
    """`sparkctl patches check --json`: one report per series."""


class ChangedTask(_Out):
    host: str
    task: str


class PlaybookRunOut(_Out):
    playbook: str
    check: bool
    status: str
    artifacts: str
    changed: list[ChangedTask]


class PrepareOutput(_Out):
    """`sparkctl prepare --json`: per-host task counts, and per playbook what changed (or would, with --check)."""
    stats: dict[str, dict[str, int]]
    runs: list[PlaybookRunOut]


class GpuOut(_Out):
    name: str | None
    driver: str | None
    cuda: str | None


class FabricOut(_Out):
    interface: str
    state: str
    mtu: int | None
    ipv4: list[str] = Field(description="IPv4 addresses the interface carries.")
    address: str | None = Field(description="The inventory's fabric_address (what the ranks dial).")
    holds_address: bool | None = Field(description="The interface answers on `address`.")


class RoceLinkOut(_Out):
    hca: str
    netdev: str
    up: bool


class DockerOut(_Out):
    version: str | None
    runtimes: list[str]
    default_runtime: str | None


class ManifestOut(_Out):
    status: str
    files: int
    manifest: str


class NodeFactsOut(_Out):
    gpu: GpuOut | None
    memory_gib: float | None
    fabric: FabricOut | None
    roce: list[RoceLinkOut] | None
    docker: DockerOut | None
    models: dict[str, ManifestOut]


class FactsOutput(RootModel[dict[str, NodeFactsOut]]):
    """`sparkctl facts --json`: {node: facts}."""


# `sparkctl schema NAME`: the file formats (profile, inventory) and these outputs.
class HistoryOutput(BaseModel):
    """`sparkctl bench history --json` (rows: sparkctl.bench.history)."""
    profile: str | None
    cards: list[JSONObject] = Field(description="One row per card, oldest first: run_id, started, status, "
                                        "on/off decode summaries per class, changed (since the previous row).")
    skipped: list[str]
    index: str
    chart: str | None


class DiffOutput(BaseModel):
    """`sparkctl bench diff A B --json` (sparkctl.bench.diff)."""
    a: JSONObject
    b: JSONObject
    noise_band: str
    arms: list[JSONObject] = Field(description="Per matched arm: metrics {name: delta, band, verdict}, changed.")
    ratio: JSONObject
    emulated: bool


OUTPUTS: dict[str, type[BaseModel]] = {
    "render": RenderOutput, "render-replicated": RenderReplicatedOutput, "profiles": ProfilesOutput,
    "image-plan": ImagePlanOutput,
    "image-plan-replicated": ImagePlanReplicatedOutput, "image-ls": ImageListOutput,
    "image-build": ImageBuildOutput, "image-build-replicated": ImageBuildReplicatedOutput,
    "image-verify": ImageVerifyOutput, "image-prune": ImagePruneOutput, "prepare": PrepareOutput,
    "patches-check": PatchesCheckOutput,
    "facts": FactsOutput, "bench-history": HistoryOutput, "bench-diff": DiffOutput,
    "doctor": DoctorReport,
}


# The lifecycle's typed results and the ledger's record (imported only when asked for: deploy/ is heavy).
LIFECYCLE_OUTPUTS = {
    "up": "sparkctl.deploy.results:UpResult", "rollback": "sparkctl.deploy.results:UpResult",
    "down": "sparkctl.deploy.results:DownResult", "down-dry-run": "sparkctl.deploy.results:DownPlanResult",
    "status": "sparkctl.deploy.results:StatusResult",
    "deployment-record": "sparkctl.state.records:DeploymentRecord",
    "up-replicated": "sparkctl.deploy.results:ReplicatedUpResult",
    "status-replicated": "sparkctl.deploy.results:ReplicatedStatusResult",
    "down-replicated": "sparkctl.deploy.results:ReplicatedDownResult",
    "replicated-record": "sparkctl.state.records:ReplicatedRecord",
    "bench": "sparkctl.state.runs:RunRecord",
    "tune": "sparkctl.state.tunejournal:TuneJournal",
}


def schema_names() -> list[str]:
    """What `sparkctl schema` knows: the two file formats, then every modelled --json output."""
    return ["profile", "inventory", *OUTPUTS, *LIFECYCLE_OUTPUTS]


def json_schema(kind: str) -> JSONObject:
    """The JSON Schema `sparkctl schema KIND` prints: a file format (sparkctl.config.schema) or a --json output."""
    from sparkctl.config.schema import file_schema
    if kind in ("profile", "inventory"):
        return file_schema(kind)
    if kind in OUTPUTS:
        return OUTPUTS[kind].model_json_schema()
    if kind in LIFECYCLE_OUTPUTS:
        import importlib
        module, name = LIFECYCLE_OUTPUTS[kind].split(":")
        schema: JSONObject = getattr(importlib.import_module(module), name).model_json_schema()
        return schema
    raise ConfigError(f"unknown schema kind {kind!r}", hint=f"use one of: {', '.join(schema_names())}")


def print_json(data: object, *, default: Callable[[object], object] = str) -> None:
    """`data` as indented JSON on stdout: ASCII (every control character and non-ASCII character a JSON escape,
    so the data is intact and nothing in it acts on a terminal), URL credentials masked; written past the
    terminal guard (sparkctl.untrusted.GuardedStream), which would bound its long lines."""
    import json
    import sys

    from sparkctl.untrusted import mask_url_credentials, write_json
    write_json(sys.stdout, mask_url_credentials(json.dumps(data, indent=2, default=default)) + "\n")


def emit(model: type[BaseModel], data: object) -> None:
    """Validate `data` against the command's output model and print it as indented JSON on stdout."""
    print_json(model.model_validate(data).model_dump(mode="json", by_alias=True))
