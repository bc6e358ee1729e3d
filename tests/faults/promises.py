"""The history checker's promises that PostgreSQL, the fake provider's counters and the supervisor can settle:
each a function of what was read (snapshot.py) and what the load saw (history.py), returning the violations
it finds. The object store's and the dead letters' are in stored.py and letters.py."""

from __future__ import annotations

from collections import Counter, defaultdict

from tests.faults.history import History, Violation
from tests.faults.snapshot import Delivery, Entry, Job, Move, Snapshot
from vidjobs.common.states import STAGE_ORDER, TERMINAL, JobStatus, Stage, app_events, is_legal, stage_after

TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)
# A service restarted more often than this in one run is looping. The faults themselves account for at most
# this many: a poison render kills media's decoder twice before it is given up (docs/RELIABILITY.md), and
# a service may die once more with a dependency it lost; every scenario that restarts no server expects none.
MAX_RESTARTS = 3
SETTLEMENTS = frozenset({"charge", "release"})
HOLDS = frozenset({"reserve", "reprice"})  # what a job's reservation is made of
GIVEN_UP_OR_RETRYING = frozenset({"pending", "failed", "disabled"})  # a delivery recorded, not lost


# --- 1: every acknowledged job is accounted for ------------------------------------------------------------

def jobs_accounted(history: History, snap: Snapshot) -> list[Violation]:
    out = []
    for job_id, account_id in sorted(history.acknowledged.items()):
        job = snap.jobs.get(job_id)
        if job is None:  # gone: only a deleted job's row may be, with its account purged
            why = None if job_id in history.deleted else "acknowledged at create, but no such job row"
        else:
            why = _unaccounted(history, job, account_id)
        if why:
            out.append(Violation("job_accounted", job_id, why))
    return out


def _unaccounted(history: History, job: Job, account_id: str) -> str | None:
    if job.account_id != account_id:
        return f"created for {account_id}, but the row names {job.account_id}"
    if job.id in history.deleted:
        # Deletion is no status: the row stays, hidden by deleted_at; a live job is canceled on the way.
        if not job.deleted:
            return "its delete was acknowledged, but it is not deleted"
        return None if job.status in TERMINAL_NAMES else f"deleted, but left {job.status} (not canceled first)"
    if job.deleted:
        return "deleted, though the load never deleted it"
    if job.status in TERMINAL_NAMES:
        return None
    if job.id in history.canceled:
        return f"its cancel was acknowledged, but it is still {job.status}"
    if job.status == JobStatus.PENDING.value and job.wait_reason:
        return None  # waiting for a slot (a full quota, a paused provider), and saying why
    return f"not terminal: {job.status}, with no wait reason"


# --- 2: every trail is legal and its stage never goes back --------------------------------------------------

def trails_legal(snap: Snapshot) -> list[Violation]:
    out = []
    for job_id, job in sorted(snap.jobs.items()):
        why = _trail_fault(snap.trails.get(job_id, []), job)
        if why:
            out.append(Violation("trail_legal", job_id, why))
    return out


def _trail_fault(trail: list[Move], job: Job) -> str | None:
    if not trail:
        return "no trail at all (not even its creation)"
    previous: JobStatus | None = None
    reached: Stage | None = None
    for i, move in enumerate(trail):
        try:
            source = None if move.from_status is None else JobStatus(move.from_status)
            target = JobStatus(move.to_status)
        except ValueError as exc:
            return f"move {i}: {exc}"
        if source != previous:
            return f"move {i} starts at {source}, but the move before ended at {previous}"
        if not is_legal(source, target):
            return f"move {i}: {source} -> {target} is not in the state machine"
        shown = stage_after(reached, target)
        stored = Stage(move.stage) if move.stage is not None else shown
        if stored is not shown:
            return f"move {i} ({source} -> {target}) stored stage {stored.value}, the machine says {shown.value}"
        if reached is not None and STAGE_ORDER[stored] < STAGE_ORDER[reached]:
            return f"move {i}: the stage went back from {reached.value} to {stored.value}"
        previous, reached = target, stored
    if previous is not None and previous.value != job.status:
        return f"the trail ends at {previous.value}, but the job is {job.status}"
    return None


# --- 3: at most one render per attempt ----------------------------------------------------------------------

def one_render_per_attempt(renders_by_attempt: dict[str, int]) -> list[Violation]:
    return [Violation("one_render_per_attempt", key.rsplit("/", 1)[0],
                      f"attempt {key.rsplit('/', 1)[-1]} was rendered {n} times at the provider")
            for key, n in sorted(renders_by_attempt.items()) if n > 1]


# --- 5: money -----------------------------------------------------------------------------------------------

def money(history: History, snap: Snapshot) -> list[Violation]:
    by_account: dict[str, list[Entry]] = defaultdict(list)
    for entry in snap.ledger:
        by_account[entry.account_id].append(entry)
    out = []
    for account_id in sorted(history.accounts):
        if account_id not in snap.balances:
            out.append(Violation("money", None, f"account {account_id} is gone"))
            continue
        jobs = [j for j in snap.jobs.values() if j.account_id == account_id]
        out += _account_money(history, account_id, snap.balances[account_id], by_account[account_id], jobs)
    return out


def _account_money(history: History, account_id: str, held_now: tuple[int, int], entries: list[Entry],
                   jobs: list[Job]) -> list[Violation]:
    balance, reserved = held_now
    out = []
    summed = (sum(e.balance_change for e in entries), sum(e.reserved_change for e in entries))
    if summed != (balance, reserved):
        out.append(Violation("money", None, f"account {account_id}: the ledger sums to balance {summed[0]} reserved "
                             f"{summed[1]}, the account holds {balance} reserved {reserved}"))
    held: Counter[str] = Counter()
    settled: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        if e.job_id is not None and e.kind in HOLDS:
            held[e.job_id] += e.reserved_change
        elif e.job_id is not None and e.kind in SETTLEMENTS:
            settled[e.job_id].append(e)
    charged, still_held = 0, 0
    for job in jobs:
        ended = job.deleted or job.status in TERMINAL_NAMES
        settlements = settled.get(job.id, [])
        if ended and len(settlements) != 1:
            out.append(Violation("money", job.id, f"ended ({job.status}) with {len(settlements)} settlements"))
        if not ended:
            still_held += held[job.id]
            if settlements:
                out.append(Violation("money", job.id, f"settled while still {job.status}"))
        if settlements and (history.began_at is None or settlements[0].at >= history.began_at):
            charged += min(max(job.actual_credits or 0, 0), held[job.id])
    if reserved != still_held:
        out.append(Violation("money", None, f"account {account_id}: {reserved} credits reserved at rest, its waiting "
                             f"jobs hold {still_held}"))
    expected = history.balances_before.get(account_id, 0) + history.grants.get(account_id, 0) - charged
    if balance != expected:
        out.append(Violation("money", None, f"account {account_id}: balance {balance}, but it began at "
                             f"{history.balances_before.get(account_id)} with grants "
                             f"{history.grants.get(account_id, 0)} and jobs charged {charged}: expected {expected}"))
    return out


# --- 6: app webhooks ----------------------------------------------------------------------------------------

def webhooks(history: History, snap: Snapshot) -> list[Violation]:
    return _receipts_own_account(history, snap) + _events_delivered(history, snap)


def _receipts_own_account(history: History, snap: Snapshot) -> list[Violation]:
    out = []
    for r in history.received:
        endpoint_account = history.endpoints.get(r.endpoint_id)
        job = snap.jobs.get(r.job_id)
        job_account = job.account_id if job else history.acknowledged.get(r.job_id)
        if endpoint_account != job_account:
            out.append(Violation("webhook_own_account", r.job_id, f"{r.event_type} ({r.event_id}) of account "
                                 f"{job_account} reached endpoint {r.endpoint_id} of account {endpoint_account}"))
        if not r.verified:
            out.append(Violation("webhook_signed", r.job_id, f"{r.event_type} ({r.event_id}) at endpoint "
                                 f"{r.endpoint_id} failed its signature check"))
    return out


def promised_events(trail: list[Move]) -> list[tuple[str, Move]]:
    """The app events a trail's moves promise, each with its move (states.app_events, as the move told)."""
    out: list[tuple[str, Move]] = []
    reached: Stage | None = None
    previous: JobStatus | None = None
    for move in trail:
        target = JobStatus(move.to_status)
        shown = Stage(move.stage) if move.stage is not None else stage_after(reached, target)
        if previous is not None and is_legal(previous, target):  # an illegal move promises nothing
            # the stage shown before the move is the one the move before left
            out += [(t, move) for t in app_events(previous, target, stage_moved=shown is not reached)]
        previous, reached = target, shown
    return out


def _events_delivered(history: History, snap: Snapshot) -> list[Violation]:
    received: dict[tuple[str, str, str], set[str]] = defaultdict(set)  # (job, endpoint, type) -> event ids
    for r in history.received:
        received[r.job_id, r.endpoint_id, r.event_type].add(r.event_id)
    rows: dict[tuple[str, str, str], list[Delivery]] = defaultdict(list)
    for d in snap.deliveries:
        rows[d.job_id, d.endpoint_id, d.event_type].append(d)
    expected: Counter[tuple[str, str, str]] = Counter()
    for job in snap.jobs.values():
        if job.deleted or job.status not in TERMINAL_NAMES:
            continue  # a deleted job is told of no more (its deliveries fail); a live one has more to come
        for event_type, move in promised_events(snap.trails.get(job.id, [])):
            for ep in snap.endpoints.values():
                if (ep.id in history.endpoints and ep.account_id == job.account_id and event_type in ep.events
                        and ep.created_at < move.at and ep.deleted_at is None
                        and (ep.disabled_at is None or ep.disabled_at > move.at)):
                    expected[job.id, ep.id, event_type] += 1
    out = []
    for key in sorted(set(expected) | set(rows)):
        out += _delivery_faults(key, expected[key], received[key], rows[key])
    return out


def _delivery_faults(key: tuple[str, str, str], wanted: int, got: set[str], rows: list[Delivery]) -> list[Violation]:
    job_id, endpoint_id, event_type = key
    out = []
    recorded = [d for d in rows if d.status in GIVEN_UP_OR_RETRYING and d.id not in got]
    if len(got) + len(recorded) < wanted:
        out.append(Violation("webhook_delivered", job_id, f"{event_type} to {endpoint_id}: {wanted} promised, "
                             f"{len(got)} received, {len(recorded)} recorded as retrying or given up"))
    for d in rows:
        if d.status == "delivered" and d.id not in got:
            out.append(Violation("webhook_delivered", job_id, f"{event_type} ({d.id}) to {endpoint_id} is recorded "
                                 "delivered, but its receiver never got it"))
    return out


# --- 8: no restart loop -------------------------------------------------------------------------------------

def no_restart_loop(starts: dict[str, int]) -> list[Violation]:
    return [Violation("no_restart_loop", None, f"{name} was restarted {n - 1} times (at most {MAX_RESTARTS})")
            for name, n in sorted(starts.items()) if n - 1 > MAX_RESTARTS]
