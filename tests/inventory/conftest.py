"""The inventory tests' fixture: a temporary folder that is also the working directory."""

import pytest


@pytest.fixture
def fleet_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path
