-- rollout: expand: two new tables the release before it never reads; its gateways keep routing by VIDJOBS_MODEL_ROUTES.
-- Model routes as live data: an alias sends each account's jobs to one of its routes (real models), weighted by
-- share, and an operator changes the shares with `vidjobs routes` while the gateways run. Every change is kept.
-- Safe beside the release before it: new tables only. That release's gateways go on picking by the setting,
-- at random per job, until they are replaced; the first gateway of this release seeds each alias of its
-- VIDJOBS_MODEL_ROUTES that has no rows here (modelroutes.py).

-- operator writes (and a gateway seeds), gateway reads --------------------------------------------------
CREATE TABLE model_routes (
    alias      text NOT NULL,
    model      text NOT NULL,                       -- a real model, `<provider>/<name>`
    share      integer NOT NULL CHECK (share >= 0), -- relative weight among the alias's enabled routes
    enabled    boolean NOT NULL DEFAULT true,       -- false: rolled back; its share goes to the others
    -- The change that last wrote the row (model_route_changes.id; 0 for a seed). An alias's version, the
    -- largest of its rows', is part of each account's sticky pick: a change of the alias re-deals every account.
    version    bigint NOT NULL DEFAULT 0,
    changed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (alias, model)
);

-- Every change of an alias's routes: who, what, when, and the routes before and after.
CREATE TABLE model_route_changes (
    id       bigserial PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    alias    text NOT NULL,
    action   text NOT NULL CHECK (action IN ('seed', 'set', 'disable', 'enable')),
    actor    text NOT NULL,                          -- the operator's login@host, or `gateway@host` for a seed
    db_user  text NOT NULL DEFAULT session_user,
    reason   text NOT NULL DEFAULT '',
    before   jsonb NOT NULL,                         -- [{"model", "share", "enabled"}], by model
    after    jsonb NOT NULL
);
CREATE INDEX model_route_changes_alias ON model_route_changes (alias, id);

-- Any change of the routes, by the command or by hand, tells every listening gateway at commit, which reads
-- the table again at once (the gateways also reread it every VIDJOBS_ROUTES_REFRESH_S, in case one missed it).
CREATE FUNCTION model_routes_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('vidjobs_model_routes', '');
    RETURN NULL;
END $$;
CREATE TRIGGER model_routes_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON model_routes
    FOR EACH STATEMENT EXECUTE FUNCTION model_routes_changed();

-- `vidjobs routes compare ALIAS` reads the jobs created through an alias since a moment.
CREATE INDEX jobs_route_created ON jobs (route, created_at) WHERE route IS NOT NULL;
