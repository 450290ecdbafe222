"""Generate docs/reference.md from the typer app and the pydantic models, so the reference cannot go stale.

Every command and option comes from the CLI itself (the same help records `--help` prints), the exit codes from
sparkctl.cli.options.EXIT_CODES, the JSON Schemas from sparkctl.cli.outputs, the profile and inventory keys from
the pydantic models (Profile, ClusterSettings, Node). tests/unit/test_docs.py regenerates it and fails when the
checked-in file differs.

Example::

    python -m sparkctl.cli.docgen > docs/reference.md      # regenerate
    python -m sparkctl.cli.docgen --check docs/reference.md  # exit 1 when stale (what the test does)
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import typer._click as click  # typer >= 0.26 carries its own click: its commands are of these types
from typer.core import TyperGroup

from sparkctl.cli.main import app
from sparkctl.cli.options import EXIT_CODES
from sparkctl.jsontypes import JSONObject

REGENERATE = ".venv/bin/python -m sparkctl.cli.docgen > docs/reference.md"


def _cell(text: object) -> str:
    """One Markdown table cell: one line, pipes escaped."""
    return re.sub(r"\s+", " ", str(text)).strip().replace("|", "\\|")


def _help(text: str | None) -> str:
    """A command's help as Markdown paragraphs: typer's `\\b` markers dropped, lines of one paragraph joined."""
    paragraphs = [" ".join(line.strip() for line in block.splitlines() if line.strip() not in ("", "\b"))
                  for block in re.split(r"\n\s*\n", (text or "").strip())]
    return "\n\n".join(p for p in paragraphs if p)


def _commands(group: TyperGroup, ctx: click.Context,
              path: list[str]) -> list[tuple[list[str], click.Command, click.Context]]:
    """(path, command, context) of every visible command under `group`, in name order: leaf commands, and groups
    that run on their own (`sparkctl bench --compare P` as well as `sparkctl bench history`)."""
    out: list[tuple[list[str], click.Command, click.Context]] = []
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        if command is None or getattr(command, "hidden", False):
            continue
        sub = type(ctx)(command, info_name=name, parent=ctx)
        if isinstance(command, TyperGroup):
            if getattr(command, "invoke_without_command", False):
                out.append((path + [name], command, sub))
            out += _commands(command, sub, path + [name])
        else:
            out.append((path + [name], command, sub))
    return out


def _params_table(command: click.Command, ctx: click.Context) -> list[str]:
    rows = []
    for param in command.params:
        if getattr(param, "hidden", False) or param.param_type_name == "argument":
            continue
        record = param.get_help_record(ctx)
        if record is None:     # an argument: typer gives it no help record unless it has help
            continue
        names, what = record
        rows.append(f"| `{_cell(names)}` | {_cell(what)} |")
    if not rows:
        return []
    return ["| option | what |", "|---|---|", *rows]


def _arguments(command: click.Command, ctx: click.Context) -> list[str]:
    out = []
    for param in command.params:
        if param.param_type_name == "argument" and not getattr(param, "hidden", False):
            name = param.name.upper() if param.name else "ARG"
            help_text = getattr(param, "help", None) or ""
            out.append(f"- `{name}`{' (required)' if param.required else ''}: {_cell(help_text)}")
    return out


def cli_reference() -> list[str]:
    import typer

    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)       # the app has subcommands
    ctx = click.Context(root, info_name="sparkctl")
    lines = ["## Commands", "", _help(root.help), "",
             "Options of `sparkctl` itself (before or after the subcommand for `-v` and `-q`):", "",
             *_params_table(root, ctx), ""]
    commands = _commands(root, ctx, [])
    lines += ["| command | what |", "|---|---|"]
    for path, command, _ in commands:
        anchor = "sparkctl-" + "-".join(path)
        first = _help(command.help).split("\n\n")[0]
        lines.append(f"| [`sparkctl {' '.join(path)}`](#{anchor}) | {_cell(first)} |")
    lines.append("")
    for path, command, sub in commands:
        arguments = [p.name.upper() if p.required else f"[{p.name.upper()}]" for p in command.params
                     if p.param_type_name == "argument" and p.name]
        usage = " ".join(["[OPTIONS]", *arguments] + (["COMMAND ..."] if hasattr(command, "list_commands") else []))
        lines += [f"### sparkctl {' '.join(path)}", "", f"`sparkctl {' '.join(path)} {usage}`", "",
                  _help(command.help), ""]
        arguments = _arguments(command, sub)
        if arguments:
            lines += ["Arguments:", "", *arguments, ""]
        table = _params_table(command, sub)
        if table:
            lines += [*table, ""]
    return lines


def exit_codes() -> list[str]:
    body = EXIT_CODES.removeprefix("Exit codes: ")
    items = [part.strip() for part in re.split(r",\s(?=\d)", body.rstrip("."))]
    lines = ["## Exit codes", "",
             "Every command's `--help` ends with the same list (`sparkctl.cli.options.EXIT_CODES`).",
             "", "| code | meaning |", "|---|---|"]
    for item in items:
        code, _, meaning = item.partition(" ")
        lines.append(f"| {code} | {_cell(meaning)} |")
    return lines + [""]


def schemas() -> list[str]:
    from sparkctl.cli.outputs import LIFECYCLE_OUTPUTS, OUTPUTS, schema_names
    lines = ["## JSON Schemas", "",
             ("`sparkctl schema NAME` prints the JSON Schema of a file format or of a command's `--json` output; "
              "`sparkctl schema list` names them. Each is generated from the model named here."), "",
             "| NAME | model |", "|---|---|"]
    for name in schema_names():
        if name == "profile":
            model = "`sparkctl.config.profile:Profile` (keys below)"
        elif name == "inventory":
            model = "`sparkctl.config.inventory:ClusterSettings` + `Node` (keys below)"
        elif name in OUTPUTS:
            cls = OUTPUTS[name]
            model = f"`{cls.__module__}:{cls.__name__}`"
        else:
            model = f"`{LIFECYCLE_OUTPUTS[name]}`"
        lines.append(f"| `{name}` | {model} |")
    from sparkctl.deploy.results import RENAMED_KEYS
    lines += ["", ("Keys renamed in 2026-12 (one name per concept): each `--json` output that had the old key writes "
                   "the new one and, until the next release, the old one beside it with the same value: "
                   + ", ".join(f"`{old}` -> `{new}`" for old, new in RENAMED_KEYS.items())
                   + " (the router's `kind` in `status` of replicas; `doctor --bundle`'s deployment `stages` -> "
                     "`steps` and `kind` -> `command` the same way). Files sparkctl wrote with the old keys "
                     "(records, handles, replicated.json) load as before.")]
    return lines + [""]


def _type_of(schema: JSONObject, defs: JSONObject) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    if "anyOf" in schema:
        return " | ".join(_type_of(s, defs) for s in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type_of(schema.get('items', {}), defs)}"
    if kind == "object" and "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return f"map of {_type_of(schema['additionalProperties'], defs)}"
    return str(kind)


def _nested(schema: JSONObject, defs: JSONObject) -> JSONObject | None:
    """The model schema a field holds (directly or as `X | null`), to list its keys under the field's own."""
    for candidate in [schema, *schema.get("anyOf", [])]:
        if "$ref" in candidate:
            target = defs[candidate["$ref"].rsplit("/", 1)[-1]]
            if "properties" in target:
                return target
    return None


def _key_rows(schema: JSONObject, defs: JSONObject, prefix: str, skip: tuple[str, ...] = ()) -> list[str]:
    rows = []
    for key, field in schema.get("properties", {}).items():
        if key in skip:
            continue
        path = f"{prefix}{key}"
        nested = _nested(field, defs)
        default = json.dumps(field["default"]) if "default" in field else ("required" if key in schema.get(
            "required", []) else "")
        kind = "mapping" if nested else _type_of(field, defs)
        rows.append(f"| `{path}` | {_cell(kind)} | {_cell(default)} | {_cell(field.get('description', ''))} |")
        if nested:
            rows += _key_rows(nested, defs, f"{path}.")
    return rows


def profile_keys() -> list[str]:
    from sparkctl.config.schema import file_schema
    schema = file_schema("profile")
    defs = schema.get("$defs", {})
    return ["## Profile keys", "",
            ("A profile is a YAML file (`profiles/*.yml`, your own in `./profiles/`, `~/.config/sparkctl/profiles/` "
             "or `$SPARKCTL_PROFILES_DIR`); unknown keys are refused with a did-you-mean. From "
             "`sparkctl.config.profile:Profile` (`sparkctl schema profile` for editors)."), "",
            "| key | type | default | what |", "|---|---|---|---|",
            *_key_rows(schema, defs, ""), ""]


def inventory_keys() -> list[str]:
    from sparkctl.config.inventory import _ANSIBLE_KEYS, _CLUSTER_KEYS, ClusterSettings, Node, SSHSettings
    cluster = ClusterSettings.model_json_schema()
    node = Node.model_json_schema()
    ssh = SSHSettings.model_json_schema()
    # the file's names for the models' fields: all.vars.sparkctl_cluster is ClusterSettings.name, ansible_host is
    # ssh.host
    cluster_vars = {"properties": {var: cluster["properties"][field] for var, field in _CLUSTER_KEYS.items()}}
    lines = ["## Inventory keys", "",
             ("An inventory is an Ansible YAML inventory (the same file works with `ansible-playbook -i`): hosts "
              "under `all.hosts` or `all.children.<group>.hosts`, in rank order. From `sparkctl.config.inventory` "
              "(`sparkctl schema inventory` for editors)."), "",
             "Cluster variables (`all.vars`):", "",
             "| key | type | default | what |", "|---|---|---|---|",
             *_key_rows(cluster_vars, cluster.get("$defs", {}), ""), "",
             "Host variables: Ansible's connection keys", "",
             "| key | type | default | what |", "|---|---|---|---|"]
    for var, field in _ANSIBLE_KEYS.items():
        one = {"properties": {var: ssh["properties"][field]}, "required": [var] if field in ssh.get("required", [])
               else []}
        lines += _key_rows(one, ssh.get("$defs", {}), "")
    lines += ["", "and sparkctl's node keys:", "", "| key | type | default | what |", "|---|---|---|---|"]
    rank = {"properties": {"sparkctl_rank": node["properties"]["rank"]}}
    lines += _key_rows(rank, node.get("$defs", {}), "")
    lines += _key_rows(node, node.get("$defs", {}), "", skip=("name", "ssh", "rank"))
    return lines + [""]


def reference() -> str:
    """The whole of docs/reference.md."""
    lines = ["# sparkctl reference", "",
             (f"Generated from the CLI and the config models by `{REGENERATE}`; do not edit by hand "
              "(tests/unit/test_docs.py fails when it is stale). The guide is [guide.md](guide.md)."), "",
             ("Contents: [Commands](#commands), [Exit codes](#exit-codes), [JSON Schemas](#json-schemas), "
              "[Profile keys](#profile-keys), [Inventory keys](#inventory-keys)."), ""]
    lines += cli_reference() + exit_codes() + schemas() + profile_keys() + inventory_keys()
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--check"] and len(args) == 2:
        path = Path(args[1])
        current = path.read_text(encoding="utf-8") if path.is_file() else ""
        if current != reference():
            print(f"{path} is stale: the CLI or the config models changed since it was generated; "
                  f"regenerate it with `{REGENERATE}` and commit it", file=sys.stderr)
            return 1
        return 0
    if args:
        print("usage: python -m sparkctl.cli.docgen [--check docs/reference.md]  (writes the reference to stdout)",
              file=sys.stderr)
        return 2
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
