"""Every command the user docs show runs as written: each `edgetune ...` (or `python -m edgetune
...`) line of a fenced ```sh block in README.md, docs/*.md and bench/README.md names a verb that
exists, with flags and arguments its argparse parser accepts; each board agent line (`python
.../edgetune-agent.pyz ...` or `python -m edgetune.agent ...`) is one the agent's parser accepts;
and each `make TARGET` names a target of the Makefile. The parsers are edgetune.cli's and
edgetune.agent.cli's own, built once as their `main`s build them, and asked in-process. README's
documentation list names every page of docs/."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from edgetune.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = (ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md")))
SH_FENCE = re.compile(r"^```(?:sh|bash)[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")"}
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
MAKE_TARGET = re.compile(r"^([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*:(?!=)", re.MULTILINE)


def sh_blocks(markdown: str) -> list[str]:
    return [match.group(1) for match in SH_FENCE.finditer(markdown)]


def command_lines(block: str) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, comments dropped, split
    at `&&`, `;`, `|`, `&` and parentheses."""
    commands: list[list[str]] = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.strip().removeprefix("$ ")
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        current: list[str] = []
        for token in lexer:
            if token in SEPARATORS:
                commands.append(current)
                current = []
            else:
                current.append(token)
        commands.append(current)
    return [command for command in commands if command]


def edgetune_arguments(command: list[str]) -> list[str] | None:
    """The arguments after `edgetune` or `python -m edgetune`; None for any other program."""
    while command and ENV_ASSIGNMENT.match(command[0]):
        command = command[1:]
    if not command:
        return None
    program = Path(command[0]).name
    if program == "edgetune":
        return command[1:]
    if re.fullmatch(r"python[0-9.]*", program) and command[1:3] == ["-m", "edgetune"]:
        return command[3:]
    return None


def agent_arguments(command: list[str]) -> list[str] | None:
    """The arguments after `python .../edgetune-agent.pyz` or `python -m edgetune.agent` (the board
    agent's bundle, or its module in a checkout); None for any other program."""
    while command and ENV_ASSIGNMENT.match(command[0]):
        command = command[1:]
    if len(command) < 2 or not re.fullmatch(r"python[0-9.]*", Path(command[0]).name):
        return None
    if Path(command[1]).name == "edgetune-agent.pyz":
        return command[2:]
    if command[1:3] == ["-m", "edgetune.agent"]:
        return command[3:]
    return None


@cache
def cli_parser():
    return build_parser()


@cache
def agent_parser():
    from edgetune.agent.cli import build_parser as build_agent_parser

    return build_agent_parser()


@cache
def makefile_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    return frozenset(name for match in MAKE_TARGET.finditer(text) for name in match.group(1).split())


def edgetune_problem(arguments: list[str], parser=None) -> str | None:
    """What the CLI's own parser (or `parser`) says about these arguments, or None if it takes them."""
    if any(argument in ("-h", "--help") for argument in arguments):
        arguments = [argument for argument in arguments if argument not in ("-h", "--help")]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            (parser or cli_parser()).parse_args(arguments)
    except SystemExit:
        return stderr.getvalue().strip().splitlines()[-1]
    return None


def make_problem(arguments: list[str]) -> str | None:
    targets = [a for a in arguments if not a.startswith("-") and not ENV_ASSIGNMENT.match(a)]
    unknown = [target for target in targets if target not in makefile_targets()]
    return f"no Makefile target {', '.join(unknown)}" if unknown else None


def problems(markdown: str) -> list[str]:
    """Every command of the markdown's sh blocks that would not run as written, with why."""
    found = []
    for block in sh_blocks(markdown):
        for command in command_lines(block):
            arguments = edgetune_arguments(command)
            if arguments is not None:
                problem = edgetune_problem(arguments)
            elif (arguments := agent_arguments(command)) is not None:
                problem = edgetune_problem(arguments, agent_parser())
            elif Path(command[0]).name == "make":
                problem = make_problem(command[1:])
            else:
                continue
            if problem:
                found.append(f"{shlex.join(command)}: {problem}")
    return found


def checked_commands(markdown: str) -> list[list[str]]:
    return [
        command
        for block in sh_blocks(markdown)
        for command in command_lines(block)
        if edgetune_arguments(command) is not None
        or agent_arguments(command) is not None
        or Path(command[0]).name == "make"
    ]


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_documented_command_runs_as_written(path):
    assert problems(path.read_text()) == []


def test_the_readme_shows_its_commands_in_sh_blocks():
    commands = {shlex.join(c) for c in checked_commands((ROOT / "README.md").read_text())}
    assert {"make tune-fleet", "make test"} <= commands
    assert sum(1 for c in commands if c.startswith("edgetune ")) >= 10


BAD_SAMPLE = """\
Some prose with `edgetune frobnicate` outside a block, which is not checked.

```sh
edgetune frobnicate -f fleet.yaml          # no such verb
edgetune tune --class gw --turbo           # no such flag
.venv/bin/python -m edgetune rollout --canary 1   # --model is required
make tune-fleet && make deploy-everything  # no such target
edgetune fleet up; edgetune fleet launch   # the second action does not exist
edgetune regress --board gw-a1 \\
    --changed-only --jsonn
```

```sh
edgetune plan --json                       # fine
FLEET=other.yaml make check                # fine
python3 -m pip install numpy               # another program: not checked
```
"""


def test_the_checker_names_each_made_up_verb_flag_and_target():
    found = problems(BAD_SAMPLE)
    assert len(found) == 6, found
    frobnicate, turbo, rollout, deploy, launch, jsonn = found
    assert frobnicate.startswith("edgetune frobnicate -f fleet.yaml: ") and "invalid choice: 'frobnicate'" in frobnicate
    assert "unrecognized arguments: --turbo" in turbo
    assert rollout.startswith(".venv/bin/python -m edgetune rollout") and "--model" in rollout
    assert deploy == "make deploy-everything: no Makefile target deploy-everything"
    assert "invalid choice: 'launch'" in launch
    assert "unrecognized arguments: --jsonn" in jsonn


def test_the_checker_reads_blocks_as_a_shell_would():
    commands = command_lines("A=1 edgetune check -f 'my fleet.yaml' && make plan  # plan\nedgetune sim up &\n")
    assert commands == [
        ["A=1", "edgetune", "check", "-f", "my fleet.yaml"],
        ["make", "plan"],
        ["edgetune", "sim", "up"],
    ]
    assert edgetune_arguments(commands[0]) == ["check", "-f", "my fleet.yaml"]
    assert problems("```sh\nedgetune plan --json\nmake test\n```\n") == []


AGENT_SAMPLE = """\
```sh
/opt/board/bin/python /var/lib/edgetune/agent/edgetune-agent.pyz --root /var/lib/edgetune/agent status --json  # fine
python3 -m edgetune.agent --root /tmp/agent fetch --model mlp                     # fine
python3 /var/lib/edgetune/agent/edgetune-agent.pyz install --model mlp           # --root is required
python3 -m edgetune.agent --root /tmp/agent --json status                         # --json goes after the verb
python3 /var/lib/edgetune/agent/edgetune-agent.pyz --root /tmp/agent install --from v3.tar.gz   # --model is required
python3 /var/lib/edgetune/agent/edgetune-agent.pyz --root /tmp/agent verify v3.tar.gz           # the agent has no verify
```
"""


def test_the_checker_reads_board_agent_lines_with_the_agents_parser():
    found = problems(AGENT_SAMPLE)
    assert len(found) == 4, found
    root, json_first, model, verify = found
    assert "--root" in root
    assert "unrecognized arguments: --json" in json_first
    assert "--model" in model
    assert "invalid choice: 'verify'" in verify
    assert agent_arguments(["python3", "-m", "edgetune", "check"]) is None
    assert edgetune_arguments(["python3", "-m", "edgetune.agent", "--root", "r", "status"]) is None


def test_the_docs_show_the_board_agent_by_hand():
    commands = checked_commands((ROOT / "docs" / "deploy.md").read_text())
    agent = [agent_arguments(c) for c in commands if agent_arguments(c) is not None]
    assert {a[2] for a in agent} >= {"status", "fetch", "install"}, agent


def test_the_readme_lists_every_page_of_docs():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"\]\(docs/([^)#]+\.md)", section))
    assert listed == {path.name for path in (ROOT / "docs").glob("*.md")}
