// idem/detail/rocks/codec.hpp: the byte layout of rocksdb_store (keys and values), with no
// RocksDB dependency, so the fuzzer and the tests can encode and decode without a database.
//
// One key space, four kinds told apart by their first byte:
//
//   'r' KEY                          -> record value   (one per idempotency key)
//   'a' KEY 0x00 SEQ(8, big-endian)  -> audit value    (one per transition)
//   'b' BATCH_ID(8, big-endian)      -> batch value    (one per committed batch: committed())
//   'm' NAME                         -> meta value     ("schema", "next_sequence", "max_fence")
//
// Audit keys sort by (idempotency key, sequence): a key holds no 0x00 byte (key::check refuses
// control bytes), so KEY 0x00 sorts below KEY followed by any other byte, and a key that is a prefix
// of another sorts first, as memcmp orders the keys themselves. An escape scheme would be needed
// only if keys could hold 0x00; the static_assert below ties the layout to that rule.
//
// Values start with a version byte (1). Integers are LEB128 varints (times and lease deadlines
// zigzag-encoded, since they are signed), strings a varint length then bytes. Record value:
//   1 STATE FENCE LEASE_UNTIL OUTCOME FINGERPRINT CREATED UPDATED
//   2 STATE FENCE LEASE_UNTIL OUTCOME FINGERPRINT CREATED UPDATED PAYLOAD
// (biz_type is not stored: it is biz_type_of(key)). Version 2 adds the response payload (a varint
// length, at most 1 MiB, then the bytes) and is written only for a record that has one: a record
// without a payload keeps the version 1 bytes, so values written before payloads existed decode
// unchanged (with an empty payload), and a library from before payloads still reads every record
// but those with a payload (which it refuses as corrupt_record: never read without its bytes).
// Audit value:
//   1 FROM TO FENCE AT NODE DETAIL
// Decoding checks every byte: truncation, an overlong varint, bytes left over, a state outside the
// enum, a record state ABSENT, a fence outside 1 .. 2^52-1 or a key the guard would refuse is
// corrupt_record naming the key and what is wrong; nothing is ever read as 0.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "idem/detail/assert.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/detail/rows/record_rules.hpp"
#include "idem/store.hpp"

namespace idem::detail::rocks {

inline constexpr char record_prefix = 'r';
inline constexpr char audit_prefix = 'a';
inline constexpr char batch_prefix = 'b';
inline constexpr char meta_prefix = 'm';
inline constexpr std::uint8_t value_version = 1;
inline constexpr std::uint8_t record_payload_version = 2;  ///< a record value that ends with a payload
using detail::rows::fence_limit;                           // fences are below 2^52, as in every store (record_rules.hpp)

static_assert(key::max_size < 0xff, "an audit key is KEY 0x00 SEQ: keys must stay short and NUL-free");

// ---- primitives -------------------------------------------------------------------------------

inline void put_varint(std::string& out, std::uint64_t v) {
    while (v >= 0x80) {
        out.push_back(static_cast<char>(v | 0x80));
        v >>= 7;
    }
    out.push_back(static_cast<char>(v));
}
inline void put_signed(std::string& out, std::int64_t v) {
    put_varint(out, (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63));  // zigzag
}
inline void put_bytes(std::string& out, std::string_view s) {
    put_varint(out, s.size());
    out.append(s);
}
inline void put_be64(std::string& out, std::uint64_t v) {
    for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
}
[[nodiscard]] inline std::uint64_t get_be64(std::string_view s) noexcept {
    IDEM_ASSERT(s.size() == 8, "a big-endian sequence or batch id is 8 bytes (split_audit_key cuts them so)");
    std::uint64_t v = 0;
    for (char c : s) v = (v << 8) | static_cast<unsigned char>(c);
    return v;
}

/// Reads a value field by field; the first fault is kept in `fault` and every later read fails.
class reader {
public:
    explicit reader(std::string_view in) : in_(in) {}
    [[nodiscard]] bool ok() const noexcept { return fault_.empty(); }
    [[nodiscard]] const std::string& fault() const noexcept { return fault_; }

    std::uint64_t varint(const char* field) {
        std::uint64_t v = 0;
        for (int shift = 0; ok(); shift += 7) {
            if (pos_ == in_.size()) return fail(field, "is cut off (the value ends inside it)");
            const auto b = static_cast<unsigned char>(in_[pos_++]);
            if (shift == 63 && b > 1) return fail(field, "is longer than 64 bits");
            v |= std::uint64_t{b & 0x7fu} << shift;
            if ((b & 0x80) == 0) return v;
        }
        return 0;
    }
    std::int64_t signed_varint(const char* field) {
        const std::uint64_t z = varint(field);
        return static_cast<std::int64_t>((z >> 1) ^ (~(z & 1) + 1));
    }
    std::uint8_t byte(const char* field) {
        if (!ok()) return 0;
        if (pos_ == in_.size()) return static_cast<std::uint8_t>(fail(field, "is missing (the value ends before it)"));
        return static_cast<std::uint8_t>(in_[pos_++]);
    }
    std::string bytes(const char* field) {
        const std::uint64_t n = varint(field);
        if (!ok()) return {};
        if (n > in_.size() - pos_) {
            fail(field,
                 ("has length " + std::to_string(n) + " but only " + std::to_string(in_.size() - pos_) + " bytes follow")
                     .c_str());
            return {};
        }
        std::string s(in_.substr(pos_, n));
        pos_ += n;
        return s;
    }
    /// A record_state byte; `absent_ok` for an audit row's from_status.
    record_state state(const char* field, bool absent_ok) {
        const std::uint8_t b = byte(field);
        if (!ok()) return record_state::absent;
        const auto s = static_cast<record_state>(b);
        switch (s) {
            case record_state::processing:
            case record_state::succeeded:
            case record_state::failed:
            case record_state::released: return s;
            case record_state::absent:
                if (absent_ok) return s;
                break;
        }
        fail(field, ("is byte " + std::to_string(b) + (absent_ok ? "; expected ABSENT, " : "; expected ") +
                     "PROCESSING, SUCCESS, FAILED or RELEASED")
                        .c_str());
        return record_state::absent;
    }
    std::uint64_t fence(const char* field) {
        const std::uint64_t f = varint(field);
        if (ok())
            if (std::string why = detail::rows::fence_fault(f, field); !why.empty()) fault_ = std::move(why);
        return f;
    }
    void version() {
        const std::uint8_t v = byte("version byte");
        if (ok() && v != value_version)
            fail("version byte", ("is " + std::to_string(v) + "; this store writes version 1").c_str());
    }
    /// A record value's version byte: 1, or 2 (a payload follows the fields). Returns it.
    std::uint8_t record_version() {
        const std::uint8_t v = byte("version byte");
        if (ok() && v != value_version && v != record_payload_version)
            fail("version byte", ("is " + std::to_string(v) + "; a record value is version 1 or 2").c_str());
        return v;
    }
    /// A payload: a varint length (at most detail::rows::payload_hard_max) then the bytes.
    std::string payload() {
        const std::size_t at = pos_;
        const std::uint64_t n = varint("payload");
        if (!ok()) return {};
        if (std::string why = detail::rows::payload_fault(n); !why.empty()) {
            fault_ = std::move(why);
            return {};
        }
        pos_ = at;
        return bytes("payload");
    }
    void end() {
        if (ok() && pos_ != in_.size())
            fail("value", (std::to_string(in_.size() - pos_) + " bytes are left after the last field").c_str());
    }

private:
    std::uint64_t fail(const char* field, const char* what) {
        if (ok()) fault_ = std::string(field) + " " + what;
        return 0;
    }
    std::string_view in_;
    std::size_t pos_ = 0;
    std::string fault_;
};

// ---- keys -------------------------------------------------------------------------------------

[[nodiscard]] inline std::string record_key(std::string_view k) {
    std::string out(1, record_prefix);
    out.append(k);
    return out;
}
[[nodiscard]] inline std::string audit_key(std::string_view k, std::uint64_t sequence) {
    std::string out(1, audit_prefix);
    out.append(k).push_back('\0');
    put_be64(out, sequence);
    return out;
}
/// The range of `k`'s audit rows: [audit_key(k, 0), audit_end(k)).
[[nodiscard]] inline std::string audit_end(std::string_view k) {
    std::string out(1, audit_prefix);
    out.append(k).push_back('\1');
    return out;
}
[[nodiscard]] inline std::string batch_key(std::uint64_t batch_id) {
    std::string out(1, batch_prefix);
    put_be64(out, batch_id);
    return out;
}
[[nodiscard]] inline std::string meta_key(std::string_view name) {
    std::string out(1, meta_prefix);
    out.append(name);
    return out;
}

/// Splits an audit key into the idempotency key and the sequence; nullopt when it has no
/// terminator followed by exactly 8 sequence bytes.
[[nodiscard]] inline std::optional<std::pair<std::string_view, std::uint64_t>> split_audit_key(std::string_view s) {
    if (s.size() < 1 + 1 + 8 || s[0] != audit_prefix || s[s.size() - 9] != '\0') return std::nullopt;
    const std::string_view k = s.substr(1, s.size() - 10);
    if (k.find('\0') != std::string_view::npos) return std::nullopt;
    return std::pair{k, get_be64(s.substr(s.size() - 8))};
}

// ---- values -----------------------------------------------------------------------------------

[[nodiscard]] inline std::string encode_record(const stored_record& r) {
    std::string out;
    out.reserve(48 + r.payload.size());
    out.push_back(static_cast<char>(r.payload.empty() ? value_version : record_payload_version));
    out.push_back(static_cast<char>(r.state));
    put_varint(out, r.fence);
    put_signed(out, r.lease_until_ms);
    put_varint(out, r.outcome);
    put_varint(out, r.fingerprint);
    put_signed(out, r.created_ms);
    put_signed(out, r.updated_ms);
    if (!r.payload.empty()) put_bytes(out, r.payload);
    return out;
}

/// The record of key `k` (the key without its prefix) from its value. Throws corrupt_record
/// "rocksdb:PATH: record 'KEY' ..." naming the field at fault (`where` is "rocksdb:PATH: ").
[[nodiscard]] inline stored_record decode_record(std::string_view where, std::string_view k, std::string_view value) {
    if (std::string why = detail::rows::key_fault(k); !why.empty())
        throw error(errc::corrupt_record, std::string(where) + why);
    stored_record r;
    r.key = std::string(k);
    reader in(value);
    const std::uint8_t version = in.record_version();
    r.state = in.state("status", false);
    r.fence = in.fence("fencing_token");
    r.lease_until_ms = in.signed_varint("lease_until");
    r.outcome = in.varint("outcome");
    r.fingerprint = in.varint("request_fingerprint");
    r.created_ms = in.signed_varint("created_time");
    r.updated_ms = in.signed_varint("updated_time");
    if (version == record_payload_version) r.payload = in.payload();
    in.end();
    if (!in.ok())
        throw error(errc::corrupt_record, std::string(where) + "record '" + key::printable(k) + "': " + in.fault());
    r.biz_type = biz_type_of(k);
    return r;
}

[[nodiscard]] inline std::string encode_audit(const store_row& r, std::string_view node) {
    std::string out;
    out.reserve(40 + node.size());
    out.push_back(static_cast<char>(value_version));
    out.push_back(static_cast<char>(r.t.from));
    out.push_back(static_cast<char>(r.t.to));
    put_varint(out, r.t.fence);
    put_signed(out, r.at_ms);
    put_bytes(out, node);
    put_bytes(out, audit_detail(r.t));
    return out;
}

/// The audit row stored under `raw_key` (with its prefix). Throws corrupt_record naming the key and
/// the sequence (when the key can be read) and the field at fault.
[[nodiscard]] inline audit_entry decode_audit(std::string_view where, std::string_view raw_key, std::string_view value) {
    const auto parts = split_audit_key(raw_key);
    if (!parts)
        throw error(errc::corrupt_record, std::string(where) + "audit key '" + key::printable(raw_key) +
                                              "' is not 'a' KEY 0x00 followed by an 8-byte sequence");
    audit_entry a;
    a.key = std::string(parts->first);
    const std::string row = "audit row " + std::to_string(parts->second) + " (key '" + key::printable(a.key) + "')";
    if (std::string why = detail::rows::key_fault(a.key); !why.empty())
        throw error(errc::corrupt_record, std::string(where) + row + ": " + why);
    if (parts->second == 0 || parts->second > (std::uint64_t{1} << 62))
        throw error(errc::corrupt_record, std::string(where) + row + ": the sequence must be between 1 and 2^62");
    a.sequence = static_cast<std::int64_t>(parts->second);
    reader in(value);
    in.version();
    a.from = in.state("from_status", true);
    a.to = in.state("to_status", false);
    a.fence = in.fence("fencing_token");
    a.at_ms = in.signed_varint("at_time");
    a.node = in.bytes("node");
    a.detail = in.bytes("detail");
    in.end();
    if (!in.ok()) throw error(errc::corrupt_record, std::string(where) + row + ": " + in.fault());
    return a;
}

/// A meta counter (next_sequence, max_fence, schema): version byte then one varint.
[[nodiscard]] inline std::string encode_counter(std::uint64_t v) {
    std::string out(1, static_cast<char>(value_version));
    put_varint(out, v);
    return out;
}
[[nodiscard]] inline std::uint64_t decode_counter(std::string_view where, std::string_view name, std::string_view value) {
    reader in(value);
    in.version();
    const std::uint64_t v = in.varint(std::string(name).c_str());
    in.end();
    if (!in.ok())
        throw error(errc::corrupt_record, std::string(where) + "metadata '" + std::string(name) + "': " + in.fault());
    return v;
}

}  // namespace idem::detail::rocks
