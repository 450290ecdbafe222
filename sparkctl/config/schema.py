"""JSON Schema of the profile and inventory file formats (for editors: yaml-language-server). The schemas of the
CLI's --json outputs live with the commands (sparkctl.cli.outputs.json_schema), which serves these two as well."""
from __future__ import annotations

from sparkctl.config.inventory import ClusterSettings, Node
from sparkctl.config.profile import Profile
from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject


def file_schema(kind: str) -> JSONObject:
    """Schema of the YAML a user writes: a profile file, or one inventory host's variables."""
    if kind == "profile":
        schema = Profile.model_json_schema()
        props = schema.get("properties", {})
        for computed in ("name", "path"):
            props.pop(computed, None)
        props["extends"] = {"type": "string", "description": "Name of the profile this one extends."}
        schema["required"] = [r for r in schema.get("required", []) if r not in ("name", "path")]
        schema["title"] = "sparkctl profile"
        return schema
    if kind == "inventory":
        node = Node.model_json_schema()
        return {
            "title": "sparkctl inventory (Ansible YAML inventory)",
            "type": "object", "required": ["all"],
            "properties": {"all": {"type": "object", "description": "Ansible's top group.",
                                   "properties": {
                                       "vars": {"type": "object", "description": "Cluster vars (sparkctl_ prefix).",
                                                "properties": {f"sparkctl_{k}": v for k, v in
                                                               ClusterSettings.model_json_schema()["properties"].items()}},
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
    raise ConfigError(f"unknown file format {kind!r}", hint="use one of: profile, inventory")
