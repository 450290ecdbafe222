"""Give every peer the building node's images, all peers at once: a whole-image stream to a peer that lacks most
of them (`sparkctl.images.stream`), the missing layers from one short-lived registry (`sparkctl.images.registry`)
to the others.

Three phases, each across every peer at the same time through the project's one fan-out
(`sparkctl.nodes.fanout.fan_out`): survey (image IDs, what the peer stores, fabric SSH from the building node),
then the copies, every peer's outcome kept; the first error is raised once every peer finished, after one line
per peer saying how its copy ended. Progress lines carry the peer's name (``[spark-c] ...``, ``spark-c <- ...``).

Example::

    for t in distribute([plan.engine_tag, plan.launch_tag], src, peers, report=print):
        print(t.line())
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable

from sparkctl.errors import ImageError
from sparkctl.images.registry import PORT, Endpoint, Registry, Transfer, human, image_ids
from sparkctl.images.stream import (CopyChoice, ImageLayers, choose_copy, held_images, image_layers_of,
                                    stream_images)
from sparkctl.nodes import host_facts
from sparkctl.nodes.fanout import Outcome, fan_out, raise_first

Report = Callable[[str], None]


@dataclass
class PeerPlan:
    """What one peer needs: the images it lacks (in order) and how they get there."""

    peer: Endpoint
    todo: list[str]
    choice: CopyChoice | None
    skipped: list[Transfer]


def distribute(images: list[str], source: Endpoint, peers: list[Endpoint], *, report: Report = lambda _: None,
               port: int = PORT, stream: bool = True) -> list[Transfer]:
    """Give every peer ``images`` (in order, e.g. engine then launch) with the source's image IDs.

    No-op with a reason for a peer that already has them all. ``stream=False`` never streams (every copy goes
    through the registry: a benchmark's comparison). Returns the peers' transfers, peer by peer.
    """
    report = _serialised(report)
    ids = image_ids(source.conn, images)
    for image, iid in ids.items():
        if not iid:
            raise ImageError(f"image {image} is not on {source.name}, the building node", where=f"[{source.name}] image",
                             hint="sparkctl image build first")
    layers = image_layers_of(source.conn, images)
    plans = _first_errors(fan_out(peers, lambda p: _survey(p, images, ids, layers, source, stream)), report)
    for pl in plans:
        for t in pl.skipped:
            report(t.line())
        if pl.choice is not None:
            report(f"{pl.peer.name} <- {', '.join(pl.todo)}: {pl.peer.name} {pl.choice.reason}")
    busy = [pl for pl in plans if pl.todo]
    by_registry = [pl for pl in busy if pl.choice is not None and pl.choice.method == "registry"]
    with (Registry(source, sorted((pl.peer for pl in by_registry), key=lambda p: p.name), port)
          if by_registry else contextlib.nullcontext()) as reg:
        if reg is not None:
            for image in dict.fromkeys(i for pl in by_registry for i in pl.todo):
                report(f"{source.name}: pushing {image} into the fabric registry (only layers it lacks are compressed)")
                reg.push(image, report)
        outcomes = fan_out(busy, lambda pl: _copy(pl, source, reg, ids, report))
    return settle(plans, outcomes, report)


def settle(plans: list[PeerPlan], outcomes: list[Outcome[PeerPlan, list[Transfer]]], report: Report) -> list[Transfer]:
    """One line per peer that copied (done, or FAILED with why), then the first error if any (every peer has
    finished: the others' images are in place and verified), else every peer's transfers in the plans' order."""
    for o in outcomes:
        how = o.item.choice.method if o.item.choice else "-"
        report(f"{o.item.peer.name}: copy done ({how})" if o.ok else
               f"{o.item.peer.name}: copy FAILED ({how}): {getattr(o.error, 'message', o.error)}")
    raise_first(outcomes)
    copied = {o.item.peer.name: o.value or [] for o in outcomes}
    return [t for pl in plans for t in [*pl.skipped, *copied.get(pl.peer.name, [])]]


def _survey(peer: Endpoint, images: list[str], ids: dict[str, str | None], layers: list[ImageLayers],
            source: Endpoint, stream: bool) -> PeerPlan:
    have_ids = image_ids(peer.conn, images)
    skipped, todo = [], []
    for image in images:
        have = have_ids[image]
        if have == ids[image]:
            skipped.append(Transfer(peer.name, image, have, skipped=f"{peer.name} has {have[:19]}"))
        elif have:
            raise ImageError(f"{image} on {peer.name} is {have[:19]}, on {source.name} {str(ids[image])[:19]}",
                             where=f"[{peer.name}] image", hint=f"docker rmi {image} on {peer.name} and run again "
                                                                "(a tag names one content; someone retagged it)")
        else:
            todo.append(image)
    if not todo:
        return PeerPlan(peer, [], None, skipped)
    held = held_images(peer.conn)
    ok, why = (_fabric_ssh(source, peer) if stream else (False, "stream turned off"))
    wanted = [layers[images.index(i)] for i in todo]
    return PeerPlan(peer, todo, choose_copy(wanted, held, stream_ok=ok, why_not_stream=why), skipped)


def _fabric_ssh(source: Endpoint, peer: Endpoint) -> tuple[bool, str]:
    """Can the building node SSH to the peer's fabric address with the fabric key (host key pinned)?"""
    fact = host_facts.fabric_ssh(peer.user, peer.fabric_address)
    got = fact.parse(source.conn.run(list(fact.argv), timeout=30).output)
    return got.ok, ("" if got.ok else "fabric key missing" if got.key_missing else got.error)


def _copy(pl: PeerPlan, source: Endpoint, reg: Registry | None, ids: dict[str, str | None],
          report: Report) -> list[Transfer]:
    peer = pl.peer
    assert pl.choice is not None
    if pl.choice.method == "stream":
        report(f"{peer.name} <- {', '.join(pl.todo)}: docker save on {source.name} | docker load on {peer.name} "
               f"over the fabric ({peer.fabric_address})")
        res = stream_images(source, peer, pl.todo, report)
        got = image_ids(peer.conn, pl.todo)
        for image in pl.todo:
            if got[image] != ids[image]:
                raise ImageError(f"{image} on {peer.name} has ID {str(got[image])[:19]} after the copy, "
                                 f"{source.name} has {str(ids[image])[:19]}", where=f"[{peer.name}] image copy",
                                 hint=f"docker rmi {image} on {peer.name} and run again")
        last = pl.todo[-1]
        out = [Transfer(peer.name, i, str(got[i]), via="stream", streamed_with=tuple(x for x in pl.todo if x != i),
                        **({"rx_bytes": res.bytes, "seconds": round(res.seconds, 3)} if i == last else {}))
               for i in pl.todo]
        report(out[-1].line())
        return out
    assert reg is not None
    out = []
    for image in pl.todo:
        report(f"{peer.name} <- {image}: pulling from {reg.host} over the fabric")
        t = reg.pull(peer, image, str(ids[image]), report)
        for layer in t.layers:
            report(f"  [{peer.name}] {layer.digest[:19]} {human(layer.size):>9}  "
                   f"{'sent' if layer.sent else 'present on ' + peer.name}")
        report(t.line())
        out.append(t)
    return out


def _first_errors(outcomes: list[Outcome], report: Report) -> list:
    """The values, or (after a line per failed peer) the first error."""
    for o in outcomes:
        if not o.ok:
            report(f"{getattr(o.item, 'name', o.item)}: {getattr(o.error, 'message', o.error)}")
    return raise_first(outcomes)


def _serialised(report: Report) -> Report:
    """``report`` called by one peer's thread at a time (lines from several peers never interleave mid-line)."""
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            report(line)
    return say
