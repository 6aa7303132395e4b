// idle_bench: what an idle durable guard costs the machine. A durable SQLite guard with default
// options (its maintenance thread too) makes one claim, then idles for --seconds (10); the program
// prints the process's CPU time over the idle span (utime + stime from /proc/self/stat) and the
// voluntary context switches of all its threads in it (/proc/self/task/*/status: each is a wake-up
// after a sleep), as JSON. docs/operations.md ("An idle guard") has the figures.
//
//   idem-idle-bench [--seconds N] [--dir DIR]
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>

#include <unistd.h>

namespace {

/// utime + stime of this process (/proc/self/stat fields 14 and 15), in milliseconds.
double process_cpu_ms() {
    std::ifstream in("/proc/self/stat");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::istringstream fields(text.substr(text.rfind(')') + 2));  // after "pid (comm) "
    std::string f;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; fields >> f; ++i) {  // the first field read is field 3 (state)
        if (i == 14) utime = std::stoull(f);
        if (i == 15) {
            stime = std::stoull(f);
            break;
        }
    }
    return 1000.0 * static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

/// Voluntary context switches of every thread of this process, summed.
unsigned long long voluntary_switches() {
    unsigned long long sum = 0;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
        std::ifstream in(task.path() / "status");
        std::string line;
        while (std::getline(in, line))
            if (line.rfind("voluntary_ctxt_switches:", 0) == 0) sum += std::stoull(line.substr(line.find(':') + 1));
    }
    return sum;
}

[[noreturn]] void usage(const std::string& why) {
    std::cerr << "idem-idle-bench: " << why << "\nusage: idem-idle-bench [--seconds N (1..3600)] [--dir DIR]\n";
    std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
    long seconds = 10;
    std::filesystem::path dir;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (i + 1 >= argc) usage("option '" + std::string(a) + "' needs a value");
        if (a == "--seconds") {
            char* end = nullptr;
            seconds = std::strtol(argv[++i], &end, 10);
            if (*end != '\0' || seconds < 1 || seconds > 3600)
                usage("--seconds '" + std::string(argv[i]) + "' must be a whole number from 1 to 3600");
        } else if (a == "--dir") {
            dir = argv[++i];
        } else {
            usage("unknown option '" + std::string(a) + "'");
        }
    }
    const bool own_dir = dir.empty();
    if (own_dir) {
        std::string tmpl = (std::filesystem::temp_directory_path() / "idem-idle-XXXXXX").string();
        if (::mkdtemp(tmpl.data()) == nullptr) usage("cannot create a temporary directory");
        dir = tmpl;
    }
    double cpu_ms = 0, wall_ms = 0;
    unsigned long long wakeups = 0;
    {
        idem::durable_guard g(std::make_unique<idem::sqlite_store>((dir / "idle.db").string()));
        {
            auto r = g->begin(idem::key("IDLE_PAY_v1"));
            if (r.status != idem::begin_status::acquired || r.ticket.succeed(1)) {
                std::cerr << "idem-idle-bench: the first claim was not granted and recorded\n";
                return 1;
            }
        }
        if (!g.flush()) {
            std::cerr << "idem-idle-bench: the first claim's rows did not commit: " << g.last_store_error() << "\n";
            return 1;
        }
        const auto w0 = voluntary_switches();
        const double c0 = process_cpu_ms();
        const auto t0 = std::chrono::steady_clock::now();
        std::this_thread::sleep_for(std::chrono::seconds(seconds));  // the idle span being measured
        cpu_ms = process_cpu_ms() - c0;
        wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        wakeups = voluntary_switches() - w0;
    }
    if (own_dir) std::filesystem::remove_all(dir);
    std::printf(
        "{\"store\": \"sqlite\", \"idle_ms\": %.0f, \"process_cpu_ms\": %.1f, \"core_share_percent\": %.2f, "
        "\"thread_wakeups\": %llu}\n",
        wall_ms, cpu_ms, 100.0 * cpu_ms / wall_ms, wakeups);
    return 0;
}
