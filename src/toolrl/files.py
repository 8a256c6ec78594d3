"""Reading the files users hand toolrl, with one-line errors of bounded length: a file that is missing or is a
folder, text that is not UTF-8, YAML whose aliases expand past any sane size (an alias bomb), nesting past the
parser's recursion, and JSON Lines whose last line a kill tore in half (skipped with a warning)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import yaml

from toolrl.errors import ConfigError, ToolRLError
from toolrl.text import clip, first_line, one_line

log = logging.getLogger(__name__)

MAX_CONFIG_BYTES = 32 * 2**20
"""Largest config file read (task files and corpora have no limit)."""
MAX_YAML_VALUES = 100_000
"""Values (mappings, lists, scalars) a YAML document may expand to once its aliases are followed."""


class YAMLSyntaxError(ConfigError):
    """Text that is not YAML at all (as opposed to YAML that is refused)."""


def read_text(
    path: str | Path,
    what: str = "file",
    error: type[ToolRLError] = ConfigError,
    max_bytes: int | None = MAX_CONFIG_BYTES,
) -> str:
    """The text of `path` (UTF-8, a BOM allowed), or `error` naming the file and what to do."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise error(f"{path} is a folder, not a {what}; pass the file itself")
    if not path.is_file():
        raise error(f"{what} {path} does not exist")
    if max_bytes is not None and path.stat().st_size > max_bytes:
        raise error(f"{path}: {path.stat().st_size / 2**20:.0f} MB is too large for a {what}")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save the {what} as UTF-8"
        ) from None


def load_yaml(text: str, where: str, error: type[ToolRLError] = ConfigError) -> Any:
    """Parse one YAML document safely: no Python objects, and aliases that expand to more than MAX_YAML_VALUES
    values (or refer to themselves) refused before anything walks the expanded tree."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # refuses NUL and other control characters here
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}, set()) > MAX_YAML_VALUES:
            raise error(
                f"{where}: expands to more than {MAX_YAML_VALUES:,} values through its aliases (&anchor/*alias); "
                "write the values out or use fewer nested aliases"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        if isinstance(exc, yaml.reader.ReaderError):
            char = exc.character if isinstance(exc.character, int) else ord(exc.character)
            problem = f"control character U+{char:04X} at offset {exc.position} is not allowed; remove it"
        else:
            problem = getattr(exc, "problem", None) or str(exc)
        message = clip(one_line(f"{where}{line}: not valid YAML ({problem})"), 300)
        raise (YAMLSyntaxError if issubclass(YAMLSyntaxError, error) else error)(message) from None
    except RecursionError:
        raise error(f"{where}: nested too deeply to read") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4,300), and the like
        if "integer string conversion" in str(exc):
            raise error(f"{where}: a number has more than 4,300 digits; write it with fewer digits") from None
        raise error(clip(f"{where}: a value cannot be read ({first_line(exc)})", 300)) from None
    finally:
        if loader is not None:
            loader.dispose()


def _expanded_size(node: yaml.Node, sizes: dict[int, int], active: set[int]) -> int:
    """Values under `node` with every alias followed; shared nodes are counted where they are used."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in active:  # an alias to one of its own ancestors: infinite once expanded
        return MAX_YAML_VALUES + 1
    active.add(key)
    total = 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            total += _expanded_size(k, sizes, active) + _expanded_size(v, sizes, active)
            if total > MAX_YAML_VALUES:
                break
    elif isinstance(node, yaml.SequenceNode):
        for child in node.value:
            total += _expanded_size(child, sizes, active)
            if total > MAX_YAML_VALUES:
                break
    active.discard(key)
    sizes[key] = total
    return total


def load_structured(path: str | Path, what: str, error: type[ToolRLError] = ConfigError) -> Any:
    """A YAML or (by suffix) JSON file's data, with the errors above."""
    path = Path(path).expanduser()
    text = read_text(path, what, error)
    if path.suffix.lower() != ".json":
        return load_yaml(text, str(path), error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:
        raise error(clip(f"{path}: cannot be read as JSON ({exc})", 300)) from None


def read_jsonl(path: str | Path, error: type[ToolRLError] = ConfigError) -> list[dict[str, Any]]:
    """The records of a JSON Lines file that toolrl appends to. A last line that does not parse (a kill in the
    middle of a write) is skipped with a warning; a bad line elsewhere is an error naming it."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):
                log.warning("%s: skipped its last line, cut short by an interrupted write", path)
                break
            raise error(f"{path}:{number}: not valid JSON ({exc.msg}); the file is damaged") from None
    return records
