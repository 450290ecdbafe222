"""`sparkctl doctor` through the typer app: --log files, the failed deployment of the embedded cluster (and `up`
citing the finding), --json against its model, --bundle (written as given, redacted), exit codes."""
from __future__ import annotations

import json
import os
import stat

from sparkctl.doctor.collect import DoctorReport
from testrig.captures import capture_path

WRONG_IFACE = capture_path("sglang/multinode-rank1-nccl-bootstrap-wrong-interface.txt")
CLEAN = capture_path("sglang/spark-1node-dflash-startup-decode-shutdown.txt")


def test_log_file_with_a_known_failure_exits_8_with_cause_fix_and_source(cli):
    code, out, err = cli("doctor", "--log", str(WRONG_IFACE))
    assert code == 8, err
    assert "FOUND nccl-bootstrap-connect-failed" in out and "NCCL_SOCKET_IFNAME" in out
    assert "source: captures/sglang/multinode-rank1-nccl-bootstrap-wrong-interface.txt" in out
    assert "returned Connection refused" in out


def test_clean_log_exits_0_and_json_follows_the_model(cli):
    code, out, err = cli("doctor", "--log", str(CLEAN), "--json")
    assert code == 0, err
    report = DoctorReport.model_validate_json(out)
    assert report.findings == [] and report.target == "files" and report.sources[0].lines > 100
    code, out, _ = cli("doctor", "--log", str(WRONG_IFACE), "--log", str(CLEAN), "--json")
    report = DoctorReport.model_validate_json(out)
    assert code == 8 and [f.signature for f in report.findings] == ["nccl-bootstrap-connect-failed",
                                                                    "nccl-remote-exited"]
    assert len(report.sources) == 2


def test_bad_log_paths_are_exit_2_with_a_clear_line(cli, tmp_path):
    code, _, err = cli("doctor", "--log", str(tmp_path))
    assert code == 2 and "is a directory, not a log file" in err
    code, _, err = cli("doctor", "--log", str(tmp_path / "missing.log"))
    assert code == 2 and "cannot read it" in err
    code, _, err = cli("doctor", "--log", str(CLEAN), "--deployment", "x")
    assert code == 2 and "give one of them" in err


def test_hostile_log_never_reaches_the_terminal_raw(cli, tmp_path):
    log = tmp_path / "hostile.log"
    log.write_bytes(b"\x1b]0;owned\x07\x1b[31mNot enough memory. Please try to increase --mem-fraction-static."
                    + b"\x1b[2J" * 1000 + b"\x00" + os.urandom(2048) + b"\n" + b"A" * (1024 * 1024) + b"\n")
    code, out, err = cli("doctor", "--log", str(log))
    assert code == 8 and "FOUND sglang-kv-pool-no-memory" in out
    assert "\x1b" not in out and "\x00" not in out and "\x07" not in out
    assert len(out) < 20_000


def test_list_prints_the_catalogue(cli):
    from sparkctl.sglang.signatures import CATALOGUE
    code, out, _ = cli("doctor", "--list")
    assert code == 0 and all(f"{s.id}: " in out for s in CATALOGUE)


def test_bundle_is_written_as_given_and_a_directory_is_refused(cli, tmp_path):
    where = tmp_path / "share"
    where.mkdir(mode=0o755)
    os.chmod(where, 0o755)
    path = where / "bundle.json"
    code, out, err = cli("doctor", "--log", str(WRONG_IFACE), "--bundle", str(path))
    assert code == 8, err
    data = json.loads(path.read_text())
    assert data["schema"] == "sparkctl-doctor-bundle/1" and data["versions"]["sparkctl"]
    assert data["report"]["findings"][0]["signature"] == "nccl-bootstrap-connect-failed"
    assert len(data["log_tails"][str(WRONG_IFACE)]) <= 200
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(where.stat().st_mode) == 0o755
    code, _, err = cli("doctor", "--log", str(WRONG_IFACE), "--bundle", str(where))
    assert code == 2 and "is a directory" in err
    code, _, err = cli("doctor", "--log", str(WRONG_IFACE), "--bundle", str(where / "no" / "b.json"))
    assert code == 2 and "does not exist" in err


def test_nothing_to_diagnose_on_a_fresh_cluster(cli, local_cluster):
    code, out, err = cli("doctor", "--no-kernel-log")
    assert code == 0 and "nothing to diagnose" in out, err
    code, _, err = cli("doctor", "--deployment", "nope")
    assert code == 2 and "no such deployment" in err


def test_failed_up_cites_the_doctor_and_doctor_reads_that_deployment(cli, local_cluster, faulty_profile, tmp_path,
                                                                      monkeypatch):
    # d5 runs --mem-fraction-static 0.88; the emulator's host OOM-killer fires above 0.5: the scheduler is SIGKILLed
    # while loading, and rank 0 prints the launcher's line of the 2x Spark capture.
    key = "sk-doctor-" + os.urandom(6).hex()
    monkeypatch.setenv("SPARKCTL_API_KEY", key)
    prof = faulty_profile({"oom_mem_fraction": 0.5})
    code, out, err = cli("up", "--profile", prof, "--yes")
    assert code == 4, err
    assert "doctor: host-oom-killed-at-load" in err and "fix: lower server.mem_fraction_static" in err
    assert "source: captures/sglang/2spark-load-host-oom-scheduler-died-poster-edited.txt" in err

    code, out, err = cli("doctor", "--json", "--no-kernel-log")
    assert code == 8, err
    report = DoctorReport.model_validate_json(out)
    assert report.status == "failed" and report.failed_stage == "boot" and report.profile == prof
    assert report.findings[0].signature == "host-oom-killed-at-load"
    assert all(e.source.startswith("rank ") for e in report.findings[0].evidence)    # not the summaries quoting it
    assert {s.name.split(" [")[0] for s in report.sources} >= {"rank 0", "rank 1", "failure record", "journal"}

    bundle = tmp_path / "support.json"
    code, out, err = cli("doctor", "--no-kernel-log", "--bundle", str(bundle))
    assert code == 8 and f"bundle written: {bundle}" in out
    data = json.loads(bundle.read_text())
    assert data["deployment"]["id"] == report.deployment and data["deployment"]["status"] == "failed"
    assert data["ranks"] and all("--mem-fraction-static" in r["argv"] for r in data["ranks"])
    assert any("boot" in line for line in data["journal"]) and data["facts"]
    assert key not in bundle.read_text()


def test_secrets_in_a_log_file_are_redacted_in_the_output_and_the_bundle(cli, tmp_path, monkeypatch):
    key, token = "sk-doc-" + os.urandom(6).hex(), "hf_doc" + os.urandom(6).hex()
    monkeypatch.setenv("SPARKCTL_API_KEY", key)
    monkeypatch.setenv("HF_TOKEN", token)
    published = "Not enough memory. Please try to increase --mem-fraction-static."   # SGLang 0.5.23's message
    log = tmp_path / "rank0.log"
    hook = ("https://watch:hookpw-doc-5@hooks.example/services/T0k3nPathSecret9876/x?token=qsecret-doc-7 and "
            "http://tok3n-user-only@127.0.0.1:9/y")
    log.write_text(f"server_args=ServerArgs(api_key='other-{os.getpid()}', hf_token={token!r})\n"
                   f"{published} {key}\nposting to {hook}\n")
    bundle = tmp_path / "b.json"
    code, out, err = cli("doctor", "--log", str(log), "--bundle", str(bundle))
    assert code == 8 and "FOUND sglang-kv-pool-no-memory" in out
    text = bundle.read_text()
    for secret in (key, token, f"other-{os.getpid()}"):
        assert secret not in out and secret not in err and secret not in text
    for secret in ("hookpw-doc-5", "T0k3nPathSecret9876", "qsecret-doc-7", "tok3n-user-only"):  # URL credentials
        assert secret not in text
    assert "https://***@hooks.example/services/***/x?***" in text
    assert "api_key='***'" in text and "***" in out
