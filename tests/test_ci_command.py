"""CI runs the README's test command, word for word (the repo's rule: nothing weaker)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_test_command() -> str:
    """The command the README's set-up section gives for installing and running the tests."""
    setup = (ROOT / "README.md").read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = [line.strip() for line in setup.splitlines() if line.startswith("    ") and "pytest" in line]
    assert len(commands) == 1, f"the README's set-up section should give one test command, found {commands}"
    return commands[0]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_test_command() in ci


def test_the_readme_test_command_runs_the_whole_suite():
    """No path, marker or keyword selection: the command runs every test pytest collects."""
    command = readme_test_command()
    pytest_args = command.split("pytest", 1)[1].split()
    if "-n" in pytest_args:                               # pytest-xdist's worker count takes a value
        del pytest_args[pytest_args.index("-n") + 1]
    assert not [arg for arg in pytest_args if arg in ("-m", "-k", "-x") or not arg.startswith("-")], pytest_args
    assert re.search(r"pip install -e \"\.\[test\]\"", command)
