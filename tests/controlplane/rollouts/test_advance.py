"""A rollout's steps, pure (controlplane/rollouts/advance.py): batches of max_unavailable machines
spread over MSBs, each drained, switched, verified and its tasks running before the next; a failed
batch rolls back only the machines that changed; pause, resume and rollback by an operator."""

from __future__ import annotations

import pytest

from controlplane.rollouts.advance import REQUEUES, MachineView, TaskView, advance, pause, resume, reverse
from controlplane.rollouts.record import MIN_READY, begin, machine_doc, reprofile_of

OLD = {"name": "base", "hash": "a" * 64, "sections": {"sysctl": {"vm.swappiness": 60}}}
NEW = {"name": "web", "hash": "b" * 64, "sections": {"sysctl": {"vm.swappiness": 10}}}


class Fleet:
    """Machines whose agents apply what the rollout says, and tasks that stop and start as the
    reconciler would make them (suspended while their machine drains or switches)."""

    def __init__(self, msbs: dict[str, str], tasks: dict[str, int], broken: set[str] = frozenset(),
                 crashing: set[str] = frozenset(), steady_after: dict[str, float] | None = None):
        self.msbs, self.ntasks, self.broken = msbs, tasks, set(broken)
        # these machines' agents say whether each task is steady: under the new profile, False until
        # it has run this many looks (inf: never; its exit is not heard yet, so it reads running)
        self.steady_after, self.looks = dict(steady_after or {}), {m: 0 for m in msbs}
        # under the new profile these machines' tasks crash at once and are restarted between two
        # reports: every report says running, and each a restart more
        self.crashing, self.restarts = set(crashing), 0
        self.applied = {m: OLD for m in msbs}
        self.healthy = {m: True for m in msbs}
        self.error = {m: "" for m in msbs}

    def views(self, r: dict) -> dict[str, MachineView]:
        out = {}
        for mid, msb in self.msbs.items():
            rp = reprofile_of(r, mid)
            doc = self.applied[mid]
            if rp is not None and rp.stops:
                state = "suspended"
            elif mid in self.broken and doc == NEW:
                state = "failed"  # the new profile breaks its tasks
            else:
                state = "running"
            if mid in self.crashing and doc == NEW:
                self.restarts += 1
            steady = None
            if mid in self.steady_after:
                self.looks[mid] = self.looks[mid] + 1 if doc == NEW and state == "running" else 0
                steady = state == "running" and (doc != NEW or self.looks[mid] > self.steady_after[mid])
            tasks = tuple(TaskView(f"e/j#{mid}{i}", state, "", self.restarts if mid in self.crashing else 0, steady)
                          for i in range(self.ntasks.get(mid, 0)))
            out[mid] = MachineView(mid, msb, self.healthy[mid], "", doc["name"], doc["hash"], not self.error[mid],
                                   self.error[mid], tasks)
        return out

    def agents(self, r: dict) -> None:
        for mid in self.msbs:  # each agent applies what it is told (its desired document)
            self.applied[mid] = machine_doc(r, mid)


def run(r: dict, fleet: Fleet, now: float, until, step: float = 1.0, limit: int = 500) -> tuple[dict, float, list]:
    notes, seen = [], []
    for _ in range(limit):
        fleet.agents(r)
        r, more = advance(r, fleet.views(r), now)
        notes += [n for n, _ in more]
        seen.append({mid: m["phase"] for mid, m in r["machines"].items()})
        if until(r):
            return r, now, notes, seen
        now += step
    raise AssertionError(f"not reached: {r['state']} {notes}")


def test_machines_switch_one_msb_at_a_time_and_never_two_at_once():
    fleet = Fleet({"m1": "msb1", "m2": "msb1", "m3": "msb2"}, {"m1": 2, "m2": 1, "m3": 1})
    r = begin("e", OLD, NEW, list(fleet.msbs), {}, 1000.0)
    r, _, notes, seen = run(r, fleet, 1000.0, lambda r: r["state"] == "done")
    assert all(sum(p in ("draining", "switching", "starting") for p in s.values()) <= 1 for s in seen)
    assert [b["machines"] for b in r["batches"]] == [["m1"], ["m2"], ["m3"]]  # the MSB with more pending first
    assert all(b["outcome"] == "done" for b in r["batches"])
    assert fleet.applied == {"m1": NEW, "m2": NEW, "m3": NEW}
    assert notes[0].startswith("batch 1: m1 (msb1) to web@bbbbbbbb, 2 machine(s) after it")
    assert notes[-1] == "rollout done: the machines hold web@bbbbbbbb"


def test_max_unavailable_two_takes_one_machine_of_each_msb():
    fleet = Fleet({"m1": "msb1", "m2": "msb1", "m3": "msb2", "m4": "msb2"}, {})
    r = begin("e", OLD, NEW, list(fleet.msbs), {"max_unavailable": 2}, 0.0)
    r, _, _, seen = run(r, fleet, 0.0, lambda r: r["state"] == "done")
    assert [b["machines"] for b in r["batches"]] == [["m1", "m3"], ["m2", "m4"]]
    assert max(sum(p in ("draining", "switching", "starting") for p in s.values()) for s in seen) == 2


def test_a_machine_is_done_only_after_its_tasks_ran_min_ready_seconds():
    fleet = Fleet({"m1": "msb1"}, {"m1": 1})
    r = begin("e", OLD, NEW, ["m1"], {}, 0.0)
    r, now, _, _ = run(r, fleet, 0.0, lambda r: r["machines"]["m1"]["phase"] == "starting", step=0.5)
    r, done_at, _, _ = run(r, fleet, now, lambda r: r["state"] == "done", step=0.5)
    assert done_at - now >= MIN_READY


def test_a_batch_whose_tasks_break_rolls_back_that_machine_and_the_others_never_change():
    fleet = Fleet({"m1": "msb1", "m2": "msb2", "m3": "msb3"}, {"m1": 1, "m2": 1, "m3": 1}, broken={"m1"})
    r = begin("e", OLD, NEW, list(fleet.msbs), {"deadline": 20}, 0.0)
    r, _, notes, seen = run(r, fleet, 0.0, lambda r: r["state"] == "rolled_back")
    assert fleet.applied == {"m1": OLD, "m2": OLD, "m3": OLD}
    assert all(s.get("m2") in (None, "pending") and s.get("m3") in (None, "pending") for s in seen)
    assert any(n.startswith("batch 1 failed: m1: tasks not running 20 s after the switch: e/j#m10 failed") for n in notes)
    assert "rolling back to base@aaaaaaaa (auto_rollback): m1 changed" in notes
    assert [b["back"] for b in r["batches"]] == [False, True] and r["batches"][1]["outcome"] == "done"


def test_tasks_that_crash_and_restart_between_reports_are_not_running_and_fail_the_batch():
    # a sample of each report says "running": only the restarts tell (the VM rollout test's bad
    # profile, whose task exits at once, was taken as done once so on a loaded host)
    fleet = Fleet({"m1": "msb1", "m2": "msb2"}, {"m1": 1, "m2": 1}, crashing={"m1"})
    r = begin("e", OLD, NEW, list(fleet.msbs), {"deadline": 20}, 0.0)
    r, _, notes, seen = run(r, fleet, 0.0, lambda r: r["state"] == "rolled_back")
    first = r["batches"][0]
    assert (first["machines"], first["outcome"]) == (["m1"], "failed"), r["batches"]
    assert any(n.startswith("batch 1 failed: m1: tasks not running 20 s after the switch: e/j#m10 restarting") for n in notes), notes
    assert fleet.applied == {"m1": OLD, "m2": OLD} and all(s.get("m2") in (None, "pending") for s in seen)


def test_a_task_whose_exit_is_heard_late_is_not_done_until_its_agent_saw_it_steady():
    # The VM rollout test's bad profile on slow emulated guests: the task exited at once, and the
    # control plane heard of it more than MIN_READY after the start, its record reading "running"
    # all that time with no restart counted. Its agent's report says it is not steady.
    fleet = Fleet({"m1": "msb1", "m2": "msb2"}, {"m1": 1, "m2": 1}, steady_after={"m1": float("inf"), "m2": 0})
    r = begin("e", OLD, NEW, list(fleet.msbs), {"deadline": 20}, 0.0)
    r, _, notes, seen = run(r, fleet, 0.0, lambda r: r["state"] == "rolled_back")
    first = r["batches"][0]
    assert (first["machines"], first["outcome"]) == (["m1"], "failed"), r["batches"]
    assert any(n.startswith("batch 1 failed: m1: tasks not running 20 s after the switch: e/j#m10 not steady")
               for n in notes), notes
    assert fleet.applied == {"m1": OLD, "m2": OLD} and all(s.get("m2") in (None, "pending") for s in seen)


def test_a_machine_is_done_once_its_agent_says_its_tasks_are_steady():
    fleet = Fleet({"m1": "msb1"}, {"m1": 2}, steady_after={"m1": 12})
    r = begin("e", OLD, NEW, ["m1"], {}, 0.0)
    r, now, _, _ = run(r, fleet, 0.0, lambda r: r["machines"]["m1"]["phase"] == "starting")
    r, done_at, _, _ = run(r, fleet, now, lambda r: r["state"] == "done")
    assert done_at - now >= 12 > MIN_READY, "steady came after MIN_READY: the batch waited for it"


def test_without_auto_rollback_a_failed_batch_pauses_and_resume_switches_it_again():
    fleet = Fleet({"m1": "msb1", "m2": "msb2"}, {"m1": 1})
    fleet.error["m1"] = ""
    r = begin("e", OLD, NEW, list(fleet.msbs), {"auto_rollback": False}, 0.0)
    r, now, _, _ = run(r, fleet, 0.0, lambda r: r["machines"]["m1"]["phase"] == "switching")
    fleet.error["m1"] = "sysctl vm.swappiness: Permission denied"
    r, now, notes, _ = run(r, fleet, now, lambda r: r["state"] == "paused")
    assert r["why"] == "batch 1 failed: m1: the agent could not apply web@bbbbbbbb: sysctl vm.swappiness: Permission denied"
    assert r["machines"]["m2"]["phase"] == "pending"
    r2, more = advance(r, fleet.views(r), now + 50)
    assert r2 is r and more == []  # paused: nothing moves
    fleet.error["m1"] = ""
    resume(r, now)
    r, _, _, _ = run(r, fleet, now, lambda r: r["state"] == "done")
    assert fleet.applied == {"m1": NEW, "m2": NEW}


def test_resume_drains_a_failed_machine_again_on_the_profile_it_holds_not_the_old_one():
    # m1's tasks broke under the new profile (no auto_rollback: paused). Fixed, the rollout resumes:
    # m1 is drained and its tasks start again under the new profile; it never goes back to the old
    # one while its tasks run (it did: a retried machine was 'draining', a phase that holds the old)
    fleet = Fleet({"m1": "msb1", "m2": "msb2"}, {"m1": 1, "m2": 1}, broken={"m1"})
    r = begin("e", OLD, NEW, list(fleet.msbs), {"auto_rollback": False, "deadline": 20}, 0.0)
    r, now, _, _ = run(r, fleet, 0.0, lambda r: r["state"] == "paused")
    assert r["machines"]["m1"]["phase"] == "failed" and fleet.applied["m1"] == NEW
    fleet.broken.clear()
    resume(r, now)
    assert r["machines"]["m1"]["phase"] == "draining" and machine_doc(r, "m1") == NEW
    held = []
    r, _, _, _ = run(r, fleet, now, lambda r: held.append(fleet.applied["m1"]) or r["state"] == "done")
    assert all(doc == NEW for doc in held) and fleet.applied == {"m1": NEW, "m2": NEW}
    # rolled back from there, m1 goes back like any machine that changed
    r = begin("e", OLD, NEW, list(fleet.msbs), {"auto_rollback": False, "deadline": 20}, 0.0)
    fleet.applied, fleet.broken = {"m1": OLD, "m2": OLD}, {"m1"}
    r, now, _, _ = run(r, fleet, 0.0, lambda r: r["state"] == "paused")
    resume(r, now)
    reverse(r, list(fleet.msbs), "rolled back by admin", now)
    assert sorted(r["machines"]) == ["m1"]
    r, _, _, _ = run(r, fleet, now, lambda r: r["state"] == "rolled_back")
    assert fleet.applied == {"m1": OLD, "m2": OLD}


@pytest.mark.parametrize("how", ["by an admin", "by a failed rollback batch"])
def test_a_paused_rollback_changes_no_machines_profile(how):
    # batch 1 switches m1, batch 2 breaks m2: the rollback takes m1 and m2 back, m3 never changed.
    # Paused half-way (one machine back on the old profile, one still on the new), every machine
    # keeps what it holds; resumed, the rollback ends with all three on the old profile. (A paused
    # rollback's documents were the forward rollout's: the new profile for m3 and the machine
    # already back, the old for the one still to go back, without its drain.)
    fleet = Fleet({"m1": "msb1", "m2": "msb2", "m3": "msb3"}, {"m1": 1, "m2": 1, "m3": 1}, broken={"m2"})
    r = begin("e", OLD, NEW, list(fleet.msbs), {"deadline": 20}, 0.0)
    r, now, _, _ = run(r, fleet, 0.0, lambda r: r["state"] == "rolling_back")
    assert sorted(r["machines"]) == ["m1", "m2"]
    r, now, _, _ = run(r, fleet, now, lambda r: any(b["back"] and b["outcome"] == "done" for b in r["batches"]))
    back = next(b["machines"] for b in r["batches"] if b["back"] and b["outcome"] == "done")
    (left,) = [mid for mid in ("m1", "m2") if mid not in back]  # in the next rollback batch, draining
    assert fleet.applied[left] == NEW and fleet.applied[back[0]] == OLD
    if how == "by an admin":
        pause(r, "paused by admin", now)
    else:  # the agent of the machine left cannot apply the old profile: its rollback batch fails
        fleet.error[left] = "sysctl vm.swappiness: Read-only file system"
        r, now, _, _ = run(r, fleet, now, lambda r: r["state"] == "paused")
        assert r["paused_from"] == "rolling_back" and r["machines"][left]["phase"] == "failed", r["why"]
        assert fleet.applied[left] == OLD  # asked for the old profile, which its agent failed to apply
    held = dict(fleet.applied)
    assert {mid: machine_doc(r, mid) for mid in fleet.msbs} == held, "a pause changes no machine's profile"
    if how == "by an admin":  # the batch in progress goes on, to the old profile; none begins after it
        r, now, _, _ = run(r, fleet, now, lambda r: r["batches"][-1]["ended"], limit=60)
        assert fleet.applied == {"m1": OLD, "m2": OLD, "m3": OLD} and r["state"] == "paused"
    r2, _ = advance(r, fleet.views(r), now + 100)
    assert r2 is r
    fleet.error[left] = ""
    resume(r, now)
    r, _, _, _ = run(r, fleet, now, lambda r: r["state"] == "rolled_back")
    assert fleet.applied == {"m1": OLD, "m2": OLD, "m3": OLD}


def test_the_same_error_as_before_the_switch_is_not_this_switchs():
    # a rollback's machine still shows the error of the profile it failed on until its agent
    # reads its new desired state: not a failure of the rollback
    fleet = Fleet({"m1": "msb1"}, {})
    fleet.error["m1"] = "old failure"
    r = begin("e", OLD, NEW, ["m1"], {}, 0.0)
    fleet.agents(r)
    r, _ = advance(r, fleet.views(r), 0.0)  # batch 1 begins: draining
    r, _ = advance(r, fleet.views(r), 1.0)  # nothing runs: switching
    assert r["machines"]["m1"]["phase"] == "switching"
    r, _ = advance(r, fleet.views(r), 2.0)
    assert r["machines"]["m1"]["phase"] == "switching", r["machines"]["m1"]["why"]


def test_an_operator_pauses_then_rolls_back_only_what_changed():
    fleet = Fleet({"m1": "msb1", "m2": "msb2", "m3": "msb3"}, {})
    r = begin("e", OLD, NEW, list(fleet.msbs), {}, 0.0)
    r, now, _, _ = run(r, fleet, 0.0, lambda r: r["batches"] and r["batches"][0]["outcome"] == "done")
    pause(r, "paused by admin", now)  # batch 2 had begun: it finishes, no batch begins after it
    r, now, _, _ = run(r, fleet, now, lambda r: all(b["ended"] for b in r["batches"]), limit=30)
    r2, _ = advance(r, fleet.views(r), now + 100)
    assert r2 is r
    assert r["state"] == "paused" and len(r["batches"]) == 2
    with pytest.raises(ValueError, match="not paused"):
        resume({**r, "state": "done"}, now)
    reverse(r, list(fleet.msbs), "rolled back by admin", now)
    assert sorted(r["machines"]) == ["m1", "m2"]  # m3 never changed
    r, _, _, _ = run(r, fleet, now, lambda r: r["state"] == "rolled_back")
    assert fleet.applied == {"m1": OLD, "m2": OLD, "m3": OLD}
    with pytest.raises(ValueError, match="already rolled back"):
        reverse(r, list(fleet.msbs), "again", now)


def test_a_machine_that_joins_during_the_rollout_gets_the_new_profile_and_one_that_left_is_dropped():
    fleet = Fleet({"m1": "msb1", "m2": "msb1"}, {})
    r = begin("e", OLD, NEW, ["m1", "m2"], {}, 0.0)
    assert machine_doc(r, "m9") == NEW and machine_doc(r, "m1") == OLD
    del fleet.msbs["m2"]
    r, _, _, _ = run(r, fleet, 0.0, lambda r: r["state"] == "done")
    assert sorted(r["machines"]) == ["m1"]


def test_a_machine_down_before_its_turn_gets_the_target_when_back_without_blocking_the_rollout():
    fleet = Fleet({"m1": "msb1", "m2": "msb2"}, {})
    fleet.healthy["m2"] = False
    r = begin("e", OLD, NEW, list(fleet.msbs), {}, 0.0)
    r, _, _, _ = run(r, fleet, 0.0, lambda r: r["state"] == "done")
    assert r["machines"]["m2"]["why"].startswith("down (): it applies web@bbbbbbbb when back")
    assert machine_doc(r, "m2") == NEW


def test_a_machine_that_goes_down_while_it_drains_waits_for_a_batch_of_its_own_and_is_seen_to_work():
    """Down before its switch, a machine leaves its batch on the old profile and takes its turn
    again when back, drained, switched and its tasks seen running like any other: a profile that
    breaks its tasks fails that batch. (It used to be done at once, taking the new profile when
    back with its tasks never stopped nor seen running: a bad profile passed its batch.)"""
    fleet = Fleet({"m1": "msb1", "m2": "msb2"}, {"m1": 1, "m2": 1}, broken={"m1"})
    r = begin("e", OLD, NEW, list(fleet.msbs), {"auto_rollback": False, "deadline": 30}, 0.0)
    r, now, _, _ = run(r, fleet, 0.0, lambda r: r["machines"]["m1"]["phase"] == "draining")
    fleet.healthy["m1"] = False
    r, now, notes, _ = run(r, fleet, now + 1, lambda r: r["batches"][-1]["machines"] == ["m2"])
    first = r["batches"][0]
    assert (first["machines"], first["outcome"]) == (["m1"], "requeued"), first
    assert "m1: went down before its switch" in first["why"], first
    assert "batch 1: m1 went down before the switch and wait for a batch again" in notes
    assert machine_doc(r, "m1") == OLD and r["machines"]["m1"]["phase"] == "pending"
    fleet.healthy["m1"] = True  # back while m2's batch runs
    r, _, notes, _ = run(r, fleet, now, lambda r: r["state"] == "paused")
    assert "batch 2 done: m2 hold web@bbbbbbbb" in notes
    assert [b["machines"] for b in r["batches"]] == [["m1"], ["m2"], ["m1"]]
    assert r["batches"][2]["outcome"] == "failed" and "tasks not running 30 s after the switch" in r["why"], r["why"]


def test_a_machine_that_keeps_going_down_while_it_drains_pauses_the_rollout_on_its_old_profile():
    fleet = Fleet({"m1": "msb1", "m2": "msb2"}, {})
    r = begin("e", OLD, NEW, list(fleet.msbs), {"auto_rollback": False}, 0.0)
    r, now, _, _ = run(r, fleet, 0.0, lambda r: r["machines"]["m1"]["phase"] == "draining")
    r["machines"]["m1"]["requeued"] = REQUEUES - 1  # down while draining twice already
    fleet.healthy["m1"] = False
    r, _ = advance(r, fleet.views(r), now + 1)
    assert r["state"] == "paused" and r["why"] == f"m1 went down before the switch {REQUEUES} times", r["why"]
    assert machine_doc(r, "m1") == OLD


def test_a_machine_that_goes_down_during_its_switch_fails_the_batch():
    fleet = Fleet({"m1": "msb1", "m2": "msb2"}, {})
    r = begin("e", OLD, NEW, list(fleet.msbs), {"auto_rollback": False}, 0.0)
    r, now, _, _ = run(r, fleet, 0.0, lambda r: r["machines"]["m1"]["phase"] == "switching")
    fleet.healthy["m1"] = False
    r, _ = advance(r, fleet.views(r), now + 1)
    assert r["state"] == "paused" and "m1 went down during its switch" in r["why"]
