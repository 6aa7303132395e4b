// idem/detail/pg/batch_params.hpp: the bound parameters of one postgres_store::apply(): a batch's rows
// as array literals, one per column, that sql.hpp's apply_main and apply_keep_lease take apart with
// unnest() on the server, and the statements' execution in the order of their $n. Keys and details
// travel as parameters only, never as SQL text.
//
// How a key's rows fold into one record write: rows/batch_fold.hpp (the fold every store writes).
// The upsert holds its guard against the stored fence S; lease_until and request_fingerprint come
// from P, the chain's last PROCESSING row, written iff P's fence >= S or on insert. sql.hpp's classes
// X (P's fence == F, the chain's last fence) and Y (the rest) put that into SQL.
//
// Invariants
//   * Every key of the batch is valid UTF-8 before anything is sent (PostgreSQL text cannot hold
//     other bytes), and no key's chain ends ABSENT: build() rejects the batch naming the key.
//   * X and Y keys are disjoint (each key is one or the other), so apply_main's data-modifying CTEs
//     never modify one row twice.
//   * biz_type is biz_type_of(key), cut back to a UTF-8 boundary.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <pqxx/pqxx>

#include "idem/detail/assert.hpp"
#include "idem/detail/pg/schema.hpp"
#include "idem/detail/pg/sql.hpp"
#include "idem/detail/rows/batch_fold.hpp"
#include "idem/store_rows.hpp"

namespace idem::detail::pg {

struct batch_params {
    struct records {
        array_literal key, biz, status, fence, lease, outcome, fp, created, updated, payload;
    };
    array_literal a_key, a_from, a_to, a_fence, a_at, a_detail;  // audit rows
    array_literal l_key, l_fence, l_lease, l_fp;                 // Y keys with P below F
    records x, y;

    /// Fills the literals from `rows`. reject(key, rule) is called for a key the store cannot
    /// write, and must throw.
    template <class Reject>
    void build(std::span<const store_row> rows, Reject&& reject) {
        // A batch holding a key the store cannot write is not sent at all: reject() does not return.
        const auto refuse = [&](std::string_view k, const char* rule) {
            reject(k, rule);
            IDEM_ASSERT(false, "batch_params::build's reject() throws");
        };
        const detail::rows::batch_fold fold = detail::rows::fold_batch(rows);
        for (const detail::rows::key_fold& f : fold.keys)
            if (!valid_utf8(f.key()))
                refuse(f.key(), "is not valid UTF-8; PostgreSQL text cannot hold it (postgres_store::accepts_key)");
        a_key.reserve(rows.size() * 40);
        a_detail.reserve(rows.size() * 28);
        for (const store_row& r : rows) {
            a_key.add_text(r.t.k.view());
            a_from.add_text(status_text(r.t.from));
            a_to.add_text(status_text(r.t.to));
            a_fence.add_uint(r.t.fence);
            a_at.add_int(r.at_ms);
            a_detail.add_text(audit_detail(r.t));
        }
        for (const detail::rows::key_fold& f : fold.keys) {
            const std::string_view k = f.key();
            if (f.last->t.to == record_state::absent)
                refuse(k, "would leave its record ABSENT; a record is PROCESSING, SUCCESS, FAILED or RELEASED");
            // Class Y's lease UPDATE is for a P below F only: fences along a chain never decrease.
            IDEM_ASSERT(f.proc == nullptr || f.proc->t.fence <= f.last->t.fence,
                        "fences along a key's chain never decrease (rows/batch_fold.hpp)");
            const bool class_x = f.proc && f.proc->t.fence == f.last->t.fence;
            records& r = class_x ? x : y;
            r.key.add_text(k);
            r.biz.add_text(utf8_prefix(biz_type_of(k)));
            r.status.add_text(status_text(f.last->t.to));
            r.fence.add_uint(f.last->t.fence);
            r.lease.add_int(f.proc ? f.proc->lease_until_ms : 0);
            r.outcome.add_uint(f.last->t.outcome);
            r.fp.add_uint(f.proc ? f.proc->t.fingerprint : 0);
            r.created.add_int(f.first->at_ms);
            r.updated.add_int(f.last->at_ms);
            r.payload.add_hex(f.last->t.payload);  // the chain's last row: as outcome (batch_fold.hpp)
            if (f.proc && !class_x) {
                l_key.add_text(k);
                l_fence.add_uint(f.proc->t.fence);
                l_lease.add_int(f.proc->lease_until_ms);
                l_fp.add_uint(f.proc->t.fingerprint);
            }
        }
    }

    /// The server's settings a batch reads right before COMMIT (sync mode checks them).
    struct settings {
        std::string fsync;          ///< current_setting('fsync')
        std::string standby_names;  ///< synchronous_standby_names
    };

    /// Writes the batch inside `w` (the caller commits): apply_main, then apply_keep_lease when
    /// some key is of class Y. `step` names the statement under way, for the caller's messages.
    /// Returns the server's fsync and synchronous_standby_names as the last statement read them
    /// (sql.hpp says why that is the value its COMMIT runs under), which sync mode checks right
    /// before COMMIT.
    settings write(pqxx::work& w, std::int64_t batch_id, std::int64_t now_ms, const std::string& node, std::string& step) {
        step = "write batch id, audit rows and records";
        const auto main = w.exec_prepared(std::string(apply_main_name), batch_id, now_ms, a_key.str(), a_from.str(),
                                          a_to.str(), a_fence.str(), a_at.str(), a_detail.str(), node, l_key.str(),
                                          l_fence.str(), l_lease.str(), l_fp.str(), x.key.str(), x.biz.str(), x.status.str(),
                                          x.fence.str(), x.lease.str(), x.outcome.str(), x.fp.str(), x.created.str(),
                                          x.updated.str(), x.payload.str());
        settings now{main[0][0].c_str(), main[0][1].c_str()};
        if (!y.key.empty()) {
            step = "write records that keep their lease";
            const auto keep = w.exec_prepared(std::string(apply_keep_lease_name), y.key.str(), y.biz.str(), y.status.str(),
                                              y.fence.str(), y.lease.str(), y.outcome.str(), y.fp.str(), y.created.str(),
                                              y.updated.str(), y.payload.str());
            now = {keep[0][0].c_str(), keep[0][1].c_str()};
        }
        return now;
    }
};

}  // namespace idem::detail::pg
