"""The router container's lifecycle pieces that need no cluster: its `docker run` argv, the record round trip, the
choice by runtime, what `start` does with a container already holding the name, and the label filter on stop.
Docker's answers are the real ones captured on the test cluster (tests/fixtures/router-0.3.2/container/, README)."""
from __future__ import annotations

import http.server
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.nodes import docker_facts
from sparkctl.nodes.ssh import CommandResult
from sparkctl.router import RouterError
from sparkctl.router import launch as router_launch
from sparkctl.router.container import RouterContainer, removable, router_container_name, start_move
from sparkctl.router.process import RouterProcess
from sparkctl.router.spec import RouterSpec
from testrig.testenv import local_server

REPO = Path(__file__).resolve().parents[2]
CAP = REPO / "tests" / "fixtures" / "router-0.3.2" / "container"
SPARKS = REPO / "inventory" / "sparks.example.yml"
IMAGE = "sparkctl-test-engine:139c540564510a97"
# the spec the captured router ran (README): its identity label matches this spec's
CAPTURED = RouterSpec("0.0.0.0", 30080, ("http://198.19.8.1:30000",), health_check_interval_s=1)


def _state(name: str) -> docker_facts.ContainerState:
    st = docker_facts.parse_container_inspect((CAP / name).read_text())
    assert st is not None
    return st


def _result_file(name: str) -> tuple[int, str, str]:
    """exit / stdout / stderr of a captured `.txt` (README)."""
    text = (CAP / name).read_text()
    head, rest = text.split("\nstdout:", 1)
    out, err = rest.split("\nstderr:", 1)
    return int(head.split()[1]), out, err


class Replay:
    """A node connector that answers each docker command from the captures (first matching prefix wins) and
    keeps every argv it was given."""

    def __init__(self, answers: list[tuple[list[str], tuple[int, str, str]]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def run(self, argv, *, check=False, timeout=60.0, merge_stderr=False) -> CommandResult:
        argv = list(argv)
        self.calls.append(argv)
        for prefix, (rc, out, err) in self.answers:
            if argv[:len(prefix)] == prefix:
                return CommandResult("spark-a", argv, rc, out, err, 0.0)
        raise AssertionError(f"unexpected command {argv}")


def _inspect(ref: str, file: str) -> tuple[list[str], tuple[int, str, str]]:
    argv = list(docker_facts.container_state(ref).argv)
    if file.endswith(".txt"):
        return argv, _result_file(file)
    return argv, (0, (CAP / file).read_text(), "")


# ---- argv --------------------------------------------------------------------------------------------------
def test_container_argv_is_a_list_with_the_router_labels_and_the_launcher():
    spec = RouterSpec("0.0.0.0", 30080, ("http://10.0.0.1:30000", "http://10.0.0.2:30000"), reach_host="10.0.0.1")
    argv = spec.container_argv(IMAGE, "sparkctl-desk-router", cluster="desk")
    i = argv.index(IMAGE)
    assert argv[:i] == ["docker", "run", "--detach", "--pull", "never", "--name", "sparkctl-desk-router",
                        "--label", "sparkctl.role=router", "--label", "sparkctl.router-cluster=desk",
                        "--label", f"sparkctl.router-identity={spec.identity(IMAGE)}", "--network", "host",
                        "--init", "--restart", "no", "--env", "NO_COLOR=1", "--entrypoint", "python3"]
    assert argv[i + 1:] == ["-m", "sglang_router.launch_router", *spec.args()]
    assert "--host" in argv and argv[argv.index("--host") + 1] == "0.0.0.0"       # binds where rank 0's API binds
    assert "10.0.0.1" not in spec.args()                                           # reach_host is not an argument
    assert spec.url == "http://10.0.0.1:30080" and spec.metrics_url == "http://10.0.0.1:29000/metrics"


def test_identity_follows_image_and_arguments_only():
    a = RouterSpec("0.0.0.0", 30080, ("http://10.0.0.1:30000",))
    assert a.identity(IMAGE) == RouterSpec("0.0.0.0", 30080, ("http://10.0.0.1:30000",),
                                           reach_host="10.0.0.9").identity(IMAGE)
    assert a.identity(IMAGE) != a.identity("other:1")
    assert a.identity(IMAGE) != RouterSpec("0.0.0.0", 30080, ("http://10.0.0.2:30000",)).identity(IMAGE)
    assert CAPTURED.identity(IMAGE) == _state("inspect-router-running.json").labels["sparkctl.router-identity"]


def test_container_name_is_one_per_cluster_in_dockers_charset():
    assert router_container_name("desk") == "sparkctl-desk-router"
    assert router_container_name("my desk/2") == "sparkctl-my-desk-2-router"


# ---- record ------------------------------------------------------------------------------------------------
def test_record_round_trip_and_the_choice_by_runtime(tmp_path):
    inv = load_inventory(SPARKS)
    rc = RouterContainer(CAPTURED, inv.rank0.name, Replay([]), "sparkctl-x-router", "abc123", IMAGE)
    d = rc.to_dict()
    assert d["runtime"] == "container" and d["argv"] == CAPTURED.args()
    back = router_launch.from_record(inv, CAPTURED, d)
    assert isinstance(back, RouterContainer)
    assert (back.node, back.name, back.container_id, back.image) == (inv.rank0.name, "sparkctl-x-router", "abc123",
                                                                     IMAGE)
    assert back.to_dict() == d and back.where == f"container sparkctl-x-router on {inv.rank0.name}"
    proc = RouterProcess(CAPTURED, 4242, tmp_path / "router.log", 17)
    pd = proc.to_dict()
    assert pd["runtime"] == "process"
    assert isinstance(router_launch.from_record(inv, CAPTURED, pd), RouterProcess)
    older = {k: v for k, v in pd.items() if k != "runtime"}          # a record from before runtimes were kept
    assert isinstance(router_launch.from_record(inv, CAPTURED, older), RouterProcess)
    was = {("kind" if k == "runtime" else k): v for k, v in d.items()}  # written as "kind" until 2026-12
    assert isinstance(router_launch.from_record(inv, CAPTURED, was), RouterContainer)
    assert router_launch.recorded_router(inv, CAPTURED, None) is None


def test_start_refuses_without_an_image_on_the_docker_runtime(tmp_path):
    from sparkctl.errors import ConfigError
    with pytest.raises(ConfigError, match="no engine image"):
        router_launch.start_router(load_inventory(SPARKS), CAPTURED, image=None, log_path=tmp_path / "r.log")


# ---- start: what happens to a container already holding the name -------------------------------------------
def test_start_move_from_the_captured_states():
    assert start_move(None, CAPTURED, IMAGE) == "run"
    assert start_move(_state("inspect-router-running.json"), CAPTURED, IMAGE) == "keep"
    other = RouterSpec("0.0.0.0", 30080, ("http://198.19.8.2:30000",), health_check_interval_s=1)
    assert start_move(_state("inspect-router-running.json"), other, IMAGE) == "replace"
    assert start_move(_state("inspect-router-exited.json"), CAPTURED, IMAGE) == "replace"
    assert start_move(_state("inspect-not-router.json"), CAPTURED, IMAGE) == "refuse"


def test_start_refuses_a_container_of_that_name_that_is_not_a_router():
    name = router_container_name("capture")
    node = Replay([_inspect(name, "inspect-not-router.json")])
    with pytest.raises(RouterError, match="not a sparkctl router") as info:
        RouterContainer.start(CAPTURED, node, node="spark-a", cluster="capture", image=IMAGE)
    assert f"docker rm -f {name}" in info.value.render()
    assert node.calls == [list(docker_facts.container_state(name).argv)]          # nothing removed, nothing run


@pytest.fixture
def liveness():
    """A local server answering /liveness 200 (the router's readiness probe) on a free loopback port."""
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/liveness" else 404)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *a):
            pass
    with local_server(H) as port:
        yield port


def test_start_replaces_an_exited_router_under_its_name(liveness):
    spec = RouterSpec("0.0.0.0", liveness, ("http://198.19.8.1:30000",), reach_host="127.0.0.1")
    name = router_container_name("capture")
    old = _state("inspect-router-exited.json")
    new_id = "f" * 64
    node = Replay([_inspect(name, "inspect-router-exited.json"), (["docker", "rm", "--force", old.id], (0, old.id, "")),
                   (["docker", "run"], (0, new_id + "\n", "")), _inspect(new_id, "inspect-router-running.json")])
    rc = RouterContainer.start(spec, node, node="spark-a", cluster="capture", image=IMAGE)
    assert rc.container_id == new_id and rc.name == name
    assert node.calls[1] == ["docker", "rm", "--force", old.id]
    assert node.calls[2] == spec.container_argv(IMAGE, name, cluster="capture")


def test_a_missing_image_names_the_node_and_the_image():
    name = router_container_name("capture")
    node = Replay([_inspect(name, "inspect-missing.txt"), (["docker", "run"], _result_file("run-no-such-image.txt")),
                   (["docker", "rm", "--force", name],
                    (1, "", f"Error response from daemon: No such container: {name}"))])
    with pytest.raises(RouterError) as info:
        RouterContainer.start(CAPTURED, node, node="spark-a", cluster="capture", image="sparkctl-test-engine:missing")
    text = info.value.render()
    assert "[spark-a]" in text and "sparkctl-test-engine:missing is not on spark-a" in text
    assert "No such image" in text


# ---- stop: only a container labelled sparkctl.role=router --------------------------------------------------
def test_removable_is_the_role_label():
    assert removable(_state("inspect-router-running.json")) and removable(_state("inspect-router-exited.json"))
    assert not removable(_state("inspect-not-router.json")) and not removable(None)


@pytest.mark.parametrize("file, removed", [("inspect-router-running.json", True), ("inspect-router-exited.json", True),
                                           ("inspect-not-router.json", False), ("inspect-missing.txt", False)])
def test_stop_removes_only_a_router_by_its_recorded_id(file, removed):
    st = docker_facts.parse_container_inspect((CAP / file).read_text()) if file.endswith(".json") else None
    cid = st.id if st else "0" * 64
    node = Replay([_inspect(cid, file), (["docker", "rm", "--force"], (0, cid, ""))])
    rc = RouterContainer(CAPTURED, "spark-a", node, "sparkctl-capture-router", cid, IMAGE)
    assert rc.stop() is removed
    rms = [c for c in node.calls if c[:2] == ["docker", "rm"]]
    assert rms == ([["docker", "rm", "--force", cid]] if removed else [])


def test_alive_and_the_log_tail_without_colour_codes():
    st = _state("inspect-router-running.json")
    node = Replay([_inspect(st.id, "inspect-router-running.json"),
                   (["docker", "logs", "--tail", "20", st.id], (0, (CAP / "logs-tail.txt").read_text(), ""))])
    rc = RouterContainer(CAPTURED, "spark-a", node, "sparkctl-capture-router", st.id, IMAGE)
    assert rc.alive()
    tail = rc.log_tail()
    assert "\x1b[" not in tail and "Starting server on 0.0.0.0:30080" in tail
    exited = Replay([_inspect(st.id, "inspect-router-exited.json")])
    assert not RouterContainer(CAPTURED, "spark-a", exited, "n", st.id, IMAGE).alive()


def test_left_over_routers_are_found_by_both_labels():
    from sparkctl.router.container import labelled_routers
    node = Replay([(["docker", "ps"], (0, "a1\nb2\n", ""))])
    assert labelled_routers(node, "desk") == ["a1", "b2"]
    assert node.calls == [["docker", "ps", "-a", "--no-trunc", "--filter", "label=sparkctl.role=router",
                           "--filter", "label=sparkctl.router-cluster=desk", "--format", "{{.ID}}"]]


# ---- which image the router container runs ------------------------------------------------------------------
def test_the_router_runs_the_replicas_engine_image_or_before_the_first_build_its_base():
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.image_stage import ImageSurvey
    from sparkctl.deploy.router_image import pick_router_image
    from sparkctl.images.plan import BaseImage, plan_images

    prof = load_profile("base")
    rendered = prof.image.engine_ref()
    prebuilt = ImageSurvey("prebuilt", image=IMAGE, present={"spark-a": {IMAGE: "sha256:1"}})
    assert pick_router_image(prebuilt, prof, "spark-a", IMAGE) == IMAGE
    inventory = load_inventory(Path(__file__).resolve().parents[2] / "inventory" / "sparks.example.yml")
    plan = plan_images(prof, inventory, BaseImage(prof.image.base_image, "sha256:" + "1" * 64))
    built = ImageSurvey("pipeline", plan=plan, present={"spark-a": {plan.engine_tag: "sha256:2"}})
    assert pick_router_image(built, prof, "spark-a", rendered) == plan.engine_tag
    first = ImageSurvey("pipeline", plan=plan, present={"spark-a": {plan.engine_tag: None}})
    assert pick_router_image(first, prof, "spark-a", rendered) == prof.image.base_image == "lmsysorg/sglang:v0.5.23"
    no_base = ImageSurvey("pipeline", base_missing=True, present={"spark-a": {}})
    assert pick_router_image(no_base, prof, "spark-a", rendered) == rendered      # docker run names it missing
    unreachable = ImageSurvey("pipeline", error="spark-a unreachable")
    assert pick_router_image(unreachable, prof, "spark-a", rendered) == rendered
