"""Sealed values are bound to their job and variable: one copied in etcd onto another job or
name, or altered, does not open (and so never reaches an agent)."""

from __future__ import annotations

import pytest

from controlplane.sealing import PREFIX, Sealer, SealingError


def test_a_sealed_value_opens_only_for_its_job_and_name_and_not_once_altered():
    s = Sealer([("k", bytes(range(32)))])
    v = s.seal("web/api", "DB_PASSWORD", "hunter2")
    assert v.startswith(PREFIX + "k:") and "hunter2" not in v
    assert s.open("web/api", "DB_PASSWORD", v) == "hunter2"
    assert s.seal("web/api", "DB_PASSWORD", "hunter2") != v, "a fresh nonce each time"
    for handle, var in (("web/other", "DB_PASSWORD"), ("web/api", "OTHER")):
        with pytest.raises(SealingError, match="does not open"):
            s.open(handle, var, v)
    tampered = v[:-6] + ("A" if v[-6] != "A" else "B") + v[-5:]
    with pytest.raises(SealingError):
        s.open("web/api", "DB_PASSWORD", tampered)
    assert s.open("web/api", "X", "written-in-clear") == "written-in-clear"
    with pytest.raises(SealingError, match="not in --secret-key-file"):
        Sealer([("other", bytes(32))]).open("web/api", "DB_PASSWORD", v)


def test_sealing_a_template_keeps_what_the_job_holds_and_seals_what_changed():
    s = Sealer([("k", bytes(32))])
    first = s.seal_task("e/j", {"image": "i", "secret_env": {"A": "1", "B": "2"}})
    again = s.seal_task("e/j", {"image": "i", "secret_env": {"A": "1", "B": "3"}}, first)
    assert again["secret_env"]["A"] == first["secret_env"]["A"]
    assert again["secret_env"]["B"] != first["secret_env"]["B"]
    assert s.open_task("e/j", again)["secret_env"] == {"A": "1", "B": "3"}
    assert Sealer().seal_task("e/j", {"secret_env": {"A": "1"}}) == {"secret_env": {"A": "1"}}, "no key: as given"
