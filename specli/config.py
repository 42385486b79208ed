"""Settings that come from the environment: where specli keeps its files."""

from __future__ import annotations

import os
from pathlib import Path

import typer

APP_NAME = "specli"


def specli_home() -> Path:
    """Directory for user settings and the user's `models.toml` (`SPECLI_HOME` overrides)."""
    env = os.environ.get("SPECLI_HOME")
    if env:
        return Path(env).expanduser()
    return Path(typer.get_app_dir(APP_NAME))


def cache_dir() -> Path:
    """Directory for files specli makes itself (the assembled demo model)."""
    env = os.environ.get("SPECLI_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / APP_NAME


def debug_enabled() -> bool:
    return os.environ.get("SPECLI_DEBUG", "") not in ("", "0")
