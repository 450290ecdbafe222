"""Give every peer the building node's images, all peers at once: one stream without the layers a peer holds
(`sparkctl.images.stream`; one ``docker save`` feeds every peer that lacks the same images and holds the same
layers), or the missing layers from one short-lived registry (`sparkctl.images.registry`) where it would send at
most half of them (`sparkctl.images.stream.choose_copy`).

Three phases, each across every peer at the same time through the project's one fan-out
(`sparkctl.nodes.fanout.fan_out`): survey (image IDs, what the peer stores, fabric SSH from the building node),
then the copies, every peer's outcome kept; the first error is raised once every peer finished, after one line
per peer saying how its copy ended. Progress lines carry the peer's name (``[spark-c] ...``, ``spark-c <- ...``).
A peer whose stream failed (`StreamFailed`: fabric SSH refused, docker save or load failed) gets its images
through the registry instead, after a line saying why; a full disk or a wrong image ID is not retried.

Example::

    for t in distribute([plan.engine_tag, plan.launch_tag], src, peers, report=print):
        print(t.line())
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from rich.filesize import decimal

from sparkctl.errors import ImageError
from sparkctl.images.registry import PORT, Endpoint, Registry, Transfer
from sparkctl.images.stream import CopyChoice, StreamFailed, Survey, choose_copy, stream_images, survey
from sparkctl.nodes.facts import FABRIC_KEY
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
    own = survey(source.conn, images, fabric_peers=[p.fabric_address for p in peers] if stream else ())
    ids = own.ids
    for image, iid in ids.items():
        if not iid:
            raise ImageError(f"image {image} is not on {source.name}, the building node",
                             where=f"[{source.name}] image", hint="sparkctl image build first")
    plans = _first_errors(fan_out(peers, lambda p: _survey(p, images, own, source, stream)), report)
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
            _push(reg, by_registry, source, report)
        # one task per stream group (peers lacking the same images: one docker save feeds them all) and per
        # registry peer, all at once; every peer's outcome comes back, in the plans' order
        # (peers lacking the same images and holding the same layers left out of the stream)
        groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[PeerPlan]] = {}
        for pl in busy:
            if pl.choice is not None and pl.choice.method == "stream":
                groups.setdefault((tuple(pl.todo), pl.choice.held), []).append(pl)
        tasks = [("stream", g) for g in groups.values()] + [("registry", [pl]) for pl in by_registry]

        def run(task: tuple[str, list[PeerPlan]]) -> list[Outcome[PeerPlan, list[Transfer]]]:
            how, group = task
            if how == "stream":
                return _stream(group, source, own, report)
            return fan_out(group, lambda pl: _pull(pl, reg, ids, report))   # one peer: kept as its outcome
        done = fan_out(tasks, run)
        per_peer = {o.item.peer.name: o for task in done
                    for o in (task.value if task.value is not None
                              else [Outcome(pl, None, task.error) for pl in task.item[1]])}
        outcomes = [per_peer[pl.peer.name] for pl in busy]
    if any(not o.ok and isinstance(o.error, StreamFailed) for o in outcomes):
        outcomes = _registry_after_failed_streams(outcomes, source, ids, report, port)
    return settle(plans, outcomes, report)


def _registry_after_failed_streams(outcomes: list[Outcome[PeerPlan, list[Transfer]]], source: Endpoint,
                                   ids: dict[str, str | None], report: Report, port: int
                                   ) -> list[Outcome[PeerPlan, list[Transfer]]]:
    """Every peer whose stream failed (`StreamFailed`: SSH refused, save or load failed; not a full disk, not a
    wrong ID) gets its images through the registry instead, all at once; each keeps its stream error if the
    registry cannot start, and the registry's error if its pull fails too."""
    failed = [o for o in outcomes if not o.ok and isinstance(o.error, StreamFailed)]
    plans = []
    for o in failed:
        pl = o.item
        report(f"{pl.peer.name}: the stream failed ({getattr(o.error, 'message', o.error)}); copying through the "
               f"registry instead")
        assert pl.choice is not None
        plans.append(replace(pl, choice=replace(pl.choice, method="registry",
                                                reason=f"{pl.choice.reason}; the stream failed")))
    try:
        with Registry(source, sorted((pl.peer for pl in plans), key=lambda p: p.name), port) as reg:
            _push(reg, plans, source, report)
            again = fan_out(plans, lambda pl: _pull(pl, reg, ids, report))
    except ImageError as exc:
        report(f"{source.name}: the registry after the failed streams did not work either: {exc.message}")
        return outcomes
    by_peer = {o.item.peer.name: o for o in again}
    return [by_peer.get(o.item.peer.name, o) for o in outcomes]


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


def _survey(peer: Endpoint, images: list[str], own: Survey, source: Endpoint, stream: bool) -> PeerPlan:
    """What the peer lacks and how it gets it (its own survey: IDs, layers, every image it stores)."""
    there = survey(peer.conn, images, held_in=peer.cache_dir)
    skipped, todo = [], []
    for image in images:
        have, want = there.ids[image], own.ids[image]
        if have == want:
            skipped.append(Transfer(peer.name, image, str(have), skipped=f"{peer.name} has {str(have)[:19]}"))
        elif have:
            raise ImageError(f"{image} on {peer.name} is {have[:19]}, on {source.name} {str(want)[:19]}",
                             where=f"[{peer.name}] image", hint=f"docker rmi {image} on {peer.name} and run again "
                                                                "(a tag names one content; someone retagged it)")
        else:
            todo.append(image)
    if not todo:
        return PeerPlan(peer, [], None, skipped)
    fabric = own.fabric.get(peer.fabric_address, "not checked") if stream else "stream turned off"
    ok, why = fabric == "ok", _WHY.get(fabric, fabric)
    wanted = [own.layers[i] for i in todo]
    return PeerPlan(peer, todo, choose_copy([w for w in wanted if w is not None], there.held, stream_ok=ok,
                                            pulled=there.pulled, why_not_stream=why), skipped)


_WHY = {"key": f"the fabric key {FABRIC_KEY} is missing on the building node",
        "host-key": "the peer's fabric host key is not in the fabric known_hosts"}


def _stream(group: list[PeerPlan], source: Endpoint, own: Survey, report: Report
            ) -> list[Outcome[PeerPlan, list[Transfer]]]:
    """One docker save on the building node into docker load on each peer of ``group`` (they lack the same images
    and hold the same layers, which the stream leaves out); each peer's outcome, its image IDs checked against the
    building node's."""
    todo, names = group[0].todo, ", ".join(pl.peer.name for pl in group)
    held = group[0].choice.held if group[0].choice is not None else ()
    without = f", without the {len(held)} layers {names} hold{'s' if len(group) == 1 else ''}" if held else ""
    report(f"{names} <- {', '.join(todo)}: one docker save on {source.name} | docker load on {names} over the "
           f"fabric{without}")
    results = stream_images(source, [pl.peer for pl in group], todo, report, skip=held)
    ids = own.ids
    out: list[Outcome[PeerPlan, list[Transfer]]] = []
    for pl in group:
        res, peer = results[pl.peer.name], pl.peer
        if isinstance(res, ImageError):
            out.append(Outcome(pl, None, res))
            continue
        wrong = [(i, got) for i, got in zip(todo, res.image_ids) if got != ids[i]]
        if wrong:
            image, got = wrong[0]
            out.append(Outcome(pl, None, ImageError(
                f"{image} on {peer.name} has ID {got[:19]} after the copy, {source.name} has {str(ids[image])[:19]}",
                where=f"[{peer.name}] image copy", hint=f"docker rmi {image} on {peer.name} and run again")))
            continue
        last = todo[-1]     # the stream's bytes and time are on its last image
        transfers = []
        for i, got in zip(todo, res.image_ids):
            layers = own.layers[i]
            chain = layers.layers if layers is not None else ()
            transfers.append(Transfer(
                peer.name, i, got, via="stream", streamed_with=tuple(x for x in todo if x != i),
                rx_bytes=res.bytes if i == last else 0, seconds=round(res.seconds, 3) if i == last else 0.0,
                stream_layers=(sum(1 for x in chain if x not in held), len(chain)) if held else None,
                left_out_bytes=res.left_out_bytes if i == last else 0))
        report(transfers[-1].line())
        out.append(Outcome(pl, transfers))
    return out


def _push(reg: Registry, plans: list[PeerPlan], source: Endpoint, report: Report) -> None:
    """Every image the registry's peers lack into the registry, once each, in order."""
    for image in dict.fromkeys(i for pl in plans for i in pl.todo):
        report(f"{source.name}: pushing {image} into the fabric registry (only layers it lacks are compressed)")
        reg.push(image, report)


def _pull(pl: PeerPlan, reg: Registry | None, ids: dict[str, str | None], report: Report) -> list[Transfer]:
    """The peer pulls the images it lacks from the registry, in order (only the layers it lacks cross)."""
    assert reg is not None
    peer, out = pl.peer, []
    for image in pl.todo:
        report(f"{peer.name} <- {image}: pulling from {reg.host} over the fabric")
        t = reg.pull(peer, image, str(ids[image]), report)
        for layer in t.layers:
            report(f"  [{peer.name}] {layer.digest[:19]} {decimal(layer.size):>9}  "
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
