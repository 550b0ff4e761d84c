"""veRL's ``verl.utils.hdfs_io``: ``exists``, ``makedirs`` and ``copy`` for local paths.

They are `verl.utils.fs`'s (one owner): local paths work as ``os.path.exists`` / ``os.makedirs`` /
``shutil.copy`` (``copytree`` for a folder); an ``hdfs://`` or other remote path raises ``NotImplementedError``
naming it, since nothing here can reach HDFS.
"""

from __future__ import annotations

from verl.utils.fs import copy, exists, is_non_local, makedirs

__all__ = ["copy", "exists", "is_non_local", "makedirs"]
