// 100 threads, started together on a latch, race over the same 50 keys of a durable SQLite guard in
// sync mode: each thread begins every key, in its own order; the one that acquires a key succeeds it
// with the key's outcome, every other begin is a duplicate (succeeded, with that outcome) or meets
// the claim still in flight (in_progress). Between two of those, each thread claims and succeeds a
// fresh key of its own, so the flush queue takes transitions from many threads at once. Exit 0 when
// each shared key ran exactly once, every own key was acquired and every duplicate saw its key's
// outcome; ThreadSanitizer must report nothing on the way.
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {
constexpr int threads = 100;
constexpr int keys = 50;
constexpr std::uint64_t outcome_of(int k) { return 1000 + static_cast<std::uint64_t>(k); }
}  // namespace

int main() {
    const auto dir = std::filesystem::current_path() / "tsan-store";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);

    idem::options opts;
    opts.capacity = 1 << 14;
    idem::store_options so;
    so.mode = idem::durability::sync;
    idem::durable_guard g(std::make_unique<idem::sqlite_store>((dir / "idem.db").string()), opts, so);

    std::array<std::atomic<int>, keys> executed{};
    std::atomic<int> duplicates{0}, wrong{0};
    std::latch start(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            start.arrive_and_wait();
            for (int i = 0; i < keys; ++i) {
                const int k = (t + i) % keys;
                auto r = g->begin(idem::key::compose("TX" + std::to_string(k), "PAY", 1));
                switch (r.status) {
                    case idem::begin_status::acquired:
                        executed[k].fetch_add(1);
                        if (r.ticket.succeed(outcome_of(k))) wrong.fetch_add(1);  // an error_code: set means refused
                        break;
                    case idem::begin_status::succeeded:
                        duplicates.fetch_add(1);
                        if (r.outcome != outcome_of(k)) wrong.fetch_add(1);
                        break;
                    case idem::begin_status::in_progress: break;
                    default: std::fprintf(stderr, "key %d: %s\n", k, idem::to_string(r.status)); wrong.fetch_add(1);
                }
                // And a key of this thread's own, which it must acquire.
                auto own = g->begin(idem::key::compose("T" + std::to_string(t) + "x" + std::to_string(i), "PAY", 1));
                if (own.status != idem::begin_status::acquired || own.ticket.succeed(1)) {
                    std::fprintf(stderr, "thread %d key %d: %s\n", t, i, idem::to_string(own.status));
                    wrong.fetch_add(1);
                }
            }
        });
    }
    for (auto& th : pool) th.join();

    int bad = wrong.load();
    for (int k = 0; k < keys; ++k) {
        if (executed[k].load() != 1) {
            std::fprintf(stderr, "key %d ran %d times\n", k, executed[k].load());
            ++bad;
        }
    }
    std::printf("tsan consumer: %d threads, %d keys, %d duplicates answered, %d wrong\n", threads, keys, duplicates.load(),
                bad);
    return bad == 0 ? 0 : 1;
}
