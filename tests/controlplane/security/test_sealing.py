"""Sealed values are bound to their job and variable: one copied in etcd onto another job or
name, or altered, does not open (and so never reaches an agent)."""

from __future__ import annotations

import pytest

from controlplane.security.sealing import PREFIX, TOKEN, Sealer, SealingError


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


def test_a_rotation_ends_as_jobs_change_and_values_from_before_the_key_are_sealed_at_the_next_change():
    old_key, new_key = ("k1", bytes(32)), ("k2", bytes(range(32)))
    held = Sealer([old_key]).seal_task("e/j", {"image": "i", "secret_env": {"A": "1"}})
    s = Sealer([new_key, old_key])
    same = s.seal_task("e/j", {"image": "i", "secret_env": {"A": "1"}}, held)
    assert same == held, "nothing else changed: the old key's seal stays (no new spec, no restart)"
    changed = s.seal_task("e/j", {"image": "j", "secret_env": {"A": "1"}}, held)
    assert s.key_of(changed["secret_env"]["A"]) == "k2", "a new spec anyway: sealed with the first key"
    clear = {"image": "i", "secret_env": {"A": "1"}}  # written before the daemon had a key
    assert s.seal_task("e/j", dict(clear), clear) == clear
    assert s.key_of(s.seal_task("e/j", {**clear, "image": "j"}, clear)["secret_env"]["A"]) == "k2"
    assert s.unknown_keys([held, changed, clear]) == {} and Sealer([new_key]).unknown_keys([held]) == {"k1": 1}
    for sealer in (s, Sealer()):
        with pytest.raises(ValueError, match="may not begin with"):
            sealer.seal_task("e/j", {"secret_env": {"A": PREFIX + "k1:AAAA"}})


def test_a_controller_token_is_kept_when_the_same_is_sent_and_opens_under_no_variables_name():
    k1, k2 = ("k1", bytes(range(32))), ("k2", bytes(32))
    s = Sealer([k1])
    held = s.seal_token("web/api", "tok", None)
    assert held.startswith("twine-sealed:v1:k1:") and s.open("web/api", TOKEN, held) == "tok"
    assert s.seal_token("web/api", "tok", held) == held, "the same token: the same sealed form (no change)"
    assert s.seal_token("web/api", "other", held) != held
    assert s.seal_token("web/api", None, held) is None
    rotated = Sealer([k2, k1])
    again = rotated.seal_token("web/api", "tok", held)
    assert again.startswith("twine-sealed:v1:k2:"), "sealed anew with the first key"
    for handle, var in (("web/other", TOKEN), ("web/api", "controller_token")):  # another job; a variable's name
        with pytest.raises(SealingError):
            s.open(handle, var, held)
    with pytest.raises(ValueError, match="controller_token"):
        s.seal_token("web/api", held, None)
