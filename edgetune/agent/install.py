"""`install` and `rollback`: install -> check -> commit, never leaving the board broken.

install: fetch (or reuse a verified download; `install_tarball` takes a local one instead),
check its manifest (read first, nothing unpacked yet) against the pinned key, this board's
class and the model asked, refuse a version below the high-water mark, then
1. unpack into `releases/<model>/.staging-v<N>-<rand>/` and verify that directory (every file
   against the signed manifest);
2. run the reference check (load `model.so`, run `reference_input.npz`, compare with
   `expected_output.npz` within the manifest's tolerance) in a child process, so that a
   library that crashes its process fails the install instead of killing the agent;
3. only then rename the staging directory to `v<N>`, switch `current`, write state.json, and
   prune to the last `keep_releases` releases (never the current nor the previous one);
4. with hooks (agent.json `hooks`, hooks.py): run the model's `on_switch`, then its health
   check; if either fails (a non-zero exit, its time out, the guard's stop), switch `current`
   back to the release it had, restore its state (the high-water mark and the health result
   kept), run `on_switch` again, and answer `failed` with the command's output.
Any failure removes the staging directory and leaves `current` and the state as they were.
A `SwitchGuard` (guard.py) may stop the run at any point before the switch: at its deadline,
which also bounds the reference check, or when the channel that started it closes; and, with
hooks, while they run after the switch, which then switches back.

rollback: switch `current` to a kept release (default: the newest below the current one) after
verifying it and re-running its reference check; `deactivate` removes the link. The high-water
mark stays where it is: rollback is the only way down. Its switch runs `on_switch` (not the
health check: a rollback has nothing to go back to); one that fails is in the record's `error`,
and the switch stands.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import edgetune
from edgetune.agent.answer import answer_record, last_json_object, read_answer
from edgetune.agent.config import ModelHooks
from edgetune.agent.errors import AgentConfigError, AgentError
from edgetune.agent.fetch import accept_manifest, checked_offer, fetch_offer, refuse_downgrade, signed_manifest
from edgetune.agent.file_tree import check_model_name
from edgetune.agent.guard import ChangeStopped, SwitchGuard
from edgetune.agent.hooks import ON_SWITCH_TIMEOUT_S, HookRun, hook_env, run_hook
from edgetune.agent.installation import Installation
from edgetune.agent.run_report import ReferenceCheck
from edgetune.agent.state import ModelState, activated, save_state
from edgetune.artifact_format.codec import added_field, to_json
from edgetune.artifact_format.files import open_archive, unpack_tarball
from edgetune.artifact_format.manifest import MANIFEST_NAME, SIGNATURE_NAME
from edgetune.artifact_format.verify import verify_artifact
from edgetune.durable import write_atomic
from edgetune.errors import ArtifactError, EdgetuneError

CHECK_TIMEOUT_S = 600.0
LOCK_WAIT_S = 60.0  # how long an install or rollback waits for another run (a pull timer's) to finish
# The child imports this same edgetune, from the folder or the bundle (a zip) it came from; -I
# keeps the working directory and PYTHONPATH from putting another one first.
_PACKAGE_PARENT = str(Path(edgetune.__file__).resolve().parents[1])
_CHILD = "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); runpy.run_module('edgetune.agent', run_name='__main__', alter_sys=True)"


@dataclass(frozen=True)
class ChangeRecord:
    """What one install or rollback did on this board (the rollout reads it as JSON)."""

    board: str
    model: str
    from_version: int | None
    to_version: int | None
    result: str  # installed | rolled_back | deactivated | unchanged | failed
    error: str | None = None
    hooks: tuple[HookRun, ...] | None = added_field()  # the hooks it ran, in order (None, not written: none)

    @property
    def ok(self) -> bool:
        return self.result != "failed"

    def to_json(self) -> dict:
        return to_json(self)


class _Change:
    """One install or rollback under way: the installation, the model's state, the version aimed at,
    and the guard that may stop it before the switch."""

    def __init__(self, installation: Installation, model: str, state: dict[str, ModelState], guard: SwitchGuard):
        self.installation, self.model, self.state, self.guard = installation, model, state, guard
        self.from_version = state[model].version if model in state else None
        self.to_version: int | None = None
        self.hooks: list[HookRun] = []

    def record(self, result: str, error: str | None = None) -> ChangeRecord:
        return ChangeRecord(
            self.installation.config.board,
            self.model,
            self.from_version,
            self.to_version,
            result,
            error,
            tuple(self.hooks) or None,
        )

    def activate(self, version: int | None) -> None:
        """Switch `current` (atomic), then record it in state.json (atomic). If the state cannot
        be written (a full disk), switch back: a failed change leaves the board as it was."""
        tree = self.installation.tree
        state = {**self.state, self.model: activated(self.state.get(self.model), version, self.installation.firmware)}
        self.guard.commit()
        tree.switch_current(self.model, version)
        try:
            save_state(tree, state)
        except BaseException:
            tree.switch_current(self.model, self.from_version)
            raise
        self.state = state

    def switch(self, version: int | None, gate: bool = False) -> str | None:
        """`activate(version)`, then the model's hooks: `on_switch`, and with `gate` (an install)
        its health check, under the guard reopened. With `gate`, an on_switch or health check
        that fails, times out or is stopped (the guard's deadline or channel) switches the board
        back to `from_version`: returns why (None: the switch stands). Without `gate` (a
        rollback), the switch stands whatever on_switch does; returns what went wrong with it."""
        before = self.state.get(self.model)
        self.activate(version)
        hooks = self.installation.config.hooks_of(self.model)
        if not gate:
            run = self._on_switch(hooks, version, self.from_version)
            return None if run is None or run.ok else f"on_switch failed after the switch: {run.described()}"
        if hooks == ModelHooks():
            return None
        try:
            self.guard.reopen()
            problem = self._gate(hooks, version)
            self.guard.commit()
        except ChangeStopped as err:
            problem = str(err)
        except BaseException:
            self.guard.commit()
            self._switch_back(before, version)
            raise
        if problem is None:
            return None
        self._switch_back(before, version)
        return f"{problem}; switched back to {_named(self.from_version)}"

    def _gate(self, hooks: ModelHooks, version: int | None) -> str | None:
        """on_switch, then the health check: what failed, or None."""
        run = self._on_switch(hooks, version, self.from_version)
        if run is not None and not run.ok:
            return f"on_switch failed after the switch to {_named(version)}: {run.described()}"
        if hooks.health is None:
            return None
        run = self._hook("health", hooks.health.command, hooks.health.timeout_s, version, self.from_version)
        self.state = {**self.state, self.model: replace(self.state[self.model], health=run)}
        try:
            save_state(self.installation.tree, self.state)
        except OSError:
            pass  # the result is in the record all the same
        return None if run.ok else f"the health check failed after the switch to {_named(version)}: {run.described()}"

    def _switch_back(self, before: ModelState | None, version: int | None) -> None:
        """After failed hooks: `current` back to `from_version` first, then its state as before
        (the high-water mark and the health result kept), then on_switch again."""
        tree = self.installation.tree
        tree.switch_current(self.model, self.from_version)
        now = self.state[self.model]
        entry = before or activated(now, None, self.installation.firmware)
        self.state = {
            **self.state,
            self.model: replace(entry, highest_installed=now.highest_installed, health=now.health),
        }
        try:
            save_state(tree, self.state)
        except OSError:
            pass  # `current` is back: the next run's recovery completes the state from it
        self._on_switch(self.installation.config.hooks_of(self.model), self.from_version, version)

    def _on_switch(self, hooks: ModelHooks, version: int | None, previous: int | None) -> HookRun | None:
        if hooks.on_switch is None:
            return None
        return self._hook("on_switch", hooks.on_switch, ON_SWITCH_TIMEOUT_S, version, previous)

    def _hook(self, hook: str, command: str, timeout_s: float, version: int | None, previous: int | None) -> HookRun:
        installation = self.installation
        release = installation.tree.release(self.model, version) if version is not None else None
        env = hook_env(installation.config.board, self.model, version, previous, release, hook)
        run = run_hook(hook, command, version, env, installation.root, timeout_s)
        self.hooks.append(run)
        return run


def install(
    root: Path, model: str, version: int | None = None, allow_downgrade: bool = False, guard: SwitchGuard | None = None
) -> ChangeRecord:
    """The `install` verb: what the server offers (or `version`), fetched and installed."""

    def from_server(change: _Change) -> ChangeRecord:
        server = change.installation.server()
        offer = checked_offer(change.installation, server, model, version)
        change.to_version = offer.version
        if offer.version == change.from_version:
            return change.record("unchanged")
        fetched = fetch_offer(change.installation, server, offer, change.state.get(model), allow_downgrade)
        return _install_verified(change, fetched.tarball, offer.version, allow_downgrade)

    return _run_change(root, model, from_server, guard)


def install_tarball(
    root: Path, model: str, tarball: Path, allow_downgrade: bool = False, guard: SwitchGuard | None = None
) -> ChangeRecord:
    """`install --from FILE`: install a tarball already on the board (e.g. from `edgetune pull`)."""
    return _run_change(
        root, model, lambda change: _install_verified(change, Path(tarball), None, allow_downgrade), guard
    )


def rollback(
    root: Path, model: str, to: int | None = None, deactivate: bool = False, guard: SwitchGuard | None = None
) -> ChangeRecord:
    """The `rollback` verb: switch to kept release `to` (default: the newest below the current
    one) after checking it again; `deactivate`: remove the `current` link."""

    def switch(change: _Change) -> ChangeRecord:
        if deactivate:
            if change.from_version is None:
                return change.record("unchanged")
            return change.record("deactivated", change.switch(None))
        kept = change.installation.tree.kept_versions(model)
        target = to if to is not None else _newest_below(kept, change.from_version)
        if target is None:
            raise AgentError(
                f"no kept release of {model} below v{change.from_version} to roll back to (kept: {_versions(kept)})"
            )
        change.to_version = target
        if target == change.from_version:
            return change.record("unchanged")
        if target not in kept:
            raise AgentError(
                f"v{target} of {model} is not kept on this board (kept: {_versions(kept)}); "
                f"install it with `install --version {target} --allow-downgrade`"
            )
        release = change.installation.tree.release(model, target)
        accept_manifest(
            change.installation.config,
            verify_artifact(release, change.installation.trusted().release_keys),
            model,
            target,
        )
        check_in_child(change.installation, release)
        return change.record("rolled_back", change.switch(target))

    return _run_change(root, model, switch, guard)


def _run_change(root: Path, model: str, action, guard: SwitchGuard | None) -> ChangeRecord:
    """Run `action` with the lock held, after recovering from killed runs, under `guard`;
    failures (a stop by the guard too) as data."""
    installation = Installation.open(root)
    check_model_name(model)
    guard = guard or SwitchGuard()
    with guard, installation.tree.locked(max(LOCK_WAIT_S, guard.deadline_s or 0.0)):
        change = _Change(installation, model, installation.recover(), guard)
        try:
            return action(change)
        except AgentConfigError:
            raise
        except (EdgetuneError, OSError) as err:
            return change.record("failed", str(err))


def _install_verified(
    change: _Change, tarball: Path, expected_version: int | None, allow_downgrade: bool
) -> ChangeRecord:
    installation, model = change.installation, change.model
    key = installation.trusted().artifact_key
    manifest_bytes, signature_bytes = tarball_head(tarball)
    manifest = signed_manifest(key, manifest_bytes, signature_bytes)
    accept_manifest(installation.config, manifest, model, expected_version)
    version = change.to_version = manifest.version
    if version == change.from_version:
        return change.record("unchanged")
    refuse_downgrade(change.state.get(model), version, allow_downgrade)
    staging = installation.tree.new_staging(model, version)
    try:
        unpack_tarball(tarball, staging)
        write_atomic(staging / MANIFEST_NAME, manifest_bytes)
        write_atomic(staging / SIGNATURE_NAME, signature_bytes)
        verify_artifact(staging, key)
        check_in_child(installation, staging)
        installation.tree.place_release(model, version, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    failed = change.switch(version, gate=True)
    try:
        if tarball.parent == installation.tree.downloads:
            installation.tree.remove_download(model, version)
        prune(installation, model, change.state[model])
    except OSError:
        pass  # installed all the same; the next install prunes again
    return change.record("failed", failed) if failed else change.record("installed")


def tarball_head(tarball: Path) -> tuple[bytes, bytes]:
    """The bytes of `manifest.json` and `manifest.sig`, the first two members of an artifact
    tarball, read without extracting anything and within `open_archive`'s head budget (they are
    checked before anything else is read)."""
    if not tarball.is_file():
        raise AgentError(f"{tarball}: no such file")
    try:
        with open_archive(tarball) as archive:
            return archive.manifest_bytes, archive.signature_bytes
    except ArtifactError as err:
        raise AgentError(f"{err}; refused") from None


def prune(installation: Installation, model: str, state: ModelState) -> list[int]:
    """Remove releases beyond the newest `keep_releases` (the current and previous ones always
    stay); returns the versions removed."""
    kept = installation.tree.kept_versions(model)
    protected = {v for v in (state.version, state.previous) if v in kept}
    others = sorted((v for v in kept if v not in protected), reverse=True)
    removed = others[max(0, installation.config.keep_releases - len(protected)) :]
    for version in removed:
        installation.tree.remove_release(model, version)
        installation.tree.remove_download(model, version)
    return removed


def check_in_child(installation: Installation, directory: Path) -> None:
    """Run the reference check of `directory` in a child process (this agent's `check` verb);
    AgentError saying why if it fails, crashes or hangs. The child does not get this run's
    stdin (the channel a guard watches); a guard's stop kills it."""
    command = [
        sys.executable,
        "-I",
        "-c",
        _CHILD,
        _PACKAGE_PARENT,
        "--root",
        str(installation.root),
        "check",
        "--json",
        "--dir",
        str(directory),
    ]
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            env=_child_env(installation),
        )
    except subprocess.TimeoutExpired:
        raise AgentError(f"the reference check did not finish within {CHECK_TIMEOUT_S:g} s; refused") from None
    if done.returncode < 0:
        raise AgentError(f"the library crashed the reference check ({signal.Signals(-done.returncode).name}); refused")
    reason = _check_failure(done)
    if reason is not None:
        raise AgentError(f"the reference check failed: {reason}; refused")


def _check_failure(done: subprocess.CompletedProcess) -> str | None:
    """Why the `check` child's answer says the release failed (None: it passed)."""
    line = last_json_object(done.stdout)
    if line is None:
        return done.stderr.strip()[-500:] or f"exit status {done.returncode}"
    where = "the reference check's answer"
    answer = read_answer(line, "check", where, AgentError)
    if answer.error is not None:
        return answer.error
    check = answer_record(ReferenceCheck, answer, where, AgentError)
    if done.returncode == 0 and check.ok:
        return None
    return check.detail or f"exit status {done.returncode}"


def _child_env(installation: Installation) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TVM_NUM_THREADS", str(installation.config.threads))
    env.setdefault("TVM_USE_RUNTIME_LIB", "1")  # the check needs only TVM's runtime, which loads faster
    return env


def _named(version: int | None) -> str:
    return "no release" if version is None else f"v{version}"


def _newest_below(kept: list[int], current: int | None) -> int | None:
    return max((v for v in kept if current is None or v < current), default=None)


def _versions(versions: list[int]) -> str:
    return ", ".join(f"v{v}" for v in versions) or "none"
