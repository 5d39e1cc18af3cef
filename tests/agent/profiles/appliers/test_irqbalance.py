"""[irqbalance] running = true|false: parse refusals, and when it is applicable."""

from __future__ import annotations

import pytest

from agent.errors import ProfileError
from agent.profiles.appliers.base import HostContext
from agent.profiles.appliers.irqbalance import Irqbalance
from agent.profiles.model import Setting
from agent.sdnotify import systemd_is_pid1


def test_parse_takes_only_running_as_a_bool():
    a = Irqbalance(HostContext())
    assert a.parse({"running": False}, "p.toml") == [Setting("irqbalance", "running", False, "p.toml")]
    with pytest.raises(ProfileError, match=r"\[irqbalance\] running.*true or false"):
        a.parse({"running": "no"}, "p.toml")
    with pytest.raises(ProfileError, match="unknown key; the only key is `running`"):
        a.parse({"banned_cpus": "0"}, "p.toml")


def test_applicable_only_where_systemd_can_switch_it():
    verdict = Irqbalance(HostContext()).applicable("running")
    if systemd_is_pid1():
        assert verdict is None or verdict.why == "irqbalance is not installed"
    else:
        assert verdict is not None and "systemd is not PID 1" in verdict.why
