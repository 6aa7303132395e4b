// readme_test: the README quick-start, compiled and run so it cannot rot.
//
// Placeholder until the README exists: the lead pastes the quick-start snippet into quick_start()
// below (unchanged, so a broken README breaks this test). The snippet may print; it must not
// read input.
#include <idem/idem.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>

namespace {

// ---- README quick-start: begin -------------------------------------------------------------
std::uint64_t quick_start() {
    idem::options opts;
    opts.capacity = 1024;
    idem::guard guard(opts);

    long balance = 100;
    auto transfer = [&] {
        balance -= 30;
        return 7001;  // receipt number, replayed to duplicates
    };
    const auto key = idem::key::compose("TX20230615123456", "TRANSFER", 2);
    const std::uint64_t receipt = guard.run(key, transfer);
    const std::uint64_t again = guard.run(key, transfer);  // a duplicate: not executed, replayed
    std::cout << "receipt " << receipt << ", replayed " << again << ", balance " << balance << '\n';
    return balance == 70 && receipt == again ? receipt : 0;
}
// ---- README quick-start: end ---------------------------------------------------------------

TEST(Readme, QuickStartRuns) { EXPECT_EQ(quick_start(), 7001u); }

}  // namespace
