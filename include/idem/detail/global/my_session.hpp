// idem/detail/global/my_session.hpp: one MySQL / MariaDB connection of a global guard (the MySQL
// arbiter of arbiter.hpp), every call bounded; the statements are my_sql.hpp's. MariaDB only (tested
// on 10.11): compound statements, max_statement_time and idle_write_transaction_timeout.
//
// The connection layer is detail/my/connection.hpp's, shared with mysql_store: deadlines (the
// server's lock-wait and statement bounds, the connector's timeouts one second above them),
// multi-statement round trips, failure classes. The session's results (arbiter.hpp):
//
//   lost connection                    in_doubt while the round trip holding COMMIT is in flight,
//                                      else transient; the session reconnects at its next call
//   an error at the COMMIT statement   in_doubt
//   deadlock, lock wait, statement     transient (the transaction is rolled back)
//   past max_statement_time, read-only
//   server, the durability check
//   anything else                      fatal (the transaction is rolled back)
//
// Durability: every (re)connect reads innodb_flush_log_at_trx_commit and sync_binlog and refuses
// (transient, naming the setting) a server that may lose a commit; every batch checks them again on
// the server right before COMMIT (detail/my/sql.hpp, durability_guard).
//
// An unanswered commit (batch_committed): as mysql_store::committed, every session holds a user
// lock of a random name for its life; the session that lost its answer is found by it
// (IS_USED_LOCK), killed, and waited for, and only then does a locking read of the batch id answer.
// A server that was stopped may not have read that session's query yet, and would otherwise run it,
// COMMIT included, after a probe that found nothing.
//
// Thread-safety: one thread at a time. Progress: blocking; each call bounded by the call deadline.
#pragma once

#include <algorithm>
#include <chrono>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/detail/assert.hpp"
#include "idem/detail/global/arbiter.hpp"
#include "idem/detail/global/my_sql.hpp"
#include "idem/detail/my/connection.hpp"
#include "idem/detail/my/schema.hpp"
#include "idem/detail/my/session_life.hpp"
#include "idem/detail/my/sql.hpp"
#include "idem/detail/my/uri.hpp"
#include "idem/detail/pg/sql.hpp"  // utf8_prefix (text only, no libpq)
#include "idem/detail/rows/text_decoder.hpp"
#include "idem/error.hpp"
#include "idem/store_rows.hpp"

namespace idem::detail::global {

class my_session final : public global_session {
public:
    /// `uri`: mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (detail/my/uri.hpp). `application` names
    /// the session in messages. Ordered versions are refused before a session is made
    /// (coordinator.hpp): `ordered` must be false.
    my_session(const std::string& uri, std::string name, std::chrono::milliseconds deadline, std::string application,
               bool ordered = false)
        : name_(std::move(name)), application_(std::move(application)), ep_(my::parse_uri(uri)), deadline_(deadline) {
        if (ordered)
            throw error(errc::invalid_argument, "global guard " + name_ + ": ordered versions need a PostgreSQL arbiter");
    }

    void drop() override { need_reconnect_ = true; }
    /// The server's id of the session (0 when disconnected): for tests (KILL CONNECTION).
    [[nodiscard]] unsigned long session_id() const noexcept { return sess_.id(); }

    result claim(std::int64_t batch_id, std::span<const claim_item> items, std::int64_t lease_ms, const std::string& node,
                 bool ordered, won_map& won) override {
        IDEM_ASSERT(!ordered, "ordered versions are refused on a MySQL arbiter (coordinator.hpp)");
        for (const claim_item& c : items)
            if (c.k.size() > key::max_size) {  // INSERT IGNORE would truncate (biz_type_of: at most 32)
                last_error_ = "mysql " + name_ + ": claim batch: key '" + key::printable(c.k) +
                              "' is longer than its column";
                return result::fatal;
            }
        return call("claim batch", [&] {
            won.clear();
            step_ = "claim, audit, commit";
            const std::string q = my_sql::claim(batch_id, items, lease_ms, node_of(node));
            if (q.size() > budget_)
                throw error(errc::store_error,
                            "a claim batch of " + std::to_string(items.size()) + " keys needs " + std::to_string(q.size()) +
                                " bytes, over the server's max_allowed_packet (" + std::to_string(budget_ + 1024) +
                                "); lower global_options::max_batch or raise it");
            in_txn_ = true;
            committing_ = true;
            commit_statement_ = my_sql::claim_commit_statement;
            sess_.run(q, [&](int st, my::row_view r) {
                if (st != my_sql::claim_winners_statement) return;
                won[std::string(r[0])] = {decoder().fence(r[0], r[1]),
                                          r[2] == "RELEASED" ? record_state::released : record_state::absent};
            });
            committing_ = false;
            in_txn_ = false;
        });
    }

    result claimed_by_us(std::span<const std::string_view> keys, const std::string& detail, const std::string& node,
                         won_map& won) override {
        return call("read own claims", [&] {
            won.clear();
            step_ = "select the claim audit rows";
            sess_.run(my_sql::claimed_by_us(keys, detail, node_of(node)), [&](int, my::row_view r) {
                won[std::string(r[0])] = {decoder().fence(r[0], r[1]), record_state::absent};
            });
        });
    }

    result read_rows(std::span<const std::string_view> keys, std::span<const std::string_view>, row_map& rows,
                     std::unordered_map<std::string, std::uint64_t>* newest) override {
        IDEM_ASSERT(newest == nullptr, "ordered versions are refused on a MySQL arbiter (coordinator.hpp)");
        return call("read claimed rows", [&] {
            rows.clear();
            step_ = "read claimed rows";
            const auto dec = decoder();
            sess_.run(my_sql::read_rows(keys), [&](int, my::row_view r) {
                const std::string_view k = r[0];
                row_read rr{dec.state(k, r[1], /*of_record=*/true),     dec.fence(k, r[2]), dec.uint64(k, r[3], "outcome"),
                            dec.uint64(k, r[4], "request_fingerprint"), r[5] == "1",        {}};
                dec.payload(k, r[6], rr.payload);
                rows[std::string(k)] = std::move(rr);
            });
        });
    }

    result complete(std::int64_t batch_id, std::span<const write_item> items, const std::string& node, bool compensation,
                    key_set& won) override {
        std::vector<std::string_view> keys;
        keys.reserve(items.size());
        for (const write_item& it : items) keys.push_back(it.k);
        return call(compensation ? "compensation batch" : "completion batch", [&] {
            won.clear();
            std::vector<std::string> stage;
            for (const write_item& it : items)
                stage.push_back(my_sql::stage_row(it.k, it.fence, it.status, it.outcome, it.detail, it.payload, 0));
            const std::string tail = my_sql::complete_tail(keys, node_of(node), compensation);
            run_staged(my_sql::batch_head(batch_id), stage, tail, my_sql::complete_winners_in_tail,
                       my_sql::complete_commit_in_tail, [&](my::row_view r) { won.insert(std::string(r[0])); });
        });
    }

    result completed_before(std::span<const write_item> items, const std::string& node, key_set& before) override {
        std::vector<std::string_view> keys;
        for (const write_item& it : items) keys.push_back(it.k);
        return call("completion check", [&] {
            before.clear();
            step_ = "select this node's audit rows";
            sess_.run(my_sql::audit_of_node(keys, node_of(node)), [&](int, my::row_view r) {
                for (const write_item& it : items)
                    if (it.k == r[0] && std::to_string(it.fence) == r[1] && it.status == r[2] && it.detail == r[3])
                        before.insert(std::string(it.k));
            });
        });
    }

    result extend(std::span<const extend_item> items, key_set& renewed) override {
        std::vector<std::string_view> keys;
        for (const extend_item& it : items) keys.push_back(it.k);
        return call("lease renewal", [&] {
            renewed.clear();
            std::vector<std::string> stage;
            for (const extend_item& it : items)
                stage.push_back(my_sql::stage_row(it.k, it.fence, "PROCESSING", 0, {}, {}, it.ms));
            // A renewal is not a batch: never probed, so a lost answer is transient (retried).
            run_staged(
                "START TRANSACTION;SET @idem_now = " IDEM_MY_NOW_MS ";", stage, my_sql::extend_tail(keys),
                my_sql::complete_winners_in_tail, my_sql::extend_commit_in_tail,
                [&](my::row_view r) { renewed.insert(std::string(r[0])); }, /*probed=*/false);
        });
    }

    result expired(std::size_t limit, std::vector<expired_row>& rows) override {
        return call("compensation scan", [&] {
            rows.clear();
            step_ = "select expired claims";
            const auto dec = decoder();
            sess_.run(my_sql::expired(limit), [&](int, my::row_view r) {
                rows.push_back({std::string(r[0]), dec.fence(r[0], r[1]), dec.uint64(r[0], r[2], "request_fingerprint")});
            });
        });
    }

    result batch_committed(std::int64_t batch_id, bool& committed) override {
        return call("resolve unknown commit", [&] {
            if (!doubt_lock_.empty()) {
                step_ = "end the session that lost its answer (user lock " + doubt_lock_ + ")";
                std::string holder;
                if (!my::end_lost_session(sess_, doubt_lock_, deadline_, &holder)) {
                    my::failure f;  // transient: asked again
                    f.code = ER_LOCK_WAIT_TIMEOUT;
                    f.text = "the session " + holder + " that lost its answer is still running";
                    throw f;
                }
                doubt_lock_.clear();
            }
            step_ = "locking read of idempotent_batch";
            in_txn_ = true;
            sess_.run("START TRANSACTION;SELECT COUNT(*) FROM idempotent_batch WHERE batch_id = " +
                          std::to_string(batch_id) + " LOCK IN SHARE MODE;ROLLBACK",
                      [&](int, my::row_view r) { committed = r[0] != "0"; });
            in_txn_ = false;
        });
    }

    result prepare(bool ordered) override {
        IDEM_ASSERT(!ordered, "ordered versions are refused on a MySQL arbiter (coordinator.hpp)");
        return call("create index", [&] {
            step_ = "create the index of expired claims";
            sess_.run(my_sql::processing_index);
        });
    }

private:
    [[nodiscard]] rows::text_decoder decoder() const noexcept { return rows::text_decoder("global guard", name_, step_); }

    /// node is VARBINARY(64): at most 64 bytes (batch_context keeps it at 64 characters).
    static std::string_view node_of(const std::string& node) noexcept { return std::string_view(node).substr(0, 64); }

    /// One batch whose stage rows may not fit one packet: `head` and as many stage rows as fit, then
    /// the rest of the rows in further round trips, then `tail` (ending in COMMIT). The rows of
    /// `tail`'s statement `rows_statement` go to `each`; its statement `commit_statement` is COMMIT.
    template <class Each>
    void run_staged(const std::string& head, const std::vector<std::string>& stage, const std::string& tail,
                    int rows_statement, int commit_statement, Each&& each, bool probed = true) {
        std::vector<std::string> queries;
        std::string q = head + "DELETE FROM idem_gstage";
        bool open_insert = false;
        for (const std::string& row : stage) {
            if (my_sql::stage_insert.size() + row.size() + 1 > budget_)
                throw error(errc::store_error, "a row of " + std::to_string(row.size()) +
                                                   " bytes does not fit the server's max_allowed_packet (" +
                                                   std::to_string(budget_ + 1024) +
                                                   "); raise it above twice options.max_payload");
            if (q.size() + row.size() + 2 > budget_ && open_insert) {
                queries.push_back(std::move(q));
                q.clear();
                open_insert = false;
            }
            if (!open_insert) {
                if (!q.empty()) q += ';';
                q += my_sql::stage_insert;
                open_insert = true;
            } else {
                q += ',';
            }
            q += row;
        }
        const int tail_first = q.empty() ? 0 : static_cast<int>(std::count(q.begin(), q.end(), ';')) + 1;
        // Statement counting by ';' is exact here: hex literals and integers hold none.
        if (!q.empty() && q.size() + tail.size() + 1 > budget_) {
            queries.push_back(std::move(q));
            q.clear();
        }
        const int offset = q.empty() ? 0 : tail_first;
        q += q.empty() ? tail : ";" + tail;
        queries.push_back(std::move(q));
        in_txn_ = true;
        for (std::size_t i = 0; i < queries.size(); ++i) {
            const bool last = i + 1 == queries.size();
            step_ = last ? "write and commit" : "write the stage rows";
            if (last) {
                committing_ = probed;
                commit_statement_ = offset + commit_statement;
            }
            sess_.run(queries[i], [&](int st, my::row_view r) {
                if (last && st == offset + rows_statement) each(r);
            });
        }
        committing_ = false;
        in_txn_ = false;
    }

    /// Runs one call: connects when needed; classifies a failure (the header's table).
    template <class F>
    result call(const char* op, F&& body) {
        committing_ = false;
        in_txn_ = false;
        try {
            if (need_reconnect_ || !sess_.is_open()) connect();
            body();
            return result::ok;
        } catch (...) {
            return classify(op);
        }
    }

    result classify(const char* op) {
        const bool in_commit = committing_;
        const bool in_txn = in_txn_;
        committing_ = false;
        in_txn_ = false;
        const std::string where = "mysql " + name_ + " (" + application_ + "): " + op + ": " + step_ + ": ";
        try {
            throw;
        } catch (const my::failure& f) {
            using my::failure_kind;
            const failure_kind kind = my::classify(f);
            last_error_ = where + f.text;
            if (kind == failure_kind::lost) {
                if (in_commit) doubt_lock_ = lock_name_;  // batch_committed ends that session before it reads
                sess_.close();
                need_reconnect_ = true;
                return in_commit ? result::in_doubt : result::transient;
            }
            roll_back(in_txn);
            // The server answered with an error: it stopped there. Only an error of COMMIT itself
            // leaves the outcome open (the statements before it all ran).
            if (in_commit && f.statement == commit_statement_) return result::in_doubt;
            switch (kind) {
                case failure_kind::contention:
                case failure_kind::read_only:
                case failure_kind::durability: return result::transient;
                case failure_kind::data:
                case failure_kind::other:
                case failure_kind::lost: break;
            }
            return result::fatal;
        } catch (const error& e) {  // ours: corrupt_record, or connect() refusing the durability settings
            roll_back(in_txn);
            last_error_ = where + e.what();
            return e.kind() == errc::store_unavailable ? result::transient : result::fatal;
        } catch (const std::exception& e) {
            roll_back(in_txn);
            last_error_ = where + e.what();
            return result::fatal;
        }
    }

    /// Ends a transaction a failed call left open; a session that cannot is dropped.
    void roll_back(bool in_txn) noexcept {
        if (!in_txn || !sess_.is_open()) return;
        try {
            sess_.run("ROLLBACK");
        } catch (...) {
            sess_.close();
            need_reconnect_ = true;
        }
    }

    void connect() {
        step_ = "connect";
        need_reconnect_ = true;  // until every step below passed
        sess_.open(ep_, deadline_);
        step_ = "set session";
        const my::session_settings set = my::set_up(sess_, deadline_);
        budget_ = set.budget;
        std::string binlog_format;
        bool log_bin = false;
        sess_.run(my_sql::session_extra(my::whole_seconds(deadline_) + 1), [&](int statement, my::row_view r) {
            if (statement != my_sql::session_extra_binlog_statement) return;
            log_bin = r[0] == "1" || r[0] == "ON";
            binlog_format.assign(r[1]);
        });
        if (log_bin && binlog_format == "STATEMENT")
            throw error(errc::store_error,
                        "binlog_format is STATEMENT, which cannot log the READ COMMITTED writes of a global guard "
                        "(every batch would fail); set binlog_format to ROW or MIXED");
        step_ = "take the session's user lock";
        lock_name_ = my::take_life_lock(sess_);
        if (lock_name_.empty())  // without it, an unanswered commit of this session could not be resolved exactly
            throw error(errc::store_unavailable, "the server did not grant the session's user lock");
        if (const std::string fault = my::durability_fault(set.d); !fault.empty())
            throw error(errc::store_unavailable, "the server may lose a commit: " + fault +
                                                     "; nothing is acknowledged on it (calls wait until it is set)");
        need_reconnect_ = false;
    }

    std::string name_, application_;
    my::endpoint ep_;
    std::chrono::milliseconds deadline_;
    my::session sess_;
    std::string step_ = "connect";
    std::size_t budget_ = 1 << 20;
    bool need_reconnect_ = true;
    bool committing_ = false;  // the round trip holding COMMIT is in flight
    bool in_txn_ = false;      // a transaction is open on the session
    int commit_statement_ = -1;
    std::string lock_name_;   // the user lock the current session holds for its life (connect())
    std::string doubt_lock_;  // the lock of a session lost with COMMIT in flight ("" when none)
};

}  // namespace idem::detail::global
