"""The agent's command line as the rollout and the regression check use it (subprocesses,
`--json`), its configuration file, recovery of a run killed between its two atomic steps, and
the proof that it runs with the board's packages only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from support.agent_support import agent_cli, answer_json, current

from edgetune.agent import AgentConfig, load_config, write_config
from edgetune.agent.cli import main
from edgetune.agent.errors import AgentConfigError
from edgetune.artifact_format.reference import npz_bytes

CONFIG = AgentConfig(
    board="gw-a1",
    device_class="gateway-avx512",
    server="https://10.231.7.1:8470",
    token_file="token",
    public_key="fleet.pub",
    server_ca="fleet-ca.pem",
    keep_releases=3,
    firmware_command="uname -srm",
    threads=1,
)


def test_status_starts_without_numpy(tmp_path):
    """`status` runs on every rollout, pull timer and check: it loads only what it needs (numpy
    alone costs a board a tenth of a second of CPU and its BLAS threads)."""
    write_config(tmp_path / "agent", CONFIG)
    probe = (
        "import sys; from edgetune.agent.cli import main; code = main(['--root', sys.argv[1], 'status', '--json']);"
        " print(code, 'numpy' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "agent")], capture_output=True, text=True, timeout=60
    )
    assert done.stderr.strip().splitlines()[-1] == "0 False", (done.stdout, done.stderr)


def test_config_is_written_canonically_and_read_back(tmp_path):
    path = write_config(tmp_path / "agent", CONFIG)
    raw = path.read_bytes()
    assert json.loads(raw) == {
        "schema": "edgetune.agent-config",
        "schema_version": 1,
        "board": "gw-a1",
        "device_class": "gateway-avx512",
        "server": "https://10.231.7.1:8470",
        "token_file": "token",
        "public_key": "fleet.pub",
        "server_ca": "fleet-ca.pem",
        "keep_releases": 3,
        "firmware_command": "uname -srm",
        "threads": 1,
    }
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    assert load_config(tmp_path / "agent") == CONFIG
    with pytest.raises(AgentConfigError, match="keep_releases: must be at least 2"):
        write_config(tmp_path / "agent", AgentConfig(**{**CONFIG.__dict__, "keep_releases": 1}))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda raw: raw.update(keep_releases="3"), "agent.json: keep_releases: must be an integer, got str '3'"),
        (lambda raw: raw.update(server="10.231.7.1:8470"), "agent.json: server: '10.231.7.1:8470' is not an http(s)"),
        (lambda raw: raw.pop("board"), "agent.json: board: required field is missing"),
        (lambda raw: raw.update(colour="blue"), "agent.json: colour: unknown key; allowed here: board, device_class"),
        (lambda raw: raw.update(schema_version=2), "agent.json: schema_version: 2 is not supported"),
        (lambda raw: raw.update(server_ca=None), "agent.json: server_ca: an https:// server needs the fleet CA file"),
    ],
)
def test_a_bad_config_exits_2_naming_the_file_and_field(tmp_path, capsys, edit, message):
    path = write_config(tmp_path, CONFIG)
    raw = json.loads(path.read_bytes())
    edit(raw)
    path.write_text(json.dumps(raw))
    assert main(["--root", str(tmp_path), "status"]) == 2
    assert message in capsys.readouterr().err


def test_missing_config_and_unsafe_token_exit_2(make_board, tmp_path, capsys):
    assert main(["--root", str(tmp_path / "nowhere"), "status", "--json"]) == 2
    assert "agent.json: missing" in answer_json("status", capsys.readouterr().out)["error"]
    root = make_board()
    (root / "token").chmod(0o644)
    assert main(["--root", str(root), "install", "--model", "mlp"]) == 2
    assert "readable by others: chmod 600" in capsys.readouterr().err
    assert main(["--root", str(root), "rollback", "--model", "../etc", "--to", "none"]) == 2


@pytest.mark.parametrize(("mode", "owner"), [(0o777, 0), (0o775, 0), (0o755, 65534)])
def test_an_agent_root_another_user_could_change_exits_2_naming_the_directory(tmp_path, capsys, mode, owner):
    """agent.json names a command the agent runs as its user: a parent another user can write
    (without the sticky bit), or owns, could have planted it."""
    parent = tmp_path / "shared"
    write_config(parent / "agent", CONFIG)
    parent.chmod(mode)
    os.chown(parent, owner, -1)
    assert main(["--root", str(parent / "agent"), "status"]) == 2
    assert f"{parent} " in capsys.readouterr().err
    parent.chmod(0o1777 if owner == 0 else 0o755)  # a sticky directory of root's, as /tmp, is fine
    os.chown(parent, 0, -1)
    assert main(["--root", str(parent / "agent"), "status"]) != 2


def test_install_and_status_json(board_on, fleet):
    root = board_on(1)
    status, record = agent_cli(root, "install", "--model", "mlp", "--from", str(fleet.tarball("mlp", "gw-fast", 2)))
    assert status == 0 and record == {
        "board": "fast-1",
        "model": "mlp",
        "from_version": 1,
        "to_version": 2,
        "result": "installed",
        "error": None,
    }
    status, refused = agent_cli(root, "install", "--model", "mlp", "--from", str(fleet.tarball("mlp", "gw-fast", 1)))
    assert status == 1 and refused["result"] == "failed" and "older than v2" in refused["error"]
    status, board = agent_cli(root, "status")
    firmware = subprocess.run("uname -srm", shell=True, capture_output=True, text=True).stdout.strip()
    assert status == 0 and (board["board"], board["device_class"], board["firmware"]) == ("fast-1", "gw-fast", firmware)
    mlp = board["models"]["mlp"]
    assert (mlp["version"], mlp["previous"], mlp["highest_installed"], mlp["kept"], mlp["firmware"]) == (
        2,
        1,
        2,
        [1, 2],
        firmware,
    )
    assert time.time() - _parse_utc(mlp["since"]) < 600


def _parse_utc(text: str) -> float:
    import calendar

    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))


def test_run_json_checks_and_times_the_current_release(board_on, fleet, tmp_path):
    root = board_on(1)
    status, report = agent_cli(root, "run", "--model", "mlp", "--number", "2", "--repeat", "4")
    assert status == 0
    assert (report["board"], report["model"], report["version"], report["input"]) == ("fast-1", "mlp", 1, "reference")
    assert report["outputs"] == {"output0": [1, 64]} and report["outputs_match"] is True
    assert report["max_abs_error"] <= 1e-5 and report["threads"] == "1"
    assert (report["number"], report["repeat"], len(report["samples_s"])) == (2, 4, 4)
    assert all(0 < s < 1 for s in report["samples_s"])
    other = tmp_path / "input.npz"
    other.write_bytes(npz_bytes({"x": np.ones((1, 64), dtype="float32")}))
    status, report = agent_cli(root, "run", "--model", "mlp", "--input", str(other), "--repeat", "0")
    assert status == 0 and report["outputs_match"] is None and report["samples_s"] == []


def test_run_loads_tvms_runtime_library_alone(board_on, tmp_path):
    """The agent compiles nothing: as a process of its own it loads TVM's runtime library, not the
    compiler's too (half TVM's start-up on a board), unless the board's environment says otherwise."""
    root = board_on(1)
    site, loaded = tmp_path / "site", tmp_path / "loaded"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import atexit, sys\n"
        f"atexit.register(lambda: open({str(loaded)!r}, 'w').write(' '.join(sorted(sys.modules['tvm'].base._LOADED_LIBS))))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TVM_USE_RUNTIME_LIB"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    status, report = agent_cli(root, "run", "--model", "mlp", "--repeat", "1", env=env)
    assert status == 0 and report["outputs_match"] is True
    assert loaded.read_text().split() == ["tvm_runtime"]
    status, report = agent_cli(root, "run", "--model", "mlp", "--repeat", "1", env={**env, "TVM_USE_RUNTIME_LIB": "0"})
    assert status == 0 and report["outputs_match"] is True
    assert "tvm_compiler" in loaded.read_text().split()


def test_state_is_completed_from_the_link_after_a_kill_between_the_two_steps(board_on):
    root = board_on(1, 2)
    link = root / "releases" / "mlp" / "current"
    os.symlink("v1", link.with_name(".current.tmp-1"))  # what a rollback killed after its link switch leaves
    os.replace(link.with_name(".current.tmp-1"), link)
    switched = os.lstat(link).st_mtime
    status, board = agent_cli(root, "status")
    mlp = board["models"]["mlp"]
    assert (mlp["version"], mlp["previous"], mlp["highest_installed"]) == (1, 2, 2)
    assert abs(_parse_utc(mlp["since"]) - switched) < 2
    status, record = agent_cli(root, "rollback", "--model", "mlp", "--to", "2")
    assert (status, record["from_version"], record["to_version"], current(root)) == (0, 1, 2, "v2")


FORBIDDEN = (
    "paramiko",
    "yaml",
    "tabulate",
    "onnx",
    "onnxruntime",
    "xgboost",
    "matplotlib",
    "starlette",
    "uvicorn",
    "psutil",
    "tornado",
    "cloudpickle",
    "edgetune.tune",
    "edgetune.compiler",
    "edgetune.fleet",
    "edgetune.inventory",
    "edgetune.deploy",
    "edgetune.cli",
    "edgetune.pipeline",
    "tvm.relax",
)

BLOCKER = """
import os, sys
FORBIDDEN = {forbidden!r}

class Forbid:
    def find_spec(self, name, path=None, target=None):
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
            with open(os.environ["AGENT_FORBIDDEN_LOG"], "a") as log:
                log.write(name + "\\n")
            raise ImportError(f"{{name}} is not installed on this board")
        return None

sys.meta_path.insert(0, Forbid())
"""


def test_the_agent_runs_with_the_board_packages_only(board_on, fleet, server, tmp_path):
    """Every verb (and install's check child) under an import hook that refuses the host's
    packages, with TVM in runtime-only mode (no tvm.relax at all)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(forbidden=FORBIDDEN))
    attempts = tmp_path / "forbidden.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "AGENT_FORBIDDEN_LOG": str(attempts),
        "TVM_USE_RUNTIME_LIB": "1",
    }
    blocked = subprocess.run([sys.executable, "-c", "import yaml"], env=env, capture_output=True, text=True)
    assert blocked.returncode == 1 and "yaml is not installed on this board" in blocked.stderr
    attempts.unlink()

    help_run = subprocess.run(
        [sys.executable, "-m", "edgetune.agent", "--help"], env=env, capture_output=True, text=True
    )
    assert help_run.returncode == 0 and "fetch" in help_run.stdout, help_run.stderr
    root = board_on(1, server=server.url)
    assert agent_cli(root, "install", "--model", "mlp", "--version", "2", env=env)[1]["result"] == "installed"
    tarball = fleet.tarball("mlp", "gw-fast", 3)
    assert agent_cli(root, "install", "--model", "mlp", "--from", str(tarball), env=env)[1]["result"] == "installed"
    assert agent_cli(root, "status", env=env)[1]["models"]["mlp"]["version"] == 3
    assert agent_cli(root, "run", "--model", "mlp", "--repeat", "1", env=env)[1]["outputs_match"] is True
    assert agent_cli(root, "rollback", "--model", "mlp", env=env)[1]["result"] == "rolled_back"
    assert not attempts.exists(), f"the agent tried to import: {attempts.read_text()}"


def test_a_config_with_a_duplicate_key_exits_2(tmp_path, capsys):
    path = write_config(tmp_path, CONFIG)
    path.write_bytes(path.read_bytes()[:-1] + b',"threads":4}')
    assert main(["--root", str(tmp_path), "status"]) == 2
    assert "agent.json: duplicate key(s) 'threads'" in capsys.readouterr().err


def _zip(files: dict[str, str]) -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:
        for name, text in files.items():
            bundle.writestr(name, text)
    return buffer.getvalue()


def test_the_launcher_runs_the_bytes_it_checked_not_what_the_bundle_holds_later(tmp_path):
    """Python reads a zip lazily: a bundle swapped once its hash was checked must not be what
    the rest of the run imports. This bundle swaps itself right after the launcher's check."""
    import hashlib

    from edgetune.fleet.agent_bundle import LAUNCHER

    path = tmp_path / "edgetune-agent.pyz"
    package = {"edgetune/__init__.py": "", "edgetune/agent/__init__.py": ""}
    swapped = _zip(
        {**package, "edgetune/agent/later.py": "WHO = 'a module put in after the check, which must not run'"}
    )
    main_module = (
        f"import os\nopen({str(path)!r}, 'wb').write({swapped!r})\nfrom edgetune.agent import later\n"
        "copy = os.path.dirname(os.path.dirname(os.path.dirname(later.__file__)))\n"
        "print(later.WHO, oct(os.stat(os.path.dirname(copy)).st_mode & 0o777))\n"
    )
    checked = _zip({**package, "edgetune/agent/__main__.py": main_module, "edgetune/agent/later.py": "WHO = 'checked'"})
    path.write_bytes(checked)
    done = subprocess.run(
        [sys.executable, "-I", "-c", LAUNCHER, str(path), hashlib.sha256(checked).hexdigest()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "checked 0o700"), done.stderr
    assert path.read_bytes() == swapped and sorted(p.name for p in tmp_path.iterdir()) == [
        path.name
    ]  # the copy is gone


def test_a_board_with_the_hosts_python_imports_the_agent_compiled(tmp_path):
    """The bundle carries each module compiled for the host's Python too (a board with another
    Python compiles the sources, as zipimport falls back to them)."""
    from edgetune.fleet.agent_bundle import agent_bundle

    path = tmp_path / "edgetune-agent.pyz"
    path.write_bytes(agent_bundle().data)
    script = "import sys; sys.path.insert(0, sys.argv[1]); import edgetune.agent.cli as cli; print(cli.__file__)"
    done = subprocess.run([sys.executable, "-I", "-c", script, str(path)], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == f"{path}/edgetune/agent/cli.pyc", done.stderr


def test_every_process_builds_the_same_bundle():
    """Its sha256 is what a board checks before it runs the agent: a process that builds other
    bytes (this test's, with much else imported, against a fresh one) would deliver it again."""
    from edgetune.fleet.agent_bundle import agent_bundle

    script = "from edgetune.fleet.agent_bundle import agent_bundle; print(agent_bundle().sha256)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == agent_bundle().sha256, done.stderr
