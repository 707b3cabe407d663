"""Fixtures the tune tests share: an isolated tune store, and copies of the tiny pair (tests change
their files). A test module imports them: `from tune_fixtures import config_dir, model_pair`."""

from __future__ import annotations

import shutil

import pytest

from llamaspec.tune import store


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    """LLAMASPEC_CONFIG_DIR in a fresh folder: no test sees the user's store or another test's."""
    d = tmp_path / "cfg"
    monkeypatch.setenv(store.ENV_CONFIG_DIR, str(d))
    return d


@pytest.fixture
def model_pair(tiny_models, tmp_path):
    """Copies of the tiny target and draft."""
    t, d = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    shutil.copy2(tiny_models["target"], t)
    shutil.copy2(tiny_models["draft"], d)
    return t, d
