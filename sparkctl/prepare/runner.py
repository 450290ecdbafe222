"""Run a playbook of ``playbooks/`` through ansible-runner against the inventory file itself.

Artifacts (events, stdout) stay under ``<state dir>/<cluster>/ansible/artifacts/`` (the last 20 runs:
ansible-runner's ``rotate_artifacts``), directories 0700 and files 0600 (a umask of 077 while it runs, then
tightened). ansible-playbook gets only the variables it needs (`ansible_env`): ansible-runner seeds a job's
environment with the caller's whole ``os.environ`` and writes it to ``artifacts/<id>/command`` (ansible-runner
2.4: ``BaseConfig.prepare_env`` then ``Runner.run``; no option turns that off), so the job is prepared with
``init_runner`` and its environment cut down before it runs: never the API key, the HF token or anything
else of the caller's that the playbooks do not use. ``suppress_env_files`` keeps extravars and passwords out of
``env/``; the become password goes to the prompt only. The
playbooks gather no Ansible facts (they read what they need with small commands), and SSH multiplexing
(ControlPersist) plus pipelining, and prepare.yml's one-round-trip state read
(playbooks/README.md), keep a no-change run to a few seconds. Host keys are verified with the inventory's
known_hosts and policy, never ignored.

Example::

    run = run_playbook(inv, "prepare.yml", check=True, on_event=print_progress)
    run.stats["spark-b"]["changed"]      # 0 on a prepared host
    run.raise_for_failures()             # NodeError naming host, task and fix
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparkctl.config.inventory import Inventory
from sparkctl.errors import ConfigError, NodeError
from sparkctl.extras import missing_error, needed
from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.environ import allowed
from sparkctl.resources import shipped
from sparkctl.statefiles import default_state_root, private_dir

log = logging.getLogger("sparkctl.prepare")

PLAYBOOK_DIR = shipped("playbooks")
PLAYBOOKS = ("prepare.yml", "models.yml", "facts.yml", "restore.yml")
KEEP_ARTIFACTS = 20
# What ansible-playbook and ssh need of the caller's environment: the user and home (~/.ssh, ~/.ansible), the
# ssh agent, the locale (ansible-core refuses a non-UTF-8 one), time zone and temp dir, the user's own Ansible
# settings. Everything else (SPARKCTL_API_KEY, HF_TOKEN, cloud credentials, PYTHONPATH...) stays out.
# What ansible-playbook keeps of the caller's environment besides every helper's allowlist (nodes/environ.py).
CALLER_ENV = frozenset({"SSH_AUTH_SOCK"})
CALLER_ENV_PREFIXES = ("ANSIBLE_",)


@dataclass
class TaskResult:
    """One task's outcome on one host (loops: one per item, plus the loop's summary)."""

    host: str
    task: str
    status: str                 # ok | changed | failed | unreachable | skipped
    res: JSONObject
    ignored: bool = False

    @property
    def message(self) -> str:
        """The most telling part of a failure: Ansible's msg, then the command's stderr/stdout tail."""
        res = self.res
        parts = [str(res.get("msg", "")).strip()]
        for key in ("stderr", "stdout", "module_stderr"):
            text = str(res.get(key) or "").strip()
            if text and text not in parts[0]:
                lines = text.splitlines()
                telling = [ln for ln in lines
                           if any(w in ln.lower() for w in ("error", "failed", "denied", "no space"))]
                parts.append("\n".join((telling or lines[-6:])[:6]))
                break
        if not any(parts) and res.get("results"):
            failed = [r for r in res["results"] if r.get("failed")]
            if failed:
                return TaskResult(self.host, self.task, self.status, failed[0]).message
        return "\n".join(p for p in parts if p) or self.status


@dataclass
class PlaybookRun:
    playbook: str
    check: bool
    status: str = ""
    rc: int | None = None
    artifacts: Path | None = None
    results: list[TaskResult] = field(default_factory=list)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)

    def changed(self, host: str | None = None) -> list[TaskResult]:
        return [r for r in self.results if r.status == "changed" and host in (None, r.host)]

    def failures(self) -> list[TaskResult]:
        return [r for r in self.results if r.status in ("failed", "unreachable") and not r.ignored]

    def registered(self, host: str, task: str) -> JSONObject | None:
        """The result of ``task`` on ``host`` (its last event), e.g. a registered command's stdout."""
        found = [r.res for r in self.results if r.host == host and r.task == task and "_ansible_item_label" not in r.res
                 and "item" not in r.res]
        return found[-1] if found else None

    def raise_for_failures(self) -> None:
        """NodeError naming the first failed host and task, the others in the evidence; also when the run
        itself failed before any host (bad playbook, ansible-playbook missing)."""
        failures = self.failures()
        if not failures:
            if self.status not in ("successful", ""):
                raise NodeError(f"ansible-playbook {self.playbook} {self.status} (exit {self.rc})",
                                where=str(self.artifacts), hint=f"see {self.artifacts}/stdout")
            return
        first = failures[0]
        raise NodeError(f"task '{first.task}' failed: {first.message.splitlines()[0] if first.message else ''}",
                        where=f"[{first.host}] {self.playbook}", hint=fix_for(first),
                        evidence="\n".join([*first.message.splitlines()[1:8],
                                            *(f"[{f.host}] {f.task}: {f.message.splitlines()[0]}"
                                              for f in failures[1:])]) or None)


def fix_for(result: TaskResult) -> str:
    """What to do about a failed task, by what the failure says."""
    text = " ".join([result.message, *(str(result.res.get(k) or "") for k in ("stderr", "stdout"))]).lower()
    if result.status == "unreachable":
        return (f"check that {result.host} is up and its sshd answers (ssh to the ansible_host of {result.host}); "
                f"nothing was changed on it; re-run prepare once it answers")
    if "sudo" in text and "password" in text:
        return (f"give the SSH user passwordless sudo on {result.host} (sudoers: USER ALL=(ALL) NOPASSWD: ALL) or "
                f"run again with --ask-become-pass")
    if "no space left on device" in text:
        return ("free space under host_paths.models on the receiving node, then re-run: files already copied "
                "are kept and only the rest is sent")
    if "netplan" in text or "failed to validate" in text:
        return (f"fix the netplan configuration on {result.host} named above (the fabric file was not replaced; "
                f"the previous one is still in force), then re-run")
    return "see the task's output above; the run's events are in the state directory; re-run once fixed"


def ansible_env(job_env: dict[str, str], caller: dict[str, str], settings: dict[str, str]) -> dict[str, str]:
    """The environment a job runs with: `job_env` (what ansible-runner prepared: the caller's environment plus
    `settings` plus its own additions) without the caller's variables other than a helper's allowlist
    (`nodes.environ.allowed`) and `CALLER_ENV` / `CALLER_ENV_PREFIXES`. Pure. Example::

        ansible_env({"HOME": "/root", "HF_TOKEN": "hf_x", "ANSIBLE_NOCOLOR": "True"}, os.environ, envvars)
        # {'HOME': '/root', 'ANSIBLE_NOCOLOR': 'True'}
    """
    def keep(key: str, value: str) -> bool:
        if key in settings:
            return True
        if key in caller and caller[key] == value:                 # the caller's, unchanged by the runner
            return allowed(key, also=CALLER_ENV, also_prefixes=CALLER_ENV_PREFIXES)
        return True                                                 # added or set by ansible-runner itself
    return {k: v for k, v in job_env.items() if keep(k, v)}


def tighten_artifacts(base: Path) -> None:
    """Directories 0700 and files 0600 under `base` (ansible-runner creates some files with the umask's mode)."""
    for root, dirs, names in os.walk(base):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o700, follow_symlinks=False)
        for n in names:
            path = os.path.join(root, n)
            if not os.path.islink(path):
                os.chmod(path, 0o600)
    os.chmod(base, 0o700)


def state_dir(inv: Inventory) -> Path:
    return default_state_root() / inv.cluster.name / "ansible"


def ssh_common_args(inv: Inventory) -> str:
    """-o options every Ansible SSH connection gets: known_hosts of the inventory, its host-key policy."""
    strict = "yes" if inv.cluster.host_key_policy == "pinned" else "accept-new"
    args = [f"-o StrictHostKeyChecking={strict}"]
    if inv.cluster.known_hosts:
        args.append(f"-o UserKnownHostsFile={os.path.expanduser(inv.cluster.known_hosts)}")
    return " ".join(args)


def code_paths() -> dict[str, str]:
    """Where the playbooks find sparkctl's own helper scripts: next to this code, wherever the data directories are
    (a checkout keeps playbooks/ at its top, a wheel under sparkctl/data/)."""
    return {"prepare_manifest_script": str(Path(__file__).resolve().parent / "model_manifest.py")}


def run_playbook(inv: Inventory, playbook: str, *, check: bool = False, tags: list[str] | None = None,
                 extravars: JSONObject | None = None, become_password: str | None = None,
                 on_event: Callable[[TaskResult], None] | None = None, forks: int = 10,
                 env: dict[str, str] | None = None) -> PlaybookRun:
    """Run ``playbooks/<playbook>`` on every node of ``inv``; returns what happened, per host and task.
    ``env`` overrides Ansible settings (e.g. the benchmark's ``ANSIBLE_PIPELINING=False``)."""
    if playbook not in PLAYBOOKS:
        raise ConfigError(f"unknown playbook {playbook!r}", hint=f"one of {', '.join(PLAYBOOKS)}")
    if inv.embedded:
        raise ConfigError("prepare needs real nodes: the embedded local cluster is this machine",
                          where=inv.path, hint="point --inventory (or SPARKCTL_INVENTORY) at your Sparks' inventory")
    with needed("prepare", f"the {playbook} playbook"):
        import ansible_runner  # noqa: F401 - only whether it is installed; _run imports it for use
    bindir = str(Path(_ansible_playbook()).parent)
    base = state_dir(inv)
    private_dir(base)
    control_dir = _control_dir(base)
    run = PlaybookRun(playbook, check)
    cmdline = ["--check", "--diff"] if check else ["--diff"]
    if become_password is not None:
        cmdline.append("--ask-become-pass")
    envvars = {
        "ANSIBLE_PIPELINING": "True", "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=60s",
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir),
        "ANSIBLE_SSH_COMMON_ARGS": ssh_common_args(inv),
        "ANSIBLE_GATHERING": "smart",   # the playbooks gather no facts at all; runner caches per run
        "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_NOCOLOR": "True", "ANSIBLE_TIMEOUT": "10",
        "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",   # DGX OS; no discovery round-trip
        "ANSIBLE_LOCAL_TEMP": str(base / "tmp"),
    }
    envvars.update(env or {})

    def handler(event: JSONObject) -> bool:
        result = _result_of(event)
        if result is not None:
            run.results.append(result)
            if on_event is not None:
                on_event(result)
        if event.get("event") == "playbook_on_stats":
            data = event.get("event_data", {})
            hosts = set().union(*(data.get(k) or {} for k in ("ok", "changed", "failures", "dark", "skipped")))
            run.stats = {h: {k: (data.get(key) or {}).get(h, 0) for k, key in
                             (("ok", "ok"), ("changed", "changed"), ("failed", "failures"),
                              ("unreachable", "dark"), ("skipped", "skipped"))} for h in sorted(hosts)}
        return True

    passwords = {r"^BECOME password.*:\s*?$": become_password} if become_password is not None else {}
    with needed("prepare", f"the {playbook} playbook"):
        from ansible_runner.interface import init_runner

    old_umask = os.umask(0o077)
    try:
        runner = init_runner(
            private_data_dir=str(base), project_dir=str(PLAYBOOK_DIR), playbook=str(PLAYBOOK_DIR / playbook),
            inventory=str(Path(inv.path).resolve()), cmdline=" ".join(cmdline),
            tags=",".join(tags) if tags else None, extravars={**(extravars or {}), **code_paths()}, envvars=envvars,
            passwords=passwords,
            forks=forks, quiet=True, event_handler=handler, rotate_artifacts=KEEP_ARTIFACTS,
            suppress_env_files=True)
        runner.config.env = ansible_env(runner.config.env, dict(os.environ), envvars)
        runner.run()
    finally:
        os.umask(old_umask)
        tighten_artifacts(base)
    run.status, run.rc = runner.status, runner.rc
    run.artifacts = Path(runner.config.artifact_dir)
    _probe_unreachable(run, inv)
    return run


def _probe_unreachable(run: PlaybookRun, inv: Inventory) -> None:
    """Add the reason to an unreachable host's message when Ansible lost it.

    With pipelining, Ansible writes the module to ssh's stdin; when ssh has already exited (sshd refused the
    connection) the write fails and Ansible reports only "Data could not be sent ... Broken pipe", which hides
    ssh's own "Connection refused" or timeout. One TCP connect to the host's SSH port tells which.
    """
    import socket

    said: dict[str, str] = {}
    for r in run.results:
        msg = str(r.res.get("msg", ""))
        if r.status != "unreachable" or " port " in msg:
            continue
        if r.host not in said:
            try:
                ssh = inv.node(r.host).ssh
            except ConfigError:     # a host outside sparkctl's view of the inventory: nothing to add
                said[r.host] = ""
                continue
            try:
                socket.create_connection((ssh.host, ssh.port), timeout=5).close()
                said[r.host] = ""
            except OSError as exc:
                reason = exc.strerror or str(exc) or type(exc).__name__
                said[r.host] = f"ssh: connect to host {ssh.host} port {ssh.port}: {reason}"
        if said[r.host]:
            r.res["msg"] = f"{said[r.host]} ({msg})" if msg else said[r.host]


def _control_dir(base: Path) -> Path:
    """A short private directory for SSH control sockets (a Unix socket path must fit in 108 bytes, and state
    directories can be deep): ``/tmp/sparkctl-<uid>/<hash of the state dir>``, mode 0700, ours."""
    import hashlib
    import tempfile

    top = Path(tempfile.gettempdir()) / f"sparkctl-{os.getuid()}"
    top.mkdir(mode=0o700, exist_ok=True)
    st = top.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ConfigError(f"{top} is not a private directory of this user", hint=f"remove {top} and re-run")
    path = top / hashlib.sha256(str(base).encode()).hexdigest()[:10]
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _ansible_playbook() -> str:
    """ansible-playbook next to this Python (the venv) or on PATH."""
    import shutil
    import sys

    here = Path(sys.executable).parent / "ansible-playbook"
    found = str(here) if here.exists() else shutil.which("ansible-playbook")
    if not found:
        raise missing_error("prepare", "the prepare playbooks", f"no ansible-playbook in {here.parent} or on PATH")
    return found


_STATUS = {"runner_on_ok": "ok", "runner_on_failed": "failed", "runner_on_unreachable": "unreachable",
           "runner_on_skipped": "skipped", "runner_item_on_ok": "ok", "runner_item_on_failed": "failed",
           "runner_item_on_skipped": "skipped"}


def _result_of(event: JSONObject) -> TaskResult | None:
    status = _STATUS.get(event.get("event", ""))
    if status is None:
        return None
    data = event.get("event_data", {})
    res = data.get("res") or {}
    if status == "ok" and res.get("changed"):
        status = "changed"
    if res.get("unreachable") is True:     # a loop's items report an unreachable host as a failed item
        status = "unreachable"
    return TaskResult(host=str(data.get("host", "?")), task=str(data.get("task", "?")), status=status, res=res,
                      ignored=bool(data.get("ignore_errors")))
