// tools/drill/process.hpp: a worker process of a crash drill: started with its stdout on a pipe,
// read line by line while it runs, and SIGKILLed at the moment the drill chooses. `idem drill` starts
// `idem drill-worker` with it; tests/crash_test.cpp starts itself again as its child.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "idem/error.hpp"

extern char** environ;

namespace idem::tool::drill {

/// The path of this program, to start copies of it as workers.
inline std::string self_exe() {
    std::error_code ec;
    const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) throw idem::error(idem::errc::invalid_argument, "cannot find this executable (/proc/self/exe): " + ec.message());
    return p.string();
}

/// A worker process with its stdout on a pipe; SIGKILLed and reaped at scope exit if still running.
class worker_process {
public:
    using clock_type = std::chrono::steady_clock;

    /// quiet: the worker's stderr goes to /dev/null (a second writer whose refusal is expected).
    /// env: NAME=VALUE entries that replace or extend this process's environment for the worker.
    worker_process(const std::string& exe, const std::vector<std::string>& args, bool quiet = false,
                   const std::vector<std::string>& env = {}) {
        int fds[2];
        if (::pipe2(fds, O_CLOEXEC) != 0)
            throw idem::error(idem::errc::invalid_argument, std::string("pipe: ") + std::strerror(errno));
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);  // dup2 clears CLOEXEC on stdout
        if (quiet) posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
        std::vector<std::string> argv_s{exe};
        argv_s.insert(argv_s.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (std::string& s : argv_s) argv.push_back(s.data());
        argv.push_back(nullptr);
        std::vector<std::string> env_s;
        for (char** e = environ; *e != nullptr; ++e) {
            const std::string_view entry(*e);
            const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& mine) {
                const std::size_t eq = mine.find('=');
                return entry.size() > eq && entry.substr(0, eq + 1) == std::string_view(mine).substr(0, eq + 1);
            });
            if (!replaced) env_s.emplace_back(entry);
        }
        env_s.insert(env_s.end(), env.begin(), env.end());
        std::vector<char*> envp;
        for (std::string& s : env_s) envp.push_back(s.data());
        envp.push_back(nullptr);
        const int rc = ::posix_spawn(&pid_, exe.c_str(), &fa, nullptr, argv.data(), envp.data());
        posix_spawn_file_actions_destroy(&fa);
        ::close(fds[1]);
        fd_ = fds[0];
        if (rc != 0) {
            ::close(fd_);
            throw idem::error(idem::errc::invalid_argument,
                              "cannot start '" + exe + (args.empty() ? "" : " " + args.front()) + "': " + std::strerror(rc));
        }
        ::fcntl(fd_, F_SETFL, O_NONBLOCK);
        started_ = clock_type::now();
    }
    ~worker_process() {
        if (pid_ > 0 && !reaped_) {
            ::kill(pid_, SIGKILL);
            wait();
        }
        if (fd_ >= 0) ::close(fd_);
    }
    worker_process(const worker_process&) = delete;
    worker_process& operator=(const worker_process&) = delete;

    /// Reads what the worker wrote, waiting up to `timeout` for something; returns complete lines.
    std::vector<std::string> read_lines(std::chrono::milliseconds timeout) {
        pollfd p{fd_, POLLIN, 0};
        if (!eof_) ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, timeout.count())));
        char buf[4096];
        for (;;) {
            const ssize_t n = ::read(fd_, buf, sizeof buf);
            if (n > 0) {
                pending_.append(buf, static_cast<std::size_t>(n));
                continue;
            }
            if (n == 0) eof_ = true;
            break;  // EAGAIN: nothing more for now
        }
        std::vector<std::string> out;
        std::size_t nl;
        while ((nl = pending_.find('\n')) != std::string::npos) {
            out.push_back(pending_.substr(0, nl));
            pending_.erase(0, nl + 1);
        }
        return out;
    }

    /// Reads complete lines until `deadline` or the end of the worker's output (false then).
    bool read_until(clock_type::time_point deadline, std::vector<std::string>& out) {
        for (;;) {
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock_type::now());
            for (std::string& l : read_lines(std::max(left, std::chrono::milliseconds::zero()))) out.push_back(std::move(l));
            if (eof_) return false;
            if (clock_type::now() >= deadline) return true;
        }
    }

    /// True once the process has exited (reaps it).
    bool exited() {
        if (reaped_) return true;
        int status = 0;
        const pid_t r = ::waitpid(pid_, &status, WNOHANG);
        if (r == pid_) {
            reaped_ = true;
            status_ = status;
        }
        return reaped_;
    }
    void kill_now() {
        if (!reaped_) ::kill(pid_, SIGKILL);
    }
    void wait() {
        if (reaped_) return;
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        reaped_ = true;
        status_ = status;
    }
    [[nodiscard]] bool eof() const noexcept { return eof_; }
    [[nodiscard]] int status() const noexcept { return status_; }
    [[nodiscard]] clock_type::time_point started() const noexcept { return started_; }

private:
    pid_t pid_ = -1;
    int fd_ = -1;
    bool reaped_ = false;
    bool eof_ = false;
    int status_ = 0;
    std::string pending_;
    clock_type::time_point started_;
};

/// "exited with code 3", "killed by signal Killed", ...: a wait status for people.
inline std::string describe_status(int status) {
    if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return std::string("killed by signal ") + ::strsignal(WTERMSIG(status));
    return "ended with status " + std::to_string(status);
}

}  // namespace idem::tool::drill
