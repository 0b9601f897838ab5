"""The command line's logging: edgetune's progress lines plain on stderr (stdout keeps a verb's
table or JSON), other libraries' only from WARNING on, everything with --verbose."""

from __future__ import annotations

import logging

import pytest

from edgetune.cli import CONSOLE_HANDLER, log_to_console, main


@pytest.fixture
def restored_logging():
    """The root and edgetune loggers as they were before the test (main() configures them)."""
    root, edgetune = logging.getLogger(), logging.getLogger("edgetune")
    handlers, root_level, edgetune_level = list(root.handlers), root.level, edgetune.level
    yield
    root.handlers[:] = handlers
    root.setLevel(root_level)
    edgetune.setLevel(edgetune_level)


def test_progress_lines_are_plain_on_stderr_and_other_libraries_only_warn(restored_logging, capsys):
    log_to_console(verbose=False)
    log_to_console(verbose=False)  # again (main() in one process twice): still one handler
    logging.getLogger("edgetune.fleet.sim").info("gw-1: simulated board up")
    logging.getLogger("a_library").info("Connected (version 2.0)")
    logging.getLogger("a_library").warning("a library's warning")
    out, err = capsys.readouterr()
    assert out == "" and err == "gw-1: simulated board up\na library's warning\n"
    assert [h.get_name() for h in logging.getLogger().handlers].count(CONSOLE_HANDLER) == 1


def test_verbose_shows_every_logger_from_debug_on(restored_logging, capsys):
    log_to_console(verbose=True)
    logging.getLogger("edgetune.deploy.rollout").debug("a debug line")
    logging.getLogger("a_library").debug("a library's debug line")
    assert capsys.readouterr().err == "a debug line\na library's debug line\n"


def test_main_logs_to_the_stderr_of_the_moment(restored_logging, tmp_path, capsys):
    """main() configures logging on every call; its handler writes to whatever stderr is then
    (pytest swaps it per test), and a verb's failure still ends in `error: ...`."""
    assert main(["check", "-f", str(tmp_path / "missing.yaml")]) != 0
    logging.getLogger("edgetune.pipeline").info("== fleet up")
    err = capsys.readouterr().err
    assert "error: " in err and "missing.yaml" in err and err.endswith("== fleet up\n")
