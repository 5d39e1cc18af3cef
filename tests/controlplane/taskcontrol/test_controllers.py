"""The reference TaskControllers: leader-last and replica-aware (paper Figure 2), driven through
`process` with wire-form requests, so the SDK's bookkeeping (in flight, completed) is part of it."""

from __future__ import annotations


from controlplane.taskcontrol.controllers.batch import Batch
from controlplane.taskcontrol.controllers.leader_last import LeaderLast
from controlplane.taskcontrol.controllers.replica_aware import ReplicaAware

H = "ent/svc"
FIGURE_2 = {"A": [0, 2], "B": [1, 4, 5], "C": [0, 3, 6], "D": [1, 2, 5]}  # shard -> task indices


def op(i: int, kind: str = "restart") -> dict:
    return {"id": f"{kind}/{i}", "task": {"job": H, "index": i, "machine": f"m{i}"}, "kind": kind, "reason": "update"}


def sick(i: int, state: str = "failed") -> dict:
    return {"job": H, "index": i, "machine": f"m{i}", "state": state, "reason": "test"}


class Driver:
    """Calls a controller with increasing sequence numbers."""

    def __init__(self, controller):
        self.c = controller
        self.seq = 0

    def ask(self, indices=(), unhealthy=(), completed=(), kind: str = "restart") -> list[str]:
        self.seq += 1
        body = {"jobHandle": H, "request": [op(i, kind) for i in indices],
                "completed": [{**op(i, kind), "outcome": "done"} for i in completed],
                "advanceNotices": [], "allUnhealthyTasks": [sick(i) for i in unhealthy], "sequenceNumber": self.seq}
        return self.c.process(body)["ack"]


def indices(acks: list[str]) -> list[int]:
    return [int(a.split("/")[1]) for a in acks]


# -- leader-last -----------------------------------------------------------------------------


def test_leader_last_followers_first_in_index_order_then_the_leader():
    d = Driver(LeaderLast(lambda: 1))
    todo = [3, 0, 1, 4, 2]
    order = []
    while todo:
        acked = indices(d.ask(todo))
        assert len(acked) == 1  # one member at a time
        order += acked
        todo.remove(acked[0])
        assert d.ask(todo) == []  # while it is in flight, nothing else
        d.ask(completed=acked)  # completed: the next may go
    assert order == [0, 2, 3, 4, 1]


def test_leader_last_without_a_known_leader_goes_in_index_order():
    d = Driver(LeaderLast(lambda: None))
    assert indices(d.ask([2, 1, 0])) == [0]


def test_leader_last_reads_the_leader_at_every_call():
    leader = {"now": 0}
    d = Driver(LeaderLast(lambda: leader["now"]))
    assert indices(d.ask([0, 1])) == [1]
    d.ask(completed=[1])
    leader["now"] = 2  # an election moved the leader
    assert indices(d.ask([0, 2])) == [0]


def test_leader_last_approves_nothing_while_an_op_is_in_flight():
    d = Driver(LeaderLast(lambda: 0))
    assert d.ask([1, 2]) == ["restart/1"]
    assert d.ask([2]) == []
    assert d.ask([2]) == []  # still: no completion came
    assert d.ask([2], completed=[1]) == ["restart/2"]


def test_leader_last_approves_nothing_while_another_member_is_unhealthy():
    d = Driver(LeaderLast(lambda: 0))
    assert d.ask([1, 2], unhealthy=[3]) == []
    assert d.ask([0], unhealthy=[3]) == []
    assert d.ask([1, 2]) == ["restart/1"]  # healthy again


def test_leader_last_the_op_for_an_unhealthy_member_itself_is_fine():
    d = Driver(LeaderLast(lambda: 0))
    assert d.ask([2], unhealthy=[2]) == ["restart/2"]
    d.ask(completed=[2])
    assert d.ask([0], unhealthy=[0], kind="move") == ["move/0"]  # the leader too, when it is the one down


def test_leader_last_approves_the_down_members_op_even_when_other_ops_are_pending():
    # #2's machine failed mid-update: the scheduler proposes the move of #2 and the restarts of #0, #1.
    # Moving #2 takes no one else down; refusing it leaves the ensemble a member short for good.
    d = Driver(LeaderLast(lambda: 1))
    assert d.ask([0, 1, 2], unhealthy=[2]) == ["restart/2"]


# -- replica-aware (paper Figure 2) ----------------------------------------------------------


def down_per_shard(batch, shards=FIGURE_2) -> dict[str, int]:
    return {name: len(set(batch) & set(tasks)) for name, tasks in shards.items()}


def test_replica_aware_all_restarts_at_once_never_two_replicas_of_a_shard():
    d = Driver(ReplicaAware(FIGURE_2))
    batch = indices(d.ask(range(7)))
    assert batch  # something may go
    assert max(down_per_shard(batch).values()) <= 1
    assert sorted(batch) == [2, 3, 4], "the largest batch: tasks 3, 4 and 5 (one replica of each shard)"


def test_replica_aware_a_rolling_restart_finishes_in_batches_that_each_fit():
    d = Driver(ReplicaAware(FIGURE_2))
    todo, batches = set(range(7)), []
    while todo:
        batch = indices(d.ask(sorted(todo)))
        assert batch and max(down_per_shard(batch).values()) <= 1
        batches.append(batch)
        todo -= set(batch)
        d.ask(completed=batch)
    assert sorted(i for b in batches for i in b) == list(range(7))
    assert len(batches) < 7  # in batches, not one at a time


def test_replica_aware_nothing_sharing_a_shard_with_a_down_task():
    d = Driver(ReplicaAware(FIGURE_2))
    batch = indices(d.ask(range(7), unhealthy=[3]))
    assert 0 not in batch and 6 not in batch  # shard C has #3 down already
    assert max(down_per_shard(set(batch) | {3}).values()) <= 1
    assert 3 in batch  # its own op is fine: it is down anyway


def test_replica_aware_approves_ops_on_already_unhealthy_tasks():
    d = Driver(ReplicaAware(FIGURE_2))
    # #0 and #2 (both of shard A) are down: moving them takes nothing more down
    assert sorted(indices(d.ask([0, 2], unhealthy=[0, 2]))) == [0, 2]


def test_replica_aware_counts_in_flight_ops_as_down():
    d = Driver(ReplicaAware(FIGURE_2))
    assert indices(d.ask([0])) == [0]
    # #0 in flight: shard A's #2 and shard C's #3, #6 wait; #1, #4 and #5 share no shard with #0
    batch = indices(d.ask([1, 2, 3, 4, 5, 6]))
    assert batch == [1]
    assert d.ask([2, 3, 4, 5, 6]) == []  # #0 and #1 in flight cover every shard
    assert 2 in indices(d.ask([2, 3, 4, 5, 6], completed=[0, 1]))


def test_replica_aware_max_down_two_gives_bigger_batches():
    one = indices(Driver(ReplicaAware(FIGURE_2)).ask(range(7)))
    two = indices(Driver(ReplicaAware(FIGURE_2, max_down=2)).ask(range(7)))
    assert max(down_per_shard(two).values()) <= 2
    assert len(two) > len(one)
    assert sorted(two) == [0, 1, 2, 3, 4]


def test_replica_aware_tasks_in_no_shard_always_fit():
    d = Driver(ReplicaAware(FIGURE_2))
    assert sorted(indices(d.ask([0, 2, 7, 8]))) == [0, 7, 8]


# -- batch (opportunistic work, issue #37) -------------------------------------------------------


def reclaim_notice(*indices: int) -> dict:
    return {"id": "rc1", "kind": "reclaim", "machines": [f"m{i}" for i in indices], "start": 0.0, "deadline": 120.0,
            "duration": None, "phase": "scheduled", "reason": "for web", "tasks": list(indices)}


def test_batch_acks_a_reclaim_once_the_task_had_its_notice_for_the_checkpoint_time():
    now = [100.0]
    c = Batch(checkpoint=5.0, clock=lambda: now[0])
    seq = iter(range(1, 100))

    def ask(ops: list[dict], notices: list[dict], completed: tuple[int, ...] = ()) -> list[str]:
        return c.process({"jobHandle": H, "request": ops, "advanceNotices": notices, "allUnhealthyTasks": [],
                          "completed": [{**op(i, "reclaim"), "outcome": "done"} for i in completed],
                          "sequenceNumber": next(seq)})["ack"]

    assert ask([op(1, "reclaim")], []) == []  # no notice heard of yet: nothing to save from
    assert ask([op(1, "reclaim"), op(2, "reclaim")], [reclaim_notice(1, 2)]) == []  # saving its work
    now[0] += 4.9
    assert ask([op(1, "reclaim"), op(2, "reclaim")], [reclaim_notice(1, 2)]) == []
    now[0] += 0.1
    assert sorted(ask([op(1, "reclaim"), op(2, "reclaim")], [reclaim_notice(1, 2)])) == ["reclaim/1", "reclaim/2"]
    assert c.handed_back == [1, 2]
    # a maintenance notice is no reclaim; other operations go one at a time, none while a reclaim
    # acked is still under way
    maint = {**reclaim_notice(3), "id": "mt1"}
    del maint["kind"]
    assert ask([op(3, "reclaim"), op(4), op(5)], [maint]) == []
    assert ask([op(3, "reclaim"), op(4), op(5)], [maint], completed=(1, 2)) == ["restart/4"]


def test_batch_with_no_checkpoint_acks_at_the_first_call_with_the_notice():
    c = Batch()
    body = {"jobHandle": H, "request": [op(7, "reclaim")], "completed": [], "advanceNotices": [reclaim_notice(7)],
            "allUnhealthyTasks": [], "sequenceNumber": 1}
    assert c.process(body)["ack"] == ["reclaim/7"]


def test_batch_gives_a_task_reclaimed_again_its_checkpoint_again():
    now = [0.0]
    c = Batch(checkpoint=5.0, clock=lambda: now[0])
    seq = iter(range(1, 100))

    def ask(notices: list[dict], completed: tuple[int, ...] = ()) -> list[str]:
        return c.process({"jobHandle": H, "request": [op(1, "reclaim")] if notices else [], "advanceNotices": notices,
                          "allUnhealthyTasks": [], "sequenceNumber": next(seq),
                          "completed": [{**op(i, "reclaim"), "outcome": "done"} for i in completed]})["ack"]

    ask([reclaim_notice(1)])
    now[0] = 5.0
    assert ask([reclaim_notice(1)]) == ["reclaim/1"]
    ask([], completed=(1,))  # handed back; placed again elsewhere, no notice for it
    now[0] = 100.0
    assert ask([reclaim_notice(1)]) == []  # reclaimed again: its checkpoint again, not the old notice's time
    now[0] = 105.0
    assert ask([reclaim_notice(1)]) == ["reclaim/1"]
