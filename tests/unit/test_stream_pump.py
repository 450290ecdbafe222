"""The stream's pump (`sparkctl.images.stream._PUMP`, the Python that runs on the building node) with a stand-in
`docker` on PATH: what reaches the peer's `docker load` when layers are left out, in both archive layouts `docker
save` writes (legacy `<v1 id>/layer.tar`, Docker >= 25 `blobs/sha256/<diff id>`), and what it remembers.

The real thing (docker save | filter | ssh | docker load on two daemons, image IDs compared) is
tests/cluster/test_image_pipeline.py and test_four_nodes.py; here each member of the archive is checked.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.images.stream import _PUMP, SAVE_LAYERS_FILE

# A stand-in for docker: `save` writes $FAKE_SAVE, `load` copies its stdin to $FAKE_LOADED, `image inspect` prints
# an ID line per ref (what the pump's remote command reads back).
FAKE_DOCKER = f"""#!{sys.executable}
import os, shutil, sys
if sys.argv[1] == "save":
    with open(os.environ["FAKE_SAVE"], "rb") as f:
        shutil.copyfileobj(f, sys.stdout.buffer)
elif sys.argv[1] == "load":
    with open(os.environ["FAKE_LOADED"], "wb") as f:
        shutil.copyfileobj(sys.stdin.buffer, f)
    print("Loaded image")
elif sys.argv[1:3] == ["image", "inspect"]:
    for ref in sys.argv[5:]:
        print("===ID sha256:" + "0" * 64)
"""


def _layer(seed: str) -> bytes:
    """A layer's tar (its bytes decide its diff ID)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = (seed * 3000).encode()
        info = tarfile.TarInfo(f"etc/{seed}")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _diff_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _archive(layers: list[bytes], *, oci: bool) -> bytes:
    """A `docker save` archive of one image made of `layers` (manifest and config after the layers, as Docker
    writes them)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        paths = []
        for i, data in enumerate(layers):
            if oci:
                path = f"blobs/sha256/{_diff_id(data).split(':')[1]}"
            else:
                v1 = hashlib.sha256(f"chain-{i}-{_diff_id(data)}".encode()).hexdigest()
                add(f"{v1}/VERSION", b"1.0")
                add(f"{v1}/json", b"{}")
                path = f"{v1}/layer.tar"
            add(path, data)
            paths.append(path)
        config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [_diff_id(x) for x in layers]}}).encode()
        add("config.json", config)
        add("manifest.json", json.dumps([{"Config": "config.json", "RepoTags": ["img:1"], "Layers": paths}]).encode())
    return buf.getvalue()


class Pump:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        bindir = tmp / "bin"
        bindir.mkdir()
        (bindir / "docker").write_text(FAKE_DOCKER)
        (bindir / "docker").chmod(0o755)
        self.spool = tmp / "cache"
        self.env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_SAVE": str(tmp / "save.tar"),
                    "FAKE_LOADED": str(tmp / "loaded.tar")}

    def run(self, archive: bytes, skip: list[str]) -> tuple[str, list[str], dict[str, bytes]]:
        """(pump output, member names the peer loaded, their contents)."""
        (self.tmp / "save.tar").write_bytes(archive)
        (self.tmp / "loaded.tar").unlink(missing_ok=True)
        arg = json.dumps({"ssh": [["sh", "-c"]], "images": ["img:1"], "skip": skip, "spool": str(self.spool),
                          "layers_file": SAVE_LAYERS_FILE})
        r = subprocess.run([sys.executable, "-c", _PUMP, arg], env=self.env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        with tarfile.open(self.tmp / "loaded.tar") as t:
            got = {m.name: (t.extractfile(m).read() if m.isfile() else b"") for m in t}  # type: ignore[union-attr]
        return r.stdout, list(got), got

    def known(self) -> dict[str, str]:
        return json.loads((self.spool / SAVE_LAYERS_FILE).read_text())


@pytest.mark.parametrize("oci", [False, True], ids=["legacy", "oci"])
def test_held_layers_are_left_out_and_the_rest_arrives_byte_for_byte(tmp_path: Path, oci: bool) -> None:
    layers = [_layer(s) for s in ("base", "engine", "launch")]
    pump = Pump(tmp_path)
    out, names, got = pump.run(_archive(layers, oci=oci), [_diff_id(layers[0]), _diff_id(layers[1])])
    sent = [v for k, v in got.items() if k.endswith("layer.tar") or k.startswith("blobs/")]
    assert sent == [layers[2]]                                  # only the layer the peer lacks, unchanged
    assert "manifest.json" in names and "config.json" in names  # the peer's load still reads the whole image
    assert f"===DROPPED 2 {len(layers[0]) + len(layers[1])}" in out
    if not oci:                                                 # legacy names were hashed once, and remembered
        assert sorted(pump.known().values()) == sorted(_diff_id(x) for x in layers)
        assert not [p for p in pump.spool.iterdir() if p.name != SAVE_LAYERS_FILE]   # no spool file left


def test_a_remembered_name_is_dropped_without_reading_and_a_wrong_memory_only_sends_more(tmp_path: Path) -> None:
    layers = [_layer(s) for s in ("base", "engine")]
    archive = _archive(layers, oci=False)
    pump = Pump(tmp_path)
    _, names, _ = pump.run(archive, ["sha256:" + "f" * 64])     # a layer it has not: every layer is read, sent
    assert sum(n.endswith("layer.tar") for n in names) == 2
    known = pump.known()
    assert sorted(known.values()) == sorted(_diff_id(x) for x in layers)
    # a name remembered as another layer: the memory decides (no hashing), and a layer it wrongly calls held is left
    # out (the peer's docker load then fails on the missing file, and the copy goes through the registry)
    base_dir = next(k for k, v in known.items() if v == _diff_id(layers[0]))
    pump.spool.joinpath(SAVE_LAYERS_FILE).write_text(json.dumps({base_dir: _diff_id(layers[1])}))
    _, names, _ = pump.run(archive, [_diff_id(layers[1])])
    assert f"{base_dir}/layer.tar" not in names


@pytest.mark.parametrize("garbage", [b"", b"not json", b"[1, 2]", b'{"a": ', b"\x00" * 64])
def test_a_garbage_memory_is_ignored_and_replaced(tmp_path: Path, garbage: bytes) -> None:
    layers = [_layer(s) for s in ("base", "engine")]
    pump = Pump(tmp_path)
    pump.spool.mkdir()
    pump.spool.joinpath(SAVE_LAYERS_FILE).write_bytes(garbage)
    _, names, got = pump.run(_archive(layers, oci=False), [_diff_id(layers[0])])
    assert [v for k, v in got.items() if k.endswith("layer.tar")] == [layers[1]]
    assert sorted(pump.known().values()) == sorted(_diff_id(x) for x in layers)


def test_a_memory_file_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    layers = [_layer(s) for s in ("base", "engine")]
    pump = Pump(tmp_path)
    pump.spool.mkdir()
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    pump.spool.joinpath(SAVE_LAYERS_FILE).symlink_to(target)
    pump.run(_archive(layers, oci=False), [_diff_id(layers[0])])
    assert target.read_text() == "{}"                           # the link's target was neither read nor written
    assert not pump.spool.joinpath(SAVE_LAYERS_FILE).is_symlink()   # replaced by a file of the pump's own


@settings(max_examples=20)
@given(held=st.lists(st.booleans(), min_size=1, max_size=5), oci=st.booleans())
def test_exactly_the_layers_not_held_arrive(tmp_path_factory: pytest.TempPathFactory, held: list[bool],
                                            oci: bool) -> None:
    layers = [_layer(f"l{i}") for i in range(len(held))]
    pump = Pump(tmp_path_factory.mktemp("pump"))
    skip = [_diff_id(x) for x, h in zip(layers, held) if h]
    _, _, got = pump.run(_archive(layers, oci=oci), skip)
    sent = [v for k, v in got.items() if k.endswith("layer.tar") or k.startswith("blobs/")]
    assert sent == [x for x, h in zip(layers, held) if not h]


@pytest.mark.parametrize("held", [0, 1], ids=["nothing-held", "base-held"])
def test_a_spool_whose_disk_is_full_costs_bytes_not_the_copy(tmp_path: Path, held: int) -> None:
    """The spool (the building node's cache directory) fills while a legacy layer is hashed: that layer is sent
    whole, byte for byte (what was spooled, then the rest), nothing is remembered for it, and the pump says so; a
    layer the memory already names is still left out."""
    from testrig.testenv import small_tmpfs

    big = os.urandom(600 * 1024)         # larger than the spool
    layers = [_layer("base"), big, _layer("launch")]
    pump = Pump(tmp_path)
    with small_tmpfs(pump.spool, 256 * 1024):
        if held:                          # the base was hashed on an earlier copy
            archive = _archive(layers, oci=False)
            with tarfile.open(fileobj=io.BytesIO(archive)) as t:
                base_dir = os.path.dirname(next(m.name for m in t if m.name.endswith("layer.tar")))
            pump.spool.joinpath(SAVE_LAYERS_FILE).write_text(json.dumps({base_dir: _diff_id(layers[0])}))
        # (a peer that holds a layer of no other image: the archive is still filtered, every layer hashed)
        out, names, got = pump.run(_archive(layers, oci=False), [_diff_id(layers[0]) if held else "sha256:" + "f" * 64])
        sent = [v for k, v in got.items() if k.endswith("layer.tar")]
        assert sent == (layers[1:] if held else layers), [len(x) for x in sent]   # the big one whole, unchanged
        assert "===SPOOLFULL 1 " in out and "No space left on device" in out, out
        known = pump.known() if pump.spool.joinpath(SAVE_LAYERS_FILE).exists() else {}
        assert _diff_id(big) not in known.values()
        assert not [p for p in pump.spool.iterdir() if p.name != SAVE_LAYERS_FILE]   # no spool file left


class LocalConn:
    """The building node's connection, run here: the pump with the stand-in docker, each peer's fabric SSH replaced
    by a local shell (the argv the stream would run is otherwise unchanged)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def run(self, argv: list[str], *, timeout: float, on_line=None):
        from sparkctl.nodes.ssh import CommandResult
        arg = json.loads(argv[-1])
        arg["ssh"] = [["sh", "-c"] for _ in arg["ssh"]]
        r = subprocess.run([sys.executable, *argv[1:-1], json.dumps(arg)], env=self.env, capture_output=True,
                           text=True, timeout=timeout)
        return CommandResult("spark-a", argv, r.returncode, r.stdout, r.stderr, 0.0)


def test_the_copy_says_when_the_spool_was_full_and_the_peer_still_gets_the_image(tmp_path: Path) -> None:
    from sparkctl.images.registry import Endpoint
    from sparkctl.images.stream import StreamResult, stream_images
    from testrig.testenv import small_tmpfs

    layers = [_layer("base"), os.urandom(600 * 1024)]
    pump = Pump(tmp_path)
    (tmp_path / "save.tar").write_bytes(_archive(layers, oci=False))
    conn = LocalConn(pump.env)
    src = Endpoint("spark-a", conn, "198.18.0.1", "lo", str(pump.spool))    # type: ignore[arg-type]
    peer = Endpoint("spark-b", conn, "198.18.0.2", "lo", "/unused")         # type: ignore[arg-type]
    lines: list[str] = []
    with small_tmpfs(pump.spool, 256 * 1024):
        got = stream_images(src, [peer], ["img:1"], lines.append, skip=["sha256:" + "f" * 64])
    res = got["spark-b"]
    assert isinstance(res, StreamResult) and len(res.image_ids) == 1, res
    said = [ln for ln in lines if "sent whole" in ln]
    assert len(said) == 1 and str(pump.spool) in said[0] and "No space left on device" in said[0], lines
    with tarfile.open(tmp_path / "loaded.tar") as t:
        assert sum(m.name.endswith("layer.tar") for m in t) == 2
