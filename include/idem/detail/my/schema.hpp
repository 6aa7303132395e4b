// idem/detail/my/schema.hpp: the MySQL/MariaDB store's schema and the server settings its promises
// rest on: the tables (the same names and columns as the PostgreSQL store's, in MySQL's types),
// creating or checking them at open (ensure_schema()), and the durability settings
// (read_durability(), durability_fault()).
//
// Invariants
//   * Opening is idempotent and safe when several processes open one database at once: GET_LOCK
//     serialises the CREATE TABLE IF NOT EXISTS; a database already at this version is only read
//     (no DDL: DDL commits implicitly and takes metadata locks a live writer would wait for).
//   * A version newer than this library's is refused (store_error), never written over.
//   * Keys, biz_type, node and detail are VARBINARY/BLOB: bytes, compared in byte order (the order
//     of SQLite's BINARY, PostgreSQL's COLLATE "C" and std::string), so any key idem::key admits is
//     stored as it is and scan_audit orders keys as memory_store does.
//   * Fences, outcomes and fingerprints are BIGINT UNSIGNED: uint64 exactly, compared unsigned.
//   * Sync durability acknowledges nothing a crash of the server can lose: InnoDB must flush its
//     log at every commit (innodb_flush_log_at_trx_commit = 1) and, where a binary log is kept, the
//     binary log too (sync_binlog = 1). Both are global settings no session can pin, so once sync
//     durability was required they are checked at every (re)connect and inside every batch, right
//     before COMMIT (detail/my/sql.hpp, durability_guard): when either is weaker the batch is not
//     committed and the store answers store_unavailable naming the setting.
#pragma once

#include <string>
#include <string_view>

#include "idem/detail/my/connection.hpp"
#include "idem/error.hpp"

namespace idem::detail::my {

inline constexpr int schema_version = 1;

inline constexpr std::string_view schema_ddl = R"sql(
CREATE TABLE IF NOT EXISTS idem_schema (
  version INT NOT NULL PRIMARY KEY,
  records_horizon BIGINT NULL,
  audit_horizon BIGINT NULL,
  pruned_fence BIGINT UNSIGNED NOT NULL DEFAULT 0
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS idempotent_record (
  idempotent_key VARBINARY(128) NOT NULL PRIMARY KEY,
  biz_type VARBINARY(32) NOT NULL,
  status ENUM('PROCESSING','SUCCESS','FAILED','RELEASED') NOT NULL,
  fencing_token BIGINT UNSIGNED NOT NULL,
  lease_until BIGINT NOT NULL,
  outcome BIGINT UNSIGNED NOT NULL,
  request_fingerprint BIGINT UNSIGNED NOT NULL,
  created_time BIGINT NOT NULL,
  updated_time BIGINT NOT NULL,
  payload MEDIUMBLOB NOT NULL,
  INDEX idx_idempotent_record_biz_status (biz_type, status),
  INDEX idx_idempotent_record_updated (updated_time)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS idempotent_audit (
  sequence BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  idempotent_key VARBINARY(128) NOT NULL,
  from_status VARCHAR(16) NOT NULL,
  to_status VARCHAR(16) NOT NULL,
  fencing_token BIGINT UNSIGNED NOT NULL,
  node VARBINARY(64) NOT NULL,
  at_time BIGINT NOT NULL,
  detail BLOB NOT NULL,
  INDEX idx_idempotent_audit_key_seq (idempotent_key, sequence)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS idempotent_batch (
  batch_id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
  committed_time BIGINT NOT NULL
) ENGINE=InnoDB;
INSERT INTO idem_schema (version) SELECT 1 FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM idem_schema)
)sql";
static_assert(schema_version == 1, "schema_ddl writes the literal 1: change both together");

/// The schema's version in the session's database: 0 when idem_schema does not exist.
inline constexpr std::string_view schema_version_query =
    "SELECT (SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND "
    "table_name = 'idem_schema')";

/// Creates the schema, or only checks a current one (no DDL then). `step`: the step under way, for
/// the caller's messages. Throws store_error naming `name` for a version this library does not
/// read; failure for anything the server answers.
inline void ensure_schema(session& s, std::string_view name, std::string& step) {
    const auto version = [&] {
        int v = 0;
        bool exists = false;
        s.run(schema_version_query, [&](int, row_view r) { exists = r[0] != "0"; });
        if (exists)
            s.run("SELECT COALESCE(MAX(version), 0) FROM idem_schema",
                  [&](int, row_view r) { v = std::stoi(std::string(r[0])); });
        return v;
    };
    step = "check schema";
    int v = version();
    if (v == 0) {
        step = "create schema";
        // GET_LOCK waits at most 10 s for a racing opener; 0 (timed out) falls through to the DDL,
        // which is idempotent on its own (IF NOT EXISTS, and an INSERT that checks first).
        s.run("SELECT GET_LOCK('idem_schema', 10)");
        try {
            s.run(schema_ddl);
        } catch (...) {
            try {
                s.run("DO RELEASE_LOCK('idem_schema')");
            } catch (...) {  // the session broke: the lock went with it
            }
            throw;
        }
        s.run("DO RELEASE_LOCK('idem_schema')");
        step = "check schema";
        v = version();
    }
    if (v != schema_version)
        throw error(errc::store_error, "mysql store " + std::string(name) + ": the database holds idem schema version " +
                                           std::to_string(v) + "; this library reads version " +
                                           std::to_string(schema_version));
}

/// The server's durability settings (global: no session can change them for itself).
struct durability {
    std::string flush_log_at_trx_commit;  ///< innodb_flush_log_at_trx_commit
    bool log_bin = false;                 ///< a binary log is kept
    std::string sync_binlog;              ///< sync_binlog
};

inline constexpr std::string_view durability_query =
    "SELECT @@global.innodb_flush_log_at_trx_commit, @@global.log_bin, @@global.sync_binlog";

[[nodiscard]] inline durability read_durability(session& s) {
    durability d;
    s.run(durability_query, [&](int, row_view r) {
        d.flush_log_at_trx_commit = std::string(r[0]);
        d.log_bin = r[1] == "1" || r[1] == "ON";
        d.sync_binlog = std::string(r[2]);
    });
    return d;
}

/// What in `d` lets a crash of the server lose an acknowledged commit ("" when nothing).
[[nodiscard]] inline std::string durability_fault(const durability& d) {
    if (d.flush_log_at_trx_commit != "1")
        return "innodb_flush_log_at_trx_commit is " + d.flush_log_at_trx_commit +
               " (a crash loses commits acknowledged in the last second); set it to 1";
    if (d.log_bin && d.sync_binlog != "1")
        return "sync_binlog is " + d.sync_binlog +
               " with the binary log on (a crash loses commits the log has not flushed); set it to 1";
    return {};
}

}  // namespace idem::detail::my
