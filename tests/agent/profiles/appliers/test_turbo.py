"""CPU turbo. This host has no turbo driver: on the real kernel the setting is not applicable.
The drivers' switching logic is exercised against their sysfs layout laid out in a temporary
directory given as HostContext.sys (the override the context has for checking another root)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import ProfileError
from agent.profiles.appliers.base import HostContext
from agent.profiles.appliers.turbo import Turbo
from agent.profiles.model import Holds


def test_this_host_turbo_control_is_found_or_the_verdict_says_where_it_looked():
    ctx = HostContext()
    pstate, boost = ctx.sys / "devices/system/cpu/intel_pstate/no_turbo", ctx.sys / "devices/system/cpu/cpufreq/boost"
    turbo = Turbo(ctx)
    verdict = turbo.applicable("enabled")
    if pstate.exists() or boost.exists():  # a host with a driver: the setting reads as a boolean
        if verdict is None:
            assert isinstance(turbo.read("enabled"), bool)
        else:  # a driver that is there but off or read-only says which
            assert str(pstate.parent) in verdict.why or str(boost) in verdict.why, verdict.why
    else:
        assert verdict is not None
        assert str(pstate) in verdict.why and str(boost) in verdict.why


@pytest.mark.parametrize("section", [{"enabled": 1}, {"enabled": "true"}, {"enabled": None}, {"boost": True}])
def test_parse_rejects_anything_but_one_boolean(section):
    with pytest.raises(ProfileError):
        Turbo(HostContext()).parse(section, "test.toml")


def test_parse_accepts_a_boolean():
    [s] = Turbo(HostContext()).parse({"enabled": False}, "test.toml")
    assert (s.key, s.value) == ("enabled", False)


def layout(root: Path, files: dict[str, str], mode: int = 0o644) -> None:
    for rel, text in files.items():
        path = root / "devices/system/cpu" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)


def test_intel_pstate_no_turbo_is_inverted(tmp_path):
    layout(tmp_path, {"intel_pstate/status": "active\n", "intel_pstate/no_turbo": "0\n"})
    t = Turbo(HostContext(sys=tmp_path))
    assert t.applicable("enabled") is None and t.read("enabled") is True
    t.write("enabled", False)
    assert (tmp_path / "devices/system/cpu/intel_pstate/no_turbo").read_text() == "1"
    assert t.verify("enabled", False) == Holds()


def test_boost_of_acpi_cpufreq(tmp_path):
    layout(tmp_path, {"cpufreq/boost": "0\n"})
    t = Turbo(HostContext(sys=tmp_path))
    t.write("enabled", True)
    assert (tmp_path / "devices/system/cpu/cpufreq/boost").read_text() == "1"
    assert t.read("enabled") is True


def test_intel_pstate_off_falls_back_to_boost_or_says_why(tmp_path):
    layout(tmp_path, {"intel_pstate/status": "off\n", "intel_pstate/no_turbo": "0\n"})
    verdict = Turbo(HostContext(sys=tmp_path)).applicable("enabled")
    assert verdict is not None and "says off" in verdict.why
    layout(tmp_path, {"cpufreq/boost": "1\n"})
    assert Turbo(HostContext(sys=tmp_path)).applicable("enabled") is None


def test_read_only_no_turbo_is_not_applicable(tmp_path):
    layout(tmp_path, {"intel_pstate/status": "passive\n", "intel_pstate/no_turbo": "1\n"}, mode=0o444)
    verdict = Turbo(HostContext(sys=tmp_path)).applicable("enabled")
    assert verdict is not None and "read-only" in verdict.why
