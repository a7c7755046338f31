"""The sandbox's child side and output capture: the rlimit bootstrap and a bounded pipe reader.

The bootstrap runs first inside the sandbox (``python -I -S -c BOOTSTRAP ...``): it drops root
when it holds it, applies the rlimits, then execs the interpreter on the model's code, so the
limits bind from the code's first instruction and nothing of the bootstrap stays in its process.
"""

from __future__ import annotations

import math
import os
import selectors
import time
from dataclasses import dataclass

SANDBOX_UID = 1000  # the uid (and gid) model code runs as inside the namespaces

BOOTSTRAP = """\
import os, resource, sys
cpu, mem, nproc, fsize, uid = (int(a) for a in sys.argv[1:6])
python, script = sys.argv[6:8]
if uid >= 0 and os.getuid() == 0:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
if uid >= 0 and 0 in (*os.getresuid(), *os.getresgid()):
    sys.exit("sandbox: could not drop root")
for res, soft, hard in (
    (resource.RLIMIT_CPU, cpu, cpu + 1),
    (resource.RLIMIT_AS, mem, mem),
    (resource.RLIMIT_NPROC, nproc, nproc),
    (resource.RLIMIT_FSIZE, fsize, fsize),
    (resource.RLIMIT_CORE, 0, 0),
):
    resource.setrlimit(res, (soft, hard))
os.execv(python, [python, "-I", "-B", script])
"""


def bootstrap_argv(python: str, script: str, limits, drop_to_uid: int) -> list[str]:
    """The command line that applies ``limits`` (a ``SandboxLimits``) and then runs ``script``."""
    return [
        python, "-I", "-S", "-c", BOOTSTRAP,
        str(max(1, math.ceil(limits.cpu_seconds))),
        str(limits.memory_bytes),
        str(limits.processes),
        str(limits.file_bytes),
        str(drop_to_uid),
        python,
        script,
    ]  # fmt: skip


@dataclass
class Captured:
    """What the reader kept of the two streams, and how much it dropped."""

    stdout: bytes
    stderr: bytes
    dropped: int
    timed_out: bool


def capture(stdout_fd: int, stderr_fd: int, cap: int, deadline: float, exited) -> Captured:
    """Read both pipes to EOF or ``deadline``, keeping at most ``cap`` bytes of each.

    Everything past the cap is read and thrown away, so a child printing without end never
    blocks on a full pipe nor grows this process. ``exited()`` says the child is gone; a
    grandchild still holding the pipes then gets a short grace before the reader stops.
    """
    kept = {stdout_fd: bytearray(), stderr_fd: bytearray()}
    dropped = 0
    grace_end: float | None = None
    with selectors.DefaultSelector() as sel:
        for fd in kept:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return Captured(bytes(kept[stdout_fd]), bytes(kept[stderr_fd]), dropped, True)
            if grace_end is None and exited():
                grace_end = now + 0.2
            if grace_end is not None and now >= grace_end:
                break
            for key, _ in sel.select(timeout=min(0.05, deadline - now)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                room = max(0, cap - len(kept[key.fd]))
                kept[key.fd] += chunk[:room]
                dropped += max(0, len(chunk) - room)
    return Captured(bytes(kept[stdout_fd]), bytes(kept[stderr_fd]), dropped, False)


def fit(stdout: bytes, stderr: bytes, cap: int) -> tuple[bytes, bytes, int]:
    """Trim both streams to ``cap`` bytes together; each keeps at least half when both overflow."""
    if len(stdout) + len(stderr) <= cap:
        return stdout, stderr, 0
    err_room = max(cap // 2, cap - len(stdout))
    err = stderr[-err_room:] if len(stderr) > err_room else stderr  # a traceback ends stderr
    out = stdout[: cap - len(err)]
    return out, err, len(stdout) + len(stderr) - len(out) - len(err)
