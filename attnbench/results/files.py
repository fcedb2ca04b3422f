"""Files in a run directory, created without following links.

Run directories sit on shared filesystems, where a neighbour may plant a symbolic link at any
name attnbench will write (``driver.json.<pid>.tmp``, ``.clock.<host>.<pid>``,
``dashboard/index.html``) hoping attnbench follows it and overwrites a file outside. So every
file attnbench writes in one is made here:

* a whole file (manifest, driver state, a dashboard page, a figure, an export) is written to a
  new temporary file in the target's own directory -- a random name, created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW``, so nothing planted is opened -- then renamed over the
  target (:func:`write_atomic`; ``rename`` replaces a link at the target, never what it
  points to), or linked to it when it must not exist yet (``replace=False``);
* a file appended to (the journal, ``driver.log``) is opened with ``O_NOFOLLOW``
  (:func:`open_append`): a link there is refused, one line, never followed;
* a scratch file whose name others must not guess (the lock's note, the filesystem-clock probe)
  is :func:`create_temp`.

Reads are bounded elsewhere (:func:`attnbench.validation.read_bounded`,
:mod:`attnbench.results.journal`).
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import BinaryIO, Callable

CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) \
    | getattr(os, "O_CLOEXEC", 0)
APPEND_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) \
    | getattr(os, "O_CLOEXEC", 0)
MODE = 0o666
"""Files are made as ``open()`` makes them (the umask decides; a run directory is read by
teammates); pass ``0o600`` for what only its owner may read."""
_TRIES = 100
"""Random names tried before giving up: 64 random bits each, so a clash means a neighbour is
creating names faster than chance allows -- refused rather than looped on."""


def create_temp(directory: Path | str, prefix: str, mode: int = MODE) -> tuple[int, Path]:
    """A new file ``<prefix><16 hex>.tmp`` in ``directory``, opened for writing: ``(fd, path)``.
    Never an existing file or link (``O_EXCL | O_NOFOLLOW``)."""
    directory = Path(directory)
    for _ in range(_TRIES):
        path = directory / f"{prefix}{secrets.token_hex(8)}.tmp"
        try:
            return os.open(path, CREATE_FLAGS, mode), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name after {_TRIES} tries",
                          str(directory))


def write_atomic(path: Path | str, data: bytes | str | Callable[[BinaryIO], None], *,
                 mode: int = MODE, sync: bool = False, replace: bool = True) -> None:
    """``path`` holds ``data``, whole, or is unchanged: written to :func:`create_temp` beside it,
    then renamed over it (``replace``) or hard-linked to it (not ``replace``: raises
    :class:`FileExistsError` when ``path`` exists, whatever it is). ``data`` may be a function
    that writes it to the open file (a table written in chunks, never whole in memory).
    ``sync``: on disk before the rename (for what a power loss must not empty). Raises
    :class:`OSError`; no temporary file is left behind."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = create_temp(path.parent, f".{path.name[:100]}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    finally:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass  # renamed into place


def _link_new(tmp: Path, path: Path) -> None:
    """Put ``tmp`` at ``path`` only if nothing is there: ``link(2)`` fails on any existing
    name, a dangling link included. A filesystem without hard links gets an ``O_EXCL`` create
    of ``path`` itself, ``tmp`` copied in (not atomic for readers, still never an overwrite)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV,
                             errno.EMLINK):
            raise
        fd = os.open(path, CREATE_FLAGS, MODE)
        with os.fdopen(fd, "wb") as fh, open(tmp, "rb") as source:
            shutil.copyfileobj(source, fh)


def open_append(path: Path | str, mode: int = MODE) -> BinaryIO:
    """``path`` opened for appending (created if absent), never through a link and never
    waiting: a link there raises :class:`OSError` (``ELOOP``), a FIFO or device (which would
    block the writer until a reader came) ``EINVAL``; :func:`refusal` words both."""
    try:
        fd = os.open(path, APPEND_FLAGS | getattr(os, "O_NONBLOCK", 0), mode)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # a FIFO without a reader, opened without waiting
            raise
        raise OSError(errno.EINVAL, NOT_REGULAR, str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, NOT_REGULAR, str(path))
    os.set_blocking(fd, True)  # a regular file: writes as ever
    return os.fdopen(fd, "ab")


NOT_REGULAR = "is not a regular file (a FIFO or a device); attnbench appends only to files"


def open_update(path: Path | str) -> BinaryIO:
    """An existing ``path`` opened for reading and writing (``rb+``), never through a link."""
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags), "rb+")


def refusal(exc: OSError) -> str:
    """Why a write failed, in words: a link met where a file was expected is named as one."""
    if exc.errno == errno.ELOOP:
        return "is a symbolic link; attnbench does not write through links in a run directory"
    return exc.strerror or str(exc)  # NOT_REGULAR for a FIFO or a device
