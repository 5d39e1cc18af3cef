"""twinectl: the operator's and job owner's command line for twine-controld (docs/api.md).

  twinectl entitlement create|modify|list|show ...   entitlement modify NAME --profile P [--wait [S]]
  twinectl entitlement rollout status|pause|resume|rollback NAME
  twinectl job run|update FILE [--wait [S]]   job update FILE --dry-run
  twinectl job status|resize|stop HANDLE ...   job list
  twinectl machine list|show ID|release ID|clean ID     twinectl events     twinectl discovery HANDLE
  twinectl fleet [--by dc,msb,entitlement,profile,type]
  twinectl job usage HANDLE [--tasks] | entitlement usage NAME  [--since DUR] [--step DUR]
  twinectl job autoscale HANDLE
  twinectl rebalance plan|apply [--entitlement E] [--max-moves N] [--wait [S]]   rebalance status
  twinectl rebalance enable|disable [--entitlement E]
  twinectl capacity [status] | pause | resume | reserve N | forecast|slo [--entitlement E]
  twinectl maintenance schedule (--machine ID ... | --dc DC | --msb MSB | --rack RACK) --start WHEN
           --duration DUR [--deadline WHEN] [--policy move|stop] [--reason TEXT] [--dry-run]
  twinectl maintenance list [--all] | show ID | end ID
  twinectl token create --role admin|owner|reader|bootstrap [--entitlement E ...] [--expires DUR] | list | revoke ID

WHEN is +90s, +10m, +2h, now, seconds since the epoch, or a local ISO time (2026-11-21T14:00);
DUR is 90, 90s, 10m, 2h or 1d.

A HANDLE is <entitlement>/<job name>. Job spec files are YAML (.yaml, .yml) or TOML (.toml).
Global options go before or after the command; --json prints the daemon's JSON as it is.

Exit codes (scripts rely on them):
  0  done
  1  the daemon refused or failed (404, 409, 422, 5xx), or --wait ran out of time
  2  bad input: a spec file or argument (nothing was sent), or the daemon's 400
  3  the daemon is unreachable (or did not answer within --timeout)
  4  unauthorized: the daemon's 401/403 (a missing or wrong token)
"""

from __future__ import annotations

import argparse

from controlplane.cli.api import PROG
from controlplane.cli.usage import window_options
from controlplane.cli.values import count, duration, nullable, seconds, spread, when

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = 30.0
DEFAULT_WAIT = 300.0  # `--wait` without SECONDS


def rollout_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--max-unavailable", type=count, metavar="N",
                    help="machines whose profile a rollout switches at once (default 1)")
    sp.add_argument("--auto-rollback", choices=("on", "off"), help="a failed batch rolls back (on, the default) "
                    "or pauses the rollout (off)")
    sp.add_argument("--rollout-deadline", type=float, metavar="S", help="seconds a machine has to apply a profile, "
                    "then its tasks to run again (default 300)")


def reclaim_flags(sp: argparse.ArgumentParser) -> None:
    """An opportunistic entitlement's disruption budget (the API's `reclaim`)."""
    sp.add_argument("--reclaim-max-machines", type=count, metavar="N",
                    help="of its machines in reclaim at once, at most N (default 10)")
    sp.add_argument("--reclaim-max-percent", type=float, metavar="P",
                    help="of its machines in reclaim at once, at most P percent (at least one; default 50)")
    sp.add_argument("--reclaim-cooldown", type=float, metavar="S",
                    help="seconds after one of its reclaims begins before the next may (default 0)")


def common(parser: argparse.ArgumentParser) -> None:
    """The global options, accepted before the command and after it (SUPPRESS: a subcommand
    that is not given one leaves the top level's value alone)."""
    g = parser.add_argument_group("global options")
    s = argparse.SUPPRESS
    g.add_argument("--url", default=s, help=f"twine-controld's URL (env TWINE_URL, default {DEFAULT_URL})")
    g.add_argument("--token", default=s, help="API token (env TWINE_TOKEN)")
    g.add_argument("--token-file", default=s, help="file holding the API token (env TWINE_TOKEN_FILE)")
    g.add_argument("--ca", default=s, help="CA bundle (PEM) to verify an https daemon against "
                                           "(env TWINE_CA; default the system's CAs)")
    g.add_argument("--json", action="store_true", default=s, help="print the daemon's JSON as it is")
    g.add_argument("--timeout", type=seconds, default=s, help=f"seconds per request (default {DEFAULT_TIMEOUT:g})")


def wait_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--wait", nargs="?", type=seconds, const=DEFAULT_WAIT, default=None, metavar="SECONDS",
                        help=f"wait until {what}; exit 1 if SECONDS (default {DEFAULT_WAIT:g}) pass first")


def parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=fmt)
    common(p)
    sub = p.add_subparsers(dest="group", required=True, metavar="COMMAND")

    def leaf(parent, name: str, help_: str) -> argparse.ArgumentParser:
        sp = parent.add_parser(name, help=help_, description=help_)
        common(sp)
        return sp

    ent = sub.add_parser("entitlement", help="create, modify, list and show entitlements")
    ent_sub = ent.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = leaf(ent_sub, "create", "create an entitlement")
    c.add_argument("name", metavar="NAME")
    c.add_argument("--machine-type", required=True, metavar="T")
    c.add_argument("--quota", required=True, type=count, metavar="N", help="at most N machines")
    c.add_argument("--profile", metavar="P", help="the host profile of its machines")
    c.add_argument("--owner", metavar="O")
    c.add_argument("--spread", type=spread, metavar="dc,msb", help="properties its jobs spread over by default")
    c.add_argument("--pin-dc", type=nullable, metavar="DC", help="keep its jobs in this dc")
    c.add_argument("--allow-controller-network", action="append", metavar="CIDR",
                   help="a network its jobs' TaskControllers may be at although controld refuses it otherwise "
                        "(loopback, link-local, the control plane's own); repeat for more")
    c.add_argument("--kind", choices=("guaranteed", "opportunistic"),
                   help="opportunistic: its jobs run on machines the region does not need now and give them back "
                        "when a guaranteed entitlement needs them (default guaranteed)")
    c.add_argument("--notice", type=float, metavar="S", help="seconds of advance notice before one of its machines "
                                                              "is taken back (default 120)")
    reclaim_flags(c)
    rollout_flags(c)
    m = leaf(ent_sub, "modify", "change an entitlement (PATCH); '' or none clears --profile / --pin-dc")
    m.add_argument("name", metavar="NAME")
    m.add_argument("--quota", type=count, metavar="N")
    m.add_argument("--profile", type=nullable, default=argparse.SUPPRESS, metavar="P")
    m.add_argument("--owner", metavar="O")
    m.add_argument("--spread", type=spread, metavar="dc,msb")
    m.add_argument("--pin-dc", type=nullable, default=argparse.SUPPRESS, metavar="DC")
    m.add_argument("--allow-controller-network", action="append", metavar="CIDR",
                   help="replaces the networks its TaskControllers may be at (repeat for more; none: no network)")
    m.add_argument("--notice", type=float, metavar="S", help="seconds of advance notice before one of its machines "
                                                              "is taken back")
    reclaim_flags(m)
    rollout_flags(m)
    m.add_argument("--wait", nargs="?", type=float, const=1800.0, default=None, metavar="S",
                   help="follow the profile rollout the change begins until it is done (at most S seconds, 1800 by "
                        "default); exit 1 if it rolls back or pauses")
    ro = ent_sub.add_parser("rollout", help="an entitlement's host-profile rollout: status, pause, resume, rollback")
    ro_sub = ro.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, what in (("status", "each machine's phase, the batches, why it paused"),
                       ("pause", "the batch in progress ends, no other begins (admin)"),
                       ("resume", "go on; machines that failed switch again first (admin)"),
                       ("rollback", "the machines that changed go back to the old profile, in batches (admin)")):
        leaf(ro_sub, verb, what).add_argument("name", metavar="NAME")
    mv = leaf(ent_sub, "move", "give an entitlement to another scheduler shard (no task restarts)")
    mv.add_argument("name", metavar="NAME")
    mv.add_argument("--shard", type=int, required=True, metavar="N", help="the shard to move it to")
    leaf(ent_sub, "list", "list entitlements")
    leaf(ent_sub, "show", "show an entitlement with its machines and jobs").add_argument("name", metavar="NAME")
    eu = leaf(ent_sub, "usage", "what an entitlement's jobs use, now and over time, against what they reserve")
    eu.add_argument("name", metavar="NAME")
    window_options(eu)

    job = sub.add_parser("job", help="run, inspect, update, resize and stop jobs")
    job_sub = job.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = leaf(job_sub, "run", "submit a job spec file (placement is committed at once)")
    r.add_argument("file", metavar="FILE")
    wait_option(r, "every task runs")
    leaf(job_sub, "status", "a job and its tasks").add_argument("handle", metavar="HANDLE")
    leaf(job_sub, "autoscale", "what the SRM does with an autoscaled job: its recommendation and why, its "
         "last resizes").add_argument("handle", metavar="HANDLE")
    ju = leaf(job_sub, "usage", "what a job's tasks use, now and over time, against what they reserve")
    ju.add_argument("handle", metavar="HANDLE")
    ju.add_argument("--tasks", action="store_true", help="and each task's: its machine, cores and memory as its "
                    "agent last measured them")
    window_options(ju)
    leaf(job_sub, "list", "list jobs").add_argument("--entitlement", metavar="E", help="only this entitlement's jobs")
    u = leaf(job_sub, "update", "replace a job's spec (a changed task starts a rolling update)")
    u.add_argument("file", metavar="FILE")
    wait_option(u, "every task runs at the new spec version")
    u.add_argument("--dry-run", action="store_true", help="change nothing: print the rounds the update would take, "
                   "as the job's TaskController answers calls marked dryRun (which tasks, in what order)")
    rs = leaf(job_sub, "resize", "change a job's task count")
    rs.add_argument("handle", metavar="HANDLE")
    rs.add_argument("count", type=count, metavar="N")
    wait_option(rs, "every task runs")
    st = leaf(job_sub, "stop", "stop a job and remove its tasks")
    st.add_argument("handle", metavar="HANDLE")
    wait_option(st, "the job is stopped")

    mach = sub.add_parser("machine", help="list, show, release and clean machines")
    mach_sub = mach.add_subparsers(dest="action", required=True, metavar="ACTION")
    leaf(mach_sub, "list", "list machines")
    leaf(mach_sub, "show", "a machine with its tasks").add_argument("id", metavar="ID")
    leaf(mach_sub, "release", "end a machine's credential, so that its agent may register it again with a "
                              "bootstrap token (a reinstalled host)").add_argument("id", metavar="ID")
    leaf(mach_sub, "clean", "drop a machine's tombstones: none of the tasks moved off it while it was unhealthy "
                            "runs there any more (it was wiped, or is gone for good); their resources are freed"
         ).add_argument("id", metavar="ID")

    mt = sub.add_parser("maintenance", help="schedule, list, show and end maintenance (the ops planner)")
    mt_sub = mt.add_subparsers(dest="action", required=True, metavar="ACTION")
    sc = leaf(mt_sub, "schedule", "schedule maintenance: jobs on the machines get advance notice; at the deadline "
                                   "what is still there stops; the machines are back after the duration")
    sc.add_argument("--machine", action="append", metavar="ID", help="a machine (repeat for more)")
    sc.add_argument("--dc", metavar="DC", help="every machine in this dc (ANDed with --msb/--rack)")
    sc.add_argument("--msb", metavar="MSB", help="every machine behind this main switchboard")
    sc.add_argument("--rack", metavar="RACK", help="every machine in this rack")
    sc.add_argument("--start", required=True, type=when, metavar="WHEN", help="when the work begins")
    sc.add_argument("--duration", required=True, type=duration, metavar="DUR", help="how long the machines are away")
    sc.add_argument("--deadline", type=when, metavar="WHEN",
                    help="when tasks still on the machines are stopped (at or before --start; default: --start)")
    sc.add_argument("--policy", choices=("move", "stop"),
                    help="for jobs without a TaskController: move tasks away before the deadline, or stop them at "
                         "it and restart them after (default: the daemon's --maintenance-policy)")
    sc.add_argument("--reason", default="", metavar="TEXT")
    sc.add_argument("--dry-run", action="store_true", help="schedule nothing: print what each job with tasks on the "
                    "machines would do before the deadline, as its TaskController answers calls marked dryRun")
    leaf(mt_sub, "list", "maintenance not over yet").add_argument("--all", action="store_true", help="also what is over")
    leaf(mt_sub, "show", "a maintenance with the tasks on its machines").add_argument("id", metavar="ID")
    leaf(mt_sub, "end", "end a maintenance now (before its deadline: cancel it)").add_argument("id", metavar="ID")

    tok = sub.add_parser("token", help="API tokens with roles (admin only): create, list, revoke")
    tok_sub = tok.add_subparsers(dest="action", required=True, metavar="ACTION")
    tc = leaf(tok_sub, "create", "make a token; its secret is shown this once")
    tc.add_argument("--role", required=True, choices=("admin", "owner", "reader", "bootstrap"),
                    help="admin: everything; owner: the jobs of its entitlements; reader: reads only; "
                         "bootstrap: registers new machines only, and expires (default 24h)")
    tc.add_argument("--entitlement", action="append", metavar="NAME", help="an entitlement an owner token owns (repeat)")
    tc.add_argument("--expires", type=duration, metavar="DUR", help="valid this long (default: until revoked; a bootstrap token 24h)")
    tc.add_argument("--description", default="", metavar="TEXT")
    leaf(tok_sub, "list", "the tokens (never their secrets)")
    leaf(tok_sub, "revoke", "end a token now").add_argument("id", metavar="ID")

    leaf(sub, "cluster", "the region's control-plane replicas, shard leaders and the entitlements of each shard")
    leaf(sub, "events", "unavailability events (failures, maintenance)")
    leaf(sub, "fleet", "the region's machines summed per dc, msb, entitlement, profile and type: held, healthy, "
         "in maintenance, reserved and used; the free pool; what each entitlement can still fit").add_argument(
        "--by", metavar="DIMS", help="sum by these only, comma-separated: dc, msb, entitlement, profile, type")
    leaf(sub, "discovery", "a job's endpoints").add_argument("handle", metavar="HANDLE")
    cap = sub.add_parser("capacity", help="opportunistic capacity: the reclaims open and the last ones; pause or "
                         "resume them")
    cap_sub = cap.add_subparsers(dest="action", required=False, metavar="ACTION")
    leaf(cap_sub, "status", "the reclaims open (machines taken back for guaranteed entitlements) and the last ones")
    leaf(cap_sub, "pause", "no reclaim begins from now on; those begun go on (admin)")
    leaf(cap_sub, "resume", "reclaims begin again (admin)")
    leaf(cap_sub, "reserve", "keep N free machines per machine type and dc from opportunistic work, for guaranteed "
         "growth; reclaims with notice refill it (admin; 0: none)").add_argument(
        "machines", metavar="N", type=int, help="free machines per machine type and dc (0 to 10,000)")
    leaf(cap_sub, "forecast", "the machines opportunistic work can count on for the next 24 hours: expected, and "
         "with 99 % (the SLO offered) and 99.9 % probability").add_argument(
        "--entitlement", metavar="E", help="only the machines this entitlement can use")
    leaf(cap_sub, "slo", "how well the region kept the capacity it offered, and the reclaims by cause with the "
         "notice they gave").add_argument("--entitlement", metavar="E", help="only the machines this entitlement "
                                          "can use")
    rb = sub.add_parser("rebalance", help="what the ReBalancer would do, one round of it, its continuous mode")
    rb_sub = rb.add_subparsers(dest="action", required=True, metavar="ACTION")
    rp = leaf(rb_sub, "plan", "a dry run: each goal's score before and after, and the moves that would reach it, "
              "with why")
    ap = leaf(rb_sub, "apply", "one round: the plan, its moves requested of the jobs' shard leaders, which move "
              "each task make-before-break once its job's TaskController acks")
    for verb in (rp, ap):
        verb.add_argument("--entitlement", metavar="E", help="only this entitlement's machines")
        verb.add_argument("--max-moves", type=int, metavar="N", help="the round's move budget: hotspots first, then "
                          "the machines cheapest to free, then repair, at most N moves in all (no swap)")
    ap.add_argument("--wait", nargs="?", type=float, const=300.0, default=None, metavar="S",
                    help="wait until the round's moves have ended (at most S seconds, 300 by default)")
    leaf(rb_sub, "status", "the continuous mode, the tasks moving now, the last moves' outcomes")
    for verb, what in (("enable", "on"), ("disable", "off")):
        leaf(rb_sub, verb, f"turn the continuous mode {what}: every entitlement, or one").add_argument(
            "--entitlement", metavar="E", help="only this entitlement")
    return p
