// idem/detail/rows/audit_detail.hpp: the `detail` text of an audit row, its one formatter and its one
// parser. Every writer of an audit row (each store, the global scope's coordinator, and the global
// scope's SQL, which builds a claim's text on the server) formats it here or from the pieces here;
// idem::verify reads it back with parse_audit_detail.
//
//   <cause> outcome=<outcome>[ payload=<size>B fnv=<hash>][ batch=<batch id>]
//
//   cause     the transition's cause (to_string(transition_cause): claim, succeed, fail, ...)
//   outcome   the outcome recorded with it, decimal (0 for claims)
//   payload   a completion's response: its length in bytes and its 64-bit FNV-1a hash as 16
//             lower-case hex digits. The trail keeps these, not the bytes: an auditor can tell which
//             response a completion recorded and check it against the record's payload, and an audit
//             row stays a few dozen bytes however large the response (up to 1 MiB). No part: none.
//   batch     the global scope's claims only: the claim batch's id (it tells an unanswered commit's
//             claims apart); the SQL appends it on the server to claim_batch_prefix.
//
// Invariant: parse_audit_detail(format(x)) gives back x's fields for every x the formatter accepts
// (tests/audit_detail_test.cpp), and format never allocates beyond the std::string it returns
// (detail_text formats into a buffer of its own, for stores that bind the text directly).
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "idem/detail/assert.hpp"
#include "idem/transition.hpp"

namespace idem::detail::rows {

/// The parts' tags, in the order they appear.
inline constexpr std::string_view outcome_tag = " outcome=";
inline constexpr std::string_view payload_tag = " payload=";
inline constexpr std::string_view fnv_tag = "B fnv=";  ///< after the payload's length
inline constexpr std::string_view batch_tag = " batch=";

/// The 64-bit FNV-1a hash of a payload: what the audit trail records of the bytes.
[[nodiscard]] constexpr std::uint64_t payload_hash(std::string_view bytes) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (const char c : bytes) {
        h ^= static_cast<unsigned char>(c);
        h *= 0x100000001b3ull;
    }
    return h;
}

/// What an audit row says of a payload: its length and hash.
struct payload_summary {
    std::uint64_t size = 0;
    std::uint64_t hash = 0;
    [[nodiscard]] static constexpr payload_summary of(std::string_view bytes) noexcept {
        return {bytes.size(), payload_hash(bytes)};
    }
    friend constexpr bool operator==(const payload_summary&, const payload_summary&) = default;
};

/// The fields of a detail text.
struct audit_detail_fields {
    std::string_view cause;  ///< as written (the formatter writes to_string(cause))
    std::uint64_t outcome = 0;
    std::optional<payload_summary> payload;  ///< none: the row recorded no payload
    std::optional<std::int64_t> batch;       ///< the global scope's claim batch id, if named
};

/// A detail text in a buffer of its own: no allocation. Holds the longest text the formatter writes.
class detail_text {
public:
    detail_text(transition_cause cause, std::uint64_t outcome, std::string_view payload = {}) noexcept
        : detail_text(cause, outcome, payload.empty() ? std::nullopt : std::optional(payload_summary::of(payload)),
                      std::nullopt) {}

    detail_text(transition_cause cause, std::uint64_t outcome, std::optional<payload_summary> payload,
                std::optional<std::int64_t> batch) noexcept {
        put(to_string(cause));
        put(outcome_tag);
        put_number(outcome);
        if (payload) put_payload(*payload);
        if (batch) {
            put(batch_tag);
            put_number(*batch);
        }
    }

    /// The payload part alone: " payload=NB fnv=HHHHHHHHHHHHHHHH".
    [[nodiscard]] static detail_text payload_part(const payload_summary& p) noexcept {
        detail_text t;
        t.put_payload(p);
        return t;
    }

    [[nodiscard]] std::string_view view() const noexcept { return {buf_, n_}; }
    [[nodiscard]] const char* data() const noexcept { return buf_; }
    [[nodiscard]] std::size_t size() const noexcept { return n_; }
    [[nodiscard]] std::string str() const { return std::string(view()); }

    /// The longest cause name ("not_durable"), 20 digits per number, 16 hex digits, the tags.
    static constexpr std::size_t capacity = 11 + outcome_tag.size() + 20 + payload_tag.size() + 20 + fnv_tag.size() + 16 +
                                            batch_tag.size() + 20;

private:
    detail_text() noexcept = default;
    void put_payload(const payload_summary& p) noexcept {
        put(payload_tag);
        put_number(p.size);
        put(fnv_tag);
        put_hex16(p.hash);
    }
    void put(std::string_view s) noexcept {
        IDEM_ASSERT(s.size() <= capacity - n_, "an audit detail fits detail_text::capacity");
        for (const char c : s) buf_[n_++] = c;
    }
    template <class I>
    void put_number(I v) noexcept {
        const auto [end, ec] = std::to_chars(buf_ + n_, buf_ + capacity, v);
        IDEM_ASSERT(ec == std::errc{}, "an audit detail fits detail_text::capacity");
        n_ = static_cast<std::size_t>(end - buf_);
    }
    void put_hex16(std::uint64_t h) noexcept {
        static constexpr char digits[] = "0123456789abcdef";
        IDEM_ASSERT(16 <= capacity - n_, "an audit detail fits detail_text::capacity");
        for (int i = 15; i >= 0; --i, h >>= 4) buf_[n_ + static_cast<std::size_t>(i)] = digits[h & 0xf];
        n_ += 16;
    }

    char buf_[capacity];
    std::size_t n_ = 0;
};

/// The detail column of a transition's audit row: cause, outcome, and the payload's length and hash
/// when it has one.
[[nodiscard]] inline std::string format_audit_detail(transition_cause cause, std::uint64_t outcome,
                                                     std::string_view payload = {}) {
    return detail_text(cause, outcome, payload).str();
}

/// The payload part alone: " payload=NB fnv=HHHHHHHHHHHHHHHH", or "" when there is none.
[[nodiscard]] inline std::string format_payload_part(std::string_view payload) {
    if (payload.empty()) return {};
    return detail_text::payload_part(payload_summary::of(payload)).str();
}

/// "NB fnv=HHHHHHHHHHHHHHHH": a payload summary as the verifier names it.
[[nodiscard]] inline std::string payload_summary_text(const payload_summary& p) {
    return std::string(detail_text::payload_part(p).view().substr(payload_tag.size()));
}

// ---- the global scope's claims: the text its SQL builds on the server --------------------------

/// A string of N characters built at compile time from the tags above.
template <std::size_t N>
struct fixed_text {
    char c[N]{};
    std::size_t n = 0;
    constexpr fixed_text& operator+=(std::string_view s) {
        for (const char x : s) c[n++] = x;
        return *this;
    }
    [[nodiscard]] constexpr std::string_view view() const { return {c, n}; }
};

inline constexpr fixed_text<32> claim_batch_prefix_text = [] {
    fixed_text<32> t;
    t += detail::name_of(transition_cause::claim);
    t += outcome_tag;
    t += "0";
    t += batch_tag;
    return t;
}();

/// "claim outcome=0 batch=": the detail of a global claim is this followed by the batch id in
/// decimal (claim_batch_detail here; `'<prefix>' || $1::text` in detail/global/pg_sql.hpp).
inline constexpr std::string_view claim_batch_prefix = claim_batch_prefix_text.view();

/// The same text as a string literal, for SQL written as literals (detail/global/pg_sql.hpp splices it
/// into a SQL string literal, so it holds no quote); checked here against the pieces above.
#define IDEM_AUDIT_CLAIM_BATCH_PREFIX "claim outcome=0 batch="
static_assert(claim_batch_prefix == IDEM_AUDIT_CLAIM_BATCH_PREFIX,
              "the SQL's claim detail is the formatter's: cause, outcome 0, batch tag");
static_assert(claim_batch_prefix.find('\'') == std::string_view::npos &&
                  claim_batch_prefix.find('\\') == std::string_view::npos,
              "claim_batch_prefix is spliced into a SQL string literal");

/// The detail of a global claim of batch `batch_id`: what the SQL writes on the server.
[[nodiscard]] inline std::string claim_batch_detail(std::int64_t batch_id) {
    return detail_text(transition_cause::claim, 0, std::nullopt, batch_id).str();
}

// ---- the parser ----------------------------------------------------------------------------------

/// How a parse ended.
enum class detail_parse : std::uint8_t {
    ok,           ///< every part read
    foreign,      ///< no " outcome=": not a text this library writes (a row written by hand)
    bad_outcome,  ///< " outcome=" without a readable number
    bad_payload,  ///< " payload=" without a readable length and hash
    bad_tail,     ///< text after the parts (or a batch id that does not read)
};

struct parsed_audit_detail {
    detail_parse status = detail_parse::foreign;
    audit_detail_fields fields;
};

namespace audit_detail_parse {
/// Reads a decimal number at the start of s (no sign for unsigned), advancing s past it.
template <class I>
[[nodiscard]] inline bool number(std::string_view& s, I& out) noexcept {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec != std::errc{} || end == s.data()) return false;
    s.remove_prefix(static_cast<std::size_t>(end - s.data()));
    return true;
}
[[nodiscard]] inline bool hex16(std::string_view& s, std::uint64_t& out) noexcept {
    if (s.size() < 16) return false;
    out = 0;
    for (std::size_t i = 0; i < 16; ++i) {
        const char c = s[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        out = out << 4 | static_cast<std::uint64_t>(d);
    }
    s.remove_prefix(16);
    return true;
}
[[nodiscard]] inline bool tag(std::string_view& s, std::string_view t) noexcept {
    if (s.substr(0, t.size()) != t) return false;
    s.remove_prefix(t.size());
    return true;
}
}  // namespace audit_detail_parse

/// Parses a detail text (the grammar at the top). The cause is what precedes the first " outcome=".
[[nodiscard]] inline parsed_audit_detail parse_audit_detail(std::string_view text) noexcept {
    namespace p = audit_detail_parse;
    parsed_audit_detail r;
    const auto at = text.find(outcome_tag);
    if (at == std::string_view::npos) return r;  // foreign
    r.fields.cause = text.substr(0, at);
    std::string_view s = text.substr(at + outcome_tag.size());
    if (!p::number(s, r.fields.outcome) || (!s.empty() && s[0] != ' ')) {
        r.status = detail_parse::bad_outcome;
        return r;
    }
    if (p::tag(s, payload_tag)) {
        payload_summary ps;
        if (!p::number(s, ps.size) || !p::tag(s, fnv_tag) || !p::hex16(s, ps.hash) || (!s.empty() && s[0] != ' ')) {
            r.status = detail_parse::bad_payload;
            return r;
        }
        r.fields.payload = ps;
    }
    if (p::tag(s, batch_tag)) {
        std::int64_t b = 0;
        if (!p::number(s, b)) {
            r.status = detail_parse::bad_tail;
            return r;
        }
        r.fields.batch = b;
    }
    r.status = s.empty() ? detail_parse::ok : detail_parse::bad_tail;
    return r;
}

}  // namespace idem::detail::rows
