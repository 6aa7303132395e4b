// tools/import.hpp: `idem import`'s logic, with no server in it: the rows of the old design's table
// (idempotent_record behind a Redis lock: key, biz_type, status, created_time, updated_time) read
// through an old_table_source, checked, compared with what the idem store holds, and written as
// idem records with their audit trails through the generic idem::store interface (store::apply), so
// it works for every store the tool opens. tools/import.cpp is the subcommand; tools/
// import_sources.hpp holds the sources that talk to a server (PostgreSQL, MySQL/MariaDB).
//
// The mapping (docs/operations.md, "Migrating from a Redis lock + MySQL table"), each key one fresh
// fence above store::max_fence() and one batch (its rows commit together or not at all):
//   SUCCESS     ABSENT -> PROCESSING -> SUCCESS, outcome 0, no payload: a duplicate is answered
//               begin_status::succeeded with outcome 0 (the old table never recorded an outcome)
//   FAILED      ABSENT -> PROCESSING -> FAILED, outcome 0: a duplicate is answered begin_status::failed
//               (run(): errc::already_failed); never run again
//   PROCESSING  ABSENT -> PROCESSING with a lease that ended when the old row was last written (at
//               the latest one ms before the import): a claim in doubt. A durable guard's recovery
//               sends it to the resolver at its next start, once; until decided it is never granted
// Every audit row has the cause `imported` (transition_cause::imported); the claim row carries
// created_time, the completion updated_time, so the record's created and updated times are the old
// row's and the idempotency window counts from the old decision. biz_type is not copied: idem
// derives it from the key (biz_type_of), as for every record.
//
// The idempotency rules, per key (judge()):
//   not in idem                          imported
//   in idem in the old row's state       skipped (already present: a second run changes nothing)
//   in idem in another state             a conflict: counted, listed, idem's record kept as it is.
//                                        Also when idem holds a claim (PROCESSING) and the old table
//                                        now says SUCCESS or FAILED ("in doubt" conflicts): the
//                                        claim stays, and the resolver decides it at the next start
//   named twice in one pass              the first row wins; a second with another state is a conflict
// Refused rows (counted by rule, listed, the rest imported; exit code 1): a NULL key, status,
// created_time or updated_time; a key idem::key refuses (longer than 128 bytes, a control byte) or
// the store cannot hold; a status other than PROCESSING, SUCCESS or FAILED; a time more than 100
// years from now. A NULL biz_type is fine (it is not copied).
//
// Invariants: the importer never overwrites a record the store holds (it writes only keys get()
// found absent, and store::apply's fence guard would keep a higher stored fence anyway); every
// fence it writes is above store::max_fence() as read at the start of the run and below 2^52; each
// key's trail is a legal path (idem::verify accepts it).
// The store must not be written by a guard while the import runs (the SQLite and RocksDB stores
// are locked by the tool's writer; on PostgreSQL it is the operator's order of cut-over).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/detail/rows/batch_fold.hpp"
#include "idem/detail/rows/record_rules.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/store.hpp"
#include "idem/store_rows.hpp"
#include "idem/transition.hpp"

namespace idem::tool::imports {

/// One row of the old table as a source read it; nullopt: the column is NULL. Times are Unix ms.
struct old_row {
    std::optional<std::string> key;       ///< idempotent_key
    std::optional<std::string> biz_type;  ///< biz_type (not copied: idem derives it from the key)
    std::optional<std::string> status;    ///< status, as text: PROCESSING, SUCCESS or FAILED
    std::optional<std::int64_t> created_ms;
    std::optional<std::int64_t> updated_ms;
};

/// Where the old rows come from: a table on a server (import_sources.hpp) or, in tests, memory.
class old_table_source {
public:
    virtual ~old_table_source() = default;
    /// Calls fn for each row whose updated_time is >= since_ms (every row without since_ms), and
    /// for each row whose updated_time is NULL (so that it is refused by name, not missed). One
    /// consistent read where the server offers one. Throws idem::error naming the source.
    virtual void read(std::optional<std::int64_t> since_ms, const std::function<void(const old_row&)>& fn) = 0;
    /// The source for reports (a URI without its password, and the table).
    [[nodiscard]] virtual std::string name() const = 0;
};

/// Rows held in memory (tests; a source that filters like a server's WHERE clause).
class memory_source final : public old_table_source {
public:
    std::vector<old_row> rows;
    void read(std::optional<std::int64_t> since_ms, const std::function<void(const old_row&)>& fn) override {
        for (const old_row& r : rows)
            if (!since_ms || !r.updated_ms || *r.updated_ms >= *since_ms) fn(r);
    }
    [[nodiscard]] std::string name() const override { return "memory"; }
};

// ---- the table's name -----------------------------------------------------------------------

/// The parts of a table name, "table" or "schema.table". Each part is an identifier:
/// [A-Za-z_][A-Za-z0-9_]*, at most 64 bytes (MySQL's limit; PostgreSQL's is 63). Nothing else is
/// accepted, so the name can be spliced into SQL quoted, never read as SQL. On refusal nullopt and
/// *why names the input and the rule.
[[nodiscard]] inline std::optional<std::vector<std::string>> parse_table_name(std::string_view text, std::string* why) {
    const std::string rule =
        "; a table name is NAME or SCHEMA.NAME, each part a letter or '_' followed by letters, "
        "digits or '_', at most 64 bytes";
    std::vector<std::string> parts;
    std::size_t start = 0;
    while (true) {
        const std::size_t dot = text.find('.', start);
        const std::string_view part = text.substr(start, dot == std::string_view::npos ? text.npos : dot - start);
        bool ok = !part.empty() && part.size() <= 64 && !(part[0] >= '0' && part[0] <= '9');
        for (const char c : part)
            ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_');
        if (!ok) {
            if (why) *why = "table '" + key::printable(text) + "' is not a table name" + rule;
            return std::nullopt;
        }
        parts.emplace_back(part);
        if (dot == std::string_view::npos) break;
        start = dot + 1;
    }
    if (parts.size() > 2) {
        if (why) *why = "table '" + key::printable(text) + "' is not a table name (it has more than two parts)" + rule;
        return std::nullopt;
    }
    return parts;
}

/// The table name quoted for SQL: each part between `quote` characters ('"' PostgreSQL, '`' MySQL).
/// The parts passed parse_table_name, so they hold no quote.
[[nodiscard]] inline std::string quoted_table(const std::vector<std::string>& parts, char quote) {
    std::string out;
    for (const std::string& p : parts) {
        if (!out.empty()) out += '.';
        out.append(1, quote).append(p).append(1, quote);
    }
    return out;
}

// ---- one row's rules ---------------------------------------------------------------------------

/// The old table's states: its ENUM('PROCESSING','SUCCESS','FAILED'), exact.
[[nodiscard]] inline std::optional<record_state> parse_old_status(std::string_view s) noexcept {
    if (s == "PROCESSING") return record_state::processing;
    if (s == "SUCCESS") return record_state::succeeded;
    if (s == "FAILED") return record_state::failed;
    return std::nullopt;
}

/// Why a row is refused.
enum class refusal : std::uint8_t {
    invalid_key,     ///< NULL, or refused by idem::key or by the store (store::accepts)
    unknown_status,  ///< not PROCESSING, SUCCESS or FAILED
    null_column,     ///< status, created_time or updated_time is NULL
    bad_time,        ///< a time more than 100 years from now (record_rules.hpp: a damaged row)
};
inline constexpr std::size_t refusal_kinds = 4;
[[nodiscard]] constexpr const char* to_string(refusal r) noexcept {
    switch (r) {
        case refusal::invalid_key: return "invalid_key";
        case refusal::unknown_status: return "unknown_status";
        case refusal::null_column: return "null_column";
        case refusal::bad_time: return "bad_time";
    }
    return "?";
}

/// A row that passed the rules.
struct checked_row {
    key k;
    record_state state = record_state::absent;
    std::int64_t created_ms = 0;
    std::int64_t updated_ms = 0;
};

/// A row checked, or the rule it breaks with a sentence naming the row and the rule.
struct row_check {
    std::optional<checked_row> row;
    refusal why = refusal::invalid_key;
    std::string message;
};

/// A key for messages: printable, and cut at 160 bytes (a refused key can be long).
[[nodiscard]] inline std::string shown_key(std::string_view k) {
    if (k.size() <= 160) return "'" + key::printable(k) + "'";
    return "'" + key::printable(k.substr(0, 160)) + "...' (" + std::to_string(k.size()) + " bytes)";
}

/// Checks one old row against the rules (top of file). `ordinal`: its place in the read (1-based),
/// named when the key is NULL; `now_ms`: the import's wall clock.
[[nodiscard]] inline row_check check_row(const old_row& r, const store& st, std::uint64_t ordinal, std::int64_t now_ms) {
    row_check out;
    auto refuse = [&](refusal why, std::string message) {
        out.why = why;
        out.message = std::move(message);
        return out;
    };
    if (!r.key)
        return refuse(refusal::invalid_key,
                      "row " + std::to_string(ordinal) + " of the read: idempotent_key is NULL; every row needs a key");
    const std::string name = "key " + shown_key(*r.key);
    std::string why;
    const auto k = key::parse(*r.key, &why);
    if (!k) return refuse(refusal::invalid_key, why + " (idem refuses it: it can never run under idem either)");
    if (!st.accepts(*k, &why))
        return refuse(refusal::invalid_key, name + ": the store " + st.name() + " cannot hold it: " + why);
    if (!r.status) return refuse(refusal::null_column, name + ": status is NULL; it must be PROCESSING, SUCCESS or FAILED");
    const auto state = parse_old_status(*r.status);
    if (!state)
        return refuse(refusal::unknown_status, name + ": status " + shown_key(*r.status) +
                                                   " is not a state of the old table (PROCESSING, SUCCESS, FAILED)");
    if (!r.created_ms) return refuse(refusal::null_column, name + ": created_time is NULL; every row needs it");
    if (!r.updated_ms) return refuse(refusal::null_column, name + ": updated_time is NULL; every row needs it");
    for (const auto& [ms, column] : {std::pair{*r.created_ms, "created_time"}, std::pair{*r.updated_ms, "updated_time"}})
        if (std::string fault = detail::rows::wall_time_fault(ms, now_ms, column); !fault.empty())
            return refuse(refusal::bad_time, name + ": " + fault);
    out.row = checked_row{*k, *state, *r.created_ms, *r.updated_ms};
    return out;
}

// ---- the idempotency rules ---------------------------------------------------------------------

/// What the importer does with a row idem may already hold.
enum class verdict : std::uint8_t {
    new_key,         ///< idem has no record of the key: imported
    present,         ///< idem holds it in the same state: skipped
    conflict,        ///< idem holds it in another state: kept, counted
    conflict_claim,  ///< idem holds a claim (PROCESSING), the old table a decision: kept, counted
};

/// The rules of the top of the file. `held`: idem's state of the key (absent: no record).
[[nodiscard]] constexpr verdict judge(record_state old_state, record_state held) noexcept {
    if (held == record_state::absent) return verdict::new_key;
    if (held == old_state) return verdict::present;
    if (held == record_state::processing) return verdict::conflict_claim;
    return verdict::conflict;
}

/// The rows that bring one checked row into idem at `fence` (seq first_seq, first_seq + 1): a claim,
/// and for SUCCESS and FAILED its completion. The claim's lease ended at the old row's last write,
/// and at the latest one ms before the import's now (so it has expired when any guard starts).
[[nodiscard]] inline std::vector<store_row> rows_for(const checked_row& r, std::uint64_t fence, std::uint64_t first_seq,
                                                     std::int64_t now_ms) {
    std::vector<store_row> out;
    store_row claim;
    claim.t.k = r.k;
    claim.t.from = record_state::absent;
    claim.t.to = record_state::processing;
    claim.t.cause = transition_cause::imported;
    claim.t.fence = fence;
    claim.seq = first_seq;
    claim.at_ms = std::min(r.created_ms, r.updated_ms);  // a completion is never before its claim
    claim.lease_until_ms = std::min(r.updated_ms, now_ms - 1);
    out.push_back(claim);
    if (r.state == record_state::processing) return out;
    store_row done = claim;
    done.t.from = record_state::processing;
    done.t.to = r.state;
    done.t.outcome = 0;  // the old table recorded none (docs/operations.md: a duplicate gets 0)
    done.seq = first_seq + 1;
    done.at_ms = r.updated_ms;
    out.push_back(done);
    return out;
}

// ---- the run -----------------------------------------------------------------------------------

struct options {
    std::optional<std::int64_t> since_ms;             ///< read rows with updated_time >= this (none: all)
    std::int64_t now_ms = 0;                          ///< the import's wall clock (Unix ms); 0: system_clock now
    std::int64_t margin_ms = 60'000;                  ///< next_since = high-water mark - margin (late commits)
    std::int64_t window_ms = 7LL * 24 * 3600 * 1000;  ///< for past_window (the guard's default window)
    std::size_t batch_keys = 500;                     ///< keys per store transaction
    std::size_t max_list = 100;                       ///< conflicts and refusals listed at most (all are counted)
};

struct report {
    std::uint64_t read = 0;                 ///< rows the source returned
    std::uint64_t imported_succeeded = 0;   ///< SUCCESS rows written as succeeded records
    std::uint64_t imported_failed = 0;      ///< FAILED rows written as failed records
    std::uint64_t imported_processing = 0;  ///< PROCESSING rows written as claims in doubt
    std::uint64_t present = 0;              ///< already in idem in the same state: skipped
    std::uint64_t conflicts = 0;            ///< in idem in another state: idem's record kept
    std::uint64_t conflicts_claim = 0;      ///< of those, idem holds a claim the old table decided
    std::uint64_t refused[refusal_kinds] = {};
    std::vector<std::string> conflict_list;
    std::vector<std::string> refused_list;
    std::uint64_t past_window = 0;                  ///< decided rows imported already older than options.window_ms
    std::optional<std::int64_t> high_water_ms;      ///< the largest updated_time read
    std::optional<std::int64_t> next_since_ms;      ///< what to pass as --since next time
    std::uint64_t first_fence = 0, last_fence = 0;  ///< the fences written (0: none)
    std::uint64_t batches = 0;                      ///< store transactions committed

    [[nodiscard]] std::uint64_t imported() const noexcept {
        return imported_succeeded + imported_failed + imported_processing;
    }
    [[nodiscard]] std::uint64_t refused_total() const noexcept {
        std::uint64_t n = 0;
        for (const std::uint64_t r : refused) n += r;
        return n;
    }
};

/// An idem::error's message without the category's text that std::system_error appends.
[[nodiscard]] inline std::string plain_what(const error& e) {
    std::string w = e.what();
    const std::string tail = ": " + e.code().message();
    if (w.size() > tail.size() && w.ends_with(tail)) w.resize(w.size() - tail.size());
    return w;
}

/// Reads `src` and writes what it finds into `st` by the rules above; returns the counts. Throws
/// idem::error when the source or the store fails: batches committed before stay (each key is whole),
/// and running the import again skips them.
class importer {
public:
    importer(store& st, options o) : st_(st), o_(std::move(o)) {
        if (o_.now_ms == 0)
            o_.now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
        if (o_.batch_keys == 0) throw error(errc::invalid_argument, "import batch size is 0; it must be at least 1");
        std::random_device rd;  // batch ids as the flusher makes them: a random prefix and a counter
        batch_prefix_ = (static_cast<std::uint64_t>(rd()) << 32) & 0x7fffffff00000000ull;
    }

    report run(old_table_source& src) {
        next_fence_ = st_.max_fence() + 1;
        src.read(o_.since_ms, [&](const old_row& r) { take(r); });
        flush();
        if (r_.high_water_ms) r_.next_since_ms = *r_.high_water_ms - o_.margin_ms;
        else r_.next_since_ms = o_.since_ms;
        return std::move(r_);
    }

private:
    void take(const old_row& row) {
        ++r_.read;
        if (row.updated_ms) r_.high_water_ms = std::max(r_.high_water_ms.value_or(*row.updated_ms), *row.updated_ms);
        row_check c = check_row(row, st_, r_.read, o_.now_ms);
        if (!c.row) {
            ++r_.refused[static_cast<std::size_t>(c.why)];
            list(r_.refused_list, std::move(c.message));
            return;
        }
        const checked_row& cr = *c.row;
        const std::string k(cr.k.view());
        record_state held = record_state::absent;
        if (const auto it = pending_.find(k); it != pending_.end()) {
            held = it->second;  // named earlier in this pass, not yet committed
        } else if (const auto rec = st_.get(k)) {
            held = rec->state;
        }
        switch (judge(cr.state, held)) {
            case verdict::new_key: add(cr); return;
            case verdict::present: ++r_.present; return;
            case verdict::conflict_claim:
                ++r_.conflicts;
                ++r_.conflicts_claim;
                list(r_.conflict_list, "key " + shown_key(k) + ": idem holds a claim (PROCESSING), the old table says " +
                                           to_string(cr.state) +
                                           ": idem's claim kept; a durable guard's resolver decides it at its next start");
                return;
            case verdict::conflict:
                ++r_.conflicts;
                list(r_.conflict_list, "key " + shown_key(k) + ": idem holds " + to_string(held) + ", the old table says " +
                                           to_string(cr.state) + ": idem's record kept");
                return;
        }
    }

    void add(const checked_row& cr) {
        if (next_fence_ >= detail::rows::fence_limit)
            throw error(errc::invalid_argument, st_.name() + ": the next fence, " + std::to_string(next_fence_) +
                                                    ", is not below 2^52 (the guard's fence bits): no room to import");
        const std::uint64_t fence = next_fence_++;
        for (const store_row& row : rows_for(cr, fence, seq_, o_.now_ms)) rows_.push_back(row);
        seq_ += 2;
        pending_.emplace(std::string(cr.k.view()), cr.state);
        if (r_.first_fence == 0) r_.first_fence = fence;
        r_.last_fence = fence;
        switch (cr.state) {
            case record_state::succeeded: ++r_.imported_succeeded; break;
            case record_state::failed: ++r_.imported_failed; break;
            default: ++r_.imported_processing; break;
        }
        if (cr.state != record_state::processing && cr.updated_ms < o_.now_ms - o_.window_ms) ++r_.past_window;
        if (pending_.size() >= o_.batch_keys) flush();
    }

    /// Commits the pending keys in one transaction (store::apply: rows sorted by key, then seq).
    void flush() {
        if (rows_.empty()) return;
        std::stable_sort(rows_.begin(), rows_.end(),
                         [](const store_row& a, const store_row& b) { return a.t.k.view() < b.t.k.view(); });
        const std::uint64_t id = batch_prefix_ | ++batches_started_;
        const auto again = "; keys committed before are in the store: run the import again (it skips them)";
        try {
            st_.apply(rows_, id);
        } catch (const commit_unknown& e) {
            bool committed = false;
            try {
                st_.reconnect();
                committed = st_.committed(id);
            } catch (const std::exception& asked) {
                throw error(errc::store_unavailable, plain_what(e) + "; asking whether batch " + std::to_string(id) +
                                                         " committed failed too: " + asked.what() + again);
            }
            if (!committed) throw error(errc::store_unavailable, plain_what(e) + " (it did not commit)" + again);
        } catch (const error& e) {
            throw error(e.kind(), plain_what(e) + again);
        }
        ++r_.batches;
        rows_.clear();
        pending_.clear();
    }

    void list(std::vector<std::string>& l, std::string line) const {
        if (l.size() < o_.max_list) l.push_back(std::move(line));
    }

    store& st_;
    options o_;
    report r_;
    std::uint64_t next_fence_ = 1;
    std::uint64_t seq_ = 1;
    std::uint64_t batch_prefix_ = 0;
    std::uint64_t batches_started_ = 0;
    std::vector<store_row> rows_;
    std::map<std::string, record_state> pending_;  // keys in rows_, with the state written
};

/// One call: importer(st, o).run(src).
inline report run(store& st, old_table_source& src, options o = {}) { return importer(st, std::move(o)).run(src); }

}  // namespace idem::tool::imports
