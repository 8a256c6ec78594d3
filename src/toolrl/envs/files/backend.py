"""A small in-memory file system, the stateful backend of the `files` environment: one instance per trajectory,
built from the task's initial tree; every public method is a tool. Paths are relative to the current folder,
`/` separates folders, `..` goes up; there is no way out of the root."""

from __future__ import annotations

import copy
import fnmatch
from typing import Any

Tree = dict[str, Any]
"""A folder: names to sub-folders (dicts) or file contents (str)."""


class FileSystem:
    """Folders and text files in memory, with a current folder."""

    def __init__(self, tree: Tree):
        self.root: Tree = copy.deepcopy(tree)
        self.cwd: list[str] = []

    # ---- helpers (not tools: they start with _) ---------------------------------------------------------

    def _path(self, path: str) -> list[str]:
        parts = [] if path.startswith("/") else list(self.cwd)
        for part in path.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if parts:
                    parts.pop()
            else:
                parts.append(part)
        return parts

    def _folder(self, parts: list[str], path: str) -> Tree:
        node = self.root
        for part in parts:
            node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict):
                raise ValueError(f"no folder {path!r}")
        return node

    def _parent(self, path: str) -> tuple[Tree, str]:
        parts = self._path(path)
        if not parts:
            raise ValueError("the root has no name")
        return self._folder(parts[:-1], path), parts[-1]

    def _file(self, path: str) -> tuple[Tree, str]:
        folder, name = self._parent(path)
        if name not in folder:
            raise ValueError(f"no file {path!r}")
        if isinstance(folder[name], dict):
            raise ValueError(f"{path!r} is a folder, not a file")
        return folder, name

    def snapshot(self) -> Tree:
        """The tree as it is (what the environment compares with the reference's)."""
        return copy.deepcopy(self.root)

    # ---- tools --------------------------------------------------------------------------------------------

    def pwd(self) -> str:
        """The current folder."""
        return "/" + "/".join(self.cwd)

    def ls(self, path: str = ".") -> str:
        """List a folder: sub-folders end with /.

        Args:
            path: The folder, the current one by default.
        """
        folder = self._folder(self._path(path), path)
        return "  ".join(f"{n}/" if isinstance(v, dict) else n for n, v in sorted(folder.items())) or "(empty)"

    def cd(self, folder: str) -> str:
        """Change the current folder.

        Args:
            folder: The folder to go to (.. goes up).
        """
        parts = self._path(folder)
        self._folder(parts, folder)
        self.cwd = parts
        return self.pwd()

    def mkdir(self, name: str) -> str:
        """Create a folder.

        Args:
            name: The new folder's path.
        """
        parent, leaf = self._parent(name)
        if leaf in parent:
            raise ValueError(f"{name!r} already exists")
        parent[leaf] = {}
        return f"created folder {name}"

    def touch(self, name: str) -> str:
        """Create an empty file (a file that exists is left as it is).

        Args:
            name: The file's path.
        """
        parent, leaf = self._parent(name)
        if isinstance(parent.get(leaf), dict):
            raise ValueError(f"{name!r} is a folder")
        parent.setdefault(leaf, "")
        return f"touched {name}"

    def write(self, name: str, text: str) -> str:
        """Write text into a file, replacing what it held (the file is created if needed).

        Args:
            name: The file's path.
            text: The new content.
        """
        parent, leaf = self._parent(name)
        if isinstance(parent.get(leaf), dict):
            raise ValueError(f"{name!r} is a folder")
        parent[leaf] = text
        return f"wrote {len(text)} characters to {name}"

    def append(self, name: str, line: str) -> str:
        """Add a line at the end of a file.

        Args:
            name: The file's path.
            line: The line to add.
        """
        folder, leaf = self._file(name)
        content = folder[leaf]
        folder[leaf] = content + ("" if not content or content.endswith("\n") else "\n") + line + "\n"
        return f"appended to {name}"

    def cat(self, name: str) -> str:
        """Show a file's content.

        Args:
            name: The file's path.
        """
        folder, leaf = self._file(name)
        return folder[leaf] or "(empty file)"

    def rm(self, name: str) -> str:
        """Delete a file.

        Args:
            name: The file's path.
        """
        folder, leaf = self._file(name)
        del folder[leaf]
        return f"deleted {name}"

    def rmdir(self, name: str) -> str:
        """Delete an empty folder.

        Args:
            name: The folder's path.
        """
        parent, leaf = self._parent(name)
        if not isinstance(parent.get(leaf), dict):
            raise ValueError(f"no folder {name!r}")
        if parent[leaf]:
            raise ValueError(f"folder {name!r} is not empty")
        del parent[leaf]
        return f"deleted folder {name}"

    def mv(self, source: str, destination: str) -> str:
        """Move or rename a file or folder; into a folder when the destination is one.

        Args:
            source: What to move.
            destination: The new path, or a folder to move it into.
        """
        folder, leaf = self._parent(source)
        if leaf not in folder:
            raise ValueError(f"no file or folder {source!r}")
        target, name = self._target(destination, leaf)
        target[name] = folder.pop(leaf)
        return f"moved {source} to {destination}"

    def cp(self, source: str, destination: str) -> str:
        """Copy a file; into a folder when the destination is one.

        Args:
            source: The file to copy.
            destination: The copy's path, or a folder to copy it into.
        """
        folder, leaf = self._file(source)
        target, name = self._target(destination, leaf)
        target[name] = folder[leaf]
        return f"copied {source} to {destination}"

    def _target(self, destination: str, leaf: str) -> tuple[Tree, str]:
        parts = self._path(destination)
        try:
            return self._folder(parts, destination), leaf  # into an existing folder
        except ValueError:
            parent, name = self._parent(destination)
            if name in parent:
                raise ValueError(f"{destination!r} already exists") from None
            return parent, name

    def find(self, pattern: str) -> str:
        """Find files and folders whose name matches a pattern (* and ? wildcards), from the current folder.

        Args:
            pattern: For example *.txt.
        """
        found = []

        def walk(node: Tree, prefix: str) -> None:
            for name, value in sorted(node.items()):
                if fnmatch.fnmatch(name, pattern):
                    found.append(prefix + name + ("/" if isinstance(value, dict) else ""))
                if isinstance(value, dict):
                    walk(value, prefix + name + "/")

        walk(self._folder(self.cwd, "."), "")
        return "\n".join(found) or "nothing found"

    def grep(self, pattern: str, name: str) -> str:
        """Lines of a file that contain a text.

        Args:
            pattern: The text to look for.
            name: The file's path.
        """
        folder, leaf = self._file(name)
        return "\n".join(line for line in folder[leaf].splitlines() if pattern in line) or "no match"

    def wc(self, name: str) -> str:
        """Count a file's lines, words and characters.

        Args:
            name: The file's path.
        """
        folder, leaf = self._file(name)
        text = folder[leaf]
        return f"{len(text.splitlines())} lines, {len(text.split())} words, {len(text)} characters"

    def sort(self, name: str) -> str:
        """A file's lines in sorted order (the file is not changed).

        Args:
            name: The file's path.
        """
        folder, leaf = self._file(name)
        return "\n".join(sorted(folder[leaf].splitlines()))

    def head(self, name: str, lines: int = 5) -> str:
        """The first lines of a file.

        Args:
            name: The file's path.
            lines: How many.
        """
        folder, leaf = self._file(name)
        return "\n".join(folder[leaf].splitlines()[: max(lines, 0)])

    def tail(self, name: str, lines: int = 5) -> str:
        """The last lines of a file.

        Args:
            name: The file's path.
            lines: How many.
        """
        folder, leaf = self._file(name)
        kept = folder[leaf].splitlines()
        return "\n".join(kept[len(kept) - max(lines, 0) :] if lines > 0 else [])

    def diff(self, first: str, second: str) -> str:
        """Lines that are in one file and not in the other.

        Args:
            first: A file's path.
            second: Another file's path.
        """
        a_folder, a = self._file(first)
        b_folder, b = self._file(second)
        left, right = a_folder[a].splitlines(), b_folder[b].splitlines()
        lines = [f"< {line}" for line in left if line not in right] + [
            f"> {line}" for line in right if line not in left
        ]
        return "\n".join(lines) or "the files are the same"

    def tree(self) -> str:
        """Everything under the current folder, indented."""

        def show(node: Tree, indent: str) -> list[str]:
            lines = []
            for name, value in sorted(node.items()):
                lines.append(indent + name + ("/" if isinstance(value, dict) else ""))
                if isinstance(value, dict):
                    lines += show(value, indent + "  ")
            return lines

        return "\n".join(show(self._folder(self.cwd, "."), "")) or "(empty)"

    def replace(self, name: str, old: str, new: str) -> str:
        """Replace every occurrence of a text in a file.

        Args:
            name: The file's path.
            old: The text to replace.
            new: What to put instead.
        """
        folder, leaf = self._file(name)
        if not old:
            raise ValueError("old must not be empty")
        count = folder[leaf].count(old)
        folder[leaf] = folder[leaf].replace(old, new)
        return f"replaced {count} occurrence(s) in {name}"

    def uniq(self, name: str) -> str:
        """A file's lines without repeats, in order (the file is not changed).

        Args:
            name: The file's path.
        """
        folder, leaf = self._file(name)
        return "\n".join(dict.fromkeys(folder[leaf].splitlines()))

    def stat(self, name: str) -> str:
        """Whether a path is a file or a folder, and its size (characters, or entries).

        Args:
            name: The path.
        """
        parent, leaf = self._parent(name)
        if leaf not in parent:
            raise ValueError(f"no file or folder {name!r}")
        value = parent[leaf]
        return f"folder, {len(value)} entries" if isinstance(value, dict) else f"file, {len(value)} characters"

    def exists(self, name: str) -> str:
        """Whether a file or folder exists (yes or no).

        Args:
            name: The path.
        """
        try:
            parent, leaf = self._parent(name)
        except ValueError:
            return "no"
        return "yes" if leaf in parent else "no"


TOOL_NAMES = [n for n in vars(FileSystem) if not n.startswith("_") and n != "snapshot"]
"""The methods that are tools, in definition order (24)."""
CORE_TOOLS = ["ls", "cd", "pwd", "cat", "mkdir", "mv"]
"""Tools every task offers (looking around, and the two of the in-context examples); the others a task offers
are the ones its reference calls use, and a few more."""
