"""Deterministic tars in the exact bytes Go's archive/tar writes.

An image recipe's copy step names a blob: the tar of its source, uploaded
once per content. The Go CLI and SDK make that tar with
``recipe.TarSource``; :func:`tar_source` makes the same bytes (so the same
digest) for the same tree: entries named relative to the source (a
directory itself has no entry), depth first with each directory's entries
in byte order of their names, directories with a trailing slash, uid and
gid 0, no user or group names, mtime 0, permission bits only (no setuid,
setgid or sticky), symlinks kept and never followed, hard links as separate
files; devices, fifos and sockets refused. Headers are USTAR, or PAX records
for what USTAR cannot hold, formatted as Go formats them, and the archive
ends with two zero blocks (no padding to a record).

:func:`write_tar` writes any list of :class:`Entry`; the code bundle of a
function uses it with normalised modes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from typing import BinaryIO, Iterable

BLOCK = 512
_NAME, _PREFIX = 100, 155


class TarTooLarge(ValueError):
    """The tar would be larger than allowed."""


@dataclasses.dataclass
class Entry:
    """One tar entry. ``kind`` is "file", "dir" or "symlink". A file's
    content is ``data``, or read from ``path`` (``size`` bytes)."""

    name: str
    kind: str
    mode: int
    data: bytes | None = None
    path: str | None = None
    size: int = 0
    linkname: str = ""


def _octal(n: int, width: int) -> bytes:
    """Go's formatOctal: zero-padded octal digits then a NUL."""
    s = format(n, "o").encode()
    if len(s) < width:
        s = b"0" * (width - len(s) - 1) + s
    return _field(s, width)


def _field(s: bytes, width: int) -> bytes:
    """Go's formatString: the bytes, NUL-terminated when shorter, cut when
    longer (with a trailing slash in the cut turned into the terminator)."""
    if len(s) < width:
        return s + b"\0" * (width - len(s))
    out = bytearray(s[:width])
    if len(s) > width and out[-1:] == b"/":
        n = len(bytes(out[:-1]).rstrip(b"/"))
        out[n] = 0
    return bytes(out)


def _split_ustar(name: bytes) -> tuple[bytes, bytes] | None:
    """Go's splitUSTARPath: (prefix, name) for a long ASCII name, or None."""
    length = len(name)
    if length <= _NAME or not name.isascii():
        return None
    if length > _PREFIX + 1:
        length = _PREFIX + 1
    elif name[length - 1:length] == b"/":
        length -= 1
    i = name.rfind(b"/", 0, length)
    nlen, plen = len(name) - i - 1, i
    if i <= 0 or nlen > _NAME or nlen == 0 or plen > _PREFIX:
        return None
    return name[:i], name[i + 1:]


def _header(name: bytes, typeflag: bytes, mode: int, size: int, linkname: bytes, prefix: bytes = b"",
            raw: bool = False) -> bytes:
    """A USTAR block (also the main block of a PAX entry), checksummed. A
    raw block (a PAX header's own) has no device numbers, as Go's
    writeRawFile leaves them."""
    b = bytearray(BLOCK)
    b[0:100] = _field(name, 100)
    b[100:108] = _octal(mode, 8)
    b[108:116] = _octal(0, 8)  # uid
    b[116:124] = _octal(0, 8)  # gid
    b[124:136] = _octal(size, 12)
    b[136:148] = _octal(0, 12)  # mtime
    b[156:157] = typeflag
    b[157:257] = _field(linkname, 100)
    b[257:263] = b"ustar\0"
    b[263:265] = b"00"
    # uname, gname: empty (NUL); devmajor, devminor: 0 in octal.
    if not raw:
        b[329:337] = _octal(0, 8)
        b[337:345] = _octal(0, 8)
    b[345:500] = _field(prefix, 155)
    b[148:156] = b" " * 8
    chk = sum(b)
    b[148:156] = _octal(chk, 7) + b" "
    return bytes(b)


def _pax_record(key: str, value: str) -> bytes:
    """Go's formatPAXRecord: "%d %s=%s\\n" whose length counts itself."""
    body = f" {key}={value}\n".encode()
    size = len(body) + 1
    while len(str(size).encode()) + len(body) != size:
        size = len(str(size).encode()) + len(body)
    return str(size).encode() + body


def _to_ascii(s: str) -> bytes:
    return "".join(c for c in s if ord(c) < 0x80 and c != "\0").encode()


def _headers_for(name: str, typeflag: bytes, mode: int, size: int, linkname: str) -> bytes:
    """The header block(s) Go's tar.Writer writes for an entry: USTAR when
    it can hold the entry (splitting a long name), else a PAX header first."""
    bname, blink = name.encode(), linkname.encode()
    pax: dict[str, str] = {}
    ustar_ok = True
    if not bname.isascii() or len(bname) > _NAME:
        pax["path"] = name
        if _split_ustar(bname) is None:
            ustar_ok = False
    if not blink.isascii() or len(blink) > _NAME:
        pax["linkpath"] = linkname
        ustar_ok = False
    if ustar_ok:
        split = _split_ustar(bname)
        prefix = b""
        if split is not None:
            prefix, bname = split
        return _header(bname, typeflag, mode, size, blink, prefix)
    records = b"".join(_pax_record(k, pax[k]) for k in sorted(pax))
    # path.Join(dir, "PaxHeaders.0", file) on path.Split(name).
    dir_part, file_part = _path_split(name)
    pax_name = _path_join(dir_part, "PaxHeaders.0", file_part)
    pax_name_b = _to_ascii(pax_name)[:_NAME].rstrip(b"/")
    out = _header(pax_name_b, b"x", 0, len(records), b"", raw=True)
    out += records + b"\0" * (-len(records) % BLOCK)
    out += _header(_to_ascii(name), typeflag, mode, size, _to_ascii(linkname))
    return out


def _path_split(p: str) -> tuple[str, str]:
    """Go's path.Split: everything up to and including the last slash."""
    i = p.rfind("/")
    return p[: i + 1], p[i + 1:]


def _path_join(*parts: str) -> str:
    """Go's path.Join: join non-empty parts with slashes, then Clean."""
    joined = "/".join(x for x in parts if x)
    if not joined:
        return ""
    rooted = joined.startswith("/")
    out: list[str] = []
    for seg in joined.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if out and out[-1] != "..":
                out.pop()
            elif not rooted:
                out.append("..")
            continue
        out.append(seg)
    s = "/".join(out)
    return ("/" + s) if rooted else (s or ".")


class _Sink:
    """Writes to a file while hashing and counting, within max_bytes."""

    def __init__(self, out: BinaryIO, max_bytes: int) -> None:
        self.out, self.max, self.n = out, max_bytes, 0
        self.h = hashlib.sha256()

    def write(self, b: bytes) -> None:
        if self.n + len(b) > self.max:
            raise TarTooLarge(f"more than {self.max} bytes")
        self.out.write(b)
        self.h.update(b)
        self.n += len(b)


def write_tar(entries: Iterable[Entry], out: BinaryIO, max_bytes: int = 1 << 62) -> tuple[str, int]:
    """Write entries as a tar to out; return ("sha256:<hex>", size)."""
    sink = _Sink(out, max_bytes)
    for e in entries:
        if e.kind == "dir":
            name = e.name if e.name.endswith("/") else e.name + "/"
            sink.write(_headers_for(name, b"5", e.mode & 0o777, 0, ""))
        elif e.kind == "symlink":
            sink.write(_headers_for(e.name, b"2", e.mode & 0o777, 0, e.linkname))
        elif e.kind == "file":
            size = len(e.data) if e.data is not None else e.size
            if size > max_bytes:
                raise TarTooLarge(f"{e.name}: {size} bytes, more than {max_bytes}")
            sink.write(_headers_for(e.name, b"0", e.mode & 0o777, size, ""))
            if e.data is not None:
                sink.write(e.data)
            else:
                _copy_file(e, sink)
            if size % BLOCK:
                sink.write(b"\0" * (BLOCK - size % BLOCK))
        else:
            raise ValueError(f"tar entry {e.name}: unknown kind {e.kind!r}")
    sink.write(b"\0" * (2 * BLOCK))
    return "sha256:" + sink.h.hexdigest(), sink.n


def _copy_file(e: Entry, sink: _Sink) -> None:
    """Copy a file's bytes, refusing one that changed since it was listed."""
    assert e.path is not None
    fd = os.open(e.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size != e.size:
            raise OSError(f"tar {e.path}: changed while taring")
        left = e.size
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                raise OSError(f"tar {e.path}: changed while taring (read {e.size - left} of {e.size} bytes)")
            sink.write(chunk)
            left -= len(chunk)


def _kind_of(path: str, st: os.stat_result) -> Entry:
    m = st.st_mode
    if stat.S_ISREG(m):
        return Entry(name="", kind="file", mode=stat.S_IMODE(m) & 0o777, path=path, size=st.st_size)
    if stat.S_ISDIR(m):
        return Entry(name="", kind="dir", mode=stat.S_IMODE(m) & 0o777)
    if stat.S_ISLNK(m):
        return Entry(name="", kind="symlink", mode=stat.S_IMODE(m) & 0o777, linkname=os.readlink(path))
    what = ("a fifo" if stat.S_ISFIFO(m) else "a socket" if stat.S_ISSOCK(m) else
            "a character device" if stat.S_ISCHR(m) else "a device" if stat.S_ISBLK(m) else "an irregular file")
    raise ValueError(f"tar {path}: {what} not supported (only regular files, directories and symlinks can be copied)")


def source_entries(src: str) -> list[Entry]:
    """The entries recipe.TarSource writes for the local file or directory
    src: a directory's tree (without the directory itself), or one file
    under its base name."""
    st = os.lstat(src)
    if not stat.S_ISDIR(st.st_mode):
        e = _kind_of(src, st)
        e.name = os.path.basename(src.rstrip("/")) or src
        return [e]
    out: list[Entry] = []

    def walk(d: str, rel: str) -> None:
        names = sorted(os.listdir(d), key=os.fsencode)
        for n in names:
            p = os.path.join(d, n)
            r = f"{rel}/{n}" if rel else n
            e = _kind_of(p, os.lstat(p))
            e.name = r
            out.append(e)
            if e.kind == "dir":
                walk(p, r)

    walk(src, "")
    return out


def tar_source(src: str, out: BinaryIO, max_bytes: int) -> tuple[str, int]:
    """recipe.TarSource in Python: write the deterministic tar of src to
    out and return its digest and size (see the module doc)."""
    try:
        return write_tar(source_entries(src), out, max_bytes)
    except TarTooLarge as e:
        raise TarTooLarge(f"tar {src}: copy source too large: {e}") from None
