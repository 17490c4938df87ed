"""Reading YAML files (stack files, the node config) with a strict, bounded loader; any problem
is a one-line UserError naming the file. No schema here: the node config is read without
pydantic when its validated form is cached (config/node.py)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..errors import UserError

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/@+-]*$")

MAX_DEPTH = 64        # nesting of mappings and lists; the schema needs 4
MAX_INT_CHARS = 32    # an integer's text; the largest value the schema takes has 8 digits


class _Refused(yaml.YAMLError):
    """Input the loader will not read (an alias, deep nesting, a huge number), with its own fix."""

    def __init__(self, problem: str, mark: Any, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark
        self.fix = fix


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader with bounds, so any file is read in time linear in its size:

    - no anchors or aliases (`&a`, `*a`): a few hundred bytes of nested aliases ("billion
      laughs") expand to billions of nodes, and no stack or node file needs them (`extends:`
      and `stack_overlay` share settings instead);
    - at most MAX_DEPTH levels of nesting (PyYAML composes recursively: 500 levels overflow
      Python's stack);
    - integers of at most MAX_INT_CHARS characters (Python refuses to convert one of over
      4,300 digits, and converting long ones is quadratic);
    - a key written twice in one mapping is refused: PyYAML would silently keep the last one
      (a pasted line overriding a setting unseen), and Compose refuses such files.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            kind = "alias" if isinstance(event, yaml.AliasEvent) else "anchor"
            raise _Refused(f"YAML {kind} {'*' if kind == 'alias' else '&'}{event.anchor} is not allowed",
                           event.start_mark, "write the value out in full; share settings between stacks "
                                             "with `extends:` or the node's stack_overlay")
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)) and self._depth >= MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep", event.start_mark,
                           "flatten the value; no setting nests that deep")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if len(str(node.value)) > MAX_INT_CHARS:
            raise _Refused(f"a number of {len(str(node.value))} characters is too long", node.start_mark,
                           f"write a number of at most {MAX_INT_CHARS} digits")
        return super().construct_yaml_int(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


def read_yaml(path: Path) -> dict[str, Any]:
    """Parse `path` as a YAML mapping; any problem is a UserError naming the file."""
    return parse_yaml(yaml_text(path), path)


def yaml_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError("file not found", where=str(path), fix="check the path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read: {e}", where=str(path), fix="check permissions and encoding") from None


def parse_yaml(text: str, path: Path) -> dict[str, Any]:
    """`text` (read from `path`) as a YAML mapping, by read_yaml's rules."""
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except _Refused as e:
        line = f"line {e.problem_mark.line + 1}: " if e.problem_mark is not None else ""
        raise UserError(f"{line}{e.problem}", where=str(path), fix=e.fix) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{line}YAML syntax error: {problem}", where=str(path),
                        fix="correct the YAML syntax") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UserError(f"top level is a {type(doc).__name__}, not a mapping", where=str(path),
                        fix="write key: value pairs at the top level")
    for key in doc:
        if not isinstance(key, str):
            raise UserError(f"key {key!r} is not a string", where=str(path), fix="quote the key")
    _check_text(doc, [], path)
    return doc


def _bad_char(text: str) -> str | None:
    """A character no rendered file may carry: controls other than tab and newline (which
    multi-line notes use; fields that reach env files refuse newlines themselves), surrogates,
    and U+FFFE/U+FFFF (outside YAML's printable set: Compose's parser refuses the file)."""
    for ch in text:
        if ch in "\ufffe\uffff" or (ch not in "\t\n" and unicodedata.category(ch) in ("Cc", "Cs")):
            return ch
    return None


def _check_text(node: Any, loc: list[Any], path: Path) -> None:
    """Reject control characters anywhere in the document (keys and values), naming the key.

    YAML escapes ("\\x1b", "\\ud800") can produce them; they would corrupt the compose file
    or the env files, or make Compose's YAML parser reject the rendered file. The loader
    refuses aliases and deep nesting, so this walks a tree of bounded depth, each node once.
    """

    def where() -> str:  # only built for an error: most nodes are fine
        return loc_path(loc) or "(top level)"

    if isinstance(node, str):
        ch = _bad_char(node)
        if ch is not None:
            raise UserError(f"{where()}: contains the control character {ch!r}", where=str(path),
                            fix="remove it; values are plain text")
    elif isinstance(node, (dict, list)):
        pairs = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in pairs:
            if isinstance(k, str):
                _check_text(k, loc, path)
            _check_text(v, [*loc, k], path)


def loc_path(loc: Sequence[Any]) -> str:
    """`a.b[0].c` from a pydantic-style location; odd YAML keys (numbers, dates) as text."""
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            text = str(part)
            # A key with spaces, quotes or a newline is shown quoted: the message stays one line.
            out += ("." if out else "") + (text if _PLAIN_KEY.match(text) else repr(text))
    return out

