"""The stack catalogue: one YAML file per stack, with `extends:` for variants.

Merge rule for `extends:` (and for the node's `stack_overlay`): mappings merge key by key,
recursively; a list or a scalar in the child replaces the parent's whole value; a child
value of `null` removes the key (e.g. `speculative: null` to drop a parent's draft).
A mapping landing on a value that is not a mapping replaces it only if that value is right
for its key (checked against the schema); a wrong one is an error naming the file that set it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from .doc_cache import DocCache
from .names import is_valid_name
from .schema import Stack
from .validation import validate, value_error
from .yamlfile import read_yaml

Provenance = dict[str, str]  # dotted key path -> file that last set it


Conflict = Callable[[tuple[str, ...], Any], None]  # (key path, the value about to be dropped)


def deep_merge(base: dict[str, Any], over: dict[str, Any], *, prov: Provenance | None = None,
               source: str = "", prefix: str = "", conflict: Conflict | None = None,
               loc: tuple[str, ...] = ()) -> dict[str, Any]:
    """Return `base` with `over` merged in by the rule in this module's docstring.

    `conflict` is called before a mapping in `over` replaces a value of `base` that is not
    a mapping (it cannot merge into it): it may raise to refuse the merge."""
    out: dict[str, Any] = _copy_tree(base)
    _merge_into(out, over, prov=prov, source=source, prefix=prefix, conflict=conflict, loc=loc)
    return out


def _merge_into(out: dict[str, Any], over: dict[str, Any], *, prov: Provenance | None, source: str,
                prefix: str, conflict: Conflict | None, loc: tuple[str, ...]) -> None:
    """deep_merge on `out` in place (it is the caller's own copy); what comes from `over` is
    copied, so `out` never shares a part with `over` (a cached document, doc_cache)."""
    for key, value in over.items():
        path = f"{prefix}.{key}" if prefix else key
        here = (*loc, key)
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            _merge_into(out[key], value, prov=prov, source=source, prefix=path, conflict=conflict, loc=here)
        else:
            if conflict is not None and isinstance(value, dict) and out.get(key) is not None:
                conflict(here, out[key])
            out[key] = _copy_tree(value)
        if prov is not None:
            _mark(prov, path, value, source)


def _copy_tree(value: Any) -> Any:
    """A deep copy of parsed YAML (mappings, lists, scalars), several times faster than
    copy.deepcopy, which a catalogue of 1,000 stacks spent a third of its time in."""
    if isinstance(value, dict):
        return {k: _copy_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_tree(v) for v in value]
    return set(value) if isinstance(value, set) else value  # YAML !!set; other scalars are immutable


def _mark(prov: Provenance, path: str, value: Any, source: str) -> None:
    prov[path] = source
    if isinstance(value, dict):
        for k, v in value.items():
            _mark(prov, f"{path}.{k}", v, source)


@dataclass
class ResolvedDoc:
    name: str
    data: dict[str, Any]
    chain: list[Path]                      # the stack's own file first, then its parents
    provenance: Provenance = field(default_factory=dict)

    def file_for(self, key: str) -> str:
        """The file that set `key` (or its nearest parent key), for error messages."""
        probe = key.split("[")[0]
        while probe:
            if probe in self.provenance:
                return self.provenance[probe]
            probe = probe.rpartition(".")[0]
        return str(self.chain[0])


class Catalogue:
    def __init__(self, stacks_dir: Path, *, overlay: dict[str, Any] | None = None,
                 overlay_source: str = "node config", image_map: dict[str, str] | None = None,
                 cache: DocCache | None = None):
        self.dir = stacks_dir
        self.cache = cache
        self.overlay = overlay or {}
        self.overlay_source = overlay_source
        self.image_map = image_map or {}
        if not stacks_dir.is_dir():
            raise UserError("stacks folder not found", where=str(stacks_dir),
                            fix="point --stacks-dir, $B70DEPLOY_STACKS or stacks_dir at a folder of stack files")

    def names(self) -> list[str]:
        names = []
        for path in self._files():
            if not is_valid_name(path.stem):
                raise _bad_file_name(path)
            names.append(path.stem)
        return names

    def _valid_names(self) -> list[str]:
        """For a hint: the stacks there are, less a badly named file (its own error is elsewhere)."""
        return [p.stem for p in self._files() if is_valid_name(p.stem)]

    def _files(self) -> list[Path]:
        return sorted(self.dir.glob("*.yaml"), key=lambda p: p.stem)  # by name: w4a16 before w4a16-131k

    def path_of(self, name: str) -> Path:
        if not is_valid_name(name):
            raise UserError(f"{name!r} is not a valid stack name",
                            fix="use [a-z0-9][a-z0-9._-]*; `b70deploy stacks` lists them")
        path = self.dir / f"{name}.yaml"
        if not path.is_file():
            names = self._valid_names()
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            fix = f"did you mean {close[0]}?" if close else f"use one of: {', '.join(names) or 'none'}"
            raise UserError(f"no stack named {name!r} in {self.dir}", fix=fix)
        return path

    def resolve_doc(self, name: str) -> ResolvedDoc:
        """Merge the `extends:` chain of `name` into one raw document (not yet validated)."""
        chain: list[Path] = []
        docs: list[dict[str, Any]] = []
        current: str | None = name
        seen: list[str] = []
        child_path: Path | None = None
        while current is not None:
            if current in seen:
                cycle = " -> ".join([*seen, current])
                raise UserError(f"extends: cycle {cycle}", where=str(chain[-1]),
                                fix="break the cycle: a stack cannot extend itself")
            seen.append(current)
            try:
                path = self.path_of(current)
            except UserError:
                if child_path is None:
                    raise
                raise UserError(f"extends: unknown parent stack {current!r}", where=str(child_path),
                                fix=f"use one of: {', '.join(self._valid_names())}") from None
            doc = self.cache.read(path) if self.cache is not None else read_yaml(path)
            if not doc:
                raise UserError("the stack file is empty", where=str(path),
                                fix="write a stack (image, model, ...) or `extends:` one; stacks/w4a16.yaml "
                                    "is an example")
            declared = doc.get("name", path.stem)
            if declared != path.stem:
                raise UserError(f"name: {declared!r} differs from the file name {path.stem!r}",
                                where=str(path), fix=f"set name: {path.stem} or remove the key")
            parent = doc.get("extends")
            if parent is not None and not isinstance(parent, str):
                raise UserError("extends: must be a stack name", where=str(path),
                                fix="write extends: <stack name>")
            chain.append(path)
            docs.append(doc)
            child_path = path
            current = parent
        merged: dict[str, Any] = {}
        prov: Provenance = {}

        def refuse_bad_dropped(loc: tuple[str, ...], dropped: Any) -> None:
            # A mapping is about to replace a value it cannot merge into (an overlay's `env:`
            # mapping over a stack's `env:` list): a wrong value would vanish unseen, so it is
            # an error naming the file that set it. A right one (a JSON `speculative:` string)
            # is replaced, as the merge rule says.
            bad = value_error(Stack, loc, dropped)
            if bad is not None:
                key, what, fix = bad
                setter = ResolvedDoc(name, merged, chain, prov).file_for(".".join(loc))
                raise UserError(f"{key}: {what}", where=setter, fix=fix)

        for path, doc in zip(reversed(chain), reversed(docs), strict=True):
            _merge_into(merged, doc, prov=prov, source=str(path), prefix="", conflict=refuse_bad_dropped, loc=())
        if self.overlay:
            _merge_into(merged, self.overlay, prov=prov, source=self.overlay_source, prefix="",
                        conflict=refuse_bad_dropped, loc=())
        merged["name"] = name
        merged["extends"] = docs[0].get("extends")
        return ResolvedDoc(name=name, data=merged, chain=chain, provenance=prov)

    def load(self, name: str) -> Stack:
        doc = self.resolve_doc(name)
        stack = validate(Stack, doc.data, where=doc.file_for)
        mapped = self.image_map.get(stack.image)
        return stack.model_copy(update={"image": mapped}) if mapped else stack

    def load_all(self) -> list[Stack]:
        stacks = [self.load(n) for n in self.names()]
        self.save_cache()
        return stacks

    def load_each(self) -> tuple[list[Stack], list[UserError]]:
        """Every stack that loads, and the error of each file that does not: one broken file
        does not hide the rest of the catalogue."""
        stacks: list[Stack] = []
        broken: list[UserError] = []
        for path in self._files():
            try:
                if not is_valid_name(path.stem):
                    raise _bad_file_name(path)
                stacks.append(self.load(path.stem))
            except UserError as e:
                broken.append(e)
        self.save_cache()
        return stacks, broken

    def save_cache(self) -> None:
        """Keep the files parsed so far for the next run (see doc_cache)."""
        if self.cache is not None:
            self.cache.save()


def _bad_file_name(path: Path) -> UserError:
    return UserError(f"stack file name {path.name!r} is not a valid stack name", where=str(path),
                     fix="rename it to [a-z0-9][a-z0-9._-]*.yaml")
