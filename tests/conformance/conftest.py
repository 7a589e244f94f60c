"""Conformance tests run inside the conformance venvs, one real parser per venv (.ci/conformance.sh).

`RLSMOKE_CONFORMANCE_PARSER` picks the parser this run checks: miles, sglang, mcore, or runner (the
cross-venv `check_plan` from the main venv). Unset, all are collected, and a parser that cannot be
imported here skips its tests with the reason (CI fails on any skip).
Loading a parser installs its device-fact fakes and import-only stubs (rlsmoke.conformance.device_facts).
"""

from __future__ import annotations

import pytest
from conformance_table import selected


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "conformance_parser(*names): runs only where RLSMOKE_CONFORMANCE_PARSER selects one of them",
    )


def pytest_collection_modifyitems(config, items):
    """Deselect (not skip) the tests of parsers this run does not check: CI fails on any skip."""
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("conformance_parser")
        (keep if marker is None or any(selected(n) for n in marker.args) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def load_parser():
    """`load_parser(name)`: the harness module with its real parser imported, or a skip with the reason."""
    loaded: dict[str, object] = {}

    def load(name: str):
        if name not in loaded:
            from rlsmoke.conformance.worker import load as load_real

            try:
                loaded[name] = load_real(name)
            except ImportError as exc:
                loaded[name] = exc
        module = loaded[name]
        if isinstance(module, ImportError):
            pytest.skip(f"the real {name} parser cannot be imported in this venv: {module}")
        return module

    return load
