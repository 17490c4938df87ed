"""The revision store: every deployed config, kept as immutable files under the state dir.

Layout (state_dir/revisions/):
    000042/files/...      the exact bytes that ran (compose, .env, vllm.env, patches/...)
    000042/meta.json      written once: stack, parent, image, hashes, operator, message
    000042/status.json    outcome, boot facts, step timings, pin: replaced atomically
    000042/container.log  the vllm container's log of that boot, when one was captured
    index.json            one summary per revision, column by column, so `history` reads one file
    index.lock            flocked by whoever changes revisions or the index
    index.dirty           present while a change is under way (a killed writer leaves it)
    current               the number of the revision the node runs (written last)
    damaged/NNNNNN-STAMP  a revision `fsck --repair` set aside (its number is never given again)

Every deploy of a revision's bytes reads them through `Revision.verified_files`, which checks
each against the sha256 meta.json recorded; a record that cannot be read is a DamagedRecord
naming the file (one line, exit 2), never a traceback.

A revision directory is assembled under a temporary name and renamed into place, so a
killed run never leaves a half-written revision; files/ and meta.json never change again.

The index is kept right without a reader opening every revision (10,000 of them took
seconds): every change (create, status update, prune) runs under the index flock with the
dirty marker present (naming the revision whose status changes), and rewrites index.json
atomically before removing the marker. A reader that finds the marker (its writer was
killed) or revision folders the index does not list repairs it under the same flock: it
reads only the folders the index lacks and the revision the marker names, and drops entries
whose folders are gone. Listing the folder names is one scandir, milliseconds for 10,000.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import UserError
from .fsio import file_mode, fsync_dir, write_atomic

# "unproven": an imported copy that never ran under the tool (`rollback STACK` accepts it; the
# rollback's own revision is what proves it).
Verdict = Literal["pending", "deployed", "superseded", "failed", "aborted", "interrupted", "unproven"]
Kind = Literal["switch", "rollback", "adopt", "import"]
HEALTHY_OUTCOMES = ("deployed", "superseded")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


FSCK_FIX = "`b70deploy fsck` lists every damaged record; `b70deploy fsck --repair` mends what it can"


class DamagedRecord(UserError):
    """A record of the store that cannot be read, or stored bytes that are not the ones the
    revision recorded: refused before anything on the node changes (exit 2, one line)."""

    def __init__(self, path: Path, what: str, *, fix: str = FSCK_FIX) -> None:
        self.path = path
        super().__init__(f"{path}: {what}", fix=fix)


def unreadable(path: Path, exc: BaseException) -> str:
    """Why a record at `path` could not be read, in a few words (no traceback)."""
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, OSError):
        return f"unreadable ({exc.strerror or exc})"
    return f"damaged ({'empty' if not path.is_file() or path.stat().st_size == 0 else 'not valid JSON'})"


@dataclass(frozen=True)
class Meta:
    number: int
    stack: str
    kind: Kind
    parent: int | None          # the revision that was current when this one was made
    restored_from: int | None   # for a rollback: the revision whose bytes were restored
    created: str
    image_ref: str
    image_id: str | None
    repo_digest: str | None
    operator: str
    message: str
    files: dict[str, str]       # name -> sha256
    stack_doc: dict[str, Any] | None = None  # the merged stack it was rendered from (expectations, smoke)
    # Hand-made files mounted over files of the image (adopt, import): each as a unified diff
    # against the image's own file, with both hashes, so a moved tag is caught (actions.handmade.check_drift).
    patches: list[dict[str, Any]] | None = None
    # Each stored file's mode (name -> mode), which a deploy dir written from these bytes gets too: an
    # operator's private key stays 0600 (render.masking.private_mode). None: a revision made before.
    modes: dict[str, int] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Meta:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


@dataclass
class Status:
    outcome: Verdict = "pending"
    pinned: bool = False
    vllm_version: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    diagnosis: str | None = None
    failure: str | None = None
    updated: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Status:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


@dataclass(frozen=True)
class Revision:
    meta: Meta
    status: Status
    path: Path

    @property
    def number(self) -> int:
        return self.meta.number

    @property
    def files_dir(self) -> Path:
        return self.path / "files"

    def read_files(self) -> dict[str, bytes]:
        """The stored bytes as they are now, unchecked: for showing them (diff), never for deploying."""
        return {name: (self.files_dir / name).read_bytes() for name in self.meta.files}

    def modes(self) -> dict[str, int]:
        """Each stored file's mode as the revision recorded it; for a revision made before modes
        were recorded, the stored copy's own mode (its name's, when the copy cannot be read)."""
        if self.meta.modes is not None:
            return {name: int(mode) for name, mode in self.meta.modes.items()}
        out = {}
        for name in self.meta.files:
            try:
                out[name] = stat.S_IMODE((self.files_dir / name).stat().st_mode)
            except OSError:
                out[name] = file_mode(name)
        return out

    def verified_files(self) -> dict[str, bytes]:
        """The stored bytes, each checked against the sha256 its meta.json recorded (and a patch
        record's hash against the file it names): what every deploy of this revision writes.
        DamagedRecord names the first file that is missing or changed."""
        out: dict[str, bytes] = {}
        for name, want in self.meta.files.items():
            path = self.files_dir / name
            try:
                data = path.read_bytes()
            except OSError as e:
                raise self.damaged(path, unreadable(path, e)) from None
            if sha256(data) != want:
                raise self.damaged(path, f"sha256 {sha256(data)[:12]}, revision {self.number} recorded {want[:12]}")
            out[name] = data
        for rec in self.meta.patches or []:
            if rec.get("source"):  # a mount from outside the revision: checked against the host (mounts_changed)
                continue
            if rec.get("sha256") not in (None, self.meta.files.get(str(rec.get("file")))):
                raise self.damaged(self.path / "meta.json", f"the patch record of {rec.get('file')} names sha256 "
                                   f"{str(rec.get('sha256'))[:12]}, not that of the stored file")
        return out

    def damage(self) -> str | None:
        """What verified_files would refuse, or None when every stored byte is as recorded."""
        try:
            self.verified_files()
        except DamagedRecord as e:
            return e.what
        return None

    def matches(self, files: Mapping[str, bytes]) -> bool:
        """Whether `files` (a deploy dir's) are byte for byte what this revision recorded, by hash."""
        return {name: sha256(data) for name, data in files.items()} == self.meta.files

    def damaged(self, path: Path, what: str) -> DamagedRecord:
        return DamagedRecord(path, f"revision {self.number}: {what}; nothing was changed",
                             fix=f"roll back to another revision (`b70deploy history`), or {FSCK_FIX}")

    def summary(self) -> dict[str, Any]:
        return {
            "number": self.meta.number, "stack": self.meta.stack, "kind": self.meta.kind,
            "parent": self.meta.parent, "restored_from": self.meta.restored_from,
            "created": self.meta.created, "image_ref": self.meta.image_ref, "image_id": self.meta.image_id,
            "repo_digest": self.meta.repo_digest, "outcome": self.status.outcome, "pinned": self.status.pinned,
            "message": self.meta.message,
            "kv_cache_tokens": self.status.facts.get("kv_cache_tokens"),
            "time_to_healthy": self.status.facts.get("time_to_healthy"),
            "vllm_version": self.status.vllm_version,
            "failure": (self.status.diagnosis or self.status.failure or "")[:FAILURE_SHOWN] or None,
        }


FAILURE_SHOWN = 200  # characters of a failed revision's reason in its summary (status.json keeps it whole)


class Summaries:
    """Revision summaries (Revision.summary), oldest first, column by column as the index stores
    them: 10,000 rows parse as lists in a quarter of the time they take as dicts, and a row
    becomes a dict only when asked for (`history` shows the newest 20)."""

    def __init__(self, columns: dict[str, list[Any]]) -> None:
        self.columns = columns  # key -> one value per revision; "number" always present

    @classmethod
    def of(cls, rows: Sequence[Mapping[str, Any]]) -> Summaries:
        keys = sorted({k for row in rows for k in row} | {"number"})
        return cls({k: [row.get(k) for row in rows] for k in keys})

    @classmethod
    def parse(cls, data: bytes) -> Summaries | None:
        """The index file's summaries; None when it is not an index (torn, or not ours)."""
        try:
            doc = json.loads(data)
        except ValueError:
            return None
        if isinstance(doc, dict) and isinstance(doc.get("revisions"), list):  # the format before columns
            rows = doc["revisions"]
            if not all(isinstance(r, dict) for r in rows):
                return None
            found = cls.of(rows)
        elif isinstance(doc, dict) and isinstance(doc.get("columns"), dict) \
                and isinstance(doc["columns"].get("number"), list):
            found = cls(doc["columns"])
            size = len(found)
            if not all(isinstance(c, list) and len(c) == size for c in found.columns.values()):
                return None
        else:
            return None
        return found if all(type(n) is int for n in found.numbers()) else None

    def __len__(self) -> int:
        return len(self.columns.get("number") or ())

    def numbers(self) -> list[int]:
        return self.columns.get("number") or []

    def column(self, key: str) -> list[Any]:
        return self.columns.get(key) or [None] * len(self)

    def rows(self, start: int = 0) -> list[dict[str, Any]]:
        """The summaries from index `start` on, as dicts."""
        keys = list(self.columns)
        return [dict(zip(keys, values, strict=True)) for values in zip(*(c[start:] for c in self.columns.values()),
                                                                       strict=True)]

    def dumps(self) -> bytes:
        # Compact: every `history` reads it (indented, the file is twice as big).
        return (json.dumps({"columns": self.columns}, sort_keys=True, separators=(",", ":")) + "\n").encode()


class RevisionStore:
    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "revisions"
        self.index_path = self.root / "index.json"
        self.lock_path = self.root / "index.lock"
        self.dirty_path = self.root / "index.dirty"
        self.current_path = self.root / "current"
        self._held = threading.local()  # .marked: this thread is inside _changing

    # ------------------------------------------------------------------ reading

    def _dir(self, number: int) -> Path:
        return self.root / f"{number:06d}"

    def numbers(self) -> list[int]:
        try:
            with os.scandir(self.root) as it:  # names and types from the directory itself: no stat each
                return sorted(int(e.name) for e in it if e.name.isdigit() and e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            return []

    def exists(self, number: int) -> bool:
        """Whether revision `number` has a folder (get() then reads it, or names what is damaged)."""
        return self._dir(number).is_dir()

    def marked(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`rows` (index summaries) with `damage` set where the revision's meta.json or
        status.json cannot be read (each is read: for a page of rows, not for 10,000)."""
        for row in rows:
            if not row.get("damage"):
                what = self.problem(row["number"])
                if what:
                    row["damage"] = what
        return rows

    def get(self, number: int) -> Revision:
        """Revision `number`; UserError when there is none, DamagedRecord (naming the file) when
        its meta.json or status.json cannot be read."""
        path = self._dir(number)
        if not path.is_dir():
            raise UserError(f"no revision {number}", fix="`b70deploy history` lists the revisions")
        return Revision(meta=self._meta(number), status=self._status(number), path=path)

    def _meta(self, number: int) -> Meta:
        path = self._dir(number) / "meta.json"
        try:
            doc = json.loads(path.read_bytes())
            meta = Meta.from_dict(doc) if isinstance(doc, dict) else None
        except (OSError, ValueError) as e:
            raise DamagedRecord(path, f"revision {number}'s record is {unreadable(path, e)}") from None
        if meta is None or meta.number != number or not isinstance(meta.files, dict) or not meta.stack:
            raise DamagedRecord(path, f"revision {number}'s record is damaged (not the meta.json of revision "
                                      f"{number})")
        return meta

    def _status(self, number: int) -> Status:
        path = self._dir(number) / "status.json"
        try:
            doc = json.loads(path.read_bytes())
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            return Status.from_dict(doc)
        except FileNotFoundError:
            return Status()  # a revision stored before status.json existed
        except (OSError, ValueError, TypeError) as e:
            raise DamagedRecord(path, f"revision {number}'s outcome is {unreadable(path, e)}") from None

    def problem(self, number: int) -> str | None:
        """What keeps revision `number`'s records from being read (None: they read)."""
        try:
            self.get(number)
        except DamagedRecord as e:
            return e.what
        return None

    def current_number(self) -> int | None:
        try:
            text = self.current_path.read_text().strip()
        except FileNotFoundError:
            return None
        return int(text) if text.isdigit() else None

    def current(self) -> Revision | None:
        """The revision `current` names; None when nothing is deployed or its folder is gone
        (set aside by `fsck --repair`), DamagedRecord when its records cannot be read."""
        n = self.current_number()
        return self.get(n) if n is not None and self._dir(n).is_dir() else None

    def index(self) -> list[dict[str, Any]]:
        """Summaries of every revision, oldest first; repaired (see the module docstring) when
        missing, torn, or stale."""
        return self.summaries().rows()

    def summaries(self) -> Summaries:
        """index(), column by column: for a reader that needs a few rows or a few keys."""
        if not self.root.is_dir():
            return Summaries.of([])  # nothing stored yet: a read creates no folder
        entries = self._read_index()
        if getattr(self._held, "marked", False):  # inside our own change: the caller writes the index
            return self._repaired(entries)
        # A folder the index lacks is a writer killed after its rename; an entry without its
        # folder (removed by hand) stays until the next change rewrites the index.
        if entries is not None and not self.dirty_path.exists() and self._lists_every_folder(entries):
            return entries
        try:
            with self._changing():  # waits for a live writer, recovers a killed one's change
                return self._repair_locked(self._read_index())
        except OSError:  # a state dir this user may read but not write: repair in memory only
            return self._repaired(None if self.dirty_path.exists() else entries)

    def rebuild_index(self) -> list[dict[str, Any]]:
        """Read every revision again and rewrite the index from them."""
        if not self.root.is_dir():
            return []
        with self._changing():
            return self._repair_locked(None).rows()

    def from_folders(self) -> Summaries:
        """Every folder's summary read afresh (damaged ones as damaged_summary): what the index
        should say."""
        return self._repaired(None)

    def index_disagreement(self) -> list[str]:
        """How index.json differs from the folders (fsck): empty when it agrees."""
        entries = self._read_index()
        if entries is None:
            return [f"{self.index_path}: missing or not an index"] if self.root.is_dir() else []
        listed = {e["number"]: e for e in entries.rows()}
        found = {e["number"]: e for e in self.from_folders().rows() if not e.get("damage")}
        out = [f"{self.index_path} lists revision {n}, which has no folder" for n in sorted(set(listed) - set(found))
               if not self._dir(n).is_dir()]
        out += [f"{self.index_path} lacks revision {n}" for n in sorted(set(found) - set(listed))]
        for n in sorted(set(found) & set(listed)):
            keys = sorted(k for k in found[n] if found[n][k] != listed[n].get(k))
            if keys:
                out.append(f"{self.index_path}: revision {n}'s {', '.join(keys)} differ from its folder")
        return out

    def _lists_every_folder(self, entries: Summaries) -> bool:
        """Whether `entries` has every revision folder. The names of one listdir first: numbers()
        (an is_dir and an int for each of 10,000 entries) costs twice that, and is asked only
        when a name is missing (it may be a file)."""
        known = set(entries.numbers())
        try:
            names = os.listdir(self.root)
        except (FileNotFoundError, NotADirectoryError):
            return True
        return known.issuperset(int(n) for n in names if n.isdigit()) or known.issuperset(self.numbers())

    def _repair_locked(self, entries: Summaries | None) -> Summaries:
        fixed = self._repaired(entries)
        if entries is None or fixed.columns != entries.columns:
            self._write_index(fixed.rows())
        return fixed

    def _repaired(self, entries: Summaries | None) -> Summaries:
        """`entries` less those whose folder is gone, plus a summary of each folder they lack
        (all of them for None), by number. A folder whose records cannot be read is listed as
        `damaged` (what is wrong, in `damage`), and never written to the index (_write_index):
        the next reader looks at it again, so a mended one shows as it is."""
        known = {e["number"]: e for e in entries.rows()} if entries is not None else {}
        out = []
        for n in self.numbers():
            if n in known:
                out.append(known[n])
                continue
            try:
                out.append(self.get(n).summary())
            except DamagedRecord as e:
                out.append(damaged_summary(n, e.what))
        return Summaries.of(out)

    def _read_index(self) -> Summaries | None:
        """The index, None when it is missing or cannot be read: rebuilt from the folders then."""
        try:
            return Summaries.parse(self.index_path.read_bytes())
        except OSError:
            return None

    @contextlib.contextmanager
    def _changing(self, number: int | None = None) -> Iterator[None]:
        """Hold the index flock with the dirty marker present, naming `number` when one
        revision's status changes (a new or removed folder shows in the listing anyway). On a
        clean exit the caller has written the index and the marker goes; an exception or a kill
        leaves it, and the next writer or reader first re-reads the revision it names and
        repairs the index. Re-entrant within this object (create reads index())."""
        if getattr(self._held, "marked", False):
            yield
            return
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # the kernel drops it if we die
            self._recover_locked()
            write_atomic(self.dirty_path, b"" if number is None else f"{number}\n".encode(), mode=0o644)
            self._held.marked = True
            try:
                yield
            finally:
                self._held.marked = False
            self.dirty_path.unlink()
        finally:
            os.close(fd)

    def _recover_locked(self) -> None:
        """After a killed writer (its marker remains): re-read the revision it named, and add
        and drop folders as the listing says."""
        try:
            named = self.dirty_path.read_text().split()
        except FileNotFoundError:
            return
        entries = self._read_index()
        if entries is not None:
            stale = {int(n) for n in named if n.isdigit()}
            entries = Summaries.of([e for e in entries.rows() if e["number"] not in stale])
        self._write_index(self._repaired(entries).rows())
        self.dirty_path.unlink()

    def latest_healthy(self, stack: str | None = None, *, exclude: Iterable[int] = (),
                       verified: bool = False) -> Revision | None:
        """The newest revision (of `stack`) that ran healthy; `verified`: of those whose records
        read and whose stored bytes are the ones recorded (what `status` may advise)."""
        skip = set(exclude)
        for entry in reversed(self.index()):
            if entry["number"] in skip or entry["outcome"] not in HEALTHY_OUTCOMES:
                continue
            if stack is None or entry["stack"] == stack:
                if not verified:
                    return self.get(entry["number"])
                try:
                    rev = self.get(entry["number"])
                except DamagedRecord:
                    continue
                if rev.damage() is None:
                    return rev
        return None

    def latest_restorable(self, stack: str) -> Revision | None:
        """The newest revision of `stack` that ran healthy or was imported and never run: what
        `rollback STACK` brings back."""
        for entry in reversed(self.index()):
            if entry["stack"] != stack:
                continue
            if entry["outcome"] in HEALTHY_OUTCOMES or (entry["kind"] == "import" and entry["outcome"] == "unproven"):
                return self.get(entry["number"])
        return None

    # ------------------------------------------------------------------ writing

    def create(self, *, stack: str, kind: Kind, files: Mapping[str, bytes], image_ref: str, image_id: str | None,
               repo_digest: str | None, operator: str, message: str, created: str,
               restored_from: int | None = None, stack_doc: dict[str, Any] | None = None,
               patches: list[dict[str, Any]] | None = None, outcome: Verdict = "pending",
               modes: Mapping[str, int] | None = None) -> Revision:
        """Store a new revision atomically; its number is one past the highest so far; a file
        has the mode `modes` gives it, else fsio.file_mode's, and meta.json records each. The
        caller holds the deploy lock, so a half-written `.new-*` folder here is a killed
        run's: it is removed."""
        import tempfile  # here: `history` only reads (as in fsio.write_atomic)

        self.root.mkdir(parents=True, exist_ok=True)
        with self._changing():  # one writer at a time: the number is ours until the rename
            for stale in self.root.glob(".new-*"):  # a killed writer's: every writer holds the flock
                shutil.rmtree(stale, ignore_errors=True)
            recorded = {name: (modes or {}).get(name, file_mode(name)) for name in sorted(files)}
            numbers = self.numbers() + self._set_aside_numbers()  # a number is never given twice
            number = max(numbers) + 1 if numbers else 1
            meta = Meta(number=number, stack=stack, kind=kind, parent=self.current_number(),
                        restored_from=restored_from, created=created, image_ref=image_ref, image_id=image_id,
                        repo_digest=repo_digest, operator=operator, message=message,
                        files={name: sha256(data) for name, data in sorted(files.items())}, stack_doc=stack_doc,
                        patches=patches, modes=recorded)
            tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=f".new-{number:06d}-"))
            try:
                for name, data in files.items():
                    write_atomic(tmp / "files" / name, data, mode=recorded[name])
                write_atomic(tmp / "meta.json", _dumps(asdict(meta)), mode=0o644)
                write_atomic(tmp / "status.json", _dumps(asdict(Status(outcome=outcome, updated=created))),
                             mode=0o644)
                os.chmod(tmp, 0o700)
                os.rename(tmp, self._dir(number))  # fails if the number was taken: never overwrite
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            fsync_dir(self.root)
            rev = self.get(number)
            self._upsert_index(rev)
        return rev

    def update_status(self, number: int, **changes: Any) -> Revision:
        self.get(number)  # a clear error for an unknown revision, before any lock
        with self._changing(number):
            rev = self.get(number)  # as the last writer left it
            status = Status.from_dict({**asdict(rev.status), **changes})
            write_atomic(rev.path / "status.json", _dumps(asdict(status)), mode=0o644)
            new = Revision(meta=rev.meta, status=status, path=rev.path)
            self._upsert_index(new)
        return new

    def mend_file(self, number: int, name: str, data: bytes, mode: int | None = None) -> None:
        """Put back stored file `name` of revision `number` from a copy whose sha256 is the one
        the revision recorded (the deploy dir's): the revision is then as it was made, with the mode
        it recorded (`mode`: for a revision made before modes were recorded)."""
        rev = self.get(number)
        if sha256(data) != rev.meta.files.get(name):
            raise ValueError(f"not revision {number}'s {name}")
        fallback = file_mode(name) if mode is None else mode
        write_atomic(rev.files_dir / name, data, mode=(rev.meta.modes or {}).get(name, fallback))

    def reset_status(self, number: int, status: Status) -> None:
        """Write status.json anew (fsck --repair, for one that cannot be read)."""
        with self._changing(number):
            write_atomic(self._dir(number) / "status.json", _dumps(asdict(status)), mode=0o644)
            self._upsert_index(self.get(number))

    def set_aside(self, number: int, stamp: str) -> Path:
        """Move revision `number`'s folder to revisions/damaged/ (fsck --repair): kept for a look,
        never listed, rolled back to or pruned again."""
        with self._changing():
            aside = self.root / "damaged" / f"{number:06d}-{stamp}"
            aside.parent.mkdir(exist_ok=True)
            os.rename(self._dir(number), aside)
            fsync_dir(self.root)
            self._write_index(self._repaired(self._read_index()).rows())
        return aside

    def _set_aside_numbers(self) -> list[int]:
        try:
            return [int(p.name[:6]) for p in (self.root / "damaged").iterdir() if p.name[:6].isdigit()]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def set_current(self, number: int) -> None:
        write_atomic(self.current_path, f"{number}\n".encode(), mode=0o644)

    def clear_current(self) -> None:
        """Nothing is current (a first deployment that was undone)."""
        self.current_path.unlink(missing_ok=True)

    def save_log(self, number: int, text: str) -> Path:
        path = self._dir(number) / "container.log"
        write_atomic(path, text.encode(errors="replace"), mode=0o600)
        return path

    def log_path(self, number: int) -> Path:
        return self._dir(number) / "container.log"

    def prune(self, keep: int, *, force: bool = False, asleep: Collection[int] = ()) -> list[int]:
        """Delete all but the newest `keep` revisions, never a pinned one or the current one, nor one
        asleep as a hot standby (`asleep`: a rollback wakes it from these bytes), nor (unless `force`) a
        way back that exists once: see `prune_plan`."""
        if not self._doomed(self.index(), keep, force=force, asleep=asleep):  # the usual case: no index write
            return []
        with self._changing():
            entries = self.index()
            doomed = self._doomed(entries, keep, force=force, asleep=asleep)
            for n in doomed:
                # Rename first so a crash mid-delete never leaves a half-revision under its number.
                trash = self.root / f".trash-{n:06d}"
                with contextlib.suppress(FileNotFoundError):
                    os.rename(self._dir(n), trash)
                    shutil.rmtree(trash, ignore_errors=True)
            gone = set(doomed)
            if doomed:
                fsync_dir(self.root)
            self._write_index([e for e in entries if e["number"] not in gone])
        return doomed

    def prune_plan(self, keep: int, *, force: bool = False,
                   asleep: Collection[int] = ()) -> tuple[list[int], dict[int, str]]:
        """What `prune(keep, force)` would delete, and the old revisions it keeps, each with why."""
        entries = self.index()
        return (self._doomed(entries, keep, force=force, asleep=asleep),
                self._kept(entries, keep, force=force, asleep=asleep))

    def _doomed(self, entries: list[dict[str, Any]], keep: int, *, force: bool,
                asleep: Collection[int] = ()) -> list[int]:
        kept = self._kept(entries, keep, force=force, asleep=asleep)
        newest = {e["number"] for e in entries[-keep:]} if keep > 0 else set()
        return [e["number"] for e in entries if e["number"] not in newest and e["number"] not in kept]

    def _kept(self, entries: list[dict[str, Any]], keep: int, *, force: bool,
              asleep: Collection[int] = ()) -> dict[int, str]:
        """The revisions older than the newest `keep` that stay, and why: pinned, current, and,
        unless `force`, the newest adopted revision (the way back to the hand-made node) and an
        unproven import (one that never ran: nothing else holds its bytes)."""
        current = self.current_number()
        adopted = [e["number"] for e in entries if e.get("kind") == "adopt"]
        older = entries[:-keep] if keep > 0 else entries
        why: dict[int, str] = {}
        for e in older:
            n = e["number"]
            if e["pinned"]:
                why[n] = "pinned"
            elif n == current:
                why[n] = "current"
            elif n in asleep:
                why[n] = "asleep as a hot standby: a rollback wakes it from these bytes"
            elif not force and adopted and n == adopted[-1]:
                why[n] = "the newest adopted revision: the way back to the hand-made node (--force deletes it)"
            elif not force and e.get("kind") == "import" and e.get("outcome") == "unproven":
                why[n] = "an unproven import: nothing else holds its bytes (--force deletes it)"
        return why

    def sweep(self, older_than: float) -> list[str]:
        """Remove what a killed writer left (`.new-*` and `.trash-*` folders, `.*.tmp` files of
        write_atomic, here and in each revision folder), if older than `older_than` (epoch: when
        the caller took the deploy lock), so an index rebuild running beside us keeps its file."""
        if not self.root.is_dir():
            return []
        gone: list[str] = []
        folders = [self.root, *(p for p in self.root.iterdir() if p.is_dir() and p.name.isdigit())]
        for folder in folders:
            for p in folder.iterdir():
                leftover = (p.name.startswith((".new-", ".trash-")) and folder == self.root and p.is_dir()) or \
                    (p.name.startswith(".") and p.name.endswith(".tmp") and p.is_file())
                with contextlib.suppress(FileNotFoundError):
                    if leftover and p.lstat().st_mtime < older_than:
                        if p.is_dir():
                            shutil.rmtree(p)
                        else:
                            p.unlink()
                        gone.append(p.relative_to(self.root).as_posix())
        return gone

    def _upsert_index(self, rev: Revision) -> None:
        entries = [e for e in self.index() if e["number"] != rev.number]
        entries.append(rev.summary())
        entries.sort(key=lambda e: e["number"])
        self._write_index(entries)

    def _write_index(self, entries: list[dict[str, Any]]) -> None:
        write_atomic(self.index_path, Summaries.of([e for e in entries if not e.get("damage")]).dumps(), mode=0o644)


def damaged_summary(number: int, what: str) -> dict[str, Any]:
    """The row `history` shows for a revision whose records cannot be read."""
    return {"number": number, "stack": "?", "kind": "?", "outcome": "damaged", "pinned": False, "created": "",
            "image_ref": "?", "image_id": None, "message": "", "damage": what}


def _dumps(data: Any) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()
