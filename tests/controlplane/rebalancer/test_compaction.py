"""Compaction planned with CP-SAT (controlplane/rebalancer/compaction.py): the fewest machines
held, then the fewest moves; capacity, memory, what may not move, racks and churn budgets hold."""

from __future__ import annotations

from controlplane.rebalancer.compaction import solve
from controlplane.rebalancer.plan import plan
from controlplane.rebalancer.view import Group, Machine, Task


def group(*machines: Machine, tasks: list[Task]) -> Group:
    return Group("web", "dc1", "msb1", list(machines), tasks)


def m(mid: str, cpus: float = 4, mem: int = 4096, rack: str = "r1", **kw) -> Machine:
    return Machine(mid, "web", "dc1", "msb1", int(cpus * 1000), mem, rack=rack, **kw)


def t(job: str, i: int, on: str, cpus: float = 1, mem: int = 64, **kw) -> Task:
    return Task(job, i, on, int(cpus * 1000), mem, **kw)


def test_half_empty_machines_are_freed_with_the_fewest_moves():
    g = group(m("a"), m("b"), m("c"), tasks=[t("web/api", 0, "a"), t("web/api", 1, "a"), t("web/api", 2, "b"),
                                             t("web/db", 0, "c", cpus=2)])
    r = solve(g, churn=1.0)
    assert r.status.startswith("optimal") and len(r.kept) == 2 and len(r.freed) == 1
    assert len(r.moves) == 1, "one task moves: the fewest that free a machine"
    mv = r.moves[0]
    assert mv.source in r.freed and mv.target in r.kept
    load = {mid: 0 for mid in r.kept}
    for task in g.tasks:
        where = next((x.target for x in r.moves if (x.job, x.index) == (task.job, task.index)), task.machine)
        load[where] += task.cpus
    assert all(v <= 4000 for v in load.values()), load


def test_memory_pinned_machines_racks_and_the_churn_budget_bound_it():
    # memory: two tasks of 3 GiB cannot share a 4 GiB machine
    g = group(m("a"), m("b"), tasks=[t("j/x", 0, "a", mem=3072), t("j/x", 1, "b", mem=3072)])
    assert solve(g, churn=1.0).freed == ()
    # a machine holding a task that is not running (fixed) is kept, and tasks may move onto it
    g = group(m("a", pinned=True, fixed_cpus=1000, fixed_memory_mb=64), m("b"),
              tasks=[t("j/x", 0, "b")])
    r = solve(g, churn=1.0)
    assert r.freed == ("b",) and [(mv.source, mv.target) for mv in r.moves] == [("b", "a")]
    # a job that spreads over racks moves within its rack only
    g = group(m("a", rack="r1"), m("b", rack="r2"), tasks=[t("j/x", 0, "a", keep_rack=True),
                                                           t("j/x", 1, "b", keep_rack=True)])
    assert solve(g, churn=1.0).freed == ()
    # the churn budget: a quarter of a job's 8 tasks (2) may move in a round
    machines = [m(f"m{i}") for i in range(8)]
    g = group(*machines, tasks=[t("j/x", i, f"m{i}") for i in range(8)])
    r = solve(g, churn=0.25)
    assert len(r.moves) == 2 and len(r.freed) == 2
    r = solve(g, churn=1.0)
    assert len(r.freed) == 6 and len(r.moves) == 6, "8 tasks of 1 core fit on 2 machines of 4"


def test_when_the_plans_time_is_spent_the_groups_keep_the_drains_answer():
    # two groups the drain alone cannot prove optimal (three machines, tasks of 3 and 1 cores: the
    # totals say one machine could go, and the drain's best fit frees none or one)
    def hard(msb: str) -> Group:
        ms = [Machine(f"{msb}-{x}", "web", "dc1", msb, 4000, 4096) for x in "abc"]
        return Group("web", "dc1", msb, ms, [t("web/api", k, f"{msb}-{x}", cpus=c, spreads_msb=False)
                                             for k, (x, c) in enumerate((("a", 3), ("b", 2), ("c", 1.5)))])
    body = plan([hard("msb1"), hard("msb2")], churn=1.0, total_limit=0.0).to_json()
    assert {x["status"] for x in body["groups"]} <= {"drain (no time left for the solver)", "optimal (drain)"}, body
    assert body["violations"] == []
    body = plan([hard("msb1"), hard("msb2")], churn=1.0).to_json()
    assert all(x["status"].startswith("optimal") for x in body["groups"]), body["groups"]


def test_a_plan_says_what_it_frees_in_words():
    g = group(m("a"), m("b"), tasks=[t("web/api", 0, "a"), t("web/api", 1, "b")])
    body = plan([g], churn=1.0).to_json()
    assert body["goals"]["compaction"]["machines_held"] == {"before": 2, "after": 1}
    assert body["goals"]["compaction"]["stranded_cpus"] == {"before": 6.0, "after": 2.0}
    (mv,) = body["moves"]
    assert mv["goal"] == "compaction" and mv["why"] == f"compaction: frees {mv['source']}"
    assert body["freed"] == [mv["source"]]
    assert "entitlement web holds 2 machines whose 8 cores are 2 reserved: moving 1 task(s) within their MSBs " \
        "frees 1 machine(s) for the free pool" in body["summary"]
    # a line a goal, in their order
    assert [line.split(":")[0] for line in body["summary"]] == ["repair", "hotspots", "entitlement web holds 2 "
                                                                "machines whose 8 cores are 2 reserved", "swaps"]
    assert body["goals"]["hotspots"]["hottest_msb"] == {"before": None, "after": None}, "nothing measured"
