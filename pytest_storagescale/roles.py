"""This process's part in a pytest-xdist session, worked out in one place."""

from __future__ import annotations

import enum

import pytest


class Role(enum.Enum):
    SINGLE = "single"
    CONTROLLER = "controller"
    WORKER = "worker"


def role_of(config: pytest.Config) -> Role:
    """This process's xdist role (the one place it is worked out)."""
    if hasattr(config, "workerinput"):
        return Role.WORKER
    if getattr(config.option, "dist", "no") != "no":  # xdist set it from -n/--dist
        return Role.CONTROLLER
    return Role.SINGLE
