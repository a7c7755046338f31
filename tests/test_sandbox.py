"""The sandbox for model-written code: every escape attempt is contained and reported, and the
rlimits fallback says (and shows) what it does not contain.

Each ``escape`` test runs a hostile program in ``bwrap`` mode and checks the host afterwards; the
run ends with the tally ``sandbox escapes contained: N/N`` (tests/conftest.py counts them).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from esbox.adapters.agents.sandbox import Sandbox, SandboxLimits
from esbox.adapters.agents.sandbox_bwrap import HOST_NOBODY
from esbox.adapters.agents.tools import PythonTool, ToolError
from esbox.errors import ConfigError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="namespaces are Linux's")

LIMITS = SandboxLimits(
    cpu_seconds=1, wall_seconds=4, memory_bytes=256 * 2**20, processes=16, output_bytes=4096
)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    """The isolated sandbox (``bwrap`` mode: it raises rather than fall back)."""
    return Sandbox(LIMITS, mode="bwrap")


def host_processes(marker: str) -> list[int]:
    """Host pids whose command line holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(pid))
    return found


def nobody_processes() -> list[int]:
    """Host pids running as the uid sandboxed code gets (nobody)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()
        if int(uids[1]) == HOST_NOBODY:
            found.append(int(pid))
    return found


def test_a_plain_program_runs_and_prints(sandbox: Sandbox) -> None:
    result = sandbox.run("import math\nprint(math.factorial(20))")
    assert (result.stdout, result.error, result.exit_code) == ("2432902008176640000\n", None, 0)
    assert sandbox.isolated and "namespaces" in sandbox.describe()


@pytest.mark.escape
def test_an_infinite_loop_is_stopped_by_the_cpu_limit(sandbox: Sandbox) -> None:
    start = time.monotonic()
    result = sandbox.run("while True:\n    pass")
    assert result.error == "timeout" and result.timed_out
    assert "CPU time limit" in result.notice
    assert time.monotonic() - start < LIMITS.wall_seconds + 2


@pytest.mark.escape
def test_a_sleeping_program_is_stopped_by_the_wall_clock(sandbox: Sandbox) -> None:
    result = sandbox.run("import time\ntime.sleep(60)")
    assert result.error == "timeout" and "wall clock" in result.notice


@pytest.mark.escape
def test_a_fork_bomb_hits_the_process_limit_and_leaves_nothing(sandbox: Sandbox) -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = sandbox.run(bomb)
    assert result.error == "timeout"
    time.sleep(0.3)
    assert nobody_processes() == []


@pytest.mark.escape
def test_a_memory_bomb_hits_the_address_space_limit(sandbox: Sandbox) -> None:
    result = sandbox.run("blocks = []\nwhile True:\n    blocks.append(bytearray(2**24))")
    assert result.error == "memory" and "memory limit" in result.notice


@pytest.mark.escape
def test_a_hundred_megabytes_of_output_are_cut_to_the_cap(sandbox: Sandbox) -> None:
    result = sandbox.run("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 2**20)")
    assert result.truncated and "output truncated" in result.notice
    assert len(result.stdout) + len(result.stderr) <= LIMITS.output_bytes


@pytest.mark.escape
def test_host_files_and_a_run_directory_canary_are_invisible(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    canary = tmp_path / "run" / "canary.txt"
    canary.parent.mkdir()
    canary.write_text("SECRET-CANARY-7f3a")
    probe = (
        "import os\n"
        f"for path in ['/etc/passwd', '/etc/shadow', {str(canary)!r},\n"
        f"             {str(Path.home() / '.cache')!r}, {os.getcwd()!r}]:\n"
        "    try:\n"
        "        print(open(path).read() if os.path.isfile(path) else os.listdir(path))\n"
        "    except OSError as exc:\n"
        "        print('denied', type(exc).__name__)\n"
    )
    result = sandbox.run(probe)
    assert result.stdout.count("denied") == 5, result.stdout
    assert "SECRET-CANARY" not in result.stdout and "root:" not in result.stdout


@pytest.mark.escape
def test_installed_packages_are_hidden_and_the_stdlib_is_there(sandbox: Sandbox) -> None:
    probe = (
        "import importlib, json\n"
        "for name in ['esbox', 'numpy', 'torch', 'json']:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "        print(name, 'imported')\n"
        "    except ImportError:\n"
        "        print(name, 'hidden')\n"
    )
    result = sandbox.run(probe)
    assert result.stdout.split("\n")[:4] == [
        "esbox hidden", "numpy hidden", "torch hidden", "json imported"
    ], result.as_text()


@pytest.mark.escape
def test_writing_and_deleting_outside_the_work_dir_change_nothing(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    keep = tmp_path / "keep.txt"
    keep.write_text("kept")
    attack = (
        "import os, shutil\n"
        f"for act in (lambda: os.remove({str(keep)!r}),\n"
        f"            lambda: open({str(tmp_path / 'planted.txt')!r}, 'w').write('x'),\n"
        "            lambda: open('/usr/planted', 'w').write('x'),\n"
        "            lambda: shutil.rmtree('/usr/lib')):\n"
        "    try:\n"
        "        act()\n"
        "    except OSError as exc:\n"
        "        print('refused', type(exc).__name__)\n"
        "open('scratch.txt', 'w').write('the work dir is writable')\n"
        "print(open('scratch.txt').read())\n"
    )
    result = sandbox.run(attack)
    assert result.stdout.count("refused") == 4, result.stdout
    assert "the work dir is writable" in result.stdout
    assert keep.read_text() == "kept" and not (tmp_path / "planted.txt").exists()
    assert not Path("/usr/planted").exists()


@pytest.mark.escape
def test_a_socket_to_a_server_on_loopback_never_connects(sandbox: Sandbox) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(5)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            accepted.append(server.accept())

    thread = threading.Thread(target=accept)
    thread.start()
    result = sandbox.run(
        "import socket\n"
        f"socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')\n"
    )
    server.close()
    thread.join()
    assert accepted == [] and result.error == "exit 1"
    assert "ConnectionRefusedError" in result.stderr or "unreachable" in result.stderr


@pytest.mark.escape
def test_ctypes_and_os_system_run_inside_the_walls_too(sandbox: Sandbox, tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    result = sandbox.run(
        "import ctypes, os\n"
        f"print('system', os.system('id > {target}; cat /etc/shadow'))\n"
        f"ctypes.CDLL(None).system(b'touch {target}')\n"
        "print('uid', os.getuid())\n"
        "try:\n"
        "    os.setuid(0)\n"
        "except OSError as exc:\n"
        "    print('no root:', type(exc).__name__)\n"
    )
    assert not target.exists()
    assert "no root: PermissionError" in result.stdout and "uid 1000" in result.stdout


@pytest.mark.escape
def test_a_child_that_outlives_its_parent_is_killed(sandbox: Sandbox) -> None:
    marker = "61.7254"
    result = sandbox.run(
        "import subprocess\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "print('spawned')\n"
    )
    assert result.stdout == "spawned\n"
    deadline = time.monotonic() + 2
    while host_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_processes(marker) == []


@pytest.mark.escape
def test_the_environment_is_stripped(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ESBOX_TEST_SECRET", "token-9d1c")
    result = sandbox.run("import os\nprint(sorted(os.environ.items()))")
    assert "token-9d1c" not in result.stdout and "HF_" not in result.stdout
    assert "'HOME', '/sandbox'" in result.stdout


@pytest.mark.escape
def test_host_processes_cannot_be_seen_or_signalled(sandbox: Sandbox) -> None:
    result = sandbox.run(
        "import os\n"
        "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        f"os.kill({os.getpid()}, 9)\n"
    )
    pids = [int(p) for p in result.stdout.strip("[]\n").split(", ")]
    assert max(pids) < 10 and result.error == "exit 1"  # its own pid namespace, nothing else
    assert "ProcessLookupError" in result.stderr


@pytest.mark.escape
def test_a_runaway_program_is_a_tool_error_and_the_next_call_works(sandbox: Sandbox) -> None:
    python = PythonTool(sandbox)
    with pytest.raises(ToolError, match="CPU time limit"):
        python(code="while True:\n    pass")
    assert python(code="print(sum(range(10)))") == "45"


def test_an_unknown_mode_names_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match="allowed: auto, bwrap, rlimits"):
        Sandbox(mode="docker")


def test_the_rlimits_fallback_says_it_is_weaker_and_does_not_hide_host_files(
    tmp_path: Path,
) -> None:
    canary = tmp_path / "canary.txt"
    canary.write_text("VISIBLE-CANARY")
    canary.chmod(0o644)
    tmp_path.chmod(0o755)
    fallback = Sandbox(LIMITS, mode="rlimits")
    assert not fallback.isolated and "WEAKER" in fallback.describe()
    result = fallback.run(f"print(open({str(canary)!r}).read())")
    assert result.stdout == "VISIBLE-CANARY\n"  # what the fallback does NOT contain
    loop = fallback.run("while True:\n    pass")  # what it still does: the limits
    assert loop.error == "timeout"
