"""Which way a peer gets an image (the registry when it would send at most half the bytes, which it can only for layers
the peer pulled from it before; else a stream that leaves out the layers the peer holds), measured from layer
chains; and how the copy to every peer at once ends (every outcome, first error)."""
from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkctl.errors import ImageError
from sparkctl.images.copy import PeerPlan, settle
from sparkctl.images.registry import Endpoint, Transfer
from sparkctl.images.stream import (
    _PUMP,
    CopyChoice,
    ImageLayers,
    choose_copy,
    fabric_ssh_argv,
    parse_held,
    shared_bytes,
    survey,
)
from sparkctl.nodes.fanout import Outcome, fan_out
from sparkctl.nodes.ssh import CommandResult, SSHConnector

# `docker image inspect --format "{{.Size}} {{json .RootFS.Layers}}"` of the test engine image on a test-cluster node
ENGINE_LINE = ('310356793 ["sha256:3e2b151042dcf8890fdd91abf8a0bf1e53ff4450b02fb544bb36ed48f3ab02fe",'
               '"sha256:510c7622e5c17cc19d1cabf3bece5e9c80ed00aad01156a46626862208eb8708",'
               '"sha256:79125d83dd47840c2a2f7556655ce81b7240c283778b0e98c47f750ae90ebdb9",'
               '"sha256:c417f3656c4b25f256053a6d58ba19be94acbb906aa3ff27bd7975652281616f",'
               '"sha256:f0fdc666db97796c2c55cba911e4ad9fb8e1faec1c58c5784b0bc586a2986e21"]')
ENGINE = parse_held(ENGINE_LINE)[0]
SGLANG = ImageLayers(ENGINE.layers + ("sha256:src", "sha256:patch"), 360_000_000)
LAUNCH = ImageLayers(SGLANG.layers + ("sha256:flags",), 360_004_100)


def test_parse_held_reads_dockers_lines_and_skips_noise():
    got = parse_held(ENGINE_LINE + "\nError: No such image: x\n\n12 []\n")
    assert got[0] == ENGINE and len(ENGINE.layers) == 5 and ENGINE.size == 310_356_793
    assert got[1] == ImageLayers((), 12) and len(got) == 2


def test_first_copy_to_an_empty_peer_streams():
    c = choose_copy([SGLANG, LAUNCH], [], stream_ok=True)
    assert (c.method, c.missing_bytes, c.total_bytes) == ("stream", LAUNCH.size, LAUNCH.size)
    assert "lacks 100%" in c.reason


def test_flag_only_copy_goes_through_the_registry_when_the_engine_came_through_it():
    c = choose_copy([SGLANG, LAUNCH], [ENGINE, SGLANG], stream_ok=True, pulled=SGLANG.layers)
    assert c.method == "registry" and c.missing_bytes == 4_100 and c.held == ()


def test_flag_only_copy_after_a_stream_streams_only_the_new_layer():
    # the peer holds the engine but loaded it: Docker's pull would send all of it again
    c = choose_copy([SGLANG, LAUNCH], [ENGINE, SGLANG], stream_ok=True)
    assert (c.method, c.missing_bytes, c.held) == ("stream", 4_100, SGLANG.layers)
    assert "the registry would send 100%" in c.reason and "without those layers" in c.reason


def test_peer_with_the_base_gets_the_rest_without_the_base():
    c = choose_copy([LAUNCH], [ENGINE], stream_ok=True)
    assert c.method == "stream" and c.missing_bytes == LAUNCH.size - ENGINE.size and c.held == ENGINE.layers
    pulled = choose_copy([LAUNCH], [ENGINE], stream_ok=True, pulled=ENGINE.layers)
    assert pulled.method == "registry" and pulled.missing_bytes == LAUNCH.size - ENGINE.size and pulled.held == ()


def test_without_fabric_ssh_a_first_copy_still_works_through_the_registry_and_says_how_to_stream():
    c = choose_copy([LAUNCH], [], stream_ok=False, why_not_stream="fabric key missing")
    assert c.method == "registry" and "fabric key missing" in c.reason and "prepare --tags fabric-ssh" in c.reason
    held = choose_copy([LAUNCH], [ENGINE], stream_ok=False)       # what the registry will send, whole
    assert held.method == "registry" and held.missing_bytes == LAUNCH.size


def test_a_diverging_image_shares_nothing_it_cannot_prove():
    other = ImageLayers(ENGINE.layers[:2] + ("sha256:elsewhere",), 300_000_000)
    assert shared_bytes(LAUNCH, [other]) == 0
    c = choose_copy([LAUNCH], [other], stream_ok=True)
    assert c.method == "stream" and c.missing_bytes == LAUNCH.size and c.held == ()   # bytes unproven: sent whole


def test_a_layer_found_again_above_the_held_prefix_is_never_left_out():
    image = ImageLayers(("sha256:a", "sha256:b", "sha256:a"), 300)
    c = choose_copy([image], [ImageLayers(("sha256:a", "sha256:b"), 200)], stream_ok=True)
    assert c.method == "stream" and c.held == ("sha256:b",)


def test_held_longer_chain_means_every_byte_is_there():
    assert shared_bytes(SGLANG, [LAUNCH]) == SGLANG.size
    c = choose_copy([SGLANG], [LAUNCH], stream_ok=True)
    assert (c.method, c.missing_bytes, c.total_bytes, c.held) == ("stream", 0, SGLANG.size, SGLANG.layers)
    c = choose_copy([SGLANG], [LAUNCH], stream_ok=True, pulled=LAUNCH.layers)
    assert (c.method, c.missing_bytes, c.total_bytes) == ("registry", 0, SGLANG.size)


def test_threshold_is_most_of_the_bytes():
    half = ImageLayers(("a",), 50)
    whole = ImageLayers(("a", "b"), 100)
    assert choose_copy([whole], [half], stream_ok=True, pulled={"a"}).method == "registry"   # sends exactly half
    assert choose_copy([whole], [ImageLayers(("a",), 49)], stream_ok=True, pulled={"a"}).method == "stream"
    with pytest.raises(ValueError):
        choose_copy([], [], stream_ok=True)


chains = st.lists(st.sampled_from("abcdef"), min_size=1, max_size=6).map(lambda xs: tuple(f"sha256:{x}" for x in xs))


@given(image=chains, held=st.lists(chains, max_size=5), pulled=st.sets(st.sampled_from("abcdef")),
       sizes=st.lists(st.integers(1, 10**9), min_size=6, max_size=6), stream_ok=st.booleans())
def test_choice_invariants_over_generated_layer_chains(image, held, pulled, sizes, stream_ok):
    def size(chain):          # one size per layer: a chain's size is its layers' sum (as docker reports it)
        return sum(sizes["abcdef".index(x[-1])] for x in chain)
    known = {f"sha256:{x}" for x in pulled}
    img = ImageLayers(image, size(image))
    held_images = [ImageLayers(h, size(h)) for h in held]
    c = choose_copy([img], held_images, stream_ok=stream_ok, pulled=known)
    assert 0 <= c.missing_bytes <= img.size
    shared = shared_bytes(img, held_images)
    if c.method == "stream":                  # it sends what the peer lacks, and leaves out only what it holds
        assert stream_ok and c.missing_bytes == img.size - shared
        prefixes = [h[:i] for h in held for i in range(len(h) + 1) if image[:i] == h[:i]]
        longest = max(prefixes, key=len, default=())
        assert set(c.held) <= set(longest) and not set(c.held) & set(image[len(longest):])
    else:                                      # the registry: what it would send, at most half unless no stream
        assert c.held == () and c.missing_bytes >= img.size - shared
        assert c.missing_bytes <= img.size / 2 or not stream_ok
    if any(h[:len(image)] == image and known.issuperset(h) for h in held):   # all there, pulled from the registry
        assert c.missing_bytes == 0 and c.method == "registry"
    if not held:
        assert c.method == ("stream" if stream_ok else "registry") and c.missing_bytes == img.size


def test_fabric_stream_is_argv_with_pinned_host_keys():
    argv = fabric_ssh_argv("spark", "192.168.100.11")
    assert argv[0] == "ssh" and argv[-1] == "spark@192.168.100.11"
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv and "UserKnownHostsFile=" \
        "~/.ssh/sparkctl_fabric_known_hosts" in argv and "~/.ssh/sparkctl_fabric_ed25519" in argv
    compile(_PUMP, "<pump>", "exec")                      # the builder-side pump is valid Python
    assert "shell=True" not in _PUMP and "os.system" not in _PUMP


def _plan(name: str, method: str = "stream") -> PeerPlan:
    peer = Endpoint(name, _Canned(""), "198.18.0.2", "enp1s0f0np0", "/var/cache/sparkctl")
    return PeerPlan(peer, ["img:1"], CopyChoice(method, 1, 1, ""), [Transfer(name, "img:0", "sha256:0", skipped="has")])


def test_settle_keeps_every_peer_and_raises_the_first_error_after_all():
    plans = [_plan("spark-b"), _plan("spark-c", "registry"), _plan("spark-d")]

    def copy(pl: PeerPlan) -> list[Transfer]:
        if pl.peer.name != "spark-b":
            raise ImageError(f"{pl.peer.name} ran out of disk space")
        return [Transfer("spark-b", "img:1", "sha256:1", via="stream", rx_bytes=10, seconds=1.0)]
    finished: list[str] = []

    def copied(pl: PeerPlan) -> list[Transfer]:
        got = copy(pl)
        finished.append(pl.peer.name)
        return got
    outcomes = fan_out(plans, copied)
    lines: list[str] = []
    with pytest.raises(ImageError, match="spark-c ran out of disk space"):      # the first in peer order
        settle(plans, outcomes, lines.append)
    assert finished == ["spark-b"]                     # spark-b's copy ran to the end although the others failed
    assert lines == ["spark-b: copy done (stream)",
                     "spark-c: copy FAILED (registry): spark-c ran out of disk space",
                     "spark-d: copy FAILED (stream): spark-d ran out of disk space"]


def test_settle_returns_skipped_and_copied_transfers_in_peer_order():
    plans = [_plan("spark-b"), _plan("spark-c")]
    outcomes = [Outcome(plans[0], [Transfer("spark-b", "img:1", "sha256:1")]),
                Outcome(plans[1], [Transfer("spark-c", "img:1", "sha256:1")])]
    got = settle(plans, outcomes, lambda _: None)
    assert [(t.node, t.image, bool(t.skipped)) for t in got] == [
        ("spark-b", "img:0", True), ("spark-b", "img:1", False),
        ("spark-c", "img:0", True), ("spark-c", "img:1", False)]


class _Canned(SSHConnector):
    """A connection to spark-b that answers any command (the survey's one) with what a test-cluster node printed;
    it opens no SSH connection (the connector's own fields are never set)."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.argv: list[str] = []

    @property
    def name(self) -> str:
        return "spark-b"

    def run(self, argv: Sequence[str], **kw: object) -> CommandResult:
        self.argv = list(argv)
        return CommandResult("spark-b", list(argv), 0, self.stdout, "", 0.1)


def test_survey_reads_ids_layers_and_what_the_node_stores_in_one_round_trip():
    iid = "sha256:ef9cafc869c4" + "0" * 52
    pulled = ENGINE.layers[0]
    conn = _Canned(f"{iid} {ENGINE_LINE}\n-\n===PULLED\n{pulled}\nsha256:short\n$(rm -rf /)\n===HELD\n{ENGINE_LINE}\n")
    got = survey(conn, ["sparkctl-test-engine:1", "absent:2"], held_in="/var/cache/sparkctl")
    assert got.ids == {"sparkctl-test-engine:1": iid, "absent:2": None}
    assert got.layers["sparkctl-test-engine:1"] == ENGINE and got.layers["absent:2"] is None
    assert got.held == [ENGINE] and got.pulled == {pulled}         # what is not a diff ID is no layer
    assert conn.argv[:2] == ["sh", "-c"] and \
        conn.argv[3:] == ["held=/var/cache/sparkctl/sparkctl-registry-pulled", "sparkctl-test-engine:1", "absent:2"]
    with pytest.raises(ImageError, match="docker image inspect failed on spark-b"):
        survey(_Canned("-\n"), ["a:1", "b:2"])


def test_building_node_survey_says_per_peer_whether_a_fabric_stream_can_log_in():
    iid = "sha256:ef9cafc869c4" + "0" * 52
    conn = _Canned(f"===FABRIC 198.18.0.2 ok\n===FABRIC 198.18.0.3 host-key\n===FABRIC 198.18.0.4 key\n"
                   f"{iid} {ENGINE_LINE}\n")
    got = survey(conn, ["sparkctl-test-engine:1"], fabric_peers=["198.18.0.2", "198.18.0.3", "198.18.0.4"])
    assert got.fabric == {"198.18.0.2": "ok", "198.18.0.3": "host-key", "198.18.0.4": "key"}
    assert got.ids == {"sparkctl-test-engine:1": iid} and got.held == []
    assert conn.argv[3] == "fabric=198.18.0.2,198.18.0.3,198.18.0.4"
    with pytest.raises(ValueError):
        survey(conn, ["a:1"], held_in="/var/cache/sparkctl", fabric_peers=["198.18.0.2"])
