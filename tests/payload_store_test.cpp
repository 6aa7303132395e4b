// payload_store_test: response payloads at the store layer, where the conformance suite cannot
// reach (it compares stores with each other; these check the bytes on disk and the rules).
//
// * RocksDB's record value: a value written before payloads (version 1) decodes, with an empty
//   payload; a record without a payload is still written as those very bytes; one with a payload is
//   version 2 and round-trips any bytes; a cut payload, a payload length above the hard maximum and
//   an unknown version are corrupt_record naming the key and the rule.
// * PostgreSQL's hex transport (detail/pg/sql.hpp): all 256 byte values round-trip, text that
//   is not hex is refused, and an array element needs no quoting.
// * The audit detail names the payload's length and FNV-1a hash, and nothing when there is none.
// * SQLite: a stored payload above the hard maximum is corrupt_record naming the key and the rule
//   (get and load); a payload stored as text by hand is read as its bytes.
// * Recovery (durable_guard over SQLite): decided records come back into memory with their
//   payloads; one whose payload is over options.max_payload, or past options.payload_budget, goes
//   to the cold window instead (the store answers for it), never into memory without its bytes.
// * idem::verify: a record whose outcome or payload differs from what its completing audit row
//   names (outcome, size and hash) is a violation naming the key and both values.
// * The cold window: a duplicate of a key recovery left in the store (older than the hot window)
//   reads the record back (transition_sink::recall) and is answered with its payload, byte for byte,
//   including one larger than options.max_payload, which memory would not hold.
#include <idem/detail/pg/sql.hpp>
#include <idem/detail/rocks/codec.hpp>
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "support/store_fixtures.hpp"

namespace {

namespace codec = idem::detail::rocks;
using idem::errc;
using idem::record_state;
using idem::transition_cause;
using idem_test::row;

const std::string any_bytes = std::string("\0\xff\x80\xc3\x28\xed\xa0\x80{\"id\":1}\r\n\0", 17);

/// The record value as the release before payloads wrote it (built by hand from the layout).
std::string version_1_value() {
    std::string v;
    v.push_back(1);
    v.push_back(static_cast<char>(record_state::succeeded));
    codec::put_varint(v, 5);      // fence
    codec::put_signed(v, 900);    // lease_until
    codec::put_varint(v, 42);     // outcome
    codec::put_varint(v, 0xabc);  // fingerprint
    codec::put_signed(v, 100);    // created
    codec::put_signed(v, 101);    // updated
    return v;
}

idem::stored_record record(std::string payload) {
    return {"K_PAY_v1", "PAY", record_state::succeeded, 5, 900, 42, 0xabc, 100, 101, std::move(payload)};
}

template <class F>
std::string corrupt_message(F&& f) {
    try {
        f();
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::corrupt_record) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "no corrupt_record";
    return {};
}

TEST(RocksdbPayloadCodec, AValueFromBeforePayloadsDecodesWithAnEmptyPayload) {
    const auto r = codec::decode_record("rocksdb:x: ", "K_PAY_v1", version_1_value());
    EXPECT_EQ(r, record(""));
    // A record without a payload is still written as exactly those bytes: an older library reads it.
    EXPECT_EQ(codec::encode_record(record("")), version_1_value());
}

TEST(RocksdbPayloadCodec, APayloadIsVersion2AndRoundTripsAnyBytes) {
    std::string max(idem::detail::rows::payload_hard_max, 'x');
    max.front() = '\0';
    max.back() = '\xff';
    for (const std::string& p : {std::string(1, '\0'), any_bytes, max}) {
        const std::string v = codec::encode_record(record(p));
        EXPECT_EQ(static_cast<std::uint8_t>(v[0]), codec::record_payload_version);
        const auto back = codec::decode_record("rocksdb:x: ", "K_PAY_v1", v);
        EXPECT_EQ(back.payload.size(), p.size());
        EXPECT_TRUE(back == record(p)) << "the payload of " << p.size() << " bytes did not round-trip";
    }
}

TEST(RocksdbPayloadCodec, ABrokenPayloadIsCorruptNamingTheKeyAndTheRule) {
    const std::string good = codec::encode_record(record(any_bytes));
    // Cut inside the payload.
    std::string msg = corrupt_message(
        [&] { (void)codec::decode_record("rocksdb:x: ", "K_PAY_v1", good.substr(0, good.size() - 3)); });
    EXPECT_NE(msg.find("record 'K_PAY_v1'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("payload has length 17"), std::string::npos) << msg;
    // A length above the hard maximum (the bytes need not even be there).
    std::string big = version_1_value();
    big[0] = static_cast<char>(codec::record_payload_version);
    codec::put_varint(big, idem::detail::rows::payload_hard_max + 1);
    msg = corrupt_message([&] { (void)codec::decode_record("rocksdb:x: ", "K_PAY_v1", big); });
    EXPECT_NE(msg.find("record 'K_PAY_v1'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("payload is 1048577 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hard maximum"), std::string::npos) << msg;
    // A version no writer produced.
    std::string v3 = good;
    v3[0] = 3;
    msg = corrupt_message([&] { (void)codec::decode_record("rocksdb:x: ", "K_PAY_v1", v3); });
    EXPECT_NE(msg.find("version byte is 3"), std::string::npos) << msg;
    // A version 1 value followed by payload bytes: bytes left over, not a payload.
    msg = corrupt_message([&] { (void)codec::decode_record("rocksdb:x: ", "K_PAY_v1", version_1_value() + "\x01z"); });
    EXPECT_NE(msg.find("left after the last field"), std::string::npos) << msg;
}

TEST(PostgresPayloadHex, EveryByteValueRoundTripsAndNonHexIsRefused) {
    std::string all;
    for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
    std::string hex;
    idem::detail::pg::append_hex(hex, all);
    EXPECT_EQ(hex.size(), 512u);
    EXPECT_EQ(hex.substr(0, 8), "00010203");
    EXPECT_EQ(hex.substr(504), "fcfdfeff");
    std::string back;
    ASSERT_TRUE(idem::detail::pg::from_hex(hex, back));
    EXPECT_TRUE(back == all);
    ASSERT_TRUE(idem::detail::pg::from_hex("00FFaB", back));
    EXPECT_EQ(back, std::string("\0\xff\xab", 3));
    EXPECT_TRUE(idem::detail::pg::from_hex("", back));
    EXPECT_TRUE(back.empty());
    EXPECT_FALSE(idem::detail::pg::from_hex("abc", back)) << "odd length";
    EXPECT_FALSE(idem::detail::pg::from_hex("zz", back)) << "not hex";
    EXPECT_FALSE(idem::detail::pg::from_hex("\\x00", back)) << "bytea's own prefix is not part of encode()'s text";

    idem::detail::pg::array_literal a;
    a.add_hex("");
    a.add_hex(std::string("\0\"\\", 3));
    EXPECT_EQ(a.str(), R"({"","00225c"})");
}

TEST(PayloadAuditDetail, NamesLengthAndHashNotTheBytes) {
    EXPECT_EQ(idem::payload_detail(""), "");
    // FNV-1a 64 of "a" (the published test vector).
    EXPECT_EQ(idem::payload_hash("a"), 0xaf63dc4c8601ec8cull);
    EXPECT_EQ(idem::payload_detail("a"), " payload=1B fnv=af63dc4c8601ec8c");
    idem::transition t;
    t.cause = transition_cause::succeed;
    t.outcome = 7;
    t.payload = any_bytes;
    const std::string d = idem::audit_detail(t);
    EXPECT_EQ(d.rfind("succeed outcome=7 payload=17B fnv=", 0), 0u) << d;
    EXPECT_EQ(d.find('\0'), std::string::npos) << "the bytes must not reach the audit trail";
}

/// A SQLite store with one succeeded record carrying `payload`.
void write_record(const std::string& db, const std::string& k, std::string_view payload, std::int64_t at_ms,
                  std::uint64_t batch) {
    idem::sqlite_store st(db);
    idem::store_row claim = row({.key = k, .at_ms = at_ms}, 1);
    idem::store_row done = row({.key = k,
                                .from = record_state::processing,
                                .to = record_state::succeeded,
                                .cause = transition_cause::succeed,
                                .outcome = 3,
                                .at_ms = at_ms},
                               2);
    done.t.payload = payload;
    st.apply(std::vector{claim, done}, batch);
}

TEST(SqlitePayload, AStoredPayloadAboveTheHardMaximumIsCorruptNamingTheKey) {
    idem_test::temp_dir dir("idem-payload");
    const std::string db = dir.file("p.db");
    write_record(db, "BIG_PAY_v1", "x", 1'700'000'000'000, 1);
    idem_test::sqlite_exec(db, "UPDATE idempotent_record SET payload = zeroblob(1048577)");
    idem::sqlite_store st(db);
    for (const bool via_load : {false, true}) {
        const std::string msg = corrupt_message([&] {
            if (via_load) st.load([](const idem::stored_record&) {});
            else (void)st.get("BIG_PAY_v1");
        });
        EXPECT_NE(msg.find("BIG_PAY_v1"), std::string::npos) << msg;
        EXPECT_NE(msg.find("payload is 1048577 bytes"), std::string::npos) << msg;
        EXPECT_NE(msg.find("hard maximum"), std::string::npos) << msg;
    }
    // Exactly the maximum is a payload like any other.
    idem_test::sqlite_exec(db, "UPDATE idempotent_record SET payload = zeroblob(1048576)");
    EXPECT_EQ(st.get("BIG_PAY_v1")->payload, std::string(idem::detail::rows::payload_hard_max, '\0'));
}

// idem::verify checks a decided record against the audit row that decided it: the outcome it names,
// and the payload's size and hash. Bytes or an outcome changed in the store afterwards show, each
// naming the key and both values; an untouched store shows nothing.
TEST(VerifyPayload, ARecordWhoseOutcomeOrPayloadDiffersFromItsCompletingRowIsAViolation) {
    idem_test::temp_dir dir("idem-payload");
    const std::string db = dir.file("p.db");
    const std::int64_t at = 1'700'000'000'000;
    std::uint64_t batch = 0;
    for (const auto& [k, payload] : std::vector<std::pair<std::string, std::string>>{{"SAME_PAY_v1", any_bytes},
                                                                                     {"BYTES_PAY_v1", any_bytes},
                                                                                     {"GONE_PAY_v1", "abc"},
                                                                                     {"ADDED_PAY_v1", ""},
                                                                                     {"OUT_PAY_v1", ""}})
        write_record(db, k, payload, at, ++batch);
    {
        idem::sqlite_store st(db);
        const auto clean = idem::verify(st);
        EXPECT_EQ(clean.keys, 5u);
        EXPECT_TRUE(clean.violations.empty()) << clean.violations.front();
    }
    idem_test::sqlite_exec(db, "UPDATE idempotent_record SET payload = X'00' WHERE idempotent_key = 'BYTES_PAY_v1'");
    idem_test::sqlite_exec(db, "UPDATE idempotent_record SET payload = X'' WHERE idempotent_key = 'GONE_PAY_v1'");
    idem_test::sqlite_exec(db, "UPDATE idempotent_record SET payload = X'41' WHERE idempotent_key = 'ADDED_PAY_v1'");
    idem_test::sqlite_exec(db, "UPDATE idempotent_record SET outcome = 4 WHERE idempotent_key = 'OUT_PAY_v1'");
    idem::sqlite_store st(db);
    const auto r = idem::verify(st);
    ASSERT_EQ(r.violations.size(), 4u);
    const auto said = [&](const std::string& k) {
        for (const auto& v : r.violations)
            if (v.find("'" + k + "'") != std::string::npos) return v;
        return std::string("(no violation names " + k + ")");
    };
    const std::string hash_of_17 = idem::payload_detail(any_bytes).substr(9);
    EXPECT_NE(said("BYTES_PAY_v1").find("payload is 1B fnv="), std::string::npos) << said("BYTES_PAY_v1");
    EXPECT_NE(said("BYTES_PAY_v1").find("audit row says " + hash_of_17), std::string::npos) << said("BYTES_PAY_v1");
    EXPECT_NE(said("GONE_PAY_v1").find("payload is empty but its completing audit row says 3B fnv="), std::string::npos)
        << said("GONE_PAY_v1");
    EXPECT_NE(said("ADDED_PAY_v1").find("payload is 1B fnv="), std::string::npos) << said("ADDED_PAY_v1");
    EXPECT_NE(said("ADDED_PAY_v1").find("audit row says none"), std::string::npos) << said("ADDED_PAY_v1");
    EXPECT_NE(said("OUT_PAY_v1").find("outcome is 4 but its completing audit row says 3"), std::string::npos)
        << said("OUT_PAY_v1");
    EXPECT_EQ(said("SAME_PAY_v1"), "(no violation names SAME_PAY_v1)");
}

TEST(SqlitePayload, APayloadStoredAsTextByHandIsReadAsItsBytes) {
    idem_test::temp_dir dir("idem-payload");
    const std::string db = dir.file("p.db");
    write_record(db, "TXT_PAY_v1", "x", 1'700'000'000'000, 1);
    idem_test::sqlite_exec(db, "UPDATE idempotent_record SET payload = 'plain text'");
    idem::sqlite_store st(db);
    EXPECT_EQ(st.get("TXT_PAY_v1")->payload, "plain text");
}

std::int64_t wall_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

TEST(DurablePayload, RecoveryRestoresPayloadsAndSendsThoseThatDoNotFitToTheColdWindow) {
    idem_test::temp_dir dir("idem-payload");
    const std::string db = dir.file("p.db");
    const std::int64_t now = wall_ms();
    write_record(db, "FIT1_PAY_v1", std::string(16, 'a'), now, 1);
    write_record(db, "FIT2_PAY_v1", any_bytes, now, 2);
    write_record(db, "NONE_PAY_v1", "", now, 3);
    write_record(db, "OVER_PAY_v1", std::string(17, 'b'), now, 4);  // over max_payload below
    {
        idem::options o;
        o.max_payload = 17;
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(db), o);
        EXPECT_EQ(g.recovery().records, 4u);
        EXPECT_EQ(g.recovery().cold, 0u);
    }
    {
        idem::options o;
        o.max_payload = 16;
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(db), o);
        EXPECT_EQ(g.recovery().records, 2u) << "FIT1 and NONE fit; FIT2 (17 bytes) and OVER do not";
        EXPECT_EQ(g.recovery().cold, 2u);
        // The store still holds every byte for the cold window's reads.
        EXPECT_TRUE(g.backing_store().get("FIT2_PAY_v1")->payload == any_bytes);
    }
    {
        // Recovery holds at most payload_budget bytes of payloads for memory: 16 + 17 fit 33, OVER's
        // 17 more do not.
        idem::options o;
        o.max_payload = 17;
        o.payload_budget = 33;
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(db), o);
        EXPECT_EQ(g.recovery().records, 3u);
        EXPECT_EQ(g.recovery().cold, 1u);
    }
}

TEST(DurablePayload, ADuplicateOfAKeyInTheColdWindowIsAnsweredWithItsPayloadFromTheStore) {
    idem_test::temp_dir dir("idem-payload");
    const std::string db = dir.file("p.db");
    const std::int64_t two_hours_ago = wall_ms() - 2 * 3600 * 1000;
    const std::string big(40'000, '\xff');
    write_record(db, "COLD1_PAY_v1", any_bytes, two_hours_ago, 1);
    write_record(db, "COLD2_PAY_v1", "", two_hours_ago, 2);
    write_record(db, "COLD3_PAY_v1", big, two_hours_ago, 3);
    idem::options o = idem_test::durable_options();
    o.retention = std::chrono::hours(1);  // the records are past the hot window, inside the store's (7 days)
    o.max_payload = 1024;                 // COLD3's payload could not be held in memory
    idem::durable_guard g(std::make_unique<idem::sqlite_store>(db), o);
    ASSERT_EQ(g.recovery().cold, 3u);
    ASSERT_EQ(g.recovery().records, 0u);
    for (const auto& [k, want] : std::vector<std::pair<std::string, std::string>>{
             {"COLD1_PAY_v1", any_bytes}, {"COLD2_PAY_v1", ""}, {"COLD3_PAY_v1", big}}) {
        for (int again = 0; again < 2; ++again) {  // the second answer may come from memory
            const auto r = g->begin(idem::key(k));
            EXPECT_EQ(r.status, idem::begin_status::succeeded) << k;
            EXPECT_EQ(r.outcome, 3u) << k;
            EXPECT_EQ(r.payload.size(), want.size()) << k;
            EXPECT_TRUE(r.payload == want) << k << ": the replayed bytes differ";
        }
    }
    EXPECT_GE(g.snapshot().recalled, 3u);
}

}  // namespace
