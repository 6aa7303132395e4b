// tools/progress.hpp: a progress bar on stderr, drawn by its own thread a few times a second.
//
// Shown only when stderr is a terminal and the caller wants it (never with --json), so logs and
// pipes stay clean. The workers publish their counts; the bar only samples them.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "report.hpp"

namespace idem::tool {

class progress_bar {
public:
    /// `sample` returns how many of `total` units are done; it is called from the bar's thread.
    progress_bar(bool wanted, std::uint64_t total, std::function<std::uint64_t()> sample, std::string unit)
        : enabled_(wanted && ::isatty(STDERR_FILENO) == 1),
          total_(total),
          sample_(std::move(sample)),
          unit_(std::move(unit)) {}
    ~progress_bar() { stop(); }
    progress_bar(const progress_bar&) = delete;
    progress_bar& operator=(const progress_bar&) = delete;

    void start() {
        if (!enabled_ || thread_.joinable()) return;
        start_ = std::chrono::steady_clock::now();
        thread_ = std::thread([this] { loop(); });
    }

    /// Stops the thread and erases the bar's line.
    void stop() {
        if (!thread_.joinable()) return;
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        cv_.notify_all();
        thread_.join();
        std::fputs("\r\033[2K", stderr);
        std::fflush(stderr);
    }

private:
    void loop() {
        std::unique_lock lock(mutex_);
        while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopping_; })) draw();
    }

    void draw() const {
        constexpr int width = 32;
        const std::uint64_t done = std::min(sample_(), total_);
        const double frac = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        const double rate = secs > 0 ? static_cast<double>(done) / secs : 0.0;
        const int filled = static_cast<int>(frac * width);
        std::string bar(static_cast<std::size_t>(filled), '#');
        bar.append(static_cast<std::size_t>(width - filled), '.');
        char eta[32] = "--";
        if (rate > 0 && done < total_) std::snprintf(eta, sizeof eta, "%.0fs", static_cast<double>(total_ - done) / rate);
        std::fprintf(stderr, "\r\033[2K[%s] %5.1f%%  %s/%s %s  %s/s  ETA %s", bar.c_str(), frac * 100.0,
                     grouped(done).c_str(), grouped(total_).c_str(), unit_.c_str(),
                     grouped(static_cast<std::uint64_t>(rate)).c_str(), eta);
        std::fflush(stderr);
    }

    bool enabled_;
    std::uint64_t total_;
    std::function<std::uint64_t()> sample_;
    std::string unit_;
    std::chrono::steady_clock::time_point start_{};
    std::mutex mutex_;
    std::condition_variable cv_;
    bool stopping_ = false;
    std::thread thread_;
};

}  // namespace idem::tool
