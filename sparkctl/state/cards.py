"""The card index: every bench card (``runs/<id>/report.json``) of a cluster's ledger, by deployment, profile,
image tags and digests, and patch series.

``cards.json`` (mode 0600, written atomically) next to ``cluster.json`` holds one entry per card::

    {"schema": "sparkctl.cards/2", "cards": {"<run id>": {
        "run_id", "started", "finished", "status", "mode", "emulated", "replicated", "path", "stamp": [mtime_ns, size],
        "deployments": [...], "profiles": [...], "images": [...], "image_ids": [...], "patch_series": [...],
        "arms": [{"role", "profile", "deployment", "speculative", "draft_tokens", "sglang_version", "images",
                  "image_ids", "identity", "patch_series": {"name", "hash"}, "flags": {"server.x": v, ...},
                  "model" (path), "served_model",
                  "argv": [...], "decode": {"code": {median, min, max, n, spread, samples}, ...},
                  "metrics": {"decode.code": {...}, "ttft.4096": {...}, "accept_len": {...}, ...}}]}}}

The cards themselves stay the truth: ``sync()`` re-reads every card whose file changed (mtime, size) and drops
entries whose card is gone, so a card written while the index was absent, damaged or older is indexed the next
time anyone reads it. What the card does not carry (the image IDs a rank ran, the launch document) comes from
the deployment record the card names. Example::

    idx = CardIndex(Ledger.for_cluster("local"))
    idx.sync()
    [e["run_id"] for e in idx.query(profile="d5")]     # oldest first
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from sparkctl.errors import ConfigError, LedgerError
from sparkctl.images.series import load_series
from sparkctl.jsontypes import JSONObject
from sparkctl.state.ledger import Ledger
from sparkctl.statefiles import write_json_atomic
from sparkctl.untrusted import is_plain_name, record_name

SCHEMA = "sparkctl.cards/2"           # /2: arms carry model + served_model, cards replicated
_PROFILE_SECTIONS = ("image", "model", "server", "speculative", "env", "warmup")
_SKIP_FLAGS = {"description", "extends", "expect", "rollback_profile", "api"}


def _flatten(data: object, prefix: str = "") -> JSONObject:
    """``{"server": {"x": 1}}`` -> ``{"server.x": 1}``; lists stay values; None is kept (a key set to null)."""
    out: JSONObject = {}
    if isinstance(data, dict):
        for k, v in data.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(_flatten(v, key))
            else:
                out[key] = v
    return out


def profile_flags(profile_data: JSONObject | None) -> JSONObject:
    """The tunable content of a resolved profile as dotted keys (server.mem_fraction_static, speculative...)."""
    if not profile_data:
        return {}
    return _flatten({k: v for k, v in profile_data.items() if k not in _SKIP_FLAGS and k in _PROFILE_SECTIONS})


def _series_hash(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return load_series(name).content_hash()
    except Exception:  # noqa: BLE001 - a series that is gone or unreadable: the name still identifies it
        return None


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _summary(s: object) -> JSONObject | None:
    """A figure's summary, or None when the card does not hold one (or holds a damaged one: a median that is not
    a number is no figure)."""
    if not isinstance(s, dict) or not all(_number(s.get(k)) for k in ("median", "min", "max")):
        return None
    samples = s.get("samples")
    return {"n": s.get("n") if isinstance(s.get("n"), int) else None, "median": s["median"], "min": s["min"],
            "max": s["max"], "spread": s.get("spread") if _number(s.get("spread")) else None,
            "samples": [x for x in samples if _number(x)] if isinstance(samples, list) else []}


def arm_metrics(results: JSONObject) -> dict[str, JSONObject]:
    """Every figure of an arm that has a spread: name -> summary (median, min, max, n, samples)."""
    out: dict[str, JSONObject] = {}
    for cls, e in ((results.get("decode") or {}).get("classes") or {}).items():
        if s := _summary(e.get("decode_tok_s")):
            out[f"decode.{cls}"] = s
    for e in (results.get("ttft") or {}).get("sizes") or []:
        if s := _summary(e.get("ttft_s")):
            out[f"ttft.{e.get('target_tokens')}"] = s
    acc = results.get("acceptance") or {}
    if s := _summary((acc.get("generate") or {}).get("accept_len")):
        out["accept_len"] = s
    for lv in (results.get("concurrency") or {}).get("levels") or []:
        agg = lv.get("aggregate_tok_s")
        if _number(agg):                       # one figure per level: its own spread is unknown (n=1)
            out[f"aggregate.c{lv.get('concurrency')}"] = {"n": 1, "median": agg, "min": agg, "max": agg,
                                                          "spread": 0.0, "samples": [agg]}
    return out


def _arm_entry(arm: JSONObject, ledger: Ledger | None) -> JSONObject:
    c = arm.get("config") or {}
    pdata = c.get("profile_data") or {}
    series = ((pdata.get("image") or {}).get("patch_series"))
    image_ids: list[str] = []
    identity = c.get("identity")
    if ledger is not None and c.get("deployment"):
        try:
            rec = ledger.load(c["deployment"])
            image_ids = sorted(set(rec.image_ids.values()))
            identity = identity or rec.identity
        except LedgerError:
            pass                                  # a record moved aside: the card's own fields still index it
    metrics = arm_metrics(arm.get("results") or {})
    return {"role": c.get("role"), "profile": c.get("profile"), "deployment": c.get("deployment"),
            "speculative": bool(c.get("speculative_algorithm")),
            "speculative_algorithm": c.get("speculative_algorithm"),
            "draft_tokens": c.get("draft_tokens"), "sglang_version": c.get("sglang_version"),
            "images": list(c.get("images") or []), "image_ids": image_ids, "identity": identity,
            "patch_series": {"name": series, "hash": _series_hash(series)} if series else None,
            "flags": profile_flags(pdata), "argv": list(((c.get("argv_per_rank") or {}).get("0")) or []),
            "emulated": bool(c.get("emulated")),
            "model": (pdata.get("model") or {}).get("path") or (c.get("server_info") or {}).get("model_path"),
            "served_model": c.get("model"),
            "decode": {k.split(".", 1)[1]: v for k, v in metrics.items() if k.startswith("decode.")},
            "metrics": metrics}


def card_entry(card: JSONObject, path: Path, ledger: Ledger | None = None) -> JSONObject:
    """The index entry of one card (its report.json content); LedgerError naming the card when it is damaged (a
    run id that is not a plain name, a section of the wrong shape): the index skips it with a line."""
    try:
        return _card_entry(card, path, ledger)
    except (TypeError, AttributeError, KeyError, ValueError) as exc:      # a field of the wrong type somewhere
        raise LedgerError(f"card has an unexpected shape ({type(exc).__name__}: {exc})", where=str(path),
                          hint="the run's report.json is damaged; the index skips it") from None


_TEXT_KEYS = ("started", "finished", "status", "mode")


def _card_entry(card: JSONObject, path: Path, ledger: Ledger | None = None) -> JSONObject:
    run_id = record_name(card.get("run_id") or path.parent.name, "run_id", str(path))
    for key in _TEXT_KEYS:
        if card.get(key) is not None and not isinstance(card.get(key), str):
            raise ValueError(f"{key} is not text")
    if not isinstance(card.get("arms"), list) or not all(isinstance(a, dict) for a in card["arms"]):
        raise ValueError("arms is not a list of objects")
    for a in card["arms"]:
        c = a.get("config") if isinstance(a.get("config"), dict) else {}
        for key in ("profile", "deployment"):
            if c.get(key) is not None:
                record_name(c.get(key), f"arm {key}", str(path))
    arms = [_arm_entry(a, ledger) for a in card.get("arms") or []]

    def union(key: str) -> list[str]:
        vals: set[str] = set()
        for a in arms:
            v = a.get(key)
            if isinstance(v, list):
                vals.update(str(x) for x in v)
            elif isinstance(v, dict):
                vals.update(str(v[n]) for n in ("name",) if v.get(n))
            elif v:
                vals.add(str(v))
        return sorted(vals)
    try:
        st = path.stat()
        stamp = [st.st_mtime_ns, st.st_size]
    except OSError:
        stamp = None
    return {"run_id": run_id, "started": card.get("started"),
            "finished": card.get("finished"), "status": card.get("status"), "mode": card.get("mode"),
            "emulated": bool(card.get("emulated")), "path": str(path), "stamp": stamp,
            "replicated": bool(card.get("router")),
            "deployments": union("deployment"), "profiles": union("profile"), "images": union("images"),
            "image_ids": union("image_ids"), "patch_series": union("patch_series"),
            "comparison": card.get("comparison") or {}, "arms": arms}


def read_card(path: Path) -> JSONObject:
    """A card's JSON, or LedgerError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LedgerError("card is missing", where=str(path)) from None
    except (OSError, ValueError, RecursionError) as exc:       # ValueError: not JSON, not UTF-8
        raise LedgerError(f"card is not readable JSON ({type(exc).__name__}: {exc})", where=str(path),
                          hint="the run's report.json is damaged; the index skips it") from None
    if not isinstance(data, dict) or "arms" not in data:
        raise LedgerError("not a bench card (no 'arms')", where=str(path))
    return data


_LIST_KEYS = ("deployments", "profiles", "images", "image_ids", "patch_series")


def _entry_ok(run_id: object, e: object) -> bool:
    """An entry of cards.json (derived, so a damaged one is dropped and rebuilt) has the shape `card_entry` gives."""
    return (is_plain_name(run_id) and isinstance(e, dict) and e.get("run_id") == run_id
            and all(isinstance(e.get(k), list) and all(isinstance(x, str) for x in e[k]) for k in _LIST_KEYS)
            and isinstance(e.get("arms"), list) and all(isinstance(a, dict) for a in e["arms"])
            and all(e.get(k) is None or isinstance(e.get(k), str) for k in _TEXT_KEYS + ("path",))
            and (e.get("stamp") is None or isinstance(e.get("stamp"), list))
            and all(_arm_ok(a) for a in e["arms"]))


def _arm_ok(a: JSONObject) -> bool:
    figures = [a.get("decode"), a.get("metrics")]
    return (all(isinstance(f, dict) and all(_summary(v) == v for v in f.values()) for f in figures)
            and all(a.get(k) is None or isinstance(a.get(k), str) for k in ("role", "profile", "deployment"))
            and isinstance(a.get("flags", {}), dict))


class CardIndex:
    """The index of one ledger's cards (``<ledger>/cards.json``)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.path = ledger.root / "cards.json"
        self.skipped: list[str] = []          # cards sync() could not read, with why

    def _load(self) -> JSONObject:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError):
            return {}                         # the index is derived: a damaged one is rebuilt from the cards
        cards = data.get("cards") if isinstance(data, dict) and data.get("schema") == SCHEMA else None
        if not isinstance(cards, dict):
            return {}
        return {k: v for k, v in cards.items() if _entry_ok(k, v)}    # a damaged entry is re-read from its card

    def sync(self) -> dict[str, JSONObject]:
        """Index every card under ``runs/``; returns run id -> entry (and rewrites cards.json if anything changed)."""
        old = self._load()
        new: dict[str, JSONObject] = {}
        self.skipped = []
        runs = self.ledger.root / "runs"
        for path in sorted(runs.glob("*/report.json")) if runs.is_dir() else []:
            run_id = path.parent.name
            try:
                st = path.stat()
            except OSError:
                continue
            prev = old.get(run_id)
            if prev and prev.get("stamp") == [st.st_mtime_ns, st.st_size]:
                new[run_id] = prev
                continue
            try:
                new[run_id] = card_entry(read_card(path), path, self.ledger)
            except LedgerError as exc:
                self.skipped.append(f"{path}: {exc.message}")
        if new != old:
            write_json_atomic(self.path, {"schema": SCHEMA, "cards": new})
        return new

    def query(self, *, profile: str | None = None, deployment: str | None = None, image: str | None = None,
              patch_series: str | None = None) -> list[JSONObject]:
        """Indexed cards matching every filter given, oldest first (by start time)."""
        def ok(e: JSONObject) -> bool:
            return ((profile is None or profile in e["profiles"]) and
                    (deployment is None or deployment in e["deployments"]) and
                    (image is None or any(image in i for i in e["images"] + e["image_ids"])) and
                    (patch_series is None or patch_series in e["patch_series"]))
        return sorted((e for e in self.sync().values() if ok(e)), key=lambda e: (e.get("started") or "", e["run_id"]))

    def resolve(self, ref: str) -> JSONObject:
        """A card by run id, unique run-id prefix, or path to a report.json (or its directory): its index entry."""
        p = Path(ref)
        if p.is_dir():
            p = p / "report.json"
        if p.suffix == ".json" and p.is_file():
            return card_entry(read_card(p), p, self.ledger)
        entries = self.sync()
        if ref in entries:
            return entries[ref]
        hits = [k for k in entries if k.startswith(ref)]
        if len(hits) == 1:
            return entries[hits[0]]
        known = ", ".join(list(entries)[-5:]) or "none"
        raise ConfigError(f"{'ambiguous' if hits else 'no'} card {ref!r}"
                          + (f" ({', '.join(hits[:5])})" if hits else ""),
                          where=str(self.ledger.root / "runs"),
                          hint=f"give a run id from `sparkctl bench history` (latest: {known}) or a report.json path")


def changes(a: JSONObject, b: JSONObject) -> list[JSONObject]:
    """What differs between two index arms: flags, image tags and IDs, patch series, SGLang version, profile."""
    out: list[JSONObject] = []
    fa, fb = a.get("flags") or {}, b.get("flags") or {}
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k) != fb.get(k):
            out.append({"what": "flag", "key": k, "a": fa.get(k), "b": fb.get(k)})
    for key in ("profile", "sglang_version", "images", "image_ids", "patch_series", "draft_tokens",
                "speculative_algorithm"):
        if a.get(key) != b.get(key):
            out.append({"what": key, "a": a.get(key), "b": b.get(key)})
    if not fa and not fb and a.get("argv") != b.get("argv"):      # bare endpoints: the launch argv is the config
        out.append({"what": "argv", "a": a.get("argv"), "b": b.get("argv")})
    return out


def describe_change(c: JSONObject) -> str:
    def short(v: object) -> str:
        if isinstance(v, dict) and "name" in v:
            return f"{v['name']}@{(v.get('hash') or '?')[:12]}"
        if isinstance(v, list):
            return ",".join(str(x)[:24] for x in v) or "none"
        return "unset" if v is None else str(v)
    label = c["key"] if c["what"] == "flag" else c["what"]
    return f"{label} {short(c['a'])} -> {short(c['b'])}"


def pick_arm(entry: JSONObject, role: str) -> JSONObject | None:
    """The arm of a card with that role (ON/OFF by speculation, A/B by position)."""
    arms: Iterable[JSONObject] = entry.get("arms") or []
    for a in arms:
        if a.get("role") == role:
            return a
    if role in ("ON", "OFF"):
        for a in entry.get("arms") or []:
            if a.get("speculative") == (role == "ON"):
                return a
    return None
