"""The docker runtime's container parameters, built without a daemon (commands are data)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import TypedDict, Unpack

import pytest

from sparkctl.config.inventory import ClusterSettings, HostPaths, Inventory, Node, SSHSettings
from sparkctl.errors import ConfigError
from sparkctl.nodes.container import ContainerConfig, container_config, container_name, resolve_image, spec_identity
from sparkctl.nodes.docker_logs import _ts_ns, parse_log_lines
from sparkctl.nodes.docker_runtime import MKDIR_FAILED, MKDIR_THEN_INSPECT, RUN_THEN_INSPECT, DockerRuntime
from sparkctl.nodes.handles import DockerHandle
from sparkctl.nodes.ssh import CommandResult
from sparkctl.sglang.launch import LaunchSpec, Mount

API_KEY = "sk-very-secret-key"
HF_TOKEN = "hf_abcdefSECRET"
SERVED = "glm; rm -rf / && echo 'x' \"y\""


def _node(gpu_runtime: str = "nvidia", **kw: object) -> Node:
    return Node(name="spark-a", ssh=SSHSettings(host="198.19.0.1"), fabric_interface="enp1s0f0np0",
                fabric_address="198.18.0.1", roce_hcas=["rocep1s0f0", "roceP2p1s0f0"],
                host_paths=HostPaths(models="/srv/models", cache="/srv/cache"), gpu_runtime=gpu_runtime, **kw)


def _spec(**kw: object) -> LaunchSpec:
    base = dict(rank=0, node="spark-a",
                argv=["python3", "-m", "sglang.launch_server", "--model-path", "/srv/models/GLM", "--served-model-name",
                      SERVED, "--tp-size", "2", "--api-key", API_KEY],
                env={"SGLANG_HOST_IP": "198.18.0.1", "NCCL_SOCKET_IFNAME": "enp1s0f0np0", "HF_TOKEN": HF_TOKEN,
                     "WITH_SPACES": " a b "},
                sglang_version="0.5.23", image="sglang-gb10:abc",
                mounts=[Mount(source="/srv/models", target="/srv/models", read_only=True),
                        Mount(source="/srv/cache", target="/root/.cache", read_only=False)],
                secret_values=frozenset({API_KEY, HF_TOKEN}))
    base.update(kw)
    return LaunchSpec(**base)  # type: ignore[arg-type]


class _Options(TypedDict, total=False):
    """The options of container_config a test sets (the rest: _cfg's)."""

    infiniband: bool
    identity: str | None
    memlock: str


def _cfg(spec: LaunchSpec | None = None, node: Node | None = None, **kw: Unpack[_Options]) -> ContainerConfig:
    return container_config(_spec() if spec is None else spec, _node() if node is None else node, cluster="desk",
                            deployment_id="20260101T000000Z-d5-ab12", image="sglang-gb10:abc", **kw)


def test_full_argv_shape() -> None:
    cfg = _cfg(infiniband=True)
    name = container_name("desk", 0, "20260101T000000Z-d5-ab12")
    assert cfg.name == name and name.startswith("sparkctl-desk-rank0-")
    assert len(name) == len("sparkctl-desk-rank0-") + 10
    a = cfg.argv
    assert a[:7] == ["docker", "run", "--detach", "--pull", "never", "--name", name]
    i = a.index("--network")
    assert a[i:i + 7] == ["--network", "host", "--ipc", "host", "--init", "--restart", "no"]   # the watcher restarts
    assert a[a.index("--runtime") + 1] == "nvidia"
    assert "--gpus" not in a
    assert [a[j + 1] for j, x in enumerate(a) if x == "--ulimit"] == ["memlock=-1", "stack=67108864"]
    assert a[a.index("--device") + 1] == "/dev/infiniband"
    assert "--shm-size" not in a            # --ipc host: the host's /dev/shm (docker ignores --shm-size there)
    mounts = [a[j + 1] for j, x in enumerate(a) if x == "--mount"]
    assert mounts == ["type=bind,source=/srv/models,target=/srv/models,readonly",
                      "type=bind,source=/srv/cache,target=/root/.cache",
                      "type=bind,source=/srv/cache/tilelang,target=/root/.tilelang",
                      "type=bind,source=/srv/cache/triton,target=/root/.triton",
                      "type=bind,source=/srv/cache/torchinductor,target=/tmp/torchinductor_root"]
    # The command: image, then the LaunchSpec's argv unchanged (after the env file from stdin).
    k = a.index("--env-file")
    assert a[k:k + 3] == ["--env-file", "/dev/stdin", "sglang-gb10:abc"]
    assert a[k + 3:] == _spec().argv


def test_served_name_with_shell_characters_stays_one_element() -> None:
    a = _cfg().argv
    assert a[a.index("--served-model-name") + 1] == SERVED


def test_labels() -> None:
    cfg = _cfg()
    assert cfg.labels["sparkctl.cluster"] == "desk"
    assert cfg.labels["sparkctl.deployment"] == "20260101T000000Z-d5-ab12"
    assert cfg.labels["sparkctl.rank"] == "0" and cfg.labels["sparkctl.node"] == "spark-a"
    assert len(cfg.labels["sparkctl.profile-identity"]) == 16
    for k, v in cfg.labels.items():
        assert f"{k}={v}" in cfg.argv
    assert _cfg(identity="plan-identity").labels["sparkctl.profile-identity"] == "plan-identity"


def test_mounts_as_models_keep_the_json_identity_and_argv_of_their_dict_form() -> None:
    """Mounts were dicts in the spec, the record and the launch identity; as `Mount` models they dump to the same
    JSON (keys in the same order), so the identity and the config hash of a running container are unchanged and
    no deployment made before is seen as changed. The expected values are computed here from the dict form."""
    as_dicts = [{"source": "/srv/models", "target": "/srv/models", "read_only": True},
                {"source": "/srv/cache", "target": "/root/.cache", "read_only": False}]
    spec = _spec()
    dumped = spec.redacted().model_dump(mode="json")
    old = {**spec.redacted().model_dump(mode="json", exclude={"mounts"}), "mounts": as_dicts}
    assert json.dumps(dumped) == json.dumps({k: old[k] for k in dumped})         # the record's and --json's bytes
    old_identity = hashlib.sha256(json.dumps({**old, "image": "img:1"}, sort_keys=True).encode()).hexdigest()[:16]
    assert spec_identity(spec, "img:1") == old_identity
    cfg = _cfg()
    old_binds = [f"type=bind,source={m['source']},target={m['target']}" + (",readonly" if m["read_only"] else "")
                 for m in as_dicts]
    assert [cfg.argv[i + 1] for i, x in enumerate(cfg.argv) if x == "--mount"][:2] == old_binds
    assert [m.model_dump() for m in cfg.mounts[:2]] == as_dicts
    assert [Mount.model_validate(m) for m in as_dicts] == spec.mounts           # a stored record's dicts load


def test_secrets_never_in_argv_env_only_in_env_file() -> None:
    cfg = _cfg()
    assert not any(HF_TOKEN in x for x in cfg.argv)
    assert f"HF_TOKEN={HF_TOKEN}\n" in cfg.env_file          # fed over stdin, never on a command line
    assert "WITH_SPACES= a b \n" in cfg.env_file             # docker's env-file keeps values verbatim
    assert cfg.redacted_env()["HF_TOKEN"] == "***"
    # The API key render puts in argv reaches the container's command (documented limit) but no label/hash.
    assert not any(API_KEY in v for v in cfg.labels.values())


def test_gpu_runtime_variants() -> None:
    a = _cfg(node=_node("gpus-all")).argv
    assert a[a.index("--gpus") + 1] == "all" and "--runtime" not in a
    none = _cfg(node=_node("none"))
    assert "--gpus" not in none.argv and "--runtime" not in none.argv
    assert "NVIDIA_VISIBLE_DEVICES" not in none.env
    assert _cfg().env["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_jit_cache_mounts_without_render_cache_mount() -> None:
    cfg = _cfg(spec=_spec(mounts=[Mount(source="/srv/models", target="/srv/models", read_only=True)]))
    targets = {m.target: m.source for m in cfg.mounts}
    assert targets["/root/.tilelang"] == "/srv/cache/tilelang"
    assert targets["/root/.triton"] == "/srv/cache/triton"
    assert targets["/root/.cache/flashinfer"] == "/srv/cache/flashinfer"
    # torch's default inductor directory for root: its precompiled headers go there whatever the variable says
    assert targets["/tmp/torchinductor_root"] == "/srv/cache/torchinductor"
    assert cfg.env["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/torchinductor_root"
    assert "/srv/models" not in cfg.host_dirs and "/srv/cache/triton" in cfg.host_dirs


def test_spec_env_wins_over_defaults_and_bad_values_refused() -> None:
    cfg = _cfg(spec=_spec(env={"NVIDIA_VISIBLE_DEVICES": "0", "PYTHONUNBUFFERED": "0"}))
    assert cfg.env["NVIDIA_VISIBLE_DEVICES"] == "0" and cfg.env["PYTHONUNBUFFERED"] == "0"
    with pytest.raises(ConfigError):
        _cfg(spec=_spec(env={"A": "line1\nline2"}))
    with pytest.raises(ConfigError):
        _cfg(spec=_spec(mounts=[Mount(source="/a,b", target="/x", read_only=True)]))


def test_memlock_override_and_no_infiniband() -> None:
    a = _cfg(memlock="8388608").argv
    assert "memlock=8388608" in a and "--device" not in a
    with pytest.raises(ConfigError):
        _cfg(memlock="lots")


def test_config_hash_changes_with_the_launch_not_with_secrets() -> None:
    h = _cfg().labels["sparkctl.config-hash"]
    assert _cfg(spec=_spec(argv=_spec().argv + ["--x"])).labels["sparkctl.config-hash"] != h
    assert _cfg(memlock="1024").labels["sparkctl.config-hash"] != h


def test_image_resolution() -> None:
    assert resolve_image(_spec(), {}) == "sglang-gb10:abc"
    assert resolve_image(_spec(image=None), {"SPARKCTL_ENGINE_IMAGE": "eng:1"}) == "eng:1"
    with pytest.raises(ConfigError, match="no engine image"):
        resolve_image(_spec(image=None), {})


def test_log_timestamps_and_lines() -> None:
    assert _ts_ns("1970-01-01T00:00:01.000000002Z") == 1_000_000_002
    assert _ts_ns("1970-01-01T01:00:01.5+01:00") == 1_500_000_000
    out = ("2026-01-01T00:00:00.000000001Z first ✓\n2026-01-01T00:00:00.000000002Z \n"
           "2026-01-01T00:00:00.000000003Z third 2026-01-01T00:00:00Z not a stamp\n")
    entries = parse_log_lines(out)
    assert [e.text for e in entries] == ["first ✓\n", "\n", "third 2026-01-01T00:00:00Z not a stamp\n"]


class FakeConnector:
    """Stands in for the SSH connector, strictly: it expects exactly these commands in this order (each given by
    an argv prefix) and answers each with its scripted result; any other or extra command fails the test."""

    def __init__(self, script: list[tuple[list[str], CommandResult]]) -> None:
        self.script = list(script)
        self.calls: list[tuple[list[str], object]] = []
        self.address = "root@198.19.0.1:22"

    def run(self, argv, *, check=False, timeout=None, stdin=None, merge_stderr=False, secrets=()):  # noqa: ANN001
        argv = list(argv)
        self.calls.append((argv, stdin))
        assert self.script, f"unexpected command after the script ended: {argv}"
        want, res = self.script.pop(0)
        assert argv[:len(want)] == want, f"expected a command starting {want}, got {argv}"
        return res.check() if check else res

    def assert_done(self) -> None:
        assert not self.script, f"commands expected but never run: {[w for w, _ in self.script]}"


def _inspect_json(status: str = "running") -> str:
    return json.dumps({"Id": "c" * 64, "Name": "/x", "Image": "sha256:" + "f" * 64,
                       "State": {"Status": status, "Running": status == "running", "ExitCode": 0,
                                 "StartedAt": "2026-01-01T00:00:00.5Z", "FinishedAt": "0001-01-01T00:00:00Z"},
                       "Config": {"Labels": {}, "Env": [], "Cmd": []}})


def test_start_handle_is_redacted_and_env_goes_over_stdin() -> None:
    node = _node()
    inv = Inventory(path="x", cluster=ClusterSettings(name="desk"), nodes=[node])
    name = container_name("desk", 0, "dep1")
    fake = FakeConnector([
        (["ls", "-1A", "/dev/infiniband"], CommandResult("spark-a", [], 2, "", "No such file", 0.0)),
        (["sh", "-c", MKDIR_THEN_INSPECT, "sh", name],
         CommandResult("spark-a", [], 1, "", "Error: No such container", 0.0)),
        (["sh", "-c", RUN_THEN_INSPECT, "sh", "docker", "run", "--detach", "--pull", "never", "--name", name],
         CommandResult("spark-a", [], 0, "c" * 64 + "\n" + _inspect_json() + "\n", "", 0.0)),
    ])
    rt = DockerRuntime(inv, node, cluster="desk", connector=fake, environ={})  # type: ignore[arg-type]
    handle = rt.start(_spec(), "dep1")
    fake.assert_done()
    assert handle.runtime == "docker" and handle.container == name and handle.container_id == "c" * 64
    assert handle.log is None and handle.rank == 0 and handle.node == "spark-a"
    dumped = handle.model_dump_json()
    assert API_KEY not in dumped and HF_TOKEN not in dumped
    run_argv, stdin = next(c for c in fake.calls if c[0][4:6] == ["docker", "run"])
    assert HF_TOKEN not in " ".join(run_argv) and HF_TOKEN in str(stdin)
    assert "--device" not in run_argv            # no /dev/infiniband on this node
    mkdir = next(c for c in fake.calls if c[0][2] == MKDIR_THEN_INSPECT)[0]
    assert "/srv/cache/triton" in mkdir[5:]


def test_read_log_follows_incrementally_without_duplicates() -> None:
    node = _node()
    inv = Inventory(path="x", cluster=ClusterSettings(name="desk"), nodes=[node])
    log = ["2026-01-01T00:00:01.000000000Z a", "2026-01-01T00:00:01.000000000Z b", "2026-01-01T00:00:02.000000000Z c"]

    class LogConnector:
        """Answers `docker logs --timestamps [--since T] ID` from `log` like the daemon; nothing else is expected."""
        address = "root@198.19.0.1:22"

        def __init__(self) -> None:
            self.calls: list[tuple[list[str], object]] = []

        def run(self, argv, **kw):  # noqa: ANN001, ANN003
            self.calls.append((list(argv), None))
            assert argv[:3] == ["docker", "logs", "--timestamps"] and argv[-1] == "c" * 64, argv
            since = argv[argv.index("--since") + 1] if "--since" in argv else None
            lines = [ln for ln in log if since is None or _ts_ns(ln.split(" ")[0]) >= int(float(since) * 1e9) - 1]
            return CommandResult("spark-a", list(argv), 0, "".join(ln + "\n" for ln in lines), "", 0.0)

    fake = LogConnector()
    rt = DockerRuntime(inv, node, cluster="desk", connector=fake, environ={})  # type: ignore[arg-type]
    h = DockerHandle(node="spark-a", rank=0, deployment="dep1", cluster="desk", container="x", container_id="c" * 64)
    text, off = rt.read_log(h, 0)
    assert text == "a\nb\nc\n" and off == 6
    log.append("2026-01-01T00:00:02.000000000Z d")       # same timestamp as the last line seen
    log.append("2026-01-01T00:00:03.000000000Z e")
    text2, off2 = rt.read_log(h, off)
    assert text2 == "d\ne\n" and off2 == 10
    assert "--since" in fake.calls[-1][0]               # incremental, not a full re-read
    assert rt.read_log(h, off2) == ("", off2)
    assert rt.read_log(h, 0)[0] == "a\nb\nc\nd\ne\n"      # offset 0: the whole log again
    assert rt.read_log(h, 4)[0] == "c\nd\ne\n"            # any other offset: sliced from a full read


def test_secret_files_are_a_read_only_mount_of_a_tmpfs_dir_per_container() -> None:
    from sparkctl.nodes.container import SECRETS_HOST_ROOT
    from sparkctl.sglang.launch import SECRETS_MOUNT
    spec = _spec(argv=["python3", "-m", "sglang.launch_server", "--config", f"{SECRETS_MOUNT}/engine-secrets.yaml"],
                 env={"HF_TOKEN_PATH": f"{SECRETS_MOUNT}/hf-token"},
                 secret_files={"engine-secrets.yaml": f"api-key: {API_KEY}\n", "hf-token": HF_TOKEN})
    cfg = _cfg(spec=spec)
    assert cfg.secrets_dir == f"{SECRETS_HOST_ROOT}/{cfg.name}" and SECRETS_HOST_ROOT == "/dev/shm/sparkctl-secrets"
    assert f"type=bind,source={cfg.secrets_dir},target={SECRETS_MOUNT},readonly" in cfg.argv
    assert cfg.secrets_dir not in cfg.host_dirs                      # not created writable by mkdir -p
    shown = json.dumps(cfg.argv) + cfg.env_file + json.dumps(cfg.labels)
    assert API_KEY not in shown and HF_TOKEN not in shown
    assert _cfg(spec=_spec(secret_files={})).secrets_dir is None


def test_secret_files_go_over_ssh_stdin_into_a_private_dir(monkeypatch) -> None:
    """`install -d -m 0700` then `install -m 0400 /dev/stdin PATH` per file: the content never in an argv."""
    from sparkctl.nodes.container import SECRETS_HOST_ROOT
    calls: list[tuple[list[str], object]] = []

    class FakeSSH:
        def run(self, argv, *, stdin=None, check=False, secrets=(), **_kw):
            calls.append((list(argv), stdin))
            return CommandResult(node="spark-a", argv=list(argv), returncode=0, stdout="", stderr="", elapsed_s=0.0)

    inv = Inventory(path="x", cluster=ClusterSettings(name="desk"), nodes=[_node()])
    rt = DockerRuntime(inv, inv.nodes[0], cluster="desk", connector=FakeSSH(), environ={})  # type: ignore[arg-type]
    spec = _spec(secret_files={"engine-secrets.yaml": f"api-key: {API_KEY}\n", "hf-token": HF_TOKEN})
    cfg = _cfg(spec=spec)
    rt._write_secrets(cfg, spec)
    assert calls[0] == (["install", "-d", "-m", "0700", "--", SECRETS_HOST_ROOT, cfg.secrets_dir], None)
    assert calls[1:] == [(["install", "-m", "0400", "/dev/stdin", f"{cfg.secrets_dir}/engine-secrets.yaml"],
                          f"api-key: {API_KEY}\n"),
                         (["install", "-m", "0400", "/dev/stdin", f"{cfg.secrets_dir}/hf-token"], HF_TOKEN)]
    assert all(API_KEY not in " ".join(argv) and HF_TOKEN not in " ".join(argv) for argv, _ in calls)


def test_remove_goes_on_when_the_log_archive_cannot_be_written(tmp_path) -> None:
    """A full or read-only state directory (here: a file where the log directory should be) keeps the log from
    being archived, never the container from being removed (the undo of a failed `up` on a full disk)."""
    node = _node()
    inv = Inventory(path="x", cluster=ClusterSettings(name="desk"), nodes=[node])
    (tmp_path / "not-a-dir").write_text("")
    fake = FakeConnector([
        (["docker", "logs", "--timestamps"], CommandResult("spark-a", [], 0, "2026-01-01T00:00:01.000000000Z a\n",
                                                           "", 0.0)),
        (["docker", "rm", "--force", "c" * 64], CommandResult("spark-a", [], 0, "", "", 0.0)),
        (["rm", "-rf", "--"], CommandResult("spark-a", [], 0, "", "", 0.0)),
    ])
    rt = DockerRuntime(inv, node, cluster="desk", connector=fake, environ={},  # type: ignore[arg-type]
                       log_dir=tmp_path / "not-a-dir" / "logs")
    rt.remove(DockerHandle(node="spark-a", rank=0, deployment="dep1", cluster="desk", container="x",
                           container_id="c" * 64))
    fake.assert_done()


def _sh(script: str, args: list[str], tmp_path: Path, docker: str, stdin: str = "") -> subprocess.CompletedProcess:
    """`sh -c script sh args...` for real, with `docker` on PATH a stand-in shell script (`docker`: its body): the
    runtime's start scripts as a node's shell runs them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "docker"
    fake.write_text("#!/bin/sh\n" + docker)
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls")}
    return subprocess.run(["sh", "-c", script, "sh", *args], input=stdin, capture_output=True, text=True, env=env,
                          timeout=30)


def test_the_start_scripts_as_a_shell_runs_them(tmp_path: Path) -> None:
    """The two commands a rank's start runs (MKDIR_THEN_INSPECT, RUN_THEN_INSPECT) through a real `sh`: hostile
    values stay single arguments, a failed mkdir is told apart from a missing container, docker run's exit status
    and error come back as they were, and what `docker run` started is what is inspected."""
    log = 'for a; do printf "%s\\n" "$a" >> "$CALLS"; done; echo --- >> "$CALLS"\n'
    odd = str(tmp_path / "cache dir; touch PWNED $(id)")
    r = _sh(MKDIR_THEN_INSPECT, ["rank0; rm -rf /", odd, str(tmp_path / "b" / "c")], tmp_path,
            log + 'echo "Error: No such container: $5" >&2; exit 1\n')
    assert r.returncode == 1 and "No such container: rank0; rm -rf /" in r.stderr
    assert Path(odd).is_dir() and (tmp_path / "b" / "c").is_dir() and not (tmp_path / "PWNED").exists()
    calls = (tmp_path / "calls").read_text().split("---\n")[0].splitlines()
    assert calls == ["container", "inspect", "--format", "{{json .}}", "rank0; rm -rf /"]
    (tmp_path / "file").write_text("")                        # a directory that cannot be made
    r = _sh(MKDIR_THEN_INSPECT, ["x", str(tmp_path / "file" / "sub")], tmp_path, "exit 0\n")
    assert r.returncode == MKDIR_FAILED and "file" in r.stderr
    cid = "c" * 64
    (tmp_path / "calls").unlink()
    r = _sh(RUN_THEN_INSPECT, ["docker", "run", "--env-file", "/dev/stdin", "--name", "n", "img"], tmp_path,
            log + f'if [ "$1" = run ]; then cat > "$CALLS.stdin"; echo {cid}; else echo "{{\\"Id\\": \\"$5\\"}}"; fi\n',
            stdin="KEY=secret\n")
    assert r.returncode == 0 and r.stdout.splitlines() == [cid, f'{{"Id": "{cid}"}}'], r
    assert (tmp_path / "calls.stdin").read_text() == "KEY=secret\n"          # the env file reached docker run
    r = _sh(RUN_THEN_INSPECT, ["docker", "run", "img"], tmp_path,
            'echo "docker: Error response from daemon: No such image: img" >&2; exit 125\n')
    assert r.returncode == 125 and "No such image" in r.stderr and r.stdout == ""
