"""Each limit of ``SandboxLimits`` is in force in the sandboxed code itself, one by one.

The other sandbox tests show that hostile programs are contained, but a program can be stopped
by another limit than the one it aims at (a fork bomb by the wall clock): here the code reads
its own rlimits and uid, and runs into each limit exactly, in ``bwrap`` mode and in the
``rlimits`` fallback. Run by root, the fallback drops to ``nobody`` only when ``nobody`` can run
the interpreter; where it cannot, the code runs as root, which the process limit does not bind,
and ``describe()`` says so: the tests check what each sandbox says of itself.
"""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from esbox.adapters.agents.sandbox import Sandbox, SandboxLimits
from esbox.adapters.agents.sandbox_bwrap import HOST_NOBODY
from esbox.adapters.agents.sandbox_child import SANDBOX_UID

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="namespaces are Linux's")

MIB = 2**20
LIMITS = SandboxLimits(
    cpu_seconds=1.5,
    wall_seconds=6,
    memory_bytes=256 * MIB,
    processes=12,
    file_bytes=1 * MIB,
    output_bytes=8192,
    tmpfs_bytes=4 * MIB,
)
SYSTEM_PYTHON = "/usr/bin/python3"  # outside /root: nobody can run it, so the fallback drops
SANDBOXES = {
    "bwrap": {"mode": "bwrap"},
    "rlimits": {"mode": "rlimits"},
    "rlimits-system-python": {"mode": "rlimits", "python": SYSTEM_PYTHON},
}


@pytest.fixture(scope="module", params=list(SANDBOXES))
def sandbox(request) -> Sandbox:
    options = SANDBOXES[request.param]
    if "python" in options and not os.access(options["python"], os.X_OK):
        pytest.skip(f"no {options['python']} here")
    return Sandbox(LIMITS, **options)


REPORT = """\
import json, os, resource
names = ["RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_CORE"]
limits = {n: list(resource.getrlimit(getattr(resource, n))) for n in names}
print(json.dumps({"limits": limits, "uids": [*os.getresuid(), *os.getresgid()],
                  "groups": os.getgroups()}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only root drops privileges")
def test_run_by_root_the_fallback_drops_to_nobody_where_nobody_can_run_python():
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON} here")
    fallback = Sandbox(LIMITS, mode="rlimits", python=SYSTEM_PYTHON)
    assert "runs as user nobody" in fallback.describe()
    assert run_json(fallback, REPORT)["uids"] == [HOST_NOBODY] * 6


def run_json(sandbox: Sandbox, code: str) -> dict:
    """Run ``code`` (which prints one JSON line) and read what it printed."""
    result = sandbox.run(code)
    assert result.error is None, result.as_text()
    return json.loads(result.stdout)


def expected_uid(sandbox: Sandbox) -> int:
    """The uid the code should see, from what the sandbox says of itself."""
    if sandbox.isolated:
        return SANDBOX_UID
    if "user nobody" in sandbox.describe():
        return HOST_NOBODY
    return os.geteuid()


def test_the_code_runs_under_every_rlimit_and_as_the_user_it_is_said_to(sandbox: Sandbox):
    report = run_json(sandbox, REPORT)
    cpu = math.ceil(LIMITS.cpu_seconds)  # whole seconds; the hard limit (SIGKILL) 1 s later
    assert report["limits"] == {
        "RLIMIT_CPU": [cpu, cpu + 1],
        "RLIMIT_AS": [LIMITS.memory_bytes] * 2,
        "RLIMIT_NPROC": [LIMITS.processes] * 2,
        "RLIMIT_FSIZE": [LIMITS.file_bytes] * 2,
        "RLIMIT_CORE": [0, 0],
    }
    uid = expected_uid(sandbox)
    assert report["uids"] == [uid] * 6
    if uid != 0:
        assert 0 not in report["groups"]


FORKS = f"""\
import errno, json, os
read, write = os.pipe()
started, refused = 0, None
for _ in range({LIMITS.processes + 4}):
    try:
        pid = os.fork()
    except OSError as exc:
        refused = errno.errorcode[exc.errno]
        break
    if pid == 0:  # a child waits until the parent lets go of the pipe
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    started += 1
os.close(write)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
print(json.dumps({{"started": started, "refused": refused}}))
"""


def test_a_burst_of_forks_is_refused_at_the_process_limit(sandbox: Sandbox):
    burst = run_json(sandbox, FORKS)
    if expected_uid(sandbox) == 0:  # root: the kernel never applies RLIMIT_NPROC to it
        assert "process limits do not bind root" in sandbox.describe()
        assert burst == {"started": LIMITS.processes + 4, "refused": None}
        return
    assert burst["refused"] == "EAGAIN", burst
    if sandbox.isolated:  # the namespace's uid counts only the code and its children
        assert burst["started"] == LIMITS.processes - 1
    else:  # host nobody: other sandboxes' processes count too
        assert burst["started"] <= LIMITS.processes - 1


def test_a_file_may_reach_the_file_size_limit_and_not_a_byte_more(sandbox: Sandbox):
    result = sandbox.run(
        "import os\n"
        "with open('big.bin', 'wb', buffering=0) as handle:\n"
        f"    handle.write(bytes({LIMITS.file_bytes}))\n"
        "    print('wrote', os.path.getsize('big.bin'), flush=True)\n"
        "    handle.write(b'x')\n"
    )
    assert result.stdout == f"wrote {LIMITS.file_bytes}\n", result.as_text()
    assert result.error == "file size" and "File too large" in result.stderr
    assert "file size limit of 1 MiB" in result.notice


def test_one_allocation_of_the_memory_limit_fails_and_half_of_it_works(sandbox: Sandbox):
    result = sandbox.run(
        f"half = bytearray({LIMITS.memory_bytes // 2})\n"
        "print('half', len(half), flush=True)\n"
        "del half\n"
        f"whole = bytearray({LIMITS.memory_bytes})\n"
    )
    assert result.stdout == f"half {LIMITS.memory_bytes // 2}\n", result.as_text()
    assert result.error == "memory" and "MemoryError" in result.stderr


@pytest.mark.parametrize("directory", ["/tmp", "/sandbox"])
def test_the_tmpfs_dirs_hold_their_cap_and_not_a_page_more(directory: str):
    sandbox = Sandbox(LIMITS, mode="bwrap")
    piece = LIMITS.file_bytes // 2
    filled = run_json(
        sandbox,
        "import errno, json\n"
        "written, error = 0, None\n"
        f"while written < {LIMITS.tmpfs_bytes + 4 * piece}:  # stops even without a cap\n"
        "    try:\n"
        f"        with open('{directory}/part-%d' % written, 'wb') as handle:\n"
        f"            handle.write(bytes({piece}))\n"
        "    except OSError as exc:\n"
        "        error = errno.errorcode[exc.errno]\n"
        "        break\n"
        f"    written += {piece}\n"
        "print(json.dumps({'written': written, 'error': error}))\n",
    )
    assert filled["error"] == "ENOSPC", filled
    assert filled["written"] == LIMITS.tmpfs_bytes  # whole pages of data: exactly the cap
