"""`sparkctl watch --install/--uninstall`: the systemd unit, checked by systemd's own `systemd-analyze verify`; the
quoting of ExecStart arguments; GPU sensor parsing (no number where nvidia-smi reports none)."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from sparkctl.nodes.facts import parse_gpu_sensors
from sparkctl.watch.systemd import systemd_quote, unit_name
from testrig.testenv import in_ci

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def _verify(unit: Path, *, user: bool, tmp: Path) -> subprocess.CompletedProcess[str]:
    if SYSTEMD_ANALYZE is None:
        if in_ci():
            pytest.fail("CI=true but systemd-analyze is missing")
        pytest.skip("systemd-analyze is not installed here")
    env = dict(os.environ)
    if user:                                   # the user manager's runtime directory, private to this test
        runtime = tmp / "runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)
    argv = [SYSTEMD_ANALYZE, *(["--user"] if user else []), "verify", str(unit)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def _ini(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("scope", ["user", "system"])
def test_install_writes_a_unit_systemd_accepts_and_uninstall_removes_it(cli, local_cluster, tmp_path, scope):
    units = tmp_path / "units"
    code, out, err = cli("watch", "--install", f"--{scope}", "--unit-dir", str(units), "--interval", "2",
                         "--metrics-port", "9464", "--inventory", str(local_cluster))
    assert code == 0, err
    cluster = local_cluster.read_text().split("sparkctl_cluster: ")[1].split()[0]
    path = units / unit_name(cluster)
    assert f"wrote {path}" in out and "daemon-reload" in out and "enable --now" in out
    text = path.read_text()
    keys = _ini(text)
    assert keys["Restart"] == ["on-failure"]
    assert keys["Wants"] == ["network-online.target docker.service"]
    assert keys["After"] == ["network-online.target docker.service"]
    assert keys["WantedBy"] == ["multi-user.target" if scope == "system" else "default.target"]
    exec_start = keys["ExecStart"][0]
    for arg in ("watch", "--inventory", str(local_cluster.resolve()), "--interval", "2", "--metrics-port", "9464"):
        assert systemd_quote(arg) in exec_start, exec_start
    assert f'"SPARKCTL_STATE_DIR={os.environ["SPARKCTL_STATE_DIR"]}"' in keys["Environment"][0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600           # a new user file: private (userfiles)
    done = _verify(path, user=scope == "user", tmp=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Unknown" not in done.stderr and "bad" not in done.stderr.lower(), done.stderr
    code, out, err = cli("watch", "--uninstall", f"--{scope}", "--unit-dir", str(units), "--inventory",
                         str(local_cluster))
    assert code == 0 and f"removed {path}" in out and not path.exists(), out + err
    code, out, _ = cli("watch", "--uninstall", f"--{scope}", "--unit-dir", str(units), "--inventory",
                       str(local_cluster))
    assert code == 0 and "no unit" in out


def test_a_unit_with_a_webhook_is_private_and_a_replaced_one_keeps_its_mode(cli, local_cluster, tmp_path):
    units = tmp_path / "units"
    code, out, err = cli("watch", "--install", "--unit-dir", str(units), "--notify", "https://u:pw@hooks.example/x")
    assert code == 0, err
    (path,) = units.iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and "https://u:pw@hooks.example/x" in path.read_text()
    assert "pw" not in out                     # the URL is in the unit, never echoed
    os.chmod(path, 0o640)                      # the user's choice stands when the unit is written again
    code, _, err = cli("watch", "--install", "--unit-dir", str(units), "--interval", "7")
    assert code == 0, err
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and '"--interval" "7"' in path.read_text()


def test_flags_that_do_not_go_together_are_refused(cli, local_cluster, tmp_path):
    code, _, err = cli("watch", "--install", "--user", "--system", "--unit-dir", str(tmp_path))
    assert code == 2 and "--user and --system" in err and "fix:" in err
    code, _, err = cli("watch", "--system")
    assert code == 2 and "go with --install or --uninstall" in err
    code, _, err = cli("watch", "--notify", "ftp://example.com/x")
    assert code == 2 and "is not an http(s) URL" in err


def test_systemd_quote_makes_specifiers_and_quotes_literal():
    assert systemd_quote("/opt/spark ctl/bin/sparkctl") == '"/opt/spark ctl/bin/sparkctl"'
    assert systemd_quote('50%"$HOME\\') == '"50%%\\"$$HOME\\\\"'
    with pytest.raises(Exception, match="newline"):
        systemd_quote("a\nb")


def test_gpu_sensor_fields_nvidia_smi_cannot_read_stay_unknown():
    # The shape of `nvidia-smi --query-gpu=index,temperature.gpu,power.draw,clocks.sm --format=csv,noheader,nounits`
    # (one GPU per line). The GB10 table in /work/shared/reference/captures/spark/nvidia-smi-gb10-580.95-idle.txt
    # shows 40C and 11W with memory "Not Supported"; these lines are written here for the parser, not captured.
    parsed = parse_gpu_sensors("0, 40, 11.25, 2405\n1, [N/A], [Not Supported], 1200\n")
    assert [(g.index, g.temperature_c, g.power_w, g.sm_clock_mhz) for g in parsed] == \
        [(0, 40.0, 11.25, 2405.0), (1, None, None, 1200.0)]
    assert parse_gpu_sensors("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
                             "that the latest NVIDIA driver is installed and running.") == []
