"""The sandbox launcher: pid 1 of the sandbox's new namespaces (see :mod:`verl.tools.sandbox`).

It runs on its own — ``python -I -S -c <this file's source> --sandbox-launcher FD`` — with the standard library only:
it reads its JSON config (code, limits, paths) from stdin, builds the new root (a tmpfs with read-only binds of the
system and Python directories), chroots, forks the program (rlimits, no capabilities, its own uid) and reports set-up
failures, readiness and the program's exit status as JSON lines on ``FD``.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import signal
import socket
import sys
from pathlib import Path
from typing import Any

SETUP_FAILED = 120  # exit code when isolation could not be set up
_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin")
_DEVICES = ("null", "zero", "urandom")
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_SECUREBITS, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 28, 24, 38, 47
_SECBIT_NOROOT_AND_LOCK, _PR_CAP_AMBIENT_CLEAR_ALL = 0b11, 4


def launcher_main(status_fd: int) -> None:
    os.set_inheritable(status_fd, False)
    os.umask(0o022)
    try:
        config = json.loads(sys.stdin.buffer.read())
        _build_root(config)
        pid = _start_program(config)
    except Exception as exc:  # report any set-up failure; the parent then refuses the run
        _report(status_fd, {"setup_error": f"{type(exc).__name__}: {exc}"})
        os._exit(SETUP_FAILED)
    _report(status_fd, {"ready": True})
    _, wait_status, usage = os.wait4(pid, 0)
    cpu = usage.ru_utime + usage.ru_stime
    if os.WIFSIGNALED(wait_status):
        _report(status_fd, {"signal": signal.Signals(os.WTERMSIG(wait_status)).name, "cpu": cpu})
    else:
        _report(status_fd, {"exit_code": os.waitstatus_to_exitcode(wait_status), "cpu": cpu})
    os._exit(0)


def _report(fd: int, message: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def _libc_call(what: str, name: str, *args: Any) -> None:
    """Call libc's ``name``; a nonzero return raises OSError describing ``what`` failed."""
    if getattr(ctypes.CDLL(None, use_errno=True), name)(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _prctl(option: int, arg: int) -> None:
    _libc_call(f"prctl({option}, {arg})", "prctl", option, *(ctypes.c_ulong(value) for value in (arg, 0, 0, 0)))


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = [None if value is None else value.encode() for value in (source, target, fstype, data)]
    _libc_call(f"mount {target} (flags {flags:#x})", "mount", *encode[:3], ctypes.c_ulong(flags), encode[3])


def _bind_readonly(source: str, target: str) -> None:
    """Bind ``source`` at ``target``, then remount it read-only, nosuid, nodev (keeping flags the source has)."""
    os.makedirs(target, mode=0o755, exist_ok=True)
    _mount(source, target, None, _MS_BIND)
    kept = os.statvfs(target).f_flag & (_MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _mount(None, target, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | kept)


def _build_root(config: dict[str, Any]) -> None:
    """Make the new root (tmpfs on the host temp dir), fill it and chroot into it."""
    root, uid, limits = config["root"], config["uid"], config["limits"]
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={limits['tmpfs_mb']}m,nr_inodes=16384,mode=0755")
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isdir(path):
            _bind_readonly(path, root + path)
    prefix = config["prefix"]
    if not any(os.path.commonpath([prefix, path]) == path for path in _SYSTEM_DIRS):
        _bind_readonly(prefix, root + prefix)
    os.mkdir(root + "/dev", 0o755)
    for name in _DEVICES:
        Path(root, "dev", name).touch()
        _mount(f"/dev/{name}", f"{root}/dev/{name}", None, _MS_BIND)
    os.mkdir(root + "/tmp")
    os.chmod(root + "/tmp", 0o1777)
    os.mkdir(root + "/work", 0o700)
    Path(root, "work", "main.py").write_text(config["code"], encoding="utf-8", errors="surrogatepass")
    if uid is not None:
        for path in ("/work", "/work/main.py"):
            os.chown(root + path, uid, uid)
    socket.sethostname("sandbox")
    os.chroot(root)
    os.chdir("/")
    if not os.access(config["python"], os.X_OK):
        raise FileNotFoundError(f"the interpreter {config['python']} is not inside the sandbox root")


def _start_program(config: dict[str, Any]) -> int:
    """Fork the user program; returns its pid once it has exec'd (raises if its set-up failed)."""
    err_r, err_w = os.pipe()  # close-on-exec: EOF without data means the exec succeeded
    pid = os.fork()
    if pid == 0:
        os.close(err_r)
        try:
            _exec_program(config)
        except BaseException as exc:
            os.write(err_w, f"{type(exc).__name__}: {exc}".encode())
        os._exit(SETUP_FAILED)
    os.close(err_w)
    with os.fdopen(err_r, "rb") as pipe:
        failure = pipe.read().decode(errors="replace")
    if failure:
        os.waitpid(pid, 0)
        raise RuntimeError(f"program set-up failed: {failure}")
    return pid


def _exec_program(config: dict[str, Any]) -> None:
    limits = config["limits"]
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    megabyte = 1 << 20
    for which, value in (
        (resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1)),  # SIGXCPU, then SIGKILL
        (resource.RLIMIT_AS, limits["memory_mb"] * megabyte),
        (resource.RLIMIT_FSIZE, limits["max_file_mb"] * megabyte),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, limits["max_processes"]),
    ):
        resource.setrlimit(which, value if isinstance(value, tuple) else (value, value))
    _drop_privileges(config["uid"])
    os.chdir("/work")
    python = config["python"]
    os.execv(python, [python, "-I", "-S", "-B", "/work/main.py", config["run_id"]])


def _drop_privileges(uid: int | None) -> None:
    """No capabilities after exec (even as namespace root), no new privileges; switch to ``uid`` when given."""
    _prctl(_PR_SET_SECUREBITS, _SECBIT_NOROOT_AND_LOCK)
    for cap in range(64):
        try:
            _prctl(_PR_CAPBSET_DROP, cap)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: past the kernel's last capability
                raise
            break
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


if __name__ == "__main__" and sys.argv[1:2] == ["--sandbox-launcher"]:
    launcher_main(int(sys.argv[2]))
