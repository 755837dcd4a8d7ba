"""Making the files of a new store (``init``) or witness, and only those.

Each file is created exclusively, so no run takes another's file for its own; a file
that cannot be made is reported against what stands in the way (its directory, most
often), never against a temporary name; a run that fails removes what it made, each
file only while it is still the one it made; and one init of a store runs at a time.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from .errors import DeleaturError, NotFoundError, StoreError
from .sqlitefile import sidecar_files

try:
    import fcntl
except ImportError:  # Windows: init_lock falls back to a lock file created exclusively
    _FLOCK = False
else:
    _FLOCK = True


def store_file(store_path: Path, path: Path, others: Iterable[Path] = ()) -> bool:
    """Whether ``path`` is one of a store's own files, or could become one: a file named
    after the store beside it (the database and its -wal, the key store, the signing and
    master keys, their locks...), one of ``others`` (a master key file kept elsewhere),
    or a link to any of them. Written over, it would destroy the store, its keys among it."""
    # The files are named after the store's path as given (a link, say) and the database
    # is the file it leads to: both are the store's names. Each is compared in its real
    # directory, as is the output, as named and as it leads.
    stores = {(p.parent.resolve(), p.name) for p in (store_path.absolute(), store_path.resolve())}
    targets = {(p.parent.resolve(), p.name) for p in (path.absolute(), path.resolve())}
    if any(t_dir == s_dir and name.startswith(prefix) for t_dir, name in targets for s_dir, prefix in stores):
        return True
    if not path.exists():
        return False
    beside: list[Path] = []
    for directory, prefix in stores:
        with contextlib.suppress(OSError):  # a directory that cannot be listed: no link found there
            beside += [p for p in directory.iterdir() if p.name.startswith(prefix)]
    for other in [*others, *beside]:  # a hard link to one of them
        with contextlib.suppress(OSError):
            if os.path.samefile(path, other):
                return True
    return False


# Errors of a new file that are its directory's: no file at all can be made there.
_DIRECTORY_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR})


def check_directory(directory: Path) -> None:
    """Refuse a directory that is missing, not a directory, or out of reach, before any
    file is made for it. Whether files may be written there is left to the first one
    made, whose error names the directory (:func:`creation_problem`): a check of the
    mode would miss what else forbids it (a read-only file system, an immutable
    directory, ACLs) and deny root what it may do."""
    try:
        mode = os.stat(directory).st_mode
    except FileNotFoundError:
        raise NotFoundError(f"directory {directory} does not exist") from None
    except OSError as exc:
        raise StoreError(f"cannot use directory {directory}: {exc.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise StoreError(f"{directory} is not a directory")


def creation_problem(path: Path, exc: OSError) -> str:
    """What kept ``path`` from being made, naming its directory where no file can be made
    there at all, so the message points at what to fix."""
    if os.path.lexists(path):
        return f"cannot open {path}: {exc.strerror}"
    if exc.errno in _DIRECTORY_ERRNOS:
        return f"cannot create files in directory {path.parent}: {exc.strerror}"
    return f"cannot create {path}: {exc.strerror}"


class Made:
    """The files a run made: as a context manager, removed if its block fails."""

    def __init__(self) -> None:
        self._files: list[tuple[Path, os.stat_result, int | None, bool]] = []

    def add(self, path: Path, made: os.stat_result, *, database: bool = False) -> None:
        """``path``, just made (``made`` is what its creation returned), is removed if the
        run fails, as long as it is still that file: by its path alone, another process's
        file put in its place would go instead.

        A file is held open until then, so that no file made later can take its identity
        (inode) if it was removed. A database is not: SQLite holds it open while it is in
        use, and a descriptor of ours on it, once closed, would drop the locks SQLite
        holds on it. SQLite's files beside a database go with it: only connections to it
        can have made them, as long as the run refused to begin where any was already
        there (a store removed while a process still had it open leaves its -wal and
        -shm, which SQLite would take up for a new one)."""
        held = None
        if not database:
            held = os.open(path, os.O_RDONLY)
            if not os.path.samestat(os.fstat(held), made):
                os.close(held)
                return
        self._files.append((path, made, held, database))

    def __enter__(self) -> Made:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        files, self._files = self._files, []
        for path, made, held, database in reversed(files):
            ours = error is not None and _is_still(path, made)
            if held is not None:
                os.close(held)  # before the removal: Windows refuses to remove a file open
            if ours:
                for part in sidecar_files(path) if database else [path]:
                    # What cannot be removed stays, and the rest go all the same: the
                    # run's own error says more than this one.
                    with contextlib.suppress(OSError):
                        part.unlink(missing_ok=True)


def _is_still(path: Path, made: os.stat_result) -> bool:
    try:
        return os.path.samestat(os.stat(path), made)
    except OSError:
        return False


@contextmanager
def making(error: type[DeleaturError], what: str) -> Iterator[Made]:
    """Files made in the block (``Made.add``) are removed if it fails, and an OS error is
    raised as ``error``: a file found in the way as refusing to overwrite ``what``,
    any other naming the file or its directory."""
    try:
        with Made() as made:
            yield made
    except FileExistsError as exc:
        raise error(f"{exc.filename} already exists; refusing to overwrite {what}") from None
    except OSError as exc:
        if exc.filename is None:
            raise
        raise error(creation_problem(Path(os.fsdecode(exc.filename)), exc)) from None


@contextmanager
def init_lock(store_path: Path) -> Iterator[None]:
    """Hold the lock of the store's init, so that a second init is refused at once.
    Without it, the second took the first one's files, half made, for what a killed
    init leaves, and finished them as its own, or removed them as it failed."""
    lock_path = store_path.with_name(store_path.name + ".init-lock")
    with exclusive_lock(lock_path, f"another init is creating {store_path}", StoreError):
        yield


@contextmanager
def exclusive_lock(lock_path: Path, busy: str, error: type[DeleaturError]) -> Iterator[None]:
    """Hold ``lock_path``, locked (flock) while the block runs; another holder meanwhile
    is refused at once with ``error``, saying ``busy``. The kernel drops the lock of a
    killed process; its file stays, and the next holder takes it. The file is removed as
    the lock is released: a process that opened it before finds it gone once locked, and
    opens the new one.

    Without flock (Windows), the file is the lock: created exclusively, removed as the
    block ends. A killed holder leaves it, and later ones are refused, naming it, until
    someone who knows that none runs removes it."""
    held = None
    if _FLOCK:
        held = _flock(lock_path, busy, error)
    else:
        _create_lock_file(lock_path, busy, error)
    try:
        yield
    finally:
        # A lock file left (its directory made read-only since a killed holder left it)
        # is taken up by the next holder, or named by its refusal; failing here would
        # hide how this one ended.
        with contextlib.suppress(OSError):
            lock_path.unlink()
        if held is not None:
            os.close(held)


def _create_lock_file(lock_path: Path, busy: str, error: type[DeleaturError]) -> None:
    try:
        os.close(os.open(lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        raise error(f"{busy}, or one was killed: if none is running, remove {lock_path}; nothing was changed") from None
    except OSError as exc:
        raise error(creation_problem(lock_path, exc)) from None


def _flock(lock_path: Path, busy: str, error: type[DeleaturError]) -> int:
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise error(creation_problem(lock_path, exc)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.fstat(fd), os.stat(lock_path)):
                return fd
        except BlockingIOError:
            os.close(fd)
            raise error(f"{busy}; nothing was changed") from None
        except FileNotFoundError:
            pass
        except OSError as exc:
            os.close(fd)
            raise error(f"cannot lock {lock_path}: {exc.strerror}") from None
        os.close(fd)
