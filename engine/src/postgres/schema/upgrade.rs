//! The upgrade of an older schema, in place, with its leases held and its waiters queued:
//! the steps the migration runs between the tables and the functions.

/// Each step looks at the catalog first and is skipped when done: `ALTER TABLE ... ADD
/// COLUMN IF NOT EXISTS` takes an ACCESS EXCLUSIVE lock before it checks, and `CREATE INDEX
/// IF NOT EXISTS` a SHARE lock, which would wait for every call in flight on the table (and
/// every new call behind it), on a schema that is up to date too.
///
/// - Version 3 (from 1 or 2): the `queued` column; a key with tickets gets its row, marked
///   `queued` (its waiters keep their places). The queue's index.
/// - Version 4 (from 3): one space and one queue per key. The key's row gains
///   `shared_until` (the latest expiry of its shared leases, what the lock's fast path
///   reads) and `released` (the id of its last release, so a release sent again reports
///   what the first did); a ticket gains its limit and its registration's nonce. A
///   version 3 schema's shared leases stay where they are (`shared_leases`) and now keep
///   the lock out; their last fences (`shared_fences`) move to the key's row (the greater
///   of the two, so fences keep rising across both modes) and their waiters
///   (`shared_tickets`) join the key's one queue, behind the lock's, in their order. A key
///   held in both spaces at the upgrade keeps both holders until they leave. The old
///   functions whose arguments changed are dropped (the new ones give the added arguments
///   defaults, so a node of the old version still running calls them: see the module docs
///   of `postgres`), and so are the shared leases' own ([`OLD_CALLS`] answers those).
pub(super) const STEPS: &str = r#"
DO $do$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = '@locks@'::regclass
      AND attname = 'queued' AND NOT attisdropped) THEN
    ALTER TABLE @locks@ ADD COLUMN queued boolean NOT NULL DEFAULT false;
    INSERT INTO @locks@ AS l (key, token, fence, expires_at, queued)
      SELECT DISTINCT key, NULL::text, 0::bigint, clock_timestamp(), true FROM @tickets@
      ON CONFLICT (key) DO UPDATE SET queued = true;
  END IF;
  IF to_regclass('@schema@.@queue_index@') IS NULL THEN
    CREATE INDEX @queue_index@ ON @tickets@ (key, seq);
  END IF;
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = '@locks@'::regclass
      AND attname = 'shared_until' AND NOT attisdropped) THEN
    ALTER TABLE @locks@ ADD COLUMN shared_until timestamptz NOT NULL DEFAULT '-infinity',
      ADD COLUMN released text;
    ALTER TABLE @tickets@ ADD COLUMN lim bigint NOT NULL DEFAULT 0,
      ADD COLUMN nonce text NOT NULL DEFAULT '';
    INSERT INTO @locks@ AS l (key, token, fence, expires_at, shared_until)
      SELECT key, NULL::text, max(fence), clock_timestamp(), max(expires_at)
        FROM @shared@ GROUP BY key
      ON CONFLICT (key) DO UPDATE SET fence = greatest(l.fence, excluded.fence),
        shared_until = excluded.shared_until;
    DROP FUNCTION IF EXISTS @acquire@(text, text, bigint, text, bigint, bigint),
      @release@(text, text), @extend@(text, text, bigint, text),
      @renew@(text[], text[], bigint[]), @handoff@(text, bigint, timestamptz);
  END IF;
  IF to_regclass('@schema@.@old_shared_fences@') IS NOT NULL THEN
    INSERT INTO @locks@ AS l (key, token, fence, expires_at)
      SELECT key, NULL::text, fence, clock_timestamp() FROM @schema@.@old_shared_fences@
      ON CONFLICT (key) DO UPDATE SET fence = greatest(l.fence, excluded.fence);
    INSERT INTO @tickets@ (key, id, token, deadline, ttl_ms, claim_ms, lim)
      SELECT key, id, token, deadline, ttl_ms, claim_ms, lim
        FROM @schema@.@old_shared_tickets@ ORDER BY seq
      ON CONFLICT DO NOTHING;
    INSERT INTO @locks@ AS l (key, token, fence, expires_at, queued)
      SELECT DISTINCT key, NULL::text, 0::bigint, clock_timestamp(), true FROM @tickets@
      ON CONFLICT (key) DO UPDATE SET queued = true;
    DROP TABLE @schema@.@old_shared_fences@, @schema@.@old_shared_tickets@;
    DROP FUNCTION IF EXISTS @old@shared_pump", @old@shared_fence", @old@shared_earliest";
  END IF;
END $do$;
"#;

/// Version 5 (from 4): the sweep finds what expired by an index on each table's expiry, in
/// bounded batches (see `sweep`): the expiry of a key's row in either mode (its rows that
/// nobody queues for), the queued rows, tickets' deadlines, shared leases', numbers' and
/// records' expiries. Each index is made only if missing (a `CREATE INDEX` takes a SHARE
/// lock: writes to its table wait while it builds, about a second per million rows). The
/// version 4 `sweep(bigint)` is dropped (the new one's added arguments have defaults, so a
/// version 4 node mid-deploy still calls it).
pub(super) const V5_SWEEP: &str = r#"
DO $do$ BEGIN
  IF to_regclass('@schema@.@locks_expiry@') IS NULL THEN
    CREATE INDEX @locks_expiry@ ON @locks@ ((greatest(expires_at, shared_until)))
      WHERE NOT queued;
  END IF;
  IF to_regclass('@schema@.@locks_queued@') IS NULL THEN
    CREATE INDEX @locks_queued@ ON @locks@ (key) WHERE queued;
  END IF;
  IF to_regclass('@schema@.@tickets_deadline@') IS NULL THEN
    CREATE INDEX @tickets_deadline@ ON @tickets@ (deadline);
  END IF;
  IF to_regclass('@schema@.@shared_expiry@') IS NULL THEN
    CREATE INDEX @shared_expiry@ ON @shared@ (expires_at);
  END IF;
  IF to_regclass('@schema@.@numbers_expiry@') IS NULL THEN
    CREATE INDEX @numbers_expiry@ ON @numbers@ (expires_at);
  END IF;
  IF to_regclass('@schema@.@records_expiry@') IS NULL THEN
    CREATE INDEX @records_expiry@ ON @records@ (expires_at);
  END IF;
  IF to_regprocedure('@sweep@(bigint)') IS NOT NULL THEN
    DROP FUNCTION @sweep@(bigint);
  END IF;
END $do$;
"#;

/// What a version 3 node still running during a rolling deploy calls for its shared leases,
/// each the one-space function in the shared mode (so its leases and waiters are in the
/// key's one space and queue too). Installed after the functions they call.
pub(super) const OLD_CALLS: &str = r#"
CREATE OR REPLACE FUNCTION @old@shared_acquire"(k text, tok text, ttl_ms bigint, tid text,
  ticket_ms bigint, max_waiters bigint, lim bigint, OUT status integer, OUT val bigint)
LANGUAGE sql AS $fn$ SELECT * FROM @acquire@(k, tok, ttl_ms, tid, ticket_ms, max_waiters, lim) $fn$;
CREATE OR REPLACE FUNCTION @old@shared_release"(k text, tok text) RETURNS integer
LANGUAGE sql AS $fn$ SELECT @release@(k, tok, 1) $fn$;
CREATE OR REPLACE FUNCTION @old@shared_leave"(k text, tid text, tok text) RETURNS bigint
LANGUAGE sql AS $fn$ SELECT @leave@(k, tid, tok) $fn$;
CREATE OR REPLACE FUNCTION @old@shared_extend"(k text, tok text, ms bigint, mode text)
RETURNS bigint LANGUAGE sql AS $fn$ SELECT @extend@(k, tok, ms, mode, 1) $fn$;
CREATE OR REPLACE FUNCTION @old@shared_renew"(ks text[], toks text[], ttls bigint[])
RETURNS text LANGUAGE sql AS $fn$
  SELECT @renew@(ks, toks, ttls, array_fill(1::bigint, ARRAY[coalesce(array_length(ks, 1), 0)]))
$fn$;
"#;

/// Version 5's holder labels: a `label` column on the key's row, a shared lease's and a
/// ticket's (from which a hand-off copies it), all nullable, so rows of an older version
/// read as unlabelled. The functions whose arguments changed (`acquire` gained `lbl`,
/// `pump` its arrival's `lbl`) are dropped, the new ones giving the added argument a
/// default, so a node of version 4 still running calls them; `holder`, whose result gained
/// `fence` and `label`, is dropped to be made again (a version 4 node reads its first three
/// columns, unchanged).
pub(super) const V5_LABEL: &str = r#"
DO $do$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = '@locks@'::regclass
      AND attname = 'label' AND NOT attisdropped) THEN
    ALTER TABLE @locks@ ADD COLUMN label text;
    DROP FUNCTION IF EXISTS @acquire@(text, text, bigint, text, bigint, bigint, bigint, text),
      @pump@(@locks@, timestamptz, boolean, text, text, bigint, bigint);
  END IF;
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = '@tickets@'::regclass
      AND attname = 'label' AND NOT attisdropped) THEN
    ALTER TABLE @tickets@ ADD COLUMN label text;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = '@shared@'::regclass
      AND attname = 'label' AND NOT attisdropped) THEN
    ALTER TABLE @shared@ ADD COLUMN label text;
  END IF;
  IF EXISTS (SELECT 1 FROM pg_proc WHERE oid = to_regprocedure('@holder@(text)')
               AND NOT ('label' = ANY (proargnames))) THEN
    DROP FUNCTION @holder@(text);
  END IF;
END $do$;
"#;
