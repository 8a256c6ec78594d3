"""A sandboxed program's output as the host keeps it: the first and last characters (a traceback is at the end),
the count of all bytes, and whether it printed past the limit that stops it."""

from __future__ import annotations


class BoundedOutput:
    """What a program printed, kept within bounds: the first and last `cap` characters' worth of bytes and
    the count of all bytes read; more than `limit` bytes in all stop the program."""

    def __init__(self, cap: int, limit: int):
        self.cap, self.limit = cap, limit
        self.keep = max(4 * cap, 2**16)  # UTF-8 takes at most 4 bytes a character
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.over_limit = False

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[: max(0, len(self.tail) - self.keep)]
        self.over_limit = self.total > self.limit

    def text(self) -> str:
        cap = self.cap
        if len(self.head) + len(self.tail) == self.total:
            text = (bytes(self.head) + bytes(self.tail)).decode("utf-8", errors="replace")
            if len(text) > cap:
                head, tail = text[: cap // 2], text[-(cap - cap // 2) :]
                text = f"{head}\n... [{len(text) - cap} characters cut] ...\n{tail}"
        else:
            head = bytes(self.head).decode("utf-8", errors="replace")[: cap // 2]
            tail = bytes(self.tail).decode("utf-8", errors="replace")[-(cap - cap // 2) :]
            cut = self.total - len(head.encode()) - len(tail.encode())
            text = f"{head}\n... [{cut} bytes cut] ...\n{tail}"
        if self.over_limit:
            text += f"\n[output past {self.limit / 2**20:g} MB: the program was stopped]"
        return text
