"""The SRM's recommender, victims and forecast: pure, the same code the daemon and the benchmark run."""

from __future__ import annotations

from controlplane.srm.forecast import peak
from controlplane.srm.recommend import Memory, Reading, recommend, usage_reading
from controlplane.srm.victims import choose, frees
from controlplane.store.autoscale import Autoscale
from controlplane.store.records import TaskRec
from controlplane.usage.history import Series

P = Autoscale(min=2, max=40, target_cpu=0.5, tolerance=0.1, predictive=True, scale_down_after=300, max_changes_per_hour=4)
PER = 0.5  # a task of 1 cpu at target 0.5


def run(p, mem, t, size, load, age=0.0, running=None, room=None, sizes=None):
    return recommend(p, mem, t, size, Reading(load, age, size if running is None else running), PER, PER, room,
                     frees=sizes)


def test_reactive_grows_at_once_to_ceil_load_over_per_task():
    mem = Memory()
    d = run(P, mem, 0, 10, 7.2)  # 0.72 a task against 0.5: 15 tasks
    assert (d.size, d.reactive, d.recommended) == (15, 15, 15) and "needs 15" in d.reason


def test_within_tolerance_nothing_changes():
    mem = Memory()
    for t, load in enumerate((5.4, 4.6, 5.0)):  # 0.54, 0.46, 0.50 a task: within 10 %
        d = run(P, mem, t * 15, 10, load)
        assert (d.size, d.reactive) == (10, 10)


def test_scale_in_waits_for_scale_down_after_of_measured_load_then_takes_the_window_peak():
    mem = Memory()
    sizes = []
    for i in range(25):  # every 15 s for 6 minutes
        load = 2.0 if i != 3 else 3.0  # one higher reading at 45 s
        sizes.append(run(P, mem, i * 15, 10, load).size)
    assert sizes[:20] == [10] * 20, "nothing before 300 s of measured load"
    assert sizes[20] == 6, "the window's peak (3.0 / 0.5 = 6) at 300 s"
    assert run(P, mem, 25 * 15, 10, 2.0).size == 4, "the peak left the window"


def test_stale_or_missing_measurements_freeze_scale_in_but_not_the_forecast():
    mem = Memory()
    for i in range(30):
        run(P, mem, i * 15, 10, 2.0)
    d = run(P, mem, 30 * 15, 10, 2.0, age=300)
    assert d.size == 10 and d.stale and "frozen" in d.reason
    d = run(P, mem, 31 * 15, 10, None)
    assert d.size == 10 and d.stale
    # back: the window starts again, scale_down_after must pass anew
    assert run(P, mem, 32 * 15, 10, 2.0).size == 10
    mem.forecast = 9.0  # a forecast peak of 9 cores: 18 tasks, growth on the forecast alone
    d = run(P, mem, 33 * 15, 10, None)
    assert (d.size, d.predictive) == (18, 18) and "forecast" in d.reason


def test_the_forecast_is_a_floor_for_scale_in():
    mem = Memory(forecast=3.0)  # 6 tasks
    for i in range(22):
        d = run(P, mem, i * 15, 10, 1.0)
    assert d.size == 6, "load says 2, the forecast 6"


def test_min_max_and_the_quota_clamp_say_so():
    mem = Memory()
    assert run(P, mem, 0, 1, 0.1).size == 2 and "below min" in mem.last.reason
    d = run(P, Memory(), 0, 10, 30.0)
    assert d.size == 40 and d.clamped == "max 40"
    d = run(P, Memory(), 0, 10, 30.0, room=25)
    assert d.size == 25 and "quota holds 25" in d.clamped
    d = run(P, Memory(), 0, 30, 15.0, room=25)
    assert d.size == 30 and d.recommended == 30, "the quota bounds growth; running tasks are not stopped for it"
    d = run(P, Memory(), 0, 45, 15.0)
    assert d.size == 40 and "above max 40" in d.reason


def test_the_flap_budget_holds_scale_in_and_forecast_growth_not_overload():
    p = Autoscale(min=1, max=40, target_cpu=0.5, scale_down_after=0, max_changes_per_hour=2)
    mem = Memory()
    mem.changed(0, 10, 12)
    mem.changed(10, 12, 10)
    assert run(p, mem, 20, 10, 2.0).size == 10 and "flap budget" in mem.last.reason
    assert run(p, mem, 30, 10, 9.0).size == 18, "measured overload grows whatever the budget"
    mem.forecast = 12.0
    assert run(p, mem, 40, 18, 9.0).size == 18 and "flap budget" in mem.last.reason
    assert run(p, mem, 3601, 18, 9.0).size == 24, "an hour later the budget has room"


def test_startup_is_measured_from_a_scale_out_to_all_running():
    mem = Memory()
    mem.changed(100, 4, 8)
    mem.ran(130, 6)
    assert mem.grew is not None
    mem.ran(145, 8)
    assert mem.grew is None and mem.startup == 45


def task(i, machine, state="running"):
    return TaskRec("e/j", i, 1, {}, machine, state)


def test_victims_empty_the_machines_with_fewest_of_the_entitlements_tasks_first():
    tasks = {0: task(0, "a"), 1: task(1, "a"), 2: task(2, "b"), 3: task(3, "c"), 4: task(4, "c"), 5: task(5, None, "pending")}
    on = {"a": 2, "b": 3, "c": 2}  # b holds another job's tasks too
    assert choose(tasks, range(6), on, 3) == [5, 1, 0], "the pending one first, then machine a whole"
    assert choose(tasks, range(6), on, 3, avoid={0}) == [5, 1, 4]
    assert choose(tasks, range(6), on, 0) == []


def test_frees_says_the_sizes_at_which_a_scale_in_has_emptied_one_machine_more():
    tasks = {0: task(0, "a"), 1: task(1, "a"), 2: task(2, "b"), 3: task(3, "c"), 4: task(4, "c"),
             5: task(5, None, "pending")}
    on = {"a": 2, "b": 3, "c": 2}  # b holds another job's tasks too: this job's scale-in alone never empties it
    assert frees(tasks, range(6), on) == [3, 1], "a empties at 3 tasks left (the pending one went first), c at 1"
    assert frees(tasks, range(6), on, avoid={0}) == [2], "a cannot empty while task 0 is kept"
    assert frees(tasks, [2], on) == [], "every machine shared"


def test_frees_says_what_stopping_in_choose_s_order_would_empty_on_random_jobs():
    import random

    rnd = random.Random(7)
    for _ in range(300):
        n = rnd.randint(0, 12)
        machines = [f"m{k}" for k in range(rnd.randint(1, 5))]
        tasks = {i: task(i, rnd.choice(machines + [None]), rnd.choice(("running", "running", "starting", "pending")))
                 for i in range(n) if rnd.random() < 0.9}
        mine = {m: sum(1 for t in tasks.values() if t.machine == m) for m in machines}
        on = {m: c + rnd.choice((0, 0, 1, 2)) for m, c in mine.items()}  # some shared with other jobs
        avoid = {i for i in range(n) if rnd.random() < 0.15}
        order = choose(tasks, range(n), on, n, avoid)  # the walk frees() stands for: stop one at a time
        left = {m: sum(1 for t in tasks.values() if t.machine == m and t.state in ("running", "starting"))
                for m in machines}
        whole = {m for m in machines if left[m] and on[m] == left[m]}
        expect = []
        for stopped, i in enumerate(order, 1):
            t = tasks.get(i)
            if t is not None and t.machine is not None and t.state in ("running", "starting"):
                left[t.machine] -= 1
                if left[t.machine] == 0 and t.machine in whole:
                    expect.append(n - stopped)
        assert frees(tasks, range(n), on, avoid) == expect, (tasks, on, avoid)


def test_a_scale_in_stops_whole_machines_worth_and_none_that_would_empty_no_machine():
    asked = []

    def on_three_machines_of_four():  # 12 tasks, 4 a machine: 8, 4 and 0 left empty one machine more each
        asked.append(1)
        return [8, 4, 0]

    mem = Memory()
    for i in range(22):  # 4.6 cores: 10 tasks' worth, two fewer than 12 (more than the tolerance's step)
        d = run(P, mem, i * 15, 12, 4.6, sizes=on_three_machines_of_four)
    assert d.size == 12 and "no machine empties at 10 or above" in d.reason, d
    mem = Memory()
    for i in range(22):  # the same load with every machine shared with other jobs: the tolerance's step
        d = run(P, mem, i * 15, 12, 4.6, sizes=lambda: [])
    assert d.size == 10, d
    mem = Memory()
    for i in range(22):  # 3.9 cores: 8 tasks' worth, one machine's fewer
        d = run(P, mem, i * 15, 12, 3.9, sizes=on_three_machines_of_four)
    assert d.size == 8 and "(to 8: 1 machine(s) emptied)" in d.reason, d
    mem = Memory()
    for i in range(22):  # 1 core: 2 tasks' worth, so two machines go and 4 tasks stay
        d = run(P, mem, i * 15, 12, 1.0, sizes=on_three_machines_of_four)
    assert d.size == 4 and "fit 2 for 300 s (to 4: 2 machine(s) emptied)" in d.reason, d
    asked.clear()
    d = run(P, Memory(), 0, 12, 9.0, sizes=on_three_machines_of_four)
    assert d.size == 18 and asked == [], "growth never asks which machines a scale-in would empty"


def test_forecast_reads_last_week_then_yesterday():
    s = Series()
    now = 30 * 86400 + 12 * 3600  # noon
    assert peak(s, now, 120) is None
    for minute in range(int((now - 86400) // 60) - 5, int((now - 86400) // 60) + 10):
        s.put_minute(minute, 1000 + minute % 7 * 100, 64)
    assert peak(s, now, 120) == max(1000 + m % 7 * 100 for m in range(int((now - 86400) // 60), int((now - 86400) // 60) + 3))
    hour = int((now - 7 * 86400) // 3600)
    s.put_hour(hour, (500, 2500, 3000, 64, 64, 64))
    assert peak(s, now, 120) == 2500, "a week ago's hour (its p95) wins when there is one"


def test_forecast_joins_the_hours_p95s_at_their_middles_by_straight_lines():
    s = Series()
    week = 7 * 86400
    hour = 30 * 24 + 12  # noon of day 30, a week before `now` below
    s.put_hour(hour - 1, (900, 1000, 1100, 64, 64, 64))
    s.put_hour(hour, (1900, 2000, 2100, 64, 64, 64))
    s.put_hour(hour + 1, (900, 1000, 1100, 64, 64, 64))
    at = lambda minute: hour * 3600 + minute * 60 + week  # noqa: E731 - a minute of the hour, a week on
    # at the hour's middle, its p95; 10 minutes in, two thirds of the way up from the hour before's
    # (whose middle is 40 of the 60 minutes back): not the hour's p95 from its first minute
    assert peak(s, at(30), 60) == 2000
    assert peak(s, at(10), 60) == round(1000 + 1000 * 41 / 60)  # the window's end, minute 11, is its highest
    # 50 minutes in, on the way down to the next hour's: the window's start is its highest
    assert peak(s, at(50), 60) == round(2000 - 1000 * 20 / 60)
    # a window over the middle takes the middle's level; past the last hour's middle, its p95
    assert peak(s, at(20), 1200) == 2000
    assert peak(s, at(120), 60) == 1000


def test_a_scale_in_stays_above_the_coming_hours_forecast_and_takes_no_step_within_the_tolerance():
    mem = Memory(forecast_hour=4.0)  # the coming hour peaks at 8 tasks' worth
    for i in range(22):
        d = run(P, mem, i * 15, 20, 1.0)
    assert d.size == 8, "load says 2, the coming hour 8"
    mem = Memory()
    for i in range(22):
        d = run(P, mem, i * 15, 20, 9.6)  # 0.48 a task: within the tolerance, reactive is the size
    assert d.size == 20
    mem = Memory(forecast_hour=9.5)  # load says 4; the coming hour 19: a step of 1 in 20, within the tolerance
    for i in range(22):
        d = run(P, mem, i * 15, 20, 2.0)
    assert d.size == 20 and "fits 20" in d.reason


def test_a_partial_usage_report_reads_as_the_whole_jobs_load_never_as_a_fall():
    # 10 running tasks at 0.5 core each; 8 report (4 cores summed): the job's load is still 5 cores
    r = usage_reading(4000, 8, 10)
    assert (r.load, r.age, r.running) == (5.0, 0.0, 10)
    mem = Memory()
    sizes = [recommend(P, mem, i * 15, 10, usage_reading(4000, 8, 10), PER, PER).size for i in range(30)]
    assert sizes == [10] * 30, "a fifth of the tasks not reporting is no reason to stop two (the sum read 0.8 of the target)"
    # fewer than 80 % report: no reading at all (scale-in frozen), as before
    assert usage_reading(3500, 7, 10).load is None and usage_reading(None, 0, 10).load is None
    # tasks starting report too: never scaled below the sum
    assert usage_reading(6000, 12, 10).load == 6.0


def trusting(rise_comes: bool) -> tuple[Memory, list]:
    """A job measured at 2 cores (4 tasks' worth) whose forecast reads 5 cores (10 tasks) for every
    5-minute window for 3 hours; the load rises to the forecast within each window, or never does."""
    mem, decisions = Memory(startup=60.0), []
    for i in range(3 * 3600 // 15):
        now = i * 15.0
        if now >= mem.forecast_until:  # as forecast.refresh reads a forecast each EVERY seconds
            mem.forecast, mem.forecast_hour, mem.forecast_until = 5.0, 5.0, now + 300
        load = 5.0 if rise_comes and (now % 300) >= 120 else 2.0
        decisions.append(run(P, mem, now, 10, load))
    return mem, decisions


def test_a_forecast_whose_rises_come_keeps_its_trust_and_one_whose_rises_never_come_loses_it():
    mem, decisions = trusting(rise_comes=True)
    assert mem.trust == 1.0 and len(mem.skill) >= 30 and decisions[-1].predictive == 10
    mem, decisions = trusting(rise_comes=False)
    assert decisions[0].predictive == 10, "trusted at first"
    assert mem.trust == 0.0 and len(mem.skill) >= 30, mem.skill
    assert decisions[-1].predictive == 4 and decisions[-1].size == 4, "the floor is what is measured: no capacity held for load that never came"
