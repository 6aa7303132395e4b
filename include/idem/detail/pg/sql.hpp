// idem/detail/pg/sql.hpp: the SQL text of the PostgreSQL store's writes (apply, committed), its
// maintenance (max_fence, prune, horizon) and the pure helpers around it (UTF-8 check, hex, array
// literals, connection-string options, password redaction). No libpqxx here, so the helpers can be
// tested without a server. The schema and the durability settings are schema.hpp's; the reads and
// the decoding of their rows row_decoder.hpp's.
//
// Parameters only. Keys, nodes and details never enter SQL text: a batch travels as a handful of
// bound parameters, each a PostgreSQL array literal ('{"k1","k2"}') that the server parses with
// array_in and unnest() turns back into rows. Every element is double-quoted and '"' and '\' are
// backslash-escaped, which is the whole of array_in's quoting rule, so a key holding quotes, ';',
// '--', braces, commas, blanks or the word NULL round-trips byte for byte.
//
// Unsigned fences. Fences, outcomes and fingerprints are uint64 stored as the int64 with the same
// bits. memory_store compares fences unsigned, so SQL compares (fence # sign_bit): flipping the sign
// bit maps unsigned order onto signed order. Fences never reach 2^63 in practice; the flip makes the
// store exact anyway, at no measurable cost.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include "idem/detail/assert.hpp"
#include "idem/detail/rows/hex.hpp"

namespace idem::detail::pg {

// apply(). Each key's rows fold into one record write (batch_params.hpp explains the fold).
// Keys fall into two classes by where lease_until / request_fingerprint come from:
//   X: the key has a PROCESSING row P in its applied chain with P's fence == the final fence F. P's
//      lease and fingerprint apply exactly when the final row does (stored fence <= F), so the
//      fence-guarded upsert writes them too. Fresh claims, and claim + succeed in one batch, are X.
//   Y: no such P. The upsert keeps the stored lease and fingerprint. In the rare case of a P with
//      fence < F (a claim, then a higher-fenced non-claim row), P's lease applies only if the stored
//      fence <= P's fence, which ON CONFLICT cannot see (it sees the proposed row and the stored
//      one, nothing else), so a plain UPDATE sets it first, while the stored fence is still the old
//      one.
// Both record upserts have the same fence guard: a lower fence never overwrites a higher one, and at
// the same fence a terminal record (SUCCESS, FAILED) is never taken back to PROCESSING or RELEASED
// (a late doubt mark or release of the same claim is audited; the outcome stays).
// Statement 1 does everything of a typical batch in one round trip; statement 2 runs only when the
// batch has class-Y keys. Each answers with the server's fsync setting (and
// synchronous_standby_names), read in the same statement as its writes (a configuration reload
// reaches a session only between statements, so it is the value the batch's last statement, and
// so its COMMIT, runs under): the last statement's answer is the last read before COMMIT, so sync
// mode's fsync check costs no round trip of its own (it used to cost one
// after statement 2, a fifth round trip per batch in sync mode, where nearly every batch holds the
// completions of keys claimed in an earlier batch: class Y). Data-modifying CTEs run exactly once, to
// completion, whether or not the final SELECT reads them. The CTEs write different tables, or different rows (X and Y keys are
// disjoint), so no row is modified twice by one statement.
//   $1 batch id, $2 committed_time (its primary key makes a replayed batch fail, not write twice)
//   $3..$8 audit rows: key, from, to, fence, at, detail (in input order: WITH ORDINALITY ... ORDER BY
//          keeps the BIGSERIAL sequence in that order); $9 node
//   $10..$13 Y keys with P below F: key, P's fence, lease, fingerprint
//   $14..$22 X records: key, biz_type, status, fence, lease, outcome, fingerprint, created, updated
//   $23 X records' payloads, each hex-encoded (text[] elements; decode(.., 'hex') on the server):
//          an array literal of bytea would need bytea's own escapes inside array_in's, and text
//          cannot hold NUL; hex holds any bytes with no escaping at all, at twice the size
inline constexpr std::string_view apply_main_name = "idem_apply_main";
inline constexpr std::string_view apply_main = R"sql(
WITH batch AS (
  INSERT INTO idempotent_batch (batch_id, committed_time) VALUES ($1, $2)
), audit AS (
  INSERT INTO idempotent_audit (idempotent_key, from_status, to_status, fencing_token, node, at_time, detail)
  SELECT a.k, a.f, a.t, a.fe, $9, a.at, a.d
  FROM unnest($3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::text[])
       WITH ORDINALITY AS a(k, f, t, fe, at, d, n)
  ORDER BY a.n
), lease AS (
  UPDATE idempotent_record AS r SET lease_until = p.pl, request_fingerprint = p.pfp
  FROM unnest($10::text[], $11::bigint[], $12::bigint[], $13::bigint[]) AS p(k, pf, pl, pfp)
  WHERE r.idempotent_key = p.k
    AND (r.fencing_token # (-9223372036854775808)::bigint) <= (p.pf # (-9223372036854775808)::bigint)
), rec AS (
INSERT INTO idempotent_record AS r (idempotent_key, biz_type, status, fencing_token, lease_until, outcome,
                                    request_fingerprint, created_time, updated_time, payload)
SELECT x.k, x.b, x.s, x.fe, x.l, x.o, x.fp, x.c, x.u, decode(x.p, 'hex')
FROM unnest($14::text[], $15::text[], $16::text[], $17::bigint[], $18::bigint[], $19::bigint[],
            $20::bigint[], $21::bigint[], $22::bigint[], $23::text[]) AS x(k, b, s, fe, l, o, fp, c, u, p)
ON CONFLICT (idempotent_key) DO UPDATE
  SET status = EXCLUDED.status, fencing_token = EXCLUDED.fencing_token, lease_until = EXCLUDED.lease_until,
      outcome = EXCLUDED.outcome, request_fingerprint = EXCLUDED.request_fingerprint,
      updated_time = EXCLUDED.updated_time, payload = EXCLUDED.payload
  WHERE (r.fencing_token # (-9223372036854775808)::bigint) < (EXCLUDED.fencing_token # (-9223372036854775808)::bigint)
     OR (r.fencing_token = EXCLUDED.fencing_token
         AND (r.status NOT IN ('SUCCESS', 'FAILED') OR EXCLUDED.status IN ('SUCCESS', 'FAILED')))
)
SELECT current_setting('fsync'), current_setting('synchronous_standby_names')
)sql";

// Statement 2: the class-Y records ($1..$10 as $14..$23 above). lease_until and request_fingerprint
// are written on insert only; created_time and biz_type are kept on update in both statements. A
// statement of its own, after statement 1: it must see statement 1's `lease` UPDATE of the same row
// (within one statement, a second write of a row the first CTE wrote would be skipped). Answers as
// statement 1 does (fsync, synchronous_standby_names).
inline constexpr std::string_view apply_keep_lease_name = "idem_apply_keep_lease";
inline constexpr std::string_view apply_keep_lease = R"sql(
WITH rec AS (
INSERT INTO idempotent_record AS r (idempotent_key, biz_type, status, fencing_token, lease_until, outcome,
                                    request_fingerprint, created_time, updated_time, payload)
SELECT x.k, x.b, x.s, x.fe, x.l, x.o, x.fp, x.c, x.u, decode(x.p, 'hex')
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[],
            $7::bigint[], $8::bigint[], $9::bigint[], $10::text[]) AS x(k, b, s, fe, l, o, fp, c, u, p)
ON CONFLICT (idempotent_key) DO UPDATE
  SET status = EXCLUDED.status, fencing_token = EXCLUDED.fencing_token, outcome = EXCLUDED.outcome,
      updated_time = EXCLUDED.updated_time, payload = EXCLUDED.payload
  WHERE (r.fencing_token # (-9223372036854775808)::bigint) < (EXCLUDED.fencing_token # (-9223372036854775808)::bigint)
     OR (r.fencing_token = EXCLUDED.fencing_token
         AND (r.status NOT IN ('SUCCESS', 'FAILED') OR EXCLUDED.status IN ('SUCCESS', 'FAILED')))
)
SELECT current_setting('fsync'), current_setting('synchronous_standby_names')
)sql";

// committed(batch_id): a speculative insert, rolled back by the caller. It waits for a transaction
// that holds the same batch id uncommitted (the COMMIT in doubt may still be running in the old
// session), then returns no row when the batch committed and one row when it did not. A plain SELECT
// would answer "not committed" while that COMMIT is still on its way.
inline constexpr std::string_view committed_name = "idem_committed";
inline constexpr std::string_view committed =
    "INSERT INTO idempotent_batch (batch_id, committed_time) VALUES ($1, 0) ON CONFLICT (batch_id) DO NOTHING "
    "RETURNING 1";
// After committed() found the batch committed: a write of the caller's own, committed by it. Its
// commit record follows the batch's in the WAL, so when a synchronous standby is configured, its
// COMMIT returns only once the standby has the batch too (a batch whose wait for the standby was
// cancelled or terminated is visible on the primary before the standby has it: schema.hpp). The row
// is the batch's own, which nothing else writes; the value is unchanged.
inline constexpr std::string_view committed_barrier_name = "idem_committed_barrier";
inline constexpr std::string_view committed_barrier =
    "UPDATE idempotent_batch SET committed_time = committed_time WHERE batch_id = $1";

// The reads (get, audit, load, scan_audit) are row_decoder.hpp's, beside the code that decodes their rows.

/// The server's clock now (Unix ms, the statement's start), the clock global scope stamps rows with.
inline constexpr std::string_view server_now_ms = "SELECT (extract(epoch FROM statement_timestamp()) * 1000)::bigint";
// NULL on an empty table; the client flips the sign bit back. Pruned records count (pruned_fence).
inline constexpr std::string_view max_fence =
    "SELECT GREATEST((SELECT max(fencing_token # (-9223372036854775808)::bigint) FROM idempotent_record), "
    "(SELECT max(pruned_fence # (-9223372036854775808)::bigint) FROM idem_schema))";

// prune() and horizon() are retention.hpp's.

// ---------------------------------------------------------------------------------------------------
// Pure helpers.

/// True when text is well-formed UTF-8 as PostgreSQL's UTF8 encoding checks it: no overlong forms,
/// no surrogates (U+D800..U+DFFF), nothing above U+10FFFF. (NUL is excluded by idem::key already.)
[[nodiscard]] inline bool valid_utf8(std::string_view text) noexcept {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const auto* end = p + text.size();
    while (p < end) {
        const unsigned c = *p;
        if (c < 0x80) {
            ++p;
            continue;
        }
        std::size_t n;
        unsigned lo = 0x80, hi = 0xbf;  // allowed range of the second byte
        if (c >= 0xc2 && c <= 0xdf) {
            n = 2;
        } else if (c >= 0xe0 && c <= 0xef) {
            n = 3;
            if (c == 0xe0) lo = 0xa0;  // overlong
            if (c == 0xed) hi = 0x9f;  // surrogates
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 4;
            if (c == 0xf0) lo = 0x90;  // overlong
            if (c == 0xf4) hi = 0x8f;  // above U+10FFFF
        } else {
            return false;
        }
        if (static_cast<std::size_t>(end - p) < n) return false;
        if (p[1] < lo || p[1] > hi) return false;
        for (std::size_t i = 2; i < n; ++i)
            if (p[i] < 0x80 || p[i] > 0xbf) return false;
        p += n;
    }
    return true;
}

/// The longest prefix of text that does not end inside a UTF-8 sequence (biz_type_of cuts at 32
/// bytes, which can split a character; PostgreSQL would reject the half).
[[nodiscard]] inline std::string_view utf8_prefix(std::string_view text) noexcept {
    while (!text.empty() && !valid_utf8(text)) text.remove_suffix(1);
    return text;
}

/// The first max_chars characters of valid UTF-8 text (VARCHAR(n) counts characters, not bytes).
[[nodiscard]] inline std::string_view utf8_truncate(std::string_view text, std::size_t max_chars) noexcept {
    // Counting lead bytes counts characters only in valid UTF-8 (postgres_store checks the node first).
    IDEM_ASSERT(valid_utf8(text), "utf8_truncate takes valid UTF-8 only");
    std::size_t chars = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if ((static_cast<unsigned char>(text[i]) & 0xc0) == 0x80) continue;  // continuation byte
        if (chars++ == max_chars) return text.substr(0, i);
    }
    return text;
}

// Hex text of bytes, both ways: detail/rows/hex.hpp (shared with the MySQL store).
using rows::append_hex;
using rows::from_hex;

/// Builds one array-literal parameter: '{"a","b"}' for text, '{1,2}' for integers.
class array_literal {
public:
    void reserve(std::size_t bytes) { text_.reserve(bytes); }
    void add_text(std::string_view s) {
        open_element();
        text_ += '"';
        for (char c : s) {
            if (c == '"' || c == '\\') text_ += '\\';
            text_ += c;
        }
        text_ += '"';
    }
    void add_int(std::int64_t v) {
        open_element();
        char buf[24];
        const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
        IDEM_ASSERT(ec == std::errc(), "24 bytes hold any int64 in decimal (20 digits and a sign)");
        text_.append(buf, end);
    }
    void add_uint(std::uint64_t v) { add_int(static_cast<std::int64_t>(v)); }  // same bits
    /// Any bytes as a hex text element (decode(.., 'hex') in the statement): needs no quoting.
    void add_hex(std::string_view bytes) {
        open_element();
        text_ += '"';
        text_.reserve(text_.size() + 2 * bytes.size() + 2);
        append_hex(text_, bytes);
        text_ += '"';
    }
    [[nodiscard]] bool empty() const noexcept { return text_.empty(); }
    [[nodiscard]] const std::string& str() {
        if (!closed_) {
            if (text_.empty()) text_ += '{';
            text_ += '}';
            closed_ = true;
        }
        return text_;
    }

private:
    void open_element() {
        IDEM_ASSERT(!closed_, "no element is added after str() closed the literal");
        text_ += text_.empty() ? '{' : ',';
    }
    std::string text_;
    bool closed_ = false;
};

[[nodiscard]] inline bool is_uri(std::string_view conninfo) noexcept {
    return conninfo.starts_with("postgresql://") || conninfo.starts_with("postgres://");
}

/// True when the connection string already sets `name` (keyword=value or URI query parameter).
[[nodiscard]] inline bool has_option(std::string_view conninfo, std::string_view name) {
    for (std::size_t pos = conninfo.find(name); pos != std::string_view::npos; pos = conninfo.find(name, pos + 1)) {
        const bool starts = pos == 0 || conninfo[pos - 1] == ' ' || conninfo[pos - 1] == '?' || conninfo[pos - 1] == '&';
        std::size_t after = pos + name.size();
        while (after < conninfo.size() && conninfo[after] == ' ') ++after;
        if (starts && after < conninfo.size() && conninfo[after] == '=') return true;
    }
    return false;
}

/// Adds name=value unless the user set it (theirs wins). value must need no quoting or escaping.
inline void add_option(std::string& conninfo, std::string_view name, std::string_view value) {
    // Appended as is, in a keyword=value string or a URI's query: a blank, quote, backslash or URI
    // delimiter would change what the rest of the string means.
    IDEM_ASSERT(value.find_first_of(" '\\\"&?=#%/") == std::string_view::npos,
                "an option value added by idem needs no quoting or escaping");
    if (has_option(conninfo, name)) return;
    if (is_uri(conninfo)) {
        conninfo += conninfo.find('?') == std::string::npos ? '?' : '&';
    } else if (!conninfo.empty()) {
        conninfo += ' ';
    }
    conninfo.append(name).append("=").append(value);
}

/// The same server, another database: the URI's path (or a dbname keyword) names `db` instead.
[[nodiscard]] inline std::string with_database(const std::string& conninfo, const std::string& db) {
    if (!is_uri(conninfo)) return conninfo + " dbname=" + db;
    const std::size_t auth = conninfo.find("://") + 3;
    const std::size_t path = conninfo.find_first_of("/?", auth);
    if (path == std::string::npos) return conninfo + "/" + db;
    if (conninfo[path] == '?') return conninfo.substr(0, path) + "/" + db + conninfo.substr(path);
    const std::size_t q = conninfo.find('?', path);
    return conninfo.substr(0, path + 1) + db + (q == std::string::npos ? "" : conninfo.substr(q));
}

/// The connection string with any password removed: "postgresql://u:secret@h/db" -> "postgresql://u@h/db",
/// "password=secret" (keyword or URI parameter) dropped.
[[nodiscard]] inline std::string redact(std::string_view conninfo) {
    std::string out;
    if (is_uri(conninfo)) {
        const std::size_t scheme = conninfo.find("://") + 3;
        const std::size_t auth_end = std::min(conninfo.find_first_of("/?", scheme), conninfo.size());
        const std::string_view auth = conninfo.substr(scheme, auth_end - scheme);
        const std::size_t at = auth.rfind('@');
        out.append(conninfo.substr(0, scheme));
        if (at != std::string_view::npos) {
            const std::string_view user = auth.substr(0, at);
            out.append(user.substr(0, user.find(':'))).append(auth.substr(at));
        } else {
            out.append(auth);
        }
        std::string_view rest = conninfo.substr(auth_end);
        const std::size_t q = rest.find('?');
        out.append(rest.substr(0, q));
        if (q != std::string_view::npos) {
            char sep = '?';
            std::string_view params = rest.substr(q + 1);
            while (!params.empty()) {
                const std::size_t amp = params.find('&');
                const std::string_view p = params.substr(0, amp);
                if (!p.starts_with("password=")) {
                    out += sep;
                    out.append(p);
                    sep = '&';
                }
                params = amp == std::string_view::npos ? std::string_view{} : params.substr(amp + 1);
            }
        }
        return out;
    }
    // keyword=value pairs separated by blanks; values may be 'single quoted' with \' escapes.
    std::size_t i = 0;
    while (i < conninfo.size()) {
        while (i < conninfo.size() && conninfo[i] == ' ') ++i;
        const std::size_t start = i;
        while (i < conninfo.size() && conninfo[i] != '=' && conninfo[i] != ' ') ++i;
        const std::string_view name = conninfo.substr(start, i - start);
        while (i < conninfo.size() && (conninfo[i] == ' ' || conninfo[i] == '=')) ++i;
        if (i < conninfo.size() && conninfo[i] == '\'') {
            for (++i; i < conninfo.size() && conninfo[i] != '\''; ++i)
                if (conninfo[i] == '\\') ++i;
            ++i;
        } else {
            while (i < conninfo.size() && conninfo[i] != ' ') ++i;
        }
        if (name == "password" || name.empty()) continue;
        if (!out.empty()) out += ' ';
        out.append(conninfo.substr(start, std::min(i, conninfo.size()) - start));
    }
    return out;
}

}  // namespace idem::detail::pg
