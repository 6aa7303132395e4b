// audit_detail_test: the audit row's `detail` text has one formatter and one parser
// (detail/rows/audit_detail.hpp). What every writer produces parses back to what it wrote: the
// stores' text (idem::audit_detail), the global scope's completions and claims, and the claim text
// the global scope's SQL builds on the server from the same pieces.
#include <idem/detail/global/pg_sql.hpp>
#include <idem/detail/rows/audit_detail.hpp>
#include <idem/store_rows.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace rows = idem::detail::rows;
using idem::transition_cause;

const std::vector<transition_cause> causes = {transition_cause::claim,   transition_cause::reclaim,
                                              transition_cause::succeed, transition_cause::fail,
                                              transition_cause::release, transition_cause::compensate,
                                              transition_cause::doubt,   transition_cause::not_durable,
                                              transition_cause::imported};

std::string binary_payload(std::size_t n) {
    std::string s(n, '\0');
    for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) & 0xff);  // NUL and high bytes
    return s;
}

TEST(audit_detail, every_text_the_formatter_writes_parses_back_to_its_fields) {
    const std::vector<std::uint64_t> outcomes = {0, 1, 42, std::numeric_limits<std::uint64_t>::max()};
    const std::vector<std::string> payloads = {"", "a", binary_payload(15), binary_payload(4096),
                                               binary_payload(std::size_t{1} << 20)};
    const std::vector<std::optional<std::int64_t>> batches = {
        std::nullopt, 0, 1, -5, std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min()};
    for (const transition_cause c : causes)
        for (const std::uint64_t o : outcomes)
            for (const std::string& p : payloads)
                for (const auto& b : batches) {
                    const std::optional<rows::payload_summary> ps = p.empty() ? std::nullopt
                                                                              : std::optional(rows::payload_summary::of(p));
                    const rows::detail_text text(c, o, ps, b);
                    const rows::parsed_audit_detail parsed = rows::parse_audit_detail(text.view());
                    ASSERT_EQ(parsed.status, rows::detail_parse::ok) << text.view();
                    EXPECT_EQ(parsed.fields.cause, idem::to_string(c)) << text.view();
                    EXPECT_EQ(parsed.fields.outcome, o) << text.view();
                    EXPECT_EQ(parsed.fields.payload, ps) << text.view();
                    EXPECT_EQ(parsed.fields.batch, b) << text.view();
                }
}

TEST(audit_detail, the_stores_text_is_the_formatters) {
    idem::transition t;
    t.cause = transition_cause::succeed;
    t.outcome = 7;
    EXPECT_EQ(idem::audit_detail(t), "succeed outcome=7");
    t.payload = "a";
    EXPECT_EQ(idem::audit_detail(t), "succeed outcome=7 payload=1B fnv=af63dc4c8601ec8c");
    EXPECT_EQ(idem::payload_detail("a"), " payload=1B fnv=af63dc4c8601ec8c");
    EXPECT_EQ(idem::payload_detail(""), "");
    EXPECT_EQ(rows::payload_summary_text(rows::payload_summary::of("a")), "1B fnv=af63dc4c8601ec8c");
    EXPECT_EQ(rows::format_audit_detail(transition_cause::compensate, 77), "compensate outcome=77");
    // detail_text (the SQLite store binds it without a string) and format_audit_detail agree.
    const std::string bytes = binary_payload(300);
    EXPECT_EQ(rows::detail_text(transition_cause::fail, 9, bytes).view(),
              rows::format_audit_detail(transition_cause::fail, 9, bytes));
}

TEST(audit_detail, texts_not_written_by_the_formatter_are_told_apart) {
    EXPECT_EQ(rows::parse_audit_detail("").status, rows::detail_parse::foreign);
    EXPECT_EQ(rows::parse_audit_detail("fixed by hand").status, rows::detail_parse::foreign);
    EXPECT_EQ(rows::parse_audit_detail("succeed outcome=").status, rows::detail_parse::bad_outcome);
    EXPECT_EQ(rows::parse_audit_detail("succeed outcome=-1").status, rows::detail_parse::bad_outcome);
    EXPECT_EQ(rows::parse_audit_detail("succeed outcome=5x").status, rows::detail_parse::bad_outcome);
    EXPECT_EQ(rows::parse_audit_detail("succeed outcome=5 payload=3B fnv=zz").status, rows::detail_parse::bad_payload);
    EXPECT_EQ(rows::parse_audit_detail("succeed outcome=5 payload=3B fnv=AF63DC4C8601EC8C").status,
              rows::detail_parse::bad_payload);  // the formatter writes lower-case hex
    EXPECT_EQ(rows::parse_audit_detail("succeed outcome=5 payload=3B fnv=af63dc4c8601ec8cz").status,
              rows::detail_parse::bad_payload);
    EXPECT_EQ(rows::parse_audit_detail("succeed outcome=5 note").status, rows::detail_parse::bad_tail);
    EXPECT_EQ(rows::parse_audit_detail("claim outcome=0 batch=").status, rows::detail_parse::bad_tail);
    const auto parsed = rows::parse_audit_detail("claim outcome=0");  // a row of the SQLite layout tests
    EXPECT_EQ(parsed.status, rows::detail_parse::ok);
    EXPECT_EQ(parsed.fields.cause, "claim");
}

// The global scope's claim statements build the detail on the server: '<claim_batch_prefix>' ||
// $1::text, $1 the batch id (a bigint: PostgreSQL prints it in decimal). The statement's text holds
// exactly that expression, and what it produces parses as a claim of outcome 0 naming the batch.
TEST(audit_detail, the_claim_text_the_global_sql_builds_parses) {
    const std::string expr = "'" + std::string(rows::claim_batch_prefix) + "' || $1::text";
    for (const std::string* statement : {&idem::detail::global::sql::claim, &idem::detail::global::sql::claim_ordered}) {
        const auto at = statement->find(expr);
        ASSERT_NE(at, std::string::npos) << "the claim statement does not build its detail from claim_batch_prefix";
        // The literal between the quotes, as the server reads it (no quote or backslash inside).
        const std::string literal = statement->substr(at + 1, rows::claim_batch_prefix.size());
        for (const std::int64_t batch : {std::int64_t{1}, std::int64_t{0x7fffffff12345678}, std::int64_t{-3}}) {
            const std::string server_text = literal + std::to_string(batch);  // '...' || $1::text
            const rows::parsed_audit_detail p = rows::parse_audit_detail(server_text);
            ASSERT_EQ(p.status, rows::detail_parse::ok) << server_text;
            EXPECT_EQ(p.fields.cause, "claim");
            EXPECT_EQ(p.fields.outcome, 0u);
            EXPECT_FALSE(p.fields.payload.has_value());
            EXPECT_EQ(p.fields.batch, batch);
            EXPECT_EQ(server_text, rows::claim_batch_detail(batch)) << "the coordinator matches its claims by this text";
        }
    }
}

}  // namespace
