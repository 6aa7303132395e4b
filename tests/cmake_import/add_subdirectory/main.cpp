// A consumer of idem: guards one operation and checks the duplicate is replayed, not executed.
// (The find_package consumer has the same program.)
#include <idem/idem.hpp>

#include <cstdio>

int main() {
    idem::options opts;
    opts.capacity = 64;
    opts.maintenance_interval = {};
    idem::guard g(opts);
    int executed = 0;
    const auto k = idem::key::compose("TX1", "PAY", 1);
    const auto first = g.run(k, [&] {
        ++executed;
        return 42;
    });
    const auto again = g.run(k, [&] {
        ++executed;
        return 43;
    });
    if (first != 42 || again != 42 || executed != 1) {
        std::fprintf(stderr, "consumer: first=%llu again=%llu executed=%d\n", static_cast<unsigned long long>(first),
                     static_cast<unsigned long long>(again), executed);
        return 1;
    }
    std::puts("consumer: ok");
    return 0;
}
