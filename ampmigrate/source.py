"""Reading and writing Python source files without losing a byte.

A file is read as bytes and decoded the way Python itself would (PEP 263 cookie or UTF-8 BOM);
line endings are kept as they are (no universal-newline translation), so a CRLF file stays CRLF.
Writing re-encodes with the same encoding and BOM, through a temporary file in the same directory
and an atomic rename, keeping the file's permission bits.
"""

from __future__ import annotations

import codecs
import errno
import io
import os
import re
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from typing import List, Optional


# Python's line breaks: `str.splitlines` also splits at form feeds, \x1c-\x1e, \x85 and
# U+2028/2029, which Python (and libcst) treat as ordinary characters inside a line.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def split_lines(text: str, keepends: bool = False) -> List[str]:
    """`text.splitlines(keepends)`, but breaking lines only where Python does (CRLF, CR, LF)."""
    lines = []
    start = 0
    for match in _LINE_BREAK.finditer(text):
        lines.append(text[start : match.end() if keepends else match.start()])
        start = match.end()
    if start < len(text):
        lines.append(text[start:])
    return lines


def line_starts(text: str) -> List[int]:
    """Offsets where each line of `text` begins (see `split_lines`)."""
    return [0, *(match.end() for match in _LINE_BREAK.finditer(text))]


class SourceError(Exception):
    """A file that cannot be read or decoded; the message is one line and names no path."""


class FileTooLarge(SourceError):
    """A regular file larger than the limit it was read with; nothing was read."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size / (1024 * 1024):.1f} MiB exceeds the {limit / (1024 * 1024):.1f} MiB read limit")
        self.size = size


def read_regular_file(path: str, limit: Optional[int] = None) -> bytes:
    """The bytes of the regular file at `path`, or SourceError with a one-line reason.

    The one way ampmigrate reads a source file: it never blocks (a named pipe is opened
    non-blocking and refused), never reads a device (`/dev/zero` is refused before a byte is
    read), and with `limit`, never reads more than that (FileTooLarge, by the file's size).
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except IsADirectoryError:
        raise SourceError("is a directory, not a file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SourceError("symlink loop") from None
        raise SourceError(f"cannot read file: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)  # before fdopen, which refuses directories itself
    except OSError as exc:
        os.close(fd)
        raise SourceError(f"cannot read file: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        if stat.S_ISDIR(info.st_mode):
            raise SourceError("is a directory, not a file")
        raise SourceError("not a regular file (a pipe, socket or device)")
    if limit is not None and info.st_size > limit:
        os.close(fd)
        raise FileTooLarge(info.st_size, limit)
    with os.fdopen(fd, "rb") as handle:
        try:
            # A file that grew since fstat is read only up to the limit (and one byte to tell).
            data = handle.read() if limit is None else handle.read(limit + 1)
        except OSError as exc:
            raise SourceError(f"cannot read file: {exc.strerror or exc}") from None
    if limit is not None and len(data) > limit:
        raise FileTooLarge(len(data), limit)
    return data


@dataclass(frozen=True)
class SourceFile:
    path: str
    raw: bytes
    text: str
    encoding: str
    bom: bool

    @classmethod
    def read(cls, path: str) -> "SourceFile":
        return cls.from_bytes(path, read_regular_file(path))

    @classmethod
    def from_bytes(cls, path: str, raw: bytes) -> "SourceFile":
        if b"\x00" in raw:
            raise SourceError("contains NUL bytes; not a Python source file")
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        except SyntaxError as exc:
            # Without a cookie, detect_encoding fails on a first line that is not UTF-8.
            if not _COOKIE.search(b"\n".join(raw.splitlines()[:2])):
                _decode(raw, "utf-8")
            raise SourceError(f"bad encoding declaration: {exc.msg}") from None
        bom = raw.startswith(codecs.BOM_UTF8)
        text = _decode(raw, encoding)
        return cls(path=path, raw=raw, text=text, encoding=encoding, bom=bom)

    def encode(self, text: str) -> bytes:
        """Encode new text the way this file was encoded (same codec, same BOM)."""
        return text.encode(self.encoding)


_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=]", re.MULTILINE)


def _decode(raw: bytes, encoding: str) -> str:
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        # The offset in the file: utf-8-sig counts from after the BOM it strips.
        start = exc.start + (len(codecs.BOM_UTF8) if encoding == "utf-8-sig" and raw.startswith(codecs.BOM_UTF8) else 0)
        raise SourceError(f"not valid {encoding} text at byte {start} ({exc.reason})") from None
    except LookupError as exc:
        raise SourceError(f"not valid {encoding} text ({exc})") from None


def write_atomic(path: str, data: bytes, expected: bytes) -> None:
    """Replace `path` with `data` atomically, keeping its mode.

    Refuses (SourceError) when the file no longer holds `expected`, i.e. it changed on disk since
    it was read. A symlink is written through: its target is replaced, the link stays a link.
    """
    try:
        target = os.path.realpath(path)
        with open(target, "rb") as handle:
            current = handle.read()
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except OSError as exc:
        raise SourceError(f"cannot re-read before writing: {exc.strerror or exc}") from None
    if current != expected:
        raise SourceError("file changed on disk while it was being fixed; not written")
    directory = os.path.dirname(target) or "."
    try:
        # In the error handling too: a read-only directory is this file's error, not the run's.
        fd, tmp = tempfile.mkstemp(prefix=".ampmigrate-", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise SourceError(f"cannot write file: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise SourceError(f"cannot write file: {exc.strerror or exc}") from None
        raise
