"""The profile engine on the real kernel: apply, verify, switch, rollback, crash recovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.errors import ProfileError
from agent.profiles.appliers.base import HostContext
from agent.profiles.engine import APPLIED, JOURNAL, Engine
from agent.profiles.model import Outcome
from tests.conftest import sysctl_path

KEYS = ("net.core.somaxconn", "vm.swappiness", "net.ipv4.tcp_fin_timeout", "vm.dirty_ratio")


def read(name: str) -> str:
    return " ".join(sysctl_path(name).read_text().split())


def other(name: str, *candidates: int) -> int:
    """A value different from the current one, so that every test really changes the host."""
    cur = int(read(name))
    return next(c for c in candidates if c != cur)


@pytest.fixture
def originals(host_files):
    host_files.save(*(sysctl_path(k) for k in KEYS))
    return {k: read(k) for k in KEYS}


@pytest.fixture
def engine(tmp_path):
    return Engine(HostContext(), tmp_path / "state", search=(tmp_path,))


def write_profile(dir: Path, name: str, body: str) -> Path:
    path = dir / f"{name}.toml"
    path.write_text(textwrap.dedent(body))
    return path


def two_sysctls(dir: Path) -> tuple[int, int]:
    """Profile "p": somaxconn and swappiness, each set to a value the host does not have now."""
    somaxconn, swappiness = other("net.core.somaxconn", 1024, 2048), other("vm.swappiness", 33, 34)
    write_profile(dir, "p", f"""
        [sysctl]
        "net.core.somaxconn" = {somaxconn}
        "vm.swappiness" = {swappiness}
    """)
    return somaxconn, swappiness


def test_apply_changes_sysctls_and_rollback_restores_every_original(tmp_path, engine, originals):
    somaxconn, swappiness = two_sysctls(tmp_path)
    report = engine.apply("p")
    assert report.ok, report.error
    assert [r.outcome for r in report.results] == [Outcome.APPLIED, Outcome.APPLIED]
    assert read("net.core.somaxconn") == str(somaxconn)
    assert read("vm.swappiness") == str(swappiness)
    assert engine.current()["profile"] == "p"
    assert engine.verify().ok

    report = engine.rollback()
    assert report.ok, report.error
    assert {r.outcome for r in report.results} == {Outcome.RESTORED}
    assert read("net.core.somaxconn") == originals["net.core.somaxconn"]
    assert read("vm.swappiness") == originals["vm.swappiness"]
    assert engine.current() is None


def test_apply_twice_holds_and_writes_nothing(tmp_path, engine, originals):
    write_profile(tmp_path, "p", f'[sysctl]\n"vm.swappiness" = {other("vm.swappiness", 33, 34)}\n')
    assert engine.apply("p").ok
    again = engine.apply("p")
    assert again.ok and [r.outcome for r in again.results] == [Outcome.HELD]
    # The original is still the one from before the first apply.
    assert engine.current()["originals"]["sysctl:vm.swappiness"]["value"] == originals["vm.swappiness"]


def test_setting_that_fails_half_way_leaves_the_host_exactly_as_it_was(tmp_path, engine, originals):
    write_profile(tmp_path, "bad", f"""
        [sysctl]
        "net.core.somaxconn" = {other("net.core.somaxconn", 1024, 2048)}
        "net.ipv4.tcp_fin_timeout" = {other("net.ipv4.tcp_fin_timeout", 17, 18)}
        "vm.swappiness" = 500   # above the kernel's maximum: the write fails with EINVAL
    """)
    report = engine.apply("bad")
    assert not report.ok
    by_id = {r.setting_id: r for r in report.results}
    assert by_id["sysctl:vm.swappiness"].outcome is Outcome.FAILED
    assert "Invalid argument" in by_id["sysctl:vm.swappiness"].reason
    assert by_id["sysctl:net.core.somaxconn"].outcome is Outcome.ROLLED_BACK
    assert "sysctl:vm.swappiness" in report.error
    assert {k: read(k) for k in KEYS} == originals
    assert engine.current() is None
    assert not (engine.state_dir / JOURNAL).exists()


def test_a_rollback_that_restores_part_leaves_no_profile_in_force_and_the_same_profile_applies_again(
        tmp_path, engine, originals):
    somaxconn, swappiness = two_sysctls(tmp_path)
    assert engine.apply("p").ok
    digest = engine.current()["hash"]
    assert engine.in_force("p", digest)
    # An original the kernel will not take back (as an IRQ it cannot move yet): the rollback
    # restores somaxconn and fails on swappiness.
    record = json.loads((engine.state_dir / APPLIED).read_text())
    record["originals"]["sysctl:vm.swappiness"]["value"] = "500"
    (engine.state_dir / APPLIED).write_text(json.dumps(record))

    report = engine.rollback()
    assert not report.ok and "sysctl:vm.swappiness" in report.error
    assert read("net.core.somaxconn") == originals["net.core.somaxconn"]
    assert read("vm.swappiness") == str(swappiness)
    # The record names what is left to restore, but p is no longer in force: neither p nor "no
    # profile" is what the host holds.
    assert engine.current()["rollback_incomplete"].startswith("sysctl:vm.swappiness")
    assert not engine.in_force("p", digest) and not engine.in_force("p") and not engine.in_force(None)

    again = engine.apply("p")
    assert again.ok, again.error
    assert {r.setting_id: r.outcome for r in again.results} == {
        "sysctl:net.core.somaxconn": Outcome.APPLIED, "sysctl:vm.swappiness": Outcome.HELD}
    assert read("net.core.somaxconn") == str(somaxconn)
    assert engine.in_force("p", digest)


def test_hold_writes_again_only_what_no_longer_holds_and_keeps_the_originals(tmp_path, engine, originals):
    somaxconn, swappiness = two_sysctls(tmp_path)
    assert engine.apply("p").ok
    assert engine.hold("sysctl") == []  # everything holds: nothing written
    sysctl_path("vm.swappiness").write_text("7")  # undone by something else on the host
    assert engine.hold("sysctl") == ["sysctl:vm.swappiness"]
    assert read("vm.swappiness") == str(swappiness)
    assert engine.hold("hugepages") == []  # the profile sets none
    assert engine.rollback().ok
    assert {k: read(k) for k in KEYS} == originals  # the originals are still the ones from before
    assert engine.hold("sysctl") == []  # no profile applied


def test_switch_restores_what_the_old_profile_set_and_the_new_one_does_not(tmp_path, engine, originals):
    a_swap, b_fin = other("vm.swappiness", 33, 34), other("net.ipv4.tcp_fin_timeout", 17, 18)
    write_profile(tmp_path, "a", f'[sysctl]\n"vm.swappiness" = {a_swap}\n"net.core.somaxconn" = 1111\n')
    write_profile(tmp_path, "b", f'[sysctl]\n"net.ipv4.tcp_fin_timeout" = {b_fin}\n"net.core.somaxconn" = 2222\n')
    assert engine.apply("a").ok
    report = engine.apply("b")
    assert report.ok and report.previous == "a"
    outcomes = {r.setting_id: r.outcome for r in report.results}
    assert outcomes["sysctl:vm.swappiness"] is Outcome.RESTORED
    assert read("vm.swappiness") == originals["vm.swappiness"]
    assert read("net.core.somaxconn") == "2222"
    assert read("net.ipv4.tcp_fin_timeout") == str(b_fin)
    # somaxconn's original is still the one from before profile a.
    assert engine.current()["originals"]["sysctl:net.core.somaxconn"]["value"] == originals["net.core.somaxconn"]
    assert engine.rollback().ok
    assert {k: read(k) for k in KEYS} == originals


def test_failed_switch_returns_to_the_previous_profile_not_to_bare_host(tmp_path, engine, originals):
    write_profile(tmp_path, "a", '[sysctl]\n"vm.swappiness" = 33\n')
    write_profile(tmp_path, "b", '[sysctl]\n"net.core.somaxconn" = 2222\n"vm.dirty_ratio" = 500\n')
    assert engine.apply("a").ok
    report = engine.apply("b")
    assert not report.ok
    assert read("vm.swappiness") == "33"  # a's setting, restored after b's failed switch
    assert read("net.core.somaxconn") == originals["net.core.somaxconn"]
    assert engine.current()["profile"] == "a"


def test_verify_names_the_setting_that_drifted(tmp_path, engine, originals):
    write_profile(tmp_path, "p", '[sysctl]\n"vm.swappiness" = 33\n')
    assert engine.apply("p").ok
    sysctl_path("vm.swappiness").write_text("35")
    report = engine.verify()
    assert not report.ok
    [failed] = report.failed()
    assert failed.setting_id == "sysctl:vm.swappiness" and failed.after == "35"
    assert "35" in failed.reason and "33" in failed.reason


def test_journal_left_by_a_crash_is_rolled_back(tmp_path, originals):
    """A real crash: a subprocess is SIGKILLed by the kernel in the middle of its second write."""
    state = tmp_path / "state"
    write_profile(tmp_path, "p", f"""
        [sysctl]
        "net.core.somaxconn" = {other("net.core.somaxconn", 1024, 2048)}
        "vm.swappiness" = {other("vm.swappiness", 33, 34)}
    """)
    crash = textwrap.dedent(f"""
        import os, signal
        from agent.profiles.appliers import sysctl
        from agent.profiles.appliers.base import HostContext
        from agent.profiles.engine import Engine
        real_write, calls = sysctl.Sysctl.write, []
        def write(self, key, value):
            calls.append(key)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            real_write(self, key, value)
        sysctl.Sysctl.write = write
        Engine(HostContext(), {str(state)!r}, search=({str(tmp_path)!r},)).apply("p")
    """)
    proc = subprocess.run([sys.executable, "-c", crash], cwd=Path(__file__).parents[3])
    assert proc.returncode == -9
    assert read("net.core.somaxconn") != originals["net.core.somaxconn"]  # half applied
    assert json.loads((state / JOURNAL).read_text())["target"] == "p"

    report = Engine(HostContext(), state).recover()
    assert report is not None and report.ok
    assert {k: read(k) for k in KEYS} == originals
    assert not (state / JOURNAL).exists() and not (state / APPLIED).exists()


@pytest.mark.parametrize(
    "bad_line, field, why",
    [
        ('"kernel.core_pattern" = "|/tmp/x"', "kernel.core_pattern", "allow-list"),
        # in the allow-list, but they hurt the host itself (issue #11)
        ('"vm.panic_on_oom" = 2', "vm.panic_on_oom", "does not panic"),
        ('"kernel.sched_rt_runtime_us" = -1', "kernel.sched_rt_runtime_us", "every CPU"),
        ('"net.ipv4.ip_forward" = 1', "net.ipv4.ip_forward", "router"),
        ('"net.ipv6.conf.all.forwarding" = 1', "net.ipv6.conf.all.forwarding", "router"),
        ('"vm.min_free_kbytes" = 20000000', "vm.min_free_kbytes", "5% of the host's memory"),
        ('x = ' + '[' * 5000 + ']' * 5000, "file", "nested too deep"),
        ('"net/../../etc/passwd" = 1', "net/../../etc/passwd", "not a sysctl name"),
        ('"vm.nr_hugepages" = 4', "vm.nr_hugepages", "[hugepages]"),
        ('"net.core.no_such_knob" = 4', "net.core.no_such_knob", "no such sysctl"),
        ('"vm.dirty_ratio" = {a = 1}', "vm.dirty_ratio", "must be an integer"),
        ('[frobnicate]\nx = 1', "[frobnicate]", "unknown applier"),
        ('"vm.dirty_ratio" = ', "file", "not valid TOML"),
        ('[profile]\ninclude = "bad"', "include", "include cycle"),
    ],
)
def test_bad_profile_is_refused_naming_file_field_and_value_and_changes_nothing(
    tmp_path, engine, originals, bad_line, field, why
):
    # A valid setting first: it must not be applied either.
    path = write_profile(tmp_path, "bad", f'[sysctl]\n"vm.swappiness" = 33\n{bad_line}\n')
    with pytest.raises(ProfileError) as e:
        engine.apply("bad")
    assert str(path) in str(e.value)
    assert field in str(e.value) and why in str(e.value)
    assert {k: read(k) for k in KEYS} == originals
    assert engine.current() is None and not (engine.state_dir / JOURNAL).exists()


def test_include_merges_per_key_and_child_overrides(tmp_path, engine):
    write_profile(tmp_path, "base", '[sysctl]\n"vm.swappiness" = 10\n"net.core.somaxconn" = 1000\n"vm.dirty_ratio" = 20\n')
    child = write_profile(tmp_path, "child", '[profile]\ninclude = "base"\n[sysctl]\n"vm.swappiness" = 1\n"vm.dirty_ratio" = ""\n')
    profile, settings = engine.load("child")
    assert {s.key: s.value for s in settings} == {"vm.swappiness": "1", "net.core.somaxconn": "1000"}
    origins = {s.key: s.origin for s in settings}
    assert origins["vm.swappiness"] == str(child) and origins["net.core.somaxconn"].endswith("base.toml")
    assert profile.files == (str(tmp_path / "base.toml"), str(child))


def test_diff_changes_nothing(tmp_path, engine, originals):
    write_profile(tmp_path, "p", f'[sysctl]\n"vm.swappiness" = {other("vm.swappiness", 33, 34)}\n')
    _, plan = engine.plan("p")
    assert [(p.setting.id, p.action, p.current) for p in plan] == [("sysctl:vm.swappiness", "change", originals["vm.swappiness"])]
    assert read("vm.swappiness") == originals["vm.swappiness"]


def test_shared_kernel_agent_applies_netns_settings_and_reports_kernel_wide_ones(tmp_path, originals):
    engine = Engine(HostContext(owns_kernel=False), tmp_path / "state", search=(tmp_path,))
    write_profile(tmp_path, "p", '[sysctl]\n"vm.swappiness" = 33\n"net.core.somaxconn" = 1234\n')
    report = engine.apply("p")
    assert report.ok
    by_id = {r.setting_id: r for r in report.results}
    assert by_id["sysctl:vm.swappiness"].outcome is Outcome.NOT_APPLICABLE
    assert "shared kernel" in by_id["sysctl:vm.swappiness"].reason
    assert read("vm.swappiness") == originals["vm.swappiness"]
    assert read("net.core.somaxconn") == "1234"
    assert engine.rollback().ok


def test_cli_apply_exit_codes_and_json(tmp_path, originals):
    write_profile(tmp_path, "p", f'[sysctl]\n"vm.swappiness" = {other("vm.swappiness", 33, 34)}\n')
    write_profile(tmp_path, "bad", '[sysctl]\n"kernel.core_pattern" = "x"\n')
    write_profile(tmp_path, "fails", '[sysctl]\n"vm.swappiness" = 500\n')
    base = [sys.executable, "-m", "agent", "--state-dir", str(tmp_path / "st"), "profile"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    run = lambda *a: subprocess.run([*base, *a], capture_output=True, text=True, env=env)  # noqa: E731

    bad = run("apply", str(tmp_path / "bad.toml"))
    assert bad.returncode == 2 and "kernel.core_pattern" in bad.stderr and "bad.toml" in bad.stderr
    # hostile files are input errors (exit 2, named), not tracebacks (exit 1)
    (tmp_path / "deep.toml").write_text("[sysctl]\nx = " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp_path / "latin1.toml").write_bytes('[sysctl]\n"vm.swappiness" = 10 # caf\u00e9\n'.encode("latin-1"))
    for name, why in (("deep", "nested too deep"), ("latin1", "not UTF-8")):
        hostile = run("apply", str(tmp_path / f"{name}.toml"))
        assert hostile.returncode == 2 and why in hostile.stderr and "Traceback" not in hostile.stderr, hostile
    fails = run("apply", str(tmp_path / "fails.toml"))
    assert fails.returncode == 1 and "Invalid argument" in fails.stdout
    ok = run("apply", str(tmp_path / "p.toml"), "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["results"][0]["outcome"] == "applied"
    sysctl_path("vm.swappiness").write_text("35")
    assert run("verify").returncode == 1
    assert run("rollback").returncode == 0
    assert read("vm.swappiness") == originals["vm.swappiness"]


def test_the_hosts_operator_may_lift_a_guard_and_only_in_the_agents_config(tmp_path):
    """A guarded sysctl is refused in a profile unless agent.toml names it in sysctl_unguarded
    (parsed only: the value is not applied to this host)."""
    import argparse

    from agent.config import load_config
    from agent.errors import InputError, ProfileError
    from agent.profiles.appliers.sysctl import Sysctl

    with pytest.raises(ProfileError, match="sysctl_unguarded"):
        Sysctl(HostContext()).parse({"vm.min_free_kbytes": 20_000_000}, "p.toml")
    conf = tmp_path / "agent.toml"
    conf.write_text('sysctl_unguarded = ["vm.min_free_kbytes", "net.ipv4.conf.eth0.forwarding"]\n')
    cfg = load_config(argparse.Namespace(config=str(conf)))
    [s] = Sysctl(cfg.host_context()).parse({"vm.min_free_kbytes": 20_000_000}, "p.toml")
    assert (s.key, s.value) == ("vm.min_free_kbytes", "20000000")
    with pytest.raises(ProfileError, match="does not panic"):  # the others stay guarded
        Sysctl(cfg.host_context()).parse({"vm.panic_on_oom": 2}, "p.toml")
    conf.write_text('sysctl_unguarded = ["net.core.somaxconn"]\n')
    with pytest.raises(InputError, match="not a guarded sysctl"):
        load_config(argparse.Namespace(config=str(conf)))



@pytest.mark.parametrize("key, bad, good", [
    ("kernel.pid_max", 300, 4194304), ("kernel.threads-max", 100, 200000), ("fs.file-max", 1000, 4194304),
    ("fs.nr_open", 64, 1048576), ("vm.overcommit_memory", 2, 1),
])
def test_limits_that_set_low_stop_the_host_starting_processes_are_guarded(key, bad, good):
    from agent.profiles.appliers.sysctl import Sysctl

    with pytest.raises(ProfileError, match="sysctl_unguarded"):
        Sysctl(HostContext()).parse({key: bad}, "p.toml")
    [s] = Sysctl(HostContext()).parse({key: good}, "p.toml")
    assert s.value == str(good)


def test_a_profile_the_control_plane_names_is_looked_up_in_the_profile_directories_only(tmp_path, monkeypatch):
    """A name from the network never reaches a file of the host: not a path, not a .toml file
    relative to the working directory, not a parent directory; the same name in a profile
    directory is found there."""
    from agent.daemon import _target
    from agent.models import DesiredState
    from agent.profiles.loader import ProfileName, load

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "web.toml").write_text('[sysctl]\n"net.core.somaxconn" = 4096\n')
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text('[sysctl]\n"net.core.somaxconn" = 1024\n')
    monkeypatch.chdir(tmp_path)
    search = (profiles,)
    assert load(ProfileName("web"), search).sections["sysctl"]["net.core.somaxconn"] == 4096
    assert load("elsewhere.toml", search).name, "an operator's path (the agent's own file) still loads"
    for name in ("elsewhere.toml", str(elsewhere), "../elsewhere", "profiles/web", ".hidden"):
        with pytest.raises(ProfileError):
            load(ProfileName(name), search)
    target = _target(DesiredState(profile=str(elsewhere)), from_control_plane=True)
    assert isinstance(target, ProfileName)
    with pytest.raises(ProfileError):
        load(target, search)
    assert not isinstance(_target(DesiredState(profile=str(elsewhere)), from_control_plane=False), ProfileName)


def test_every_sysctl_an_operator_is_told_is_guarded_is_held_and_no_neighbour():
    """The names in agent.toml's error ("guarded: ...") are the guards' own: each one it says
    (IFACE any interface, ipv4|6 either) is held, and a longer name beside it is not."""
    from agent.profiles.appliers.sysctl import GUARDED_NAMES, is_guarded

    said = [n.replace("IFACE", "eth0") for n in GUARDED_NAMES.split(", ")]
    said = [n.replace("ipv4|6", v) for n in said for v in (("ipv4", "ipv6") if "ipv4|6" in n else ("",))]
    assert len(said) == 13
    assert all(is_guarded(n) for n in said), [n for n in said if not is_guarded(n)]
    assert not any(is_guarded(n + "x") or is_guarded("x" + n) for n in said)
    assert not is_guarded("net.ipv4.conf.eth0.rp_filter")
