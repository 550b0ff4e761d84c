"""File-system helpers at veRL's import path (``verl.utils.fs``), for local paths only.

veRL copies ``hdfs://`` checkpoints and models into a local cache before use. This verl reads local paths (and
Hugging Face Hub names, which ``transformers`` resolves itself); a remote URL raises ``NotImplementedError`` naming
the path, instead of failing later with a confusing "file not found".

The cache itself is veRL's: for a path :func:`is_non_local` accepts, :func:`copy_to_local` copies it once (under a
file lock) into ``<cache_dir>/<md5(src)>/<basename>`` with :func:`copy`, records a copied folder's tree and copies
again when the cached tree no longer matches the record. :func:`copy` here reads local paths only, so an
``hdfs://`` source still ends in its ``NotImplementedError``; a site that can read HDFS replaces ``copy``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile

__all__ = [
    "copy",
    "copy_local_path_from_hdfs",
    "copy_to_local",
    "copy_to_shm",
    "exists",
    "get_local_temp_path",
    "is_non_local",
    "local_mkdir_safe",
    "makedirs",
    "md5_encode",
    "verify_copy",
]

logger = logging.getLogger(__name__)

_HDFS_PREFIX = "hdfs://"
# "scheme://..." with a scheme of two or more letters; a Windows drive ("C:\\") or a plain path has none.
_REMOTE_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+://")
_SHM_ROOT = "/dev/shm/verl-cache"


def is_non_local(path: str) -> bool:
    """True when ``path`` is an HDFS path (``hdfs://...``), as in veRL."""
    return str(path).startswith(_HDFS_PREFIX)


def _remote_scheme(path: str) -> str | None:
    """The URL scheme of ``path`` (``"hdfs"``, ``"s3"``...), or None for a local path; ``file://`` counts as local."""
    match = _REMOTE_SCHEME.match(str(path))
    if not match:
        return None
    scheme = match.group(0)[:-3].lower()
    return None if scheme == "file" else scheme


def _local(path: str, arg: str = "path") -> str:
    """``path`` as a local path (``~`` expanded, ``file://`` stripped); a remote URL raises NotImplementedError."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"{arg} must be a path string, got {type(path).__name__}: {path!r}")
    path = os.fspath(path)
    scheme = _remote_scheme(path)
    if scheme is not None:
        what = "HDFS" if scheme == "hdfs" else f"{scheme}://"
        raise NotImplementedError(
            f"{arg}={path!r}: {what} paths are not supported here (only local paths and Hugging Face Hub names); "
            "copy the files to a local or shared filesystem first"
        )
    if path.startswith("file://"):
        path = path[len("file://") :]
    return os.path.expanduser(path)


def md5_encode(path: str) -> str:
    """Hex MD5 of the path string (names cache folders and lock files)."""
    return hashlib.md5(str(path).encode()).hexdigest()


def get_local_temp_path(hdfs_path: str, cache_dir: str) -> str:
    """``<cache_dir>/<md5(hdfs_path)>/<basename(hdfs_path)>``; the hashed folder is created."""
    folder = os.path.join(cache_dir, md5_encode(hdfs_path))
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, os.path.basename(str(hdfs_path).rstrip("/")))


def exists(path: str, **kwargs) -> bool:
    """Whether the local ``path`` exists (remote URLs raise NotImplementedError)."""
    return os.path.exists(_local(path))


def makedirs(name: str, mode: int = 0o777, exist_ok: bool = False, **kwargs) -> None:
    """``os.makedirs`` on a local path (remote URLs raise NotImplementedError)."""
    os.makedirs(_local(name, "name"), mode=mode, exist_ok=exist_ok)


def copy(src: str, dst: str, **kwargs) -> bool:
    """Copy a local file or folder tree ``src`` to ``dst`` (folders merge into an existing ``dst``)."""
    src, dst = _local(src, "src"), _local(dst, "dst")
    if os.path.isdir(src):
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)
    return True


def _tree(root: str) -> dict[str, int]:
    """Relative path → size (``-1`` for folders) of everything under ``root``."""
    entries: dict[str, int] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            entries[os.path.relpath(os.path.join(folder, name), root)] = -1
        for name in files:
            full = os.path.join(folder, name)
            entries[os.path.relpath(full, root)] = os.path.getsize(full)
    return entries


def verify_copy(src: str, dest: str) -> bool:
    """True when ``dest`` holds the same files and folders as ``src``, with the same sizes."""
    if not (os.path.exists(src) and os.path.exists(dest)) or os.path.isfile(src) != os.path.isfile(dest):
        return False
    if os.path.isfile(src):
        return os.path.getsize(src) == os.path.getsize(dest)
    return _tree(src) == _tree(dest)


_RECORD_NAME = ".directory_record.json"


def _tree_without_record(folder: str) -> dict[str, int]:
    return {path: size for path, size in _tree(folder).items() if path != _RECORD_NAME}


def _record_directory_structure(folder_path: str | os.PathLike) -> str:
    """Write the tree of ``folder_path`` (relative path → size, -1 for folders) into a record file inside it and
    return the record's path (veRL's helper; the record itself is left out of the tree)."""
    folder = os.fspath(folder_path)
    record_file = os.path.join(folder, _RECORD_NAME)
    with open(record_file, "w") as f:
        json.dump(_tree_without_record(folder), f, sort_keys=True)
    return record_file


def _check_directory_structure(folder_path: str | os.PathLike, record_file: str | os.PathLike) -> bool:
    """True when ``folder_path`` holds exactly the files and folders (and file sizes) of ``record_file``; False when
    the record is missing, unreadable or differs."""
    try:
        with open(record_file) as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        return False
    return recorded == _tree_without_record(os.fspath(folder_path))


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)


def _copy_into_cache(src: str, cache_dir: str | None, verbose: bool, always_recopy: bool) -> str:
    """veRL's cache of a non-local ``src``: ``<cache_dir>/<md5(src)>/<basename>``, copied once with :func:`copy`."""
    from filelock import FileLock

    cache_dir = os.fspath(cache_dir) if cache_dir is not None else tempfile.gettempdir()
    os.makedirs(cache_dir, exist_ok=True)
    local = get_local_temp_path(src, cache_dir)
    with FileLock(os.path.join(cache_dir, md5_encode(src) + ".lock")):
        if always_recopy and os.path.exists(local):
            _remove(local)
        if os.path.isdir(local) and not _check_directory_structure(local, os.path.join(local, _RECORD_NAME)):
            logger.warning("cached copy %s of %s is incomplete or changed: copying again", local, src)
            _remove(local)
        if not os.path.exists(local):
            if verbose:
                logger.info("copying %s to %s", src, local)
            copy(src, local)
            if os.path.isdir(local):
                _record_directory_structure(local)
    return local


def copy_to_shm(src: str) -> str:
    """Copy the local ``src`` into ``/dev/shm/verl-cache/<md5>/`` (once; reused while it matches) and return it.

    The copy is written beside its place and renamed into it, so ranks copying at once never read a partial one.
    """
    src = os.path.abspath(_local(src, "src"))
    dest = os.path.join(_SHM_ROOT, md5_encode(src), os.path.basename(src))
    if os.path.exists(dest) and verify_copy(src, dest):
        logger.info("reusing the shared-memory copy %s of %s", dest, src)
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".copy-", dir=os.path.dirname(dest))
    try:
        copy(src, os.path.join(staging, "copy"))
        if os.path.exists(dest) and not verify_copy(src, dest):
            shutil.rmtree(dest, ignore_errors=True) if os.path.isdir(dest) else os.remove(dest)
        try:
            os.rename(os.path.join(staging, "copy"), dest)
        except OSError:  # another process put its (complete) copy there first
            if not verify_copy(src, dest):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("copied %s to shared memory: %s", src, dest)
    return dest


def copy_to_local(
    src: str,
    cache_dir: str | None = None,
    filelock: str = ".file.lock",
    verbose: bool = False,
    always_recopy: bool = False,
    use_shm: bool = False,
) -> str:
    """The local path to read ``src`` from.

    A local path (or a Hugging Face Hub name) is returned as is, with ``~`` expanded; ``use_shm`` first copies a
    local path into ``/dev/shm``. A path :func:`is_non_local` accepts (``hdfs://``) goes through veRL's cache in
    ``cache_dir`` (default: the system temp folder; ``always_recopy`` copies again), whose transfer is :func:`copy`:
    it refuses remote paths with ``NotImplementedError``. Other remote URLs raise ``NotImplementedError`` at once.
    ``filelock`` is accepted for veRL compatibility (the lock is named after the source's hash, as in veRL).
    """
    local = copy_local_path_from_hdfs(src, cache_dir, filelock, verbose, always_recopy)
    if use_shm:
        if not os.path.exists(local):
            raise FileNotFoundError(f"copy_to_local(use_shm=True): src={src!r} is not an existing local path")
        return copy_to_shm(local)
    return local


def copy_local_path_from_hdfs(
    src: str,
    cache_dir: str | None = None,
    filelock: str = ".file.lock",
    verbose: bool = False,
    always_recopy: bool = False,
) -> str:
    """Deprecated veRL name of :func:`copy_to_local` (without ``use_shm``); same rules."""
    if is_non_local(src):
        return _copy_into_cache(os.fspath(src).rstrip("/"), cache_dir, verbose, always_recopy)
    local = _local(src, "src")
    if verbose:
        logger.info("copy_to_local: %s is local, nothing to copy", local)
    return local


def local_mkdir_safe(path: str) -> str:
    """Create the folder ``path`` (relative to the working directory if not absolute), safe when several processes
    do it at once; returns the absolute path."""
    path = os.path.abspath(_local(path))
    os.makedirs(path, exist_ok=True)  # exist_ok makes concurrent creation race-free
    return path
