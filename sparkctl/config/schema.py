"""JSON Schema of the profile and inventory file formats (for editors: yaml-language-server) and of the CLI's
--json outputs (sparkctl.cli.outputs)."""
from __future__ import annotations

from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject


def json_schema(kind: str) -> JSONObject:
    """Schema of the YAML a user writes: a profile file, or one inventory host's variables."""
    if kind == "profile":
        from sparkctl.config.profile import Profile
        schema = Profile.model_json_schema()
        props = schema.get("properties", {})
        for computed in ("name", "path"):
            props.pop(computed, None)
        props["extends"] = {"type": "string", "description": "Name of the profile this one extends."}
        schema["required"] = [r for r in schema.get("required", []) if r not in ("name", "path")]
        schema["title"] = "sparkctl profile"
        return schema
    if kind == "inventory":
        from sparkctl.config.inventory import Cluster, Node
        node = Node.model_json_schema()
        return {
            "title": "sparkctl inventory (Ansible YAML inventory)",
            "type": "object", "required": ["all"],
            "properties": {"all": {"type": "object", "description": "Ansible's top group.",
                                   "properties": {
                                       "vars": {"type": "object", "description": "Cluster vars (sparkctl_ prefix).",
                                                "properties": {f"sparkctl_{k}": v for k, v in
                                                               Cluster.model_json_schema()["properties"].items()}},
                                       "hosts": {"type": "object", "additionalProperties": {"$ref": "#/$defs/host"}},
                                       "children": {"type": "object"}}}},
            "$defs": {**node.get("$defs", {}), "host": {
                "type": "object", "description": "Host vars: Ansible connection keys plus sparkctl's node keys.",
                "properties": {"ansible_host": {"type": "string"}, "ansible_port": {"type": "integer"},
                               "ansible_user": {"type": "string"},
                               "ansible_ssh_private_key_file": {"type": "string"},
                               "sparkctl_rank": {"type": "integer", "minimum": 0},
                               **{k: v for k, v in node["properties"].items()
                                  if k not in ("name", "ssh", "rank")}}}},
        }
    from sparkctl.cli.outputs import OUTPUTS
    if kind in OUTPUTS:
        return OUTPUTS[kind].model_json_schema()
    if kind in LIFECYCLE_OUTPUTS:
        import importlib
        module, name = LIFECYCLE_OUTPUTS[kind].split(":")
        return getattr(importlib.import_module(module), name).model_json_schema()
    raise ConfigError(f"unknown schema kind {kind!r}", hint=f"use one of: {', '.join(schema_names())}")


def schema_names() -> list[str]:
    """What `sparkctl schema` knows: the two file formats, then every modelled --json output."""
    from sparkctl.cli.outputs import OUTPUTS
    return ["profile", "inventory", *OUTPUTS, *LIFECYCLE_OUTPUTS]


# The lifecycle's typed results and the ledger's record (imported only when asked for: deploy/ is heavy).
LIFECYCLE_OUTPUTS = {
    "up": "sparkctl.deploy.results:UpResult", "rollback": "sparkctl.deploy.results:UpResult",
    "down": "sparkctl.deploy.results:DownResult", "status": "sparkctl.deploy.results:StatusResult",
    "deployment-record": "sparkctl.state.records:DeploymentRecord",
    "up-replicated": "sparkctl.deploy.results:ReplicatedUpResult",
    "status-replicated": "sparkctl.deploy.results:ReplicatedStatusResult",
    "down-replicated": "sparkctl.deploy.results:ReplicatedDownResult",
    "replicated-record": "sparkctl.state.records:ReplicatedRecord",
    "bench": "sparkctl.state.records:RunRecord",
}
