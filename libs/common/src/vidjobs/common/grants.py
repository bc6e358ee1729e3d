"""Who owns each table, and what each service may do to it: one PostgreSQL role per service.

The migrator (whoever runs `vidjobs migrate`) owns the schema, every table and every function. Each service
connects as a login user that is a member of its own NOLOGIN group role, `vidjobs_<service>`, which holds
only the privileges below: a gateway bug cannot delete assets, a compromised media pod cannot read API key
hashes or webhook secrets, and no service can change the schema or add credit to an account. The operator
commands (`vidjobs accounts`, `keys`, `credits`, `rates`, `submissions`, `routes`) run as the migrator: they
do what no service may (OPERATOR_ONLY).

A privilege is on a whole table or view, on named columns only (`columns`), or EXECUTE on a function. A
service reaches a table another service owns through an interface its owner keeps (INTERFACES: a view that
shows what the reader needs, a function that makes the one change the caller may make), never by a privilege
on the table itself; the few direct privileges across owners left are named, with why, in UNMEDIATED. A
service that reads a table holding secrets it does not own (accounts, webhook_endpoints) is granted the
columns it reads, an allow-list: a column added later (a new secret, say) stays out of its reach until it is
named here. Credit moves only through the functions of migration 0014, which run as their owner and do only
what reserving for a new job and settling an ended one do (credits.py).

`apply` makes the database hold exactly this declaration; `db.migrate` calls it after the migrations, so a
new table is granted in the same step that creates it. tests/test_roles.py checks the declaration against
the SQL each service's code contains, and runs the whole lifecycle with every service on its own role;
tests/test_privileges.py shows what PostgreSQL refuses the roles.
"""

from __future__ import annotations

import enum
import logging
from typing import NamedTuple

import asyncpg

from vidjobs.common.errors import ConfigError

log = logging.getLogger("vidjobs.grants")


class Privilege(enum.StrEnum):
    SELECT = "SELECT"
    INSERT = "INSERT"
    UPDATE = "UPDATE"  # also what `SELECT ... FOR UPDATE` needs
    DELETE = "DELETE"
    EXECUTE = "EXECUTE"  # on a function; the others are on a table or its columns


class Column(NamedTuple):
    """A privilege on one column only (GRANT SELECT (name) ON table)."""

    privilege: Privilege
    name: str


Grant = Privilege | Column


def columns(privilege: Privilege, *names: str) -> frozenset[Grant]:
    """`privilege` on the named columns of a table, and on no other, present or added later."""
    return frozenset(Column(privilege, name) for name in names)


def privilege_of(grant: Grant) -> Privilege:
    return grant.privilege if isinstance(grant, Column) else grant


SEL, INS, UPD, DEL, EXE = (frozenset({p}) for p in Privilege)

SERVICES = ("gateway", "submitter", "poller", "media", "reaper")

# The accounts columns a platform sets when it makes or changes one of its accounts (gateway/platform_accounts.py).
_PLATFORM_ACCOUNT = ("name", "plan", "concurrent_jobs", "max_queued_jobs", "daily_spend_cap", "max_job_credits",
                     "requests_per_s", "request_burst", "storage_quota_bytes", "fallback_models")

# The part that owns each table (docs/ARCHITECTURE.md "Shape"): it defines the rows' meaning and is where a change of
# the table is decided. `common` is libs/common (the job row, its audit, the outbox and the money, which
# run inside every service); `operator` tables are written only by the operator commands.
OWNERS: dict[str, str] = {
    "accounts": "gateway",
    "api_keys": "gateway",
    "idempotency_keys": "gateway",
    "webhook_inbox": "gateway",
    "uploads": "gateway",
    "webhook_endpoints": "gateway",
    "webhook_deliveries": "gateway",
    "webhook_attempts": "gateway",
    "platforms": "operator",
    "platform_keys": "operator",
    "plans": "gateway",
    "browser_tokens": "gateway",
    "platform_audit": "gateway",
    "provider_submissions": "submitter",
    "provider_rate_buckets": "submitter",
    "provider_breakers": "submitter",
    "account_turns": "submitter",
    "poll_schedule": "poller",
    "provider_answers": "poller",
    "assets": "media",
    "media_copies": "media",
    "job_exports": "media",
    "recovery_leases": "reaper",
    "jobs": "common",
    "job_transitions": "common",
    "outbox": "common",
    "credit_ledger": "common",
    "account_daily_spend": "common",
    "attempt_costs": "common",
    "rate_cards": "operator",
    "rate_card_prices": "operator",
    "platform_controls": "operator",
    "model_routes": "operator",
    "model_route_changes": "operator",
    "schema_migrations": "migrator",
}

# The views and functions a service's role may use, and the part that keeps each: the owner of the tables
# behind it, which may change them as it likes while what it keeps here means the same (migration 0029 for
# the views and the uploads' functions; 0014, 0019 and 0028 for the rest).
INTERFACES: dict[str, str] = {
    "job_files": "media",  # a job's stored files, as the media service recorded them
    "live_uploads": "gateway",  # uploads not deleted
    "mark_upload_ready": "gateway",  # the media worker decoded a processing upload
    "mark_upload_rejected": "gateway",  # ... or refused it
    "reject_unprocessed_uploads": "gateway",  # the reaper gives up on uploads left processing
    "expire_unused_uploads": "gateway",  # the reaper retires uploads no live job needs
    "reserve_job_credit": "common",
    "settle_job_credit": "common",
    "reprice_job_credit": "common",
    "platform_credit": "common",  # credit a platform grants, checked against its key
    "purge_closed_account": "gateway",
    "grant_credit": "operator",
}

# The direct privileges a service still holds on a table another service owns, with no interface between
# (tests/test_roles.py refuses any other), each with why: named so that a new one is a decision, not an
# accident, and so that the next interface has its list of candidates.
UNMEDIATED: dict[tuple[str, str], str] = {
    ("gateway", "provider_submissions"): "a verified callback is stored while a submit is in flight (inbox.is_known)",
    ("gateway", "provider_breakers"): "a waiting job's estimate says when its provider's breaker holds it back",
    ("gateway", "job_exports"): "records an export and shows how it went; the media service copies and settles it",
    ("submitter", "accounts"): "two columns: an account's id and its cap on renders in flight",
    ("poller", "webhook_inbox"): "reads the callback the gateway stored, which is what the inbox is for",
    **{(service, "webhook_endpoints"): "three columns: whether a job's account has a live endpoint to tell"
       for service in ("submitter", "poller", "media", "reaper")},
}

# What every service does through libs/common: a transition rereads and updates the job, appends its audit
# row, writes its events to the outbox (and the relay publishes and deletes them), and settles the job's
# credit through settle_job_credit; `schema_migrations` is read at start to see that the schema is current.
_COMMON: dict[str, frozenset[Grant]] = {
    "jobs": SEL | UPD,
    "job_transitions": INS,
    "outbox": SEL | INS | UPD | DEL,
    "settle_job_credit": EXE,  # releases an ended job's reservation and charges what it owes
    # A transition emits an app event only if the account has a live endpoint: the columns that say so.
    "webhook_endpoints": columns(Privilege.SELECT, "account_id", "deleted_at", "disabled_at"),
    "schema_migrations": SEL,
}


def _merged(*parts: dict[str, frozenset[Grant]]) -> dict[str, frozenset[Grant]]:
    merged: dict[str, frozenset[Grant]] = {}
    for part in parts:
        for name, granted in part.items():
            merged[name] = merged.get(name, frozenset()) | granted
    # A column's privilege adds nothing where the whole table's is granted: only the table's is declared.
    return {name: frozenset(g for g in granted if not (isinstance(g, Column) and g.privilege in granted))
            for name, granted in merged.items()}


def _with_common(own: dict[str, frozenset[Grant]]) -> dict[str, frozenset[Grant]]:
    return _merged(_COMMON, own)


# What this release's code needs of each object, service by service.
NEEDED: dict[str, dict[str, frozenset[Grant]]] = {
    "gateway": _with_common({
        "jobs": INS,  # creates jobs; no other service does
        # Reads every account column; writes the account's default fallback models and its webhook secret
        # (sealed, with its rotation and the plaintext the sweep clears), and a platform's accounts: made with
        # their limits (never their credit: that moves only through platform_credit), changed, disabled,
        # closed.
        "accounts": SEL | columns(Privilege.INSERT, *_PLATFORM_ACCOUNT, "id", "platform_id", "external_id")
                        | columns(Privilege.UPDATE, "fallback_models", "webhook_secret", "webhook_secret_sealed",
                                  "webhook_secret_created_at", "webhook_previous_secret_sealed",
                                  "webhook_previous_secret_expires_at", *_PLATFORM_ACCOUNT, "disabled_at",
                                  "closed_at"),
        "reserve_job_credit": EXE,  # holds a new job's estimate
        "credit_ledger": SEL,  # the account's ledger (GET /v1/account/ledger)
        "account_daily_spend": SEL,  # what the account committed today
        "job_transitions": SEL,  # a job's trail (GET /v1/jobs/{id}/events)
        # Authenticates, and writes back what a key spent (ratelimit.py); issues and revokes a platform's
        # accounts' keys.
        "api_keys": SEL | INS | UPD,
        # A platform key is read to authenticate it and marked used with its audit lines; made, rotated and
        # revoked only by the operator.
        "platforms": SEL,
        "platform_keys": SEL | columns(Privilege.UPDATE, "last_used_at"),
        "plans": SEL | INS | UPD,
        "browser_tokens": SEL | INS | UPD,
        "platform_audit": SEL | INS,
        # Credit a platform grants or takes back, checked against its key (migration 0028); the purge of an
        # account a platform closed.
        "platform_credit": EXE,
        "purge_closed_account": EXE,
        "idempotency_keys": SEL | INS | UPD | DEL,
        "webhook_inbox": SEL | INS | DEL,  # stores verified provider callbacks, prunes old ones
        "provider_submissions": SEL,  # a callback must name a render of ours
        "uploads": SEL | INS,  # records an upload; the media worker and the reaper change it through functions
        "webhook_endpoints": SEL | INS | UPD,  # the endpoints' secrets sign their deliveries
        "webhook_deliveries": SEL | INS | UPD | DEL,  # prunes finished history
        "webhook_attempts": SEL | INS,  # pruned with their deliveries (ON DELETE CASCADE runs as the owner)
        "rate_cards": SEL,  # prices a job at create
        "rate_card_prices": SEL,
        # A finished job's outputs, what kept clips hold, and delivered seconds, as the media service keeps them.
        "job_files": SEL,
        "live_uploads": SEL,  # reads an upload as the other services do (uploads.owned)
        "job_exports": SEL | INS,  # records an export (the media service copies and settles it), shows how it went
        "attempt_costs": SEL,  # what the provider billed for a job's attempts (its cost, the account's usage)
        # A waiting job's estimate says when the switch or the provider's breaker holds it back (estimates.py).
        "platform_controls": SEL,
        "provider_breakers": SEL,
        # Picks each job's route from the model routes it reads; seeds an alias of VIDJOBS_MODEL_ROUTES the
        # table lacks, with its audit row (modelroutes.seed). Changing a route is the operator's.
        "model_routes": SEL | INS,
        "model_route_changes": INS,
    }),
    "submitter": _with_common({
        "accounts": columns(Privilege.SELECT, "id", "concurrent_jobs"),  # an account's cap on renders in flight
        "provider_submissions": SEL | INS | UPD,
        "provider_rate_buckets": SEL | INS | UPD,
        "provider_breakers": SEL | INS | UPD,
        "account_turns": SEL | INS | UPD,
        "platform_controls": SEL,  # the operator's submission switch
        "live_uploads": SEL,  # hands the provider a job's input image
        "reprice_job_credit": EXE,  # lowers a job's reservation when it moves to a cheaper fallback model
        "rate_cards": SEL,  # prices a fallback model for a move
        "rate_card_prices": SEL,
    }),
    "poller": _with_common({
        "poll_schedule": SEL | INS | UPD | DEL,
        "provider_answers": SEL | INS | UPD | DEL,  # what providers told it, kept for a while, then pruned
        "webhook_inbox": SEL,  # reads the callback the gateway stored
        "rate_cards": SEL,  # prices what the provider reported it billed
        "rate_card_prices": SEL,
        "attempt_costs": SEL | INS | UPD,  # each attempt's reported bill; a repeated report replaces it
    }),
    "media": _with_common({
        "assets": SEL | INS | UPD,
        "media_copies": SEL | INS | UPD | DEL,
        "job_exports": SEL | UPD,  # copies an export's clip and settles it
        # The orphan sweep keeps objects a live upload names; decoding an upload marks it ready or rejected.
        "live_uploads": SEL,
        "mark_upload_ready": EXE,
        "mark_upload_rejected": EXE,
    }),
    "reaper": _with_common({
        "recovery_leases": SEL | INS | UPD | DEL,
        # Expires uploads no live job needs, and rejects those left processing too long (the gateway owns the
        # table).
        "expire_unused_uploads": EXE,
        "reject_unprocessed_uploads": EXE,
    }),
}

# Direct privileges on another service's table that this release's code no longer uses (it goes through
# the owner's interface instead, migration 0029) but the release before it still does: granted so that
# release's pods keep working beside this one's during a rollout (docs/UPGRADES.md), and taken away by the
# next release, as a contract. tests/test_roles.py shows this release needs none of them.
FOR_THE_RELEASE_BEFORE: dict[str, dict[str, frozenset[Grant]]] = {
    "gateway": {"assets": SEL},
    "submitter": {"uploads": SEL},
    "media": {"uploads": SEL | columns(Privilege.UPDATE, "status", "bytes", "sha256", "width", "height", "reason",
                                       "message")},
    "reaper": {"uploads": SEL | UPD},
}

# What each service's role holds: what its code needs, and what the release before it still uses.
GRANTS: dict[str, dict[str, frozenset[Grant]]] = {
    service: _merged(NEEDED[service], FOR_THE_RELEASE_BEFORE.get(service, {})) for service in SERVICES}

# Statements reachable from a service's code that only the operator commands run, as the migrator: creating
# accounts and keys, granting credit, publishing a rate card, pausing submissions, recording a migration.
OPERATOR_ONLY: frozenset[tuple[str, Privilege]] = frozenset({
    ("grant_credit", Privilege.EXECUTE),
    ("rate_cards", Privilege.INSERT),
    ("rate_card_prices", Privilege.INSERT),
    ("platform_controls", Privilege.UPDATE),
    ("schema_migrations", Privilege.INSERT),
})


def role(service: str) -> str:
    return f"vidjobs_{service}"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_SEQUENCES = """
SELECT t.relname AS table_name, s.relname AS sequence_name
FROM pg_class s
JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = s.oid AND d.deptype IN ('a', 'i')
JOIN pg_class t ON t.oid = d.refobjid
WHERE s.relkind = 'S' AND s.relnamespace = current_schema()::regnamespace
"""


async def sequences(conn: asyncpg.Connection) -> dict[str, list[str]]:
    """The sequences behind each table's serial columns: an INSERT takes its next id from one."""
    found: dict[str, list[str]] = {}
    for row in await conn.fetch(_SEQUENCES):
        found.setdefault(row["table_name"], []).append(row["sequence_name"])
    return found


def functions() -> frozenset[str]:
    """The functions the declaration names: those granted to a service, and the operator's own."""
    granted = {name for objects in GRANTS.values() for name, g in objects.items() if Privilege.EXECUTE in g}
    return frozenset(granted | {name for name, privilege in OPERATOR_ONLY if privilege is Privilege.EXECUTE})


def _column_grants(granted: frozenset[Grant]) -> list[tuple[Privilege, list[str]]]:
    by_privilege = [(p, sorted(g.name for g in granted if isinstance(g, Column) and g.privilege is p))
                    for p in Privilege]
    return [(p, names) for p, names in by_privilege if names]


def listed(granted: frozenset[Grant]) -> str:
    """The privileges as GRANT spells them: `SELECT, UPDATE (webhook_secret)`."""
    return ", ".join([p.value for p in Privilege if p in granted]
                     + [f"{p.value} ({', '.join(names)})" for p, names in _column_grants(granted)])


def _grants_on(name: str, granted: frozenset[Grant], grantee: str, sequences: dict[str, list[str]]) -> list[str]:
    if Privilege.EXECUTE in granted:
        return [f"GRANT EXECUTE ON FUNCTION {_quote(name)} TO {grantee}"]
    whole = [p.value for p in Privilege if p in granted]
    sql = [f"GRANT {', '.join(whole)} ON {_quote(name)} TO {grantee}"] if whole else []
    sql += [f"GRANT {p.value} ({', '.join(map(_quote, names))}) ON {_quote(name)} TO {grantee}"
            for p, names in _column_grants(granted)]
    if any(privilege_of(g) is Privilege.INSERT for g in granted):
        sql += [f"GRANT USAGE ON SEQUENCE {_quote(seq)} TO {grantee}" for seq in sequences.get(name, ())]
    return sql


def statements(schema: str, sequences: dict[str, list[str]]) -> list[str]:
    """The SQL that makes the service roles hold exactly GRANTS (the roles themselves must exist). A privilege
    taken away from the declaration is revoked here too, so the database never keeps a stale grant: REVOKE
    ALL on a table also revokes every privilege on its columns, and the declared functions are taken from
    PUBLIC, which may run any function unless told otherwise."""
    # No service creates anything in the schema: PostgreSQL 15 and later give PUBLIC no CREATE on it, older
    # servers do, and a role that may create there could slip its own function or operator in front of
    # what a function running as the schema's owner calls.
    sql = [f"REVOKE CREATE ON SCHEMA {_quote(schema)} FROM PUBLIC"]
    for service in SERVICES:
        name = _quote(role(service))
        sql += [f"GRANT USAGE ON SCHEMA {_quote(schema)} TO {name}",
                f"REVOKE CREATE ON SCHEMA {_quote(schema)} FROM {name}",
                f"REVOKE ALL ON ALL TABLES IN SCHEMA {_quote(schema)} FROM {name}",
                f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {_quote(schema)} FROM {name}",
                f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {_quote(schema)} FROM {name}"]
        for granted_on, granted in sorted(GRANTS[service].items()):
            sql += _grants_on(granted_on, granted, name, sequences)
    sql += [f"REVOKE EXECUTE ON FUNCTION {_quote(function)} FROM PUBLIC" for function in sorted(functions())]
    return sql


# What the roles hold on tables and views, on their columns, and on functions, in this schema.
_HELD = """
SELECT r.rolname AS grantee, c.relname AS name, NULL::name AS column_name, a.privilege_type
FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a JOIN pg_roles r ON r.oid = a.grantee
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'v') AND r.rolname = ANY($1::text[])
UNION ALL
SELECT r.rolname, c.relname, t.attname, a.privilege_type
FROM pg_class c JOIN pg_attribute t ON t.attrelid = c.oid AND t.attnum > 0 AND NOT t.attisdropped
    CROSS JOIN LATERAL aclexplode(t.attacl) a JOIN pg_roles r ON r.oid = a.grantee
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'v') AND r.rolname = ANY($1::text[])
UNION ALL
SELECT r.rolname, p.proname, NULL, a.privilege_type
FROM pg_proc p CROSS JOIN LATERAL aclexplode(p.proacl) a JOIN pg_roles r ON r.oid = a.grantee
WHERE p.pronamespace = current_schema()::regnamespace AND r.rolname = ANY($1::text[])
"""


async def held(conn: asyncpg.Connection) -> dict[str, dict[str, frozenset[Grant]]]:
    """The privileges each service role holds in this database now, in GRANTS' shape (any session may read
    them): on tables, on single columns, and EXECUTE on functions."""
    found: dict[str, dict[str, set[Grant]]] = {service: {} for service in SERVICES}
    by_role = {role(s): s for s in SERVICES}
    for row in await conn.fetch(_HELD, list(by_role)):
        if row["privilege_type"] not in Privilege.__members__:
            continue
        privilege = Privilege(row["privilege_type"])
        grant = privilege if row["column_name"] is None else Column(privilege, row["column_name"])
        found[by_role[row["grantee"]]].setdefault(row["name"], set()).add(grant)
    return {s: {name: frozenset(g) for name, g in objects.items()} for s, objects in found.items()}


# A function's ACL is NULL until its first GRANT or REVOKE: the default, under which PUBLIC may run it.
_PUBLIC_EXECUTES = """
SELECT p.proname FROM pg_proc p CROSS JOIN LATERAL aclexplode(COALESCE(p.proacl, acldefault('f', p.proowner))) a
WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = ANY($1::text[]) AND a.grantee = 0
"""


async def public_executes(conn: asyncpg.Connection) -> set[str]:
    """The declared functions every role may run, through PUBLIC: none, when the database is in step."""
    return {r["proname"] for r in await conn.fetch(_PUBLIC_EXECUTES, sorted(functions()))}


async def may_create(conn: asyncpg.Connection) -> list[str]:
    """The service roles that may create objects in the schema: none, when the database is in step."""
    return [r["rolname"] for r in await conn.fetch(
        "SELECT rolname FROM pg_roles WHERE rolname = ANY($1::text[]) "
        "AND has_schema_privilege(oid, current_schema(), 'CREATE') ORDER BY rolname",
        [role(s) for s in SERVICES])]


async def _missing_roles(conn: asyncpg.Connection) -> list[str]:
    names = [role(s) for s in SERVICES]
    present = {r["rolname"] for r in await conn.fetch("SELECT rolname FROM pg_roles WHERE rolname = ANY($1)", names)}
    return [n for n in names if n not in present]


async def _may_create_roles(conn: asyncpg.Connection) -> bool:
    return bool(await conn.fetchval("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"))


async def _create_roles(conn: asyncpg.Connection, names: list[str]) -> None:
    for name in names:
        try:
            await conn.execute(f"CREATE ROLE {_quote(name)} NOLOGIN")
        except (asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError):
            # Roles belong to the whole server: a migration of another database made it a moment ago.
            pass


async def in_step(conn: asyncpg.Connection) -> bool:
    """True when every service role exists and holds exactly what GRANTS declares, no other role may run a
    declared function, and no service role may create objects in the schema."""
    return (not await _missing_roles(conn) and await held(conn) == GRANTS
            and not await public_executes(conn) and not await may_create(conn))


async def apply(conn: asyncpg.Connection, *, strict: bool = True) -> bool:
    """Create the missing service roles and give them exactly GRANTS; returns True if anything changed.
    Needs the tables' owner. If roles are missing and this user may not create them, `strict` raises;
    otherwise (a migration by a user without CREATEROLE, where every service still connects as that user)
    it says so in the log and leaves the grants alone."""
    if await in_step(conn):
        return False
    missing = await _missing_roles(conn)
    if missing and not await _may_create_roles(conn):
        message = (f"the roles {', '.join(missing)} do not exist and this user may not create them: create "
                   "them as an administrator (CREATE ROLE <name> NOLOGIN), or give the migrator CREATEROLE")
        if strict:
            raise ConfigError(message)
        log.warning("service roles not granted", extra={"reason": message})
        return False
    await _create_roles(conn, missing)
    schema = await conn.fetchval("SELECT current_schema()")
    sql = statements(schema, await sequences(conn))
    async with conn.transaction():
        for statement in sql:
            await conn.execute(statement)
    log.info("service roles granted", extra={"roles": [role(s) for s in SERVICES]})
    if creators := await may_create(conn):
        # Only the schema's owner may take CREATE back from PUBLIC; PostgreSQL warns and goes on otherwise.
        log.warning("service roles may create objects in the schema", extra={
            "roles": creators, "reason": f"run `REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC` as the schema's owner"})
    return True


async def owns_schema(conn: asyncpg.Connection) -> bool:
    """Whether this session may grant on the tables: the migrator may, a service's own login user may not."""
    return bool(await conn.fetchval(
        "SELECT pg_has_role(current_user, relowner, 'USAGE') FROM pg_class WHERE oid = 'jobs'::regclass"))
