"""`sparkctl watch --install/--uninstall`: the systemd unit is what the user ran. Checked by systemd's own
`systemd-analyze verify` (which is shown to fail on a bad unit), read back as systemd reads it (testrig.unitfile)
and run from an empty environment: the same cluster and deployment as the installer's. Escaping generated with
Hypothesis per kind of line; what a unit cannot carry refused. The webhook URL's credentials never reach argv or
the unit. GPU sensor parsing (no number where nvidia-smi reports none)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.errors import ConfigError
from sparkctl.nodes.facts import parse_gpu_sensors
from sparkctl.watch.systemd import UnitInputs, env_assignment, exec_word, path_value, unit_name, unit_text
from testrig.testenv import in_ci
from testrig.unitfile import parse_unit, read_unit, words
from testrig.watchrig import up

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def _analyze() -> str:
    if SYSTEMD_ANALYZE is None:
        if in_ci():
            pytest.fail("CI=true but systemd-analyze is missing (.ci/run installs Debian's systemd)")
        pytest.skip("systemd-analyze is not installed here")
    return SYSTEMD_ANALYZE


def _verify(unit: Path, *, user: bool, tmp: Path) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze [--user] verify --man=no UNIT`: offline (systemd need not be PID 1), the unit's file path."""
    env = dict(os.environ)
    if user:                                   # the user manager's runtime directory, private to this test
        runtime = tmp / "runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)
    argv = [_analyze(), *(["--user"] if user else []), "verify", "--man=no", str(unit)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def _clean(done: subprocess.CompletedProcess[str], unit: Path) -> None:
    """verify's exit 0 and no line about the unit (a setting it ignored is a `FILE:LINE: ...` warning, rc 0)."""
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert f"{unit}:" not in said and unit.name not in said, said


def _install(cli, units: Path, *args: str) -> tuple[Path, str]:
    code, out, err = cli("watch", "--install", "--unit-dir", str(units), *args)
    assert code == 0, err
    (path,) = [p for p in units.iterdir() if p.suffix == ".service"]
    return path, out


@pytest.mark.parametrize("scope", ["user", "system"])
def test_install_writes_a_unit_systemd_accepts_and_uninstall_removes_it(cli, local_cluster, tmp_path, scope):
    units = tmp_path / "units"
    code, out, err = cli("watch", "--install", f"--{scope}", "--unit-dir", str(units), "--interval", "2",
                         "--metrics-port", "9464", "--inventory", str(local_cluster))
    assert code == 0, err
    cluster = local_cluster.read_text().split("sparkctl_cluster: ")[1].split()[0]
    path = units / unit_name(cluster)
    assert f"wrote {path}" in out and "daemon-reload" in out and "enable --now" in out
    unit = read_unit(path)
    assert unit.keys["Restart"] == ["on-failure"]
    assert unit.keys["Wants"] == ["network-online.target docker.service"]
    assert unit.keys["WantedBy"] == ["multi-user.target" if scope == "system" else "default.target"]
    at = unit.argv.index("watch")
    assert unit.argv[at:] == ["watch", "--inventory", str(local_cluster.resolve()), "--interval", "2", "--backoff",
                              "10", "--backoff-max", "300", "--max-failures", "3", "--window", "600",
                              "--fail-checks", "2", "--fail-window", "60",
                              "--metrics-port", "9464", "--metrics-addr", "127.0.0.1"]
    assert unit.environment["SPARKCTL_STATE_DIR"] == os.environ["SPARKCTL_STATE_DIR"]
    assert unit.working_directory == os.getcwd()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600           # a new user file: private (userfiles)
    _clean(_verify(path, user=scope == "user", tmp=tmp_path), path)
    code, out, err = cli("watch", "--uninstall", f"--{scope}", "--unit-dir", str(units), "--inventory",
                         str(local_cluster))
    assert code == 0 and f"removed {path}" in out and not path.exists(), out + err
    code, out, _ = cli("watch", "--uninstall", f"--{scope}", "--unit-dir", str(units), "--inventory",
                       str(local_cluster))
    assert code == 0 and "no unit" in out


@pytest.mark.parametrize("broken", ['ExecStart="/bin/true "a', 'Environment="A=b c', "WorkingDirectory=relative",
                                    "Environment=1NAME=x", "ExecStart=relative/bin x"])
def test_verify_fails_on_a_unit_systemd_would_not_take(tmp_path, broken):
    """The check above can fail: systemd-analyze verify, run the same way, rejects each of these lines."""
    text = unit_text(UnitInputs(argv=["/bin/true"], working_directory="/"), "c", scope="system")
    key = broken.split("=", 1)[0]
    lines = [ln for ln in text.splitlines() if not ln.startswith(key + "=")]
    lines.insert(lines.index("[Service]") + 1, broken)
    path = tmp_path / "bad.service"
    path.write_text("\n".join(lines) + "\n")
    done = _verify(path, user=False, tmp=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode != 0 or f"{path}:" in said, said


def test_the_unit_runs_what_the_installer_resolved_from_an_empty_environment(cli, local_cluster, tmp_path,
                                                                           monkeypatch):
    """The inventory came from SPARKCTL_INVENTORY and the state directory from SPARKCTL_STATE_DIR (not flags), the
    installer ran in its own directory: the unit's ExecStart, run as systemd would (its argv, only its Environment=,
    its WorkingDirectory) from an empty environment, sees the same cluster and deployment, and the watcher it
    starts is the one the installer's `status` reports."""
    dep = up(cli)["deployment"]
    home = tmp_path / "installer-cwd"
    home.mkdir()
    monkeypatch.chdir(home)
    units = tmp_path / "units"
    path, _ = _install(cli, units, "--interval", "1")
    _clean(_verify(path, user=True, tmp=tmp_path), path)
    unit = read_unit(path)
    assert unit.working_directory == str(home)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    at = unit.argv.index("watch")
    inventory = unit.argv[at + 1:at + 3]
    assert inventory == ["--inventory", str(local_cluster)]
    status_argv = [*unit.argv[:at], "status", "--json", *inventory]
    done = subprocess.run(status_argv, env=dict(unit.environment), cwd=unit.working_directory, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    theirs = json.loads(done.stdout)
    code, out, err = cli("status", "--json")
    mine = json.loads(out)
    for key in ("cluster", "active", "history", "profile", "endpoint", "identity", "ranks"):
        assert theirs[key] == mine[key], key
    assert mine["active"] == dep
    proc = subprocess.Popen(unit.argv, env=dict(unit.environment), cwd=unit.working_directory,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        seen = None
        while time.monotonic() < end and proc.poll() is None:
            seen = json.loads(cli("status", "--json")[1]).get("watcher")
            if seen and seen.get("running") and seen.get("pid") == proc.pid:
                break
            time.sleep(0.3)
        assert seen and seen.get("pid") == proc.pid and seen.get("desired"), (seen, proc.poll())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode in (0, 143), proc.stderr.read() if proc.stderr else ""


LOOKUPS = ["--inventory relative", "SPARKCTL_INVENTORY relative", "./inventory/sparks.yml",
           "$XDG_CONFIG_HOME/sparkctl/inventory/sparks.yml", "the embedded cluster"]


@pytest.mark.parametrize("state", ["SPARKCTL_STATE_DIR relative", "XDG_STATE_HOME relative", "HOME default"])
@pytest.mark.parametrize("lookup", LOOKUPS)
def test_each_lookup_of_the_inventory_and_the_state_directory_reaches_the_unit_absolute(
        cli, local_cluster, tmp_path, monkeypatch, lookup, state):
    """Whichever documented lookup found the inventory and the state directory, the unit names them absolute, and
    sparkctl run with only the unit's argv and environment resolves the same two paths."""
    from sparkctl.config.inventory import resolve_inventory
    from sparkctl.resources import shipped
    from sparkctl.statefiles import default_state_root

    work = tmp_path / "work"
    (work / "rel").mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.delenv("SPARKCTL_INVENTORY")
    for name in ("SPARKCTL_STATE_DIR", "XDG_STATE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    args: list[str] = []
    expected = str(work / "rel" / "inv.yml")
    shutil.copy(local_cluster, expected)
    if lookup == "--inventory relative":
        args = ["--inventory", "rel/inv.yml"]
    elif lookup == "SPARKCTL_INVENTORY relative":
        monkeypatch.setenv("SPARKCTL_INVENTORY", "rel/inv.yml")
    elif lookup == "./inventory/sparks.yml":
        (work / "inventory").mkdir()
        expected = str(work / "inventory" / "sparks.yml")
        shutil.copy(local_cluster, expected)
    elif lookup.startswith("$XDG_CONFIG_HOME"):
        (tmp_path / "cfg" / "sparkctl" / "inventory").mkdir(parents=True)
        expected = str(tmp_path / "cfg" / "sparkctl" / "inventory" / "sparks.yml")
        shutil.copy(local_cluster, expected)
    else:
        expected = str(shipped("inventory", "local.yml"))
    if state == "SPARKCTL_STATE_DIR relative":
        monkeypatch.setenv("SPARKCTL_STATE_DIR", "st")
    elif state == "XDG_STATE_HOME relative":
        monkeypatch.setenv("XDG_STATE_HOME", "xs")
    mine = (os.path.abspath(resolve_inventory(args[1] if args else None).path), str(default_state_root().absolute()))
    assert mine[0] == expected
    path, _ = _install(cli, tmp_path / "units", *args)
    unit = read_unit(path)
    at = unit.argv.index("watch")
    assert unit.argv[at + 1:at + 3] == ["--inventory", expected]
    assert unit.environment["SPARKCTL_STATE_DIR"] == mine[1] and os.path.isabs(mine[1])
    assert unit.environment["XDG_CONFIG_HOME"] == str(tmp_path / "cfg")
    probe = ("import os, sys; from sparkctl.config.inventory import resolve_inventory; "
             "from sparkctl.statefiles import default_state_root; i = resolve_inventory(sys.argv[1]); "
             "print(os.path.abspath(i.path)); print(default_state_root().absolute()); print(i.embedded)")
    done = subprocess.run([sys.executable, "-c", probe, unit.argv[at + 2]], env=dict(unit.environment),
                          cwd=unit.working_directory, capture_output=True, text=True, timeout=60,
                          )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [mine[0], mine[1], str(lookup == "the embedded cluster")]


# --- escaping, per kind of line --------------------------------------------------------------------------------
_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40)


@settings(max_examples=300, deadline=None)
@given(args=st.lists(_TEXT, min_size=1, max_size=6), value=_TEXT,
       directory=_TEXT.filter(lambda s: s == s.rstrip() and not s.endswith("\\")))
def test_every_line_reads_back_as_written(args, value, directory):
    wd = "/" + directory.lstrip("/")
    if wd != wd.rstrip() or wd.endswith("\\"):
        return
    inputs = UnitInputs(argv=["/opt/spark ctl/50%$/sparkctl", *args], environment={"SPARKCTL_X": value},
                        working_directory=wd)
    unit = parse_unit(unit_text(inputs, "local", scope="user"))
    assert unit.argv == inputs.argv
    assert unit.environment == {"SPARKCTL_X": value}
    assert unit.working_directory == wd


@settings(max_examples=25, deadline=None)
@given(name=st.text(st.sampled_from(list("ab %$\"'\\;é{}")), min_size=1, max_size=12))
def test_systemd_itself_reads_the_program_path_back(tmp_path_factory, name):
    """systemd's own parser on the first ExecStart word (spaces, %, $, ;, quotes, backslashes): verify names the
    missing program exactly as sparkctl meant it, or sparkctl refused a name systemd refuses (a quote or a
    backslash: "Executable name contains special characters")."""
    tmp = tmp_path_factory.mktemp("probe")
    program = f"/nonexistent-sparkctl/{name}"
    inputs = UnitInputs(argv=[program, "watch", name], working_directory="/")
    if any(c in name for c in "\\\"'"):
        with pytest.raises(ConfigError, match="systemd refuses"):
            unit_text(inputs, "c", scope="system")
        return
    path = tmp / "probe.service"
    path.write_text(unit_text(inputs, "c", scope="system"))
    done = _verify(path, user=False, tmp=tmp)
    assert f"Command {program} is not executable" in done.stdout + done.stderr, done.stdout + done.stderr
    assert parse_unit(path.read_text()).argv == inputs.argv


BAD = {"a newline": "a\nb", "a carriage return": "a\rb", "a control character": "a\x1bb",
       "text that is not UTF-8": "a\udcffb", "NUL": "a\x00b"}


@pytest.mark.parametrize("kind", ["exec", "env", "path"])
@pytest.mark.parametrize("bad", sorted(BAD))
def test_what_a_unit_cannot_carry_is_refused_naming_it(kind, bad):
    value = BAD[bad]
    with pytest.raises(ConfigError, match="cannot carry it"):
        {"exec": exec_word, "env": lambda v: env_assignment("SPARKCTL_X", v),
         "path": lambda v: path_value("/x/" + v, "the working directory")}[kind](value)


@pytest.mark.parametrize("path", ["relative/dir", "/ends/in/space ", "/ends/in/backslash\\"])
def test_a_raw_path_line_refuses_what_systemd_would_change(path):
    with pytest.raises(ConfigError):
        path_value(path, "the working directory")


def test_escapes_per_kind_of_line():
    assert exec_word('50%"$HOME\\') == '"50%%\\"$$HOME\\\\"'
    assert env_assignment("X", '50%"$HOME\\') == '"X=50%%\\"$HOME\\\\"'       # Environment= expands no $
    assert path_value("/a b/50%", "d") == "/a b/50%%"
    assert words('"a b" c\\ d "e\\"f"') == ["a b", "c d", 'e"f']


def test_an_installer_directory_with_a_newline_is_refused_before_writing(cli, local_cluster, tmp_path,
                                                                         monkeypatch):
    odd = tmp_path / "odd\ndir"
    odd.mkdir()
    monkeypatch.chdir(odd)
    units = tmp_path / "units"
    code, _, err = cli("watch", "--install", "--unit-dir", str(units))
    assert code == 2 and "a newline" in err and "cannot carry it" in err, err
    assert not units.exists() or not list(units.iterdir())


# --- the webhook's URL: never in argv, never in the unit -------------------------------------------------------
SECRET = "pw-unit-8842"


def test_a_url_with_credentials_on_the_command_line_is_refused_saying_how(cli, local_cluster, tmp_path):
    for url in (f"https://u:{SECRET}@hooks.example/x", f"https://hooks.example/x?token={SECRET}",
                "https://hooks.example/services/T0000/B0000/aB3dE5gH7jK9mN1pQ3r"):
        code, out, err = cli("watch", "--install", "--unit-dir", str(tmp_path / "u"), "--notify", url)
        assert code == 2 and "--notify-file" in err and "--notify-env" in err, err
        assert SECRET not in err + out and "aB3dE5gH7jK9mN1pQ3r" not in err + out
    assert not (tmp_path / "u").exists()


def test_a_url_file_goes_into_the_unit_by_path_and_a_variable_by_name(cli, local_cluster, tmp_path, monkeypatch):
    url_file = tmp_path / "hook.url"
    url_file.write_text(f"https://u:{SECRET}@hooks.example/x\n")
    url_file.chmod(0o644)
    code, _, err = cli("watch", "--install", "--unit-dir", str(tmp_path / "u"), "--notify-file", str(url_file))
    assert code == 2 and f"chmod 600 {url_file}" in err and SECRET not in err, err
    assert stat.S_IMODE(url_file.stat().st_mode) == 0o644            # the user's file is never chmod-ed
    url_file.chmod(0o600)
    path, out = _install(cli, tmp_path / "u", "--notify-file", str(url_file))
    text = path.read_text()
    assert SECRET not in text and SECRET not in out
    assert read_unit(path).argv[-2:] == ["--notify-file", str(url_file)]
    monkeypatch.setenv("HOOK_URL", f"https://hooks.example/x?token={SECRET}")
    path, out = _install(cli, tmp_path / "v", "--notify-env", "HOOK_URL")
    assert SECRET not in path.read_text() + out
    unit = read_unit(path)
    assert unit.argv[-2:] == ["--notify-env", "HOOK_URL"]
    assert f"next: put HOOK_URL=<the webhook URL> in {unit.environment_files[0].lstrip('-')}" in out
    monkeypatch.delenv("HOOK_URL")
    code, _, err = cli("watch", "--install", "--unit-dir", str(tmp_path / "w"), "--notify-env", "HOOK_URL")
    assert code == 2 and "HOOK_URL: the variable is not set" in err


def test_a_mistyped_url_in_a_file_or_a_variable_is_never_echoed(cli, local_cluster, tmp_path, monkeypatch):
    url_file = tmp_path / "hook.url"
    url_file.write_text(f"htps://u:{SECRET}@hooks.example/x\n")
    url_file.chmod(0o600)
    monkeypatch.setenv("HOOK_URL", f"hooks.example/x?token={SECRET}")
    for args in (["--notify-file", str(url_file)], ["--notify-env", "HOOK_URL"]):
        code, out, err = cli("watch", *args)
        assert code == 2 and "is not an http(s) URL" in err and SECRET not in out + err, err


def test_reinstalling_needs_force_and_keeps_the_users_mode(cli, local_cluster, tmp_path):
    units = tmp_path / "units"
    path, _ = _install(cli, units)
    os.chmod(path, 0o640)                      # the user's choice stands when the unit is written again
    code, _, err = cli("watch", "--install", "--unit-dir", str(units), "--interval", "7")
    assert code == 2 and "exists" in err and "--force" in err, err
    path, _ = _install(cli, units, "--interval", "7", "--force")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and '"--interval" "7"' in path.read_text()


def test_flags_that_do_not_go_together_are_refused(cli, local_cluster, tmp_path):
    code, _, err = cli("watch", "--install", "--user", "--system", "--unit-dir", str(tmp_path))
    assert code == 2 and "--user and --system" in err and "fix:" in err
    code, _, err = cli("watch", "--system")
    assert code == 2 and "go with --install or --uninstall" in err
    code, _, err = cli("watch", "--notify", "ftp://example.com/x")
    assert code == 2 and "is not an http(s) URL" in err
    code, _, err = cli("watch", "--force")
    assert code == 2 and "--force goes with --install" in err
    code, _, err = cli("watch", "--notify", "https://a.example/x", "--notify-env", "X")
    assert code == 2 and "give one of them" in err


def test_gpu_sensor_fields_nvidia_smi_cannot_read_stay_unknown():
    # The shape of `nvidia-smi --query-gpu=index,temperature.gpu,power.draw,clocks.sm --format=csv,noheader,nounits`
    # (one GPU per line). The GB10 table in /work/shared/reference/captures/spark/nvidia-smi-gb10-580.95-idle.txt
    # shows 40C and 11W with memory "Not Supported"; these lines are written here for the parser, not captured.
    parsed = parse_gpu_sensors("0, 40, 11.25, 2405\n1, [N/A], [Not Supported], 1200\n")
    assert [(g.index, g.temperature_c, g.power_w, g.sm_clock_mhz) for g in parsed] == \
        [(0, 40.0, 11.25, 2405.0), (1, None, None, 1200.0)]
    assert parse_gpu_sensors("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
                             "that the latest NVIDIA driver is installed and running.") == []
