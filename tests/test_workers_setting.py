"""The `workers` setting: `auto` follows the CPUs the process may use, a container's CPU limit included
(cgroup v2 `cpu.max` or v1 `cpu.cfs_quota_us`); a bad value names the setting."""

from __future__ import annotations

import os

import pytest

from bertserve.service.settings import SettingsError, auto_workers, load_settings, usable_cpus


def _v2(tmp_path, text: str):
    (tmp_path / "cpu.max").write_text(text)
    return tmp_path


def _v1(tmp_path, quota: int, period: int = 100_000):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(f"{period}\n")
    return tmp_path


def test_usable_cpus_follow_the_container_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(64)))  # a 64-CPU node
    assert usable_cpus(tmp_path) == 64  # no cgroup files: the affinity
    cases = [(_v2, "max 100000", 64), (_v2, "250000 100000", 3), (_v1, 800_000, 8), (_v1, -1, 64)]
    for k, (write, value, cpus) in enumerate(cases):
        (tmp_path / str(k)).mkdir()
        assert usable_cpus(write(tmp_path / str(k), value)) == cpus, value


@pytest.mark.parametrize(("cpus", "workers"), [(1, 1), (2, 1), (3, 2), (8, 7), (9, 8), (64, 8)])
def test_auto_leaves_a_cpu_to_the_engine_and_stays_single_on_two(cpus, workers):
    assert auto_workers(cpus) == workers


@pytest.mark.parametrize("value", ["0", "65", "x", "-1", "1.5"])
def test_a_bad_workers_value_names_the_setting(value, monkeypatch):
    monkeypatch.setenv("BERTSERVE_WORKERS", value)
    with pytest.raises(SettingsError, match=r"setting workers \(BERTSERVE_WORKERS\): .*auto or a number"):
        load_settings()


def test_workers_from_the_environment(monkeypatch):
    monkeypatch.setenv("BERTSERVE_WORKERS", "3")
    assert load_settings().worker_count() == 3
    monkeypatch.setenv("BERTSERVE_WORKERS", "auto")
    assert load_settings().worker_count() == auto_workers()
