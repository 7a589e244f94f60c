"""Fixtures that several unit modules share."""

import pytest


@pytest.fixture
def isolated(pytester, monkeypatch, tmp_path):
    """Leases in a private folder; no NUM_GPUS from the caller's shell."""
    monkeypatch.setenv("RLSMOKE_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.delenv("NUM_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    pytester.makeini("[pytest]\naddopts = --strict-markers -ra\n")
    return pytester
