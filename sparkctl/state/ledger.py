"""The ledger: one state directory per cluster holding every deployment and run as records.

Layout (all files mode 0600, directories 0700; `private_dir` tightens sparkctl's own directories)::

    $SPARKCTL_STATE_DIR/debug.log         tracebacks of internal errors (exit 70)
    $SPARKCTL_STATE_DIR/<cluster>/
        cluster.json              {"active": id|null, "history": [ids, oldest first]}: a cache derived from the
                                  records (`Ledger.index`), rebuilt when missing, stale or truncated
        deployments/<id>.json     one record per `up` / `rollback`
        runs/<id>/                bench runs (report.md, report.json)
        logs/<id>/rank<N>.log     engine logs of the process runtime (secrets redacted), archived docker logs
        secrets/<id>/rank<N>/     the process runtime's secret files (0400), removed with the engine
        lock, lock.holder         the cluster lock and who holds it (pid, host, pid start time, command)
        compare.json              a `bench --compare` in progress: what it will restore (deploy/compare.py)
        damaged/                  records `sparkctl repair` moved aside (kept, never deleted)

Nothing sparkctl did not make is followed or changed: a state root of another user, a symlinked ``<cluster>``,
``logs`` or ``logs/router.log`` is refused naming the path and its owner (`sparkctl.statefiles.check_state_path`,
`open_state_file`). Paths the user names for outputs are not the ledger's: `sparkctl.userfiles`.

Writes are atomic (temp file + fsync + rename). Records are typed (`sparkctl.state.records`): a missing
record, a file that is not JSON, or JSON of the wrong shape is reported as a LedgerError naming the file, never
silently replaced or read as "nothing recorded".
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ValidationError

from sparkctl.errors import LedgerError, LockHeldError
from sparkctl.jsontypes import JSONObject, JSONValue
from sparkctl.nodes.handles import Handle
from sparkctl.nodes.procfs import start_ticks
from sparkctl.state.records import DeploymentRecord, RecordHandles, Status
from sparkctl.statefiles import (
    check_state_path,
    default_state_root,
    open_state_file,
    private_dir,
    state_dir_error,
    write_json_atomic,
)

if TYPE_CHECKING:
    from sparkctl.state.runs import RunRecord

M = TypeVar("M", bound=BaseModel)   # the record model a state file is read as (`_validated`)

REPAIR_HINT = ("run `sparkctl repair`: it keeps the damaged file (moved aside), rebuilds the ledger from the engines "
               "actually running and asks before changing anything")


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def check_state_root(root: Path) -> str | None:
    """A warning when the state root (not sparkctl's to change: it may be a directory the user chose) lets group
    or others in; None when it is private or does not exist yet (sparkctl then creates it 0700)."""
    try:
        mode = stat.S_IMODE(root.stat().st_mode)
    except OSError:
        return None
    if mode & 0o077:
        return (f"state directory {root} has mode {mode:04o}: others on this machine can list the deployments "
                f"and logs sparkctl keeps there (files are 0600); chmod 700 {root}")
    return None


def read_json(path: Path) -> JSONValue:
    """A JSON file of the state directory, read without following links (`open_state_file`): LedgerError (exit 6)
    naming the file when it is missing, not UTF-8 JSON, or a planted symlink."""
    try:
        with os.fdopen(open_state_file(path, os.O_RDONLY), "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise LedgerError("record is missing", where=str(path),
                          hint="the ledger refers to a record that is not there (moved aside?): "
                               + REPAIR_HINT) from None
    except OSError as exc:
        raise state_dir_error(path, exc) from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise LedgerError(f"record is corrupt (not UTF-8 at byte {exc.start})", where=str(path),
                          hint=REPAIR_HINT) from None
    except json.JSONDecodeError as exc:
        raise LedgerError(f"record is corrupt ({exc.msg} at line {exc.lineno})", where=str(path),
                          hint=REPAIR_HINT) from None
    except RecursionError:
        raise LedgerError("record is corrupt (nested too deep)", where=str(path), hint=REPAIR_HINT) from None


def _validated(model: type[M], data: object, path: Path) -> M:
    """`data` as a `model`, or LedgerError naming the file and the first fields that do not fit."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}" for e in exc.errors()[:3])
        raise LedgerError(f"record is corrupt (not a {model.__name__}: {fields})", where=str(path),
                          hint=REPAIR_HINT) from None


WRITE_FAULT_ENV = "SPARKCTL_FULL_FROM_WRITE"   # tests: every record write from the Nth on fails as on a full disk
_writes = [0]


def _write_fault(path: Path) -> None:
    """Tests only (`SPARKCTL_FULL_FROM_WRITE=N`): the Nth record write of this process and every later one fail
    exactly as a full file system makes them fail (ENOSPC, named by the state-directory error)."""
    want = os.environ.get(WRITE_FAULT_ENV)
    if not want:
        return
    _writes[0] += 1
    if _writes[0] >= int(want):
        import errno
        raise state_dir_error(path.parent, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)))


class Ledger:
    """Records of one cluster. Example: ``Ledger.for_cluster("local").active()``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def for_cluster(cls, cluster: str, state_root: Path | None = None) -> Ledger:
        """The ledger of `cluster`; StateDirError (exit 6, naming path and owner) when the state root is another
        user's or ``<cluster>`` is a symlink or another user's (`check_state_path`): never followed."""
        root = (state_root or default_state_root()) / cluster
        check_state_path(root)
        return cls(root)

    # -- paths ---------------------------------------------------------------------------------------------------
    @property
    def index_path(self) -> Path:
        return self.root / "cluster.json"

    def deployment_path(self, dep_id: str) -> Path:
        return self.root / "deployments" / f"{dep_id}.json"

    def log_dir(self, dep_id: str) -> Path:
        """Where the engine logs of deployment `dep_id` go (created, mode 0700, by whoever writes there first)."""
        return self.root / "logs" / dep_id

    def run_dir(self, run_id: str) -> Path:
        return private_dir(self.root / "runs" / run_id)

    # -- index ---------------------------------------------------------------------------------------------------
    # cluster.json is a cache derived from the records: it is rebuilt when missing, stale or truncated and never
    # read as "nothing deployed". The records decide: the history is every record on disk (in the order the
    # cache knows, the others by id, which starts with the UTC time), the active deployment the newest record
    # that took over and still serves (`active_id`).
    def read_index_file(self) -> JSONObject | None:
        """cluster.json as written (None when missing); LedgerError when it is not an index (`repair` uses it)."""
        if not self.index_path.exists():
            return None
        data = read_json(self.index_path)
        if not (isinstance(data, dict) and isinstance(data.get("history"), list)
                and all(isinstance(h, str) for h in data["history"])
                and (data.get("active") is None or isinstance(data.get("active"), str))):
            raise LedgerError("cluster index has an unexpected shape", where=str(self.index_path),
                              hint=REPAIR_HINT)
        return data

    def record_ids(self) -> list[str]:
        """Ids of every deployment record on disk (unordered)."""
        try:
            names = os.listdir(self.root / "deployments")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise state_dir_error(self.root / "deployments", exc) from None
        return [n[:-5] for n in names if n.endswith(".json") and not n.startswith(".")]

    def history(self) -> list[str]:
        on_disk = set(self.record_ids())
        try:
            cached = self.read_index_file() or {}
        except LedgerError:
            cached = {}   # truncated or of the wrong shape: rebuilt from the records
        order = [i for i in dict.fromkeys(cached.get("history", [])) if i in on_disk]
        return order + sorted(on_disk - set(order))

    def active_id(self) -> str | None:
        """The newest record that took over and still serves: successful (or recovered and not stopped). Older
        records than one that took over (handed off, superseded, stopped) are never active; records that never
        took over (running, failed, canceled, interrupted) are passed over. A damaged record on the way is a
        LedgerError (never "nothing deployed")."""
        for dep_id in reversed(self.history()):
            rec = self.load(dep_id)
            if rec.status == Status.SUCCESSFUL or (rec.status == Status.RECOVERED and not rec.stopped):
                return rec.id
            if rec.handed_off or rec.status in (Status.SUPERSEDED, Status.STOPPED, Status.RECOVERED):
                return None
        return None

    def index(self) -> JSONObject:
        return {"active": self.active_id(), "history": self.history()}

    def sync_index(self) -> None:
        """Rewrite cluster.json from the records when it differs (missing, stale, truncated)."""
        idx = self.index()
        try:
            if self.read_index_file() == idx:
                return
        except LedgerError:
            pass
        write_json_atomic(self.index_path, idx)

    def set_active(self, dep_id: str | None = None) -> None:
        """Kept for callers of the old index: the active deployment is derived from the records; this refreshes
        cluster.json from them."""
        self.sync_index()

    def add_to_history(self, dep_id: str) -> None:
        self.sync_index()

    # -- records -------------------------------------------------------------------------------------------------
    @staticmethod
    def new_id(profile: str) -> str:
        return f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{profile}-{secrets.token_hex(2)}"

    def save(self, record: DeploymentRecord) -> None:
        _write_fault(self.deployment_path(record.id))
        record.updated = now_iso()
        write_json_atomic(self.deployment_path(record.id), record.as_json())

    def load(self, dep_id: str) -> DeploymentRecord:
        path = self.deployment_path(dep_id)
        return _validated(DeploymentRecord, read_json(path), path)

    def handles(self, dep_id: str) -> list[Handle]:
        """The engine handles of record `dep_id`, without validating the rest of it (LedgerError if they do not
        fit): for a look across the whole history (`deploy.observe.leftovers`)."""
        path = self.deployment_path(dep_id)
        return _validated(RecordHandles, read_json(path), path).handles

    def active(self) -> DeploymentRecord | None:
        dep_id = self.active_id()
        return self.load(dep_id) if dep_id else None

    def known_good(self, *, exclude: str | None = None, rollback: bool = False,
                   avoid_identity: str | None = None) -> DeploymentRecord | None:
        """The newest known-good deployment (never `exclude`, nor one of launch identity `avoid_identity`: the
        watcher's crash loop never rolls back to what is crashing); with `rollback`, never a bench comparison's arm
        (a temporary deployment, not something the user chose to run)."""
        for dep_id in reversed(self.history()):
            if dep_id == exclude:
                continue
            rec = self.load(dep_id)
            if avoid_identity is not None and rec.identity == avoid_identity:
                continue
            if rec.known_good and not (rollback and rec.command == "bench-compare"):
                return rec
        return None

    # -- bench runs ----------------------------------------------------------------------------------------------
    def load_run(self, run_id: str) -> RunRecord:
        from sparkctl.state.runs import RunRecord
        path = self.root / "runs" / run_id / "report.json"
        return _validated(RunRecord, read_json(path), path)

    # -- lock ----------------------------------------------------------------------------------------------------
    _held: dict[str, int] = {}   # lock paths this process holds -> depth (re-entrant within one process)

    @contextmanager
    def lock(self, command: str) -> Iterator[None]:
        """Exclusive cluster lock; a second holder gets LockHeldError saying who holds it.

        Re-entrant within one process, so a command that holds it (bench --compare) can call `up` inside.
        """
        from filelock import FileLock, Timeout

        key = str(self.root.resolve())
        if Ledger._held.get(key):
            Ledger._held[key] += 1
            try:
                yield
            finally:
                Ledger._held[key] -= 1
            return
        private_dir(self.root)
        lock = FileLock(str(self.root / "lock"), mode=0o600)
        holder_path = self.root / "lock.holder"
        try:
            try:
                lock.acquire(timeout=0)
            except Timeout:
                raise
            except OSError as exc:   # the lock file cannot be created (Timeout is an OSError too: re-raised above)
                raise state_dir_error(self.root, exc) from None
        except Timeout:
            who = "unknown holder"
            try:
                h = json.loads(holder_path.read_text())
                who = f"pid {h['pid']} on {h['host']} running `sparkctl {h['command']}` since {h['since']}"
            except (OSError, ValueError, KeyError):
                pass
            raise LockHeldError(f"cluster is locked by {who}", where=str(self.root),
                                hint="wait for that command to finish (or stop it); the lock frees itself "
                                     "when its process exits") from None
        Ledger._held[key] = 1
        try:
            write_json_atomic(holder_path, {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                                            "since": now_iso(), "argv": sys.argv[1:],
                                            "start_ticks": start_ticks(os.getpid())})
            yield
        finally:
            Ledger._held.pop(key, None)
            with suppress(FileNotFoundError):
                holder_path.unlink()
            lock.release()


class Stopwatch:
    """Monotonic timing for stage records."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 3)
