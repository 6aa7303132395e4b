// idem/detail/regions/lease_sql.hpp: the home leases' tables and statements (idem/home_lease.hpp).
//
// Every cluster of a region, and every witness, is a lease store: a row per key space in
// idem__leases.home_lease (owner, epoch, lease_until on that server's clock). A data cluster also
// holds idem__leases.held: the lease its own region's processes hold for the key spaces it decides,
// as a time on this server's clock until which a majority of the stores are known to have accepted
// it (written by home_lease_keeper, only after the majority accepted). The lease fence, a trigger
// on every copy of every key space's records, refuses a write unless `held` says the lease is
// valid now: after its lease ran out, a cluster decides nothing, whichever process asks it.
//
// Schema idem__leases (two underscores) can never be a key space's schema: those are idem_<name>
// with names of a-z and 0-9 only (names.hpp). It is never published: each cluster's rows are its
// own.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace idem::detail::regions::lease {

inline constexpr std::string_view ddl = R"sql(
CREATE SCHEMA IF NOT EXISTS idem__leases;
CREATE TABLE IF NOT EXISTS idem__leases.home_lease (
  space TEXT PRIMARY KEY,
  owner TEXT NOT NULL,
  epoch BIGINT NOT NULL,
  lease_until TIMESTAMPTZ NOT NULL,
  previous TEXT
);
ALTER TABLE idem__leases.home_lease ADD COLUMN IF NOT EXISTS previous TEXT;
CREATE TABLE IF NOT EXISTS idem__leases.held (
  space TEXT PRIMARY KEY,
  epoch BIGINT NOT NULL,
  valid_until TIMESTAMPTZ NOT NULL
);
CREATE OR REPLACE FUNCTION idem__leases.fence() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM idem__leases.held
                  WHERE space = substr(TG_TABLE_SCHEMA, 6) AND valid_until > clock_timestamp()) THEN
    RAISE EXCEPTION 'idem: key space % holds no valid home lease in this cluster (expired, not renewed by a majority of the lease stores, or taken over by another region); nothing of it is decided here',
      substr(TG_TABLE_SCHEMA, 6) USING ERRCODE = '55000';
  END IF;
  RETURN NEW;
END $f$
)sql";

/// The lease fence on one key space's records (`schema` = idem_<space>), in a data cluster. An
/// origin trigger: replication's apply workers (session_replication_role = replica) pass it.
[[nodiscard]] inline std::vector<std::string> fence_sql(const std::string& schema) {
    return {"DROP TRIGGER IF EXISTS idem_lease ON " + schema + ".idempotent_record",
            "CREATE TRIGGER idem_lease BEFORE INSERT OR UPDATE ON " + schema +
                ".idempotent_record FOR EACH ROW EXECUTE FUNCTION idem__leases.fence()"};
}

// A key space's first row: owned by the region deciding it, epoch 0, already expired (the
// owner's keeper renews it before anything is decided).
inline constexpr std::string_view seed =
    "INSERT INTO idem__leases.home_lease (space, owner, epoch, lease_until) VALUES ($1, $2, 0, '-infinity') "
    "ON CONFLICT (space) DO NOTHING";

// The key spaces a store says `owner` holds: (space, epoch).
inline constexpr std::string_view owned = "SELECT space, epoch FROM idem__leases.home_lease WHERE owner = $1";

// A renewal: $1 space, $2 owner, $3 epoch, $4 lease in ms. Accepted (a row) only while the row is
// still the owner's at that epoch: a higher epoch (a takeover) refuses it for good.
inline constexpr std::string_view renew =
    "UPDATE idem__leases.home_lease SET lease_until = GREATEST(lease_until, clock_timestamp() + $4 * interval '1 "
    "millisecond') WHERE space = $1 AND owner = $2 AND epoch = $3 RETURNING 1";

// $1 space: (owner, epoch, expired by the margin $2 ms, ms until it is, the owner before the
// last takeover or move or '') on this store's clock.
inline constexpr std::string_view read = R"sql(
SELECT owner, epoch, lease_until + $2 * interval '1 millisecond' <= clock_timestamp() AS expired,
       CASE WHEN isfinite(lease_until)
            THEN GREATEST(0, extract(epoch FROM lease_until + $2 * interval '1 millisecond' - clock_timestamp()) * 1000)::bigint
            ELSE 0 END,
       COALESCE(previous, '')
  FROM idem__leases.home_lease WHERE space = $1
)sql";

// A takeover's conditional write: $1 space, $2 new owner, $3 new epoch, $4 lease ms, $5 margin ms.
// Accepted when the row's lease ran out by the margin under an older epoch, or when this takeover
// already wrote it (a re-run). The owner it takes from stays as `previous`: a takeover that every
// store accepted and that stopped before the new owner decided is finished from it.
inline constexpr std::string_view take = R"sql(
UPDATE idem__leases.home_lease
   SET previous = CASE WHEN owner = $2 THEN previous ELSE owner END,
       owner = $2, epoch = $3, lease_until = GREATEST(lease_until, clock_timestamp() + $4 * interval '1 millisecond')
 WHERE space = $1
   AND ((epoch < $3 AND lease_until + $5 * interval '1 millisecond' <= clock_timestamp()) OR (epoch = $3 AND owner = $2))
RETURNING 1
)sql";

// A planned move's hand-over (move_home): the old home is fenced already, so no expiry is waited
// for; the new owner's keeper renews it. $1 space, $2 new owner, $3 new epoch.
inline constexpr std::string_view hand_over =
    "UPDATE idem__leases.home_lease SET previous = owner, owner = $2, epoch = $3, lease_until = '-infinity' "
    "WHERE space = $1 AND epoch < $3 RETURNING 1";

// The highest epoch a store has for $1 space (NULL when it has no row).
inline constexpr std::string_view epoch_of = "SELECT max(epoch) FROM idem__leases.home_lease WHERE space = $1";

// Whether this cluster has the lease tables (setup_home_leases ran).
inline constexpr std::string_view installed =
    "SELECT 1 FROM pg_tables WHERE schemaname = 'idem__leases' AND tablename = 'home_lease'";

// This server's clock, in microseconds since the epoch.
inline constexpr std::string_view clock_us = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint";

// The view a data cluster's fence checks: $1 space, $2 epoch, $3 valid until (µs since the epoch,
// this server's clock). Only extended at the same epoch; a newer epoch replaces an older one; an
// older one never replaces a newer.
inline constexpr std::string_view hold = R"sql(
INSERT INTO idem__leases.held AS h (space, epoch, valid_until) VALUES ($1, $2, to_timestamp($3::double precision / 1000000))
ON CONFLICT (space) DO UPDATE
   SET epoch = EXCLUDED.epoch,
       valid_until = CASE WHEN h.epoch = EXCLUDED.epoch THEN GREATEST(h.valid_until, EXCLUDED.valid_until)
                          ELSE EXCLUDED.valid_until END
 WHERE h.epoch <= EXCLUDED.epoch
)sql";

// The view withdrawn: the lease was fenced (a higher epoch seen) or moved away. $1 space, $2 the
// epoch withdrawn: a newer view (the key space came back to this region) is kept.
inline constexpr std::string_view drop =
    "UPDATE idem__leases.held SET valid_until = '-infinity' WHERE space = $1 AND epoch <= $2";

// A store that lacks a key space's row (a rebuilt or new cluster, a witness added later) gets the
// newest owner and epoch the others hold, valid for lease + margin from now: it may have accepted
// a renewal before it was lost, so it must not vote "expired" before that renewal could have run
// out. $1 space, $2 owner, $3 epoch, $4 lease + margin in ms.
inline constexpr std::string_view adopt = R"sql(
INSERT INTO idem__leases.home_lease AS l (space, owner, epoch, lease_until)
VALUES ($1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond')
ON CONFLICT (space) DO UPDATE SET owner = EXCLUDED.owner, epoch = EXCLUDED.epoch,
                                  lease_until = GREATEST(l.lease_until, EXCLUDED.lease_until)
 WHERE l.epoch < EXCLUDED.epoch
)sql";

}  // namespace idem::detail::regions::lease
