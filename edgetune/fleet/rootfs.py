"""The root file system of emulated simulated boards (`simulated: {arch: aarch64}`).

An arm64 Debian (bookworm, minbase, python3) with a venv at /opt/tvm holding the aarch64
wheels of the very TVM build this host runs. It is built once with debootstrap and cached as a
tarball under the inventory's `sim.cache` (kept by `sim down`); each emulated board gets its
own unpacked copy there, which its sshd enters with ChrootDirectory. Every program in it runs
under qemu-user through binfmt_misc, so over SSH the board is an aarch64 machine. Like a real
board it holds nothing of edgetune: `fleet up` and `rollout` deliver the agent's bundle.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from edgetune.fleet.errors import SimError

DEBIAN_RELEASE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BOARD_PYTHON = "/opt/tvm/bin/python"
FIRMWARE_FILE = "/etc/edgetune-sim-firmware"  # inside the root: the version `sim firmware` gave the board
BINFMT = Path("/proc/sys/fs/binfmt_misc")
# What the rpc_server and the board agent import, at the host's versions (TVM refuses
# executables built by another TVM version).
WHEELS = (
    "apache-tvm",
    "apache-tvm-ffi",
    "numpy",
    "ml_dtypes",
    "typing_extensions",
    "psutil",
    "cloudpickle",
    "tornado",
    "cryptography",
    "cffi",
    "pycparser",
)
_COMPLETE = ".edgetune-root-complete"

log = logging.getLogger(__name__)


def check_emulation(arch: str) -> None:
    """Raise SimError saying what to install or enable unless this host can run `arch` programs."""
    if os.uname().machine == arch:
        return
    if not (BINFMT / "register").exists():
        done = subprocess.run(
            ["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SimError(
                f"binfmt_misc cannot be mounted at {BINFMT} ({done.stderr.strip()}): this host cannot run "
                f"{arch} boards under qemu-user (a container without that privilege, for example)"
            )
    entry = BINFMT / f"qemu-{arch}"
    if not entry.exists() and shutil.which("update-binfmts"):
        subprocess.run(["update-binfmts", "--enable", f"qemu-{arch}"], capture_output=True)
    if not entry.exists():
        raise SimError(
            f"qemu-user is not registered for {arch} in binfmt_misc: "
            "`apt-get install -y qemu-user-static binfmt-support` (or `make test-arm`) installs it"
        )
    lines = entry.read_text().splitlines()
    if "enabled" not in lines:
        raise SimError(f"{entry} is disabled: `update-binfmts --enable qemu-{arch}` enables it")
    if not any(line.startswith("flags:") and "F" in line for line in lines):
        raise SimError(
            f"{entry} lacks the F flag, so qemu cannot be found inside a board's root file system: "
            "use Debian's qemu-user-static, whose registration has it"
        )


def cached_root(cache: Path, arch: str) -> Path:
    """The tarball of the root file system for `arch`, built first if it is not cached yet."""
    tarball = cache / f"rootfs-{arch}-{DEBIAN_RELEASE}-tvm{version('apache-tvm')}.tar"
    if tarball.exists():
        return tarball
    if shutil.which("debootstrap") is None:
        raise SimError("debootstrap is missing: `apt-get install -y debootstrap` (or `make test-arm`) installs it")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".building-") as scratch:
        root = Path(scratch) / "root"
        log.info(f"building the {arch} root file system once (about 10 min; cached as {tarball})")
        log.info(f"  debootstrap {DEBIAN_RELEASE} arm64 from {DEBIAN_MIRROR}")
        _run(
            [
                "debootstrap",
                "--arch=arm64",
                "--variant=minbase",
                "--include=python3,python3-venv",
                DEBIAN_RELEASE,
                str(root),
                DEBIAN_MIRROR,
            ],
            "debootstrap",
        )
        _install_tvm(root, arch)
        log.info(f"  packing {tarball.name}")
        _run(["tar", "-C", str(root), "-cf", str(Path(scratch) / "root.tar"), "."], "tar")
        os.replace(Path(scratch) / "root.tar", tarball)
    return tarball


def _install_tvm(root: Path, arch: str) -> None:
    pins = [f"{name}=={version(name)}" for name in WHEELS]
    wheels = root / "tmp" / "wheels"
    log.info(f"  downloading the {arch} wheels of {', '.join(pins[:2])} and what they need")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
            str(wheels),
            "--python-version",
            "3.11",
            *(f"--platform={tag}_{arch}" for tag in ("manylinux_2_28", "manylinux_2_17", "manylinux2014")),
            *pins,
        ],
        "pip download",
    )
    log.info(f"  installing them into {BOARD_PYTHON} (under qemu)")
    _run(
        ["chroot", str(root), "/usr/bin/python3", "-m", "venv", str(Path(BOARD_PYTHON).parent.parent)],
        "python3 -m venv",
    )
    _run(
        [
            "chroot",
            str(root),
            BOARD_PYTHON,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--find-links",
            "/tmp/wheels",
            *pins,
        ],
        "pip install",
    )
    shutil.rmtree(wheels)
    got = _run(["chroot", str(root), BOARD_PYTHON, "-c", "import tvm; print(tvm.__version__)"], "import tvm").strip()
    if got != version("apache-tvm"):
        raise SimError(f"the {arch} root file system imports TVM {got}, this host runs {version('apache-tvm')}")


def boards_dir(cache: Path) -> Path:
    """Where the emulated boards' own root file systems are unpacked."""
    return cache / "boards"


def board_root(cache: Path, fleet_name: str, board_name: str) -> Path:
    return boards_dir(cache) / f"{fleet_name}-{board_name}"


def ensure_board_root(tarball: Path, root: Path) -> None:
    """Unpack the cached root file system for one board (once) and mount its /proc and /dev."""
    check_chroot_path(root.parent)
    if not (root / _COMPLETE).exists():
        _unmount(root)
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True, mode=0o755)
        _run(["tar", "-C", str(root), "-xf", str(tarball)], "tar")
        (root / _COMPLETE).touch()
    if not os.path.ismount(root / "proc"):
        _run(["mount", "-t", "proc", "proc", str(root / "proc")], "mount proc")
    if not os.path.ismount(root / "dev"):
        _run(["mount", "--bind", "/dev", str(root / "dev")], "mount --bind /dev")


def remove_board_root(root: Path) -> bool:
    """Unmount and delete one board's root file system; never deletes through a mount."""
    if not root.exists():
        return False
    _unmount(root)
    if _mounts_under(root):
        raise SimError(f"{root} still has mounts ({', '.join(_mounts_under(root))}); left in place")
    shutil.rmtree(root)
    return True


def _unmount(root: Path) -> None:
    for mount in sorted(_mounts_under(root), reverse=True):
        subprocess.run(["umount", "--lazy", mount], capture_output=True)


def _mounts_under(root: Path) -> list[str]:
    prefix = f"{root.resolve()}/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1].encode().decode("unicode_escape") for line in mounts]
    return [point for point in points if point.startswith(prefix)]


def check_chroot_path(folder: Path) -> None:
    """sshd's ChrootDirectory refuses a root below a folder that is not root's alone."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    for part in [folder.resolve(), *folder.resolve().parents]:
        status = part.stat()
        if status.st_uid != 0 or status.st_mode & 0o022:
            raise SimError(
                f"{part} is not owned by root or is writable by others, so sshd will not chroot "
                f"into a board root below it: set sim.cache in the inventory to a folder such as "
                f"/var/cache/edgetune"
            )


def _run(argv: list[str], what: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SimError(f"{what} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-800:]}")
    return done.stdout
