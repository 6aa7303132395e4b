// tools/drill/fault_proxy.hpp: a fault-injecting TCP proxy on the loopback interface, for tests that
// need a slow network, a cut connection or a partition between a client and a server of their own.
//
// fault_proxy(target) listens on 127.0.0.1:port() (a free port chosen by the kernel) and forwards each
// connection to 127.0.0.1:target; it never connects anywhere else. Per connection and direction a
// reader thread stamps what it reads into a queue and a writer thread delivers it once the injected
// latency has passed, so pipelined traffic keeps flowing. Sockets are close-on-exec, so a server
// started by a shell (pg_ctl) never inherits one and keeps a cut connection open (Linux: accept4).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace idem::tool::drill {

/// A TCP proxy from 127.0.0.1:port() to 127.0.0.1:target with injectable latency, cuts and partitions.
/// Every public member may be called from any thread; the destructor stops and joins every thread.
class fault_proxy {
public:
    /// Listens on 127.0.0.1, port chosen by the kernel; throws std::runtime_error when it cannot.
    explicit fault_proxy(std::uint16_t target) : target_(target) {
        listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (listen_fd_ < 0) throw std::runtime_error("fault_proxy: socket() failed: errno " + std::to_string(errno));
        const int one = 1;
        (void)::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in addr = loopback(0);
        socklen_t len = sizeof addr;
        auto* const sa = reinterpret_cast<sockaddr*>(&addr);
        if (::bind(listen_fd_, sa, sizeof addr) != 0 || ::listen(listen_fd_, 128) != 0 ||
            ::getsockname(listen_fd_, sa, &len) != 0) {
            const int err = errno;
            ::close(listen_fd_);
            throw std::runtime_error("fault_proxy: bind/listen on 127.0.0.1 failed: errno " + std::to_string(err));
        }
        port_ = ntohs(addr.sin_port);
        try {
            acceptor_ = std::thread([this] { accept_loop(); });
        } catch (...) {
            ::close(listen_fd_);
            throw;
        }
    }
    ~fault_proxy() {
        stop_ = true;
        acceptor_.join();  // no connection is added from here on
        std::lock_guard lock(mu_);
        for (auto& c : conns_) cut(*c);
        for (auto& c : conns_) finish(*c);
        conns_.clear();
        ::close(listen_fd_);
    }
    fault_proxy(const fault_proxy&) = delete;
    fault_proxy& operator=(const fault_proxy&) = delete;

    /// The loopback port to connect to instead of the target's.
    std::uint16_t port() const { return port_; }
    /// Each chunk read from either side is delivered to the other no earlier than `one_way` after it was
    /// read (a round trip gains 2 * one_way). A chunk's delay is fixed when its turn comes. Order is kept.
    void set_latency(std::chrono::milliseconds one_way) { latency_ms_ = one_way.count(); }
    /// Cuts every open connection at once (both sockets shut down, so both peers see it die) and, until
    /// heal(), closes each new connection as soon as it is accepted (with a reset: the client fails fast).
    void partition() {
        std::lock_guard lock(mu_);
        partitioned_ = true;
        for (auto& c : conns_) cut(*c);
    }
    /// Until heal(), every byte of existing and new connections is silently dropped: connections stay
    /// open, nothing is delivered (packets vanish). Bytes dropped are lost for good, so a connection
    /// that lost some carries a broken stream after heal().
    void blackhole() { blackholed_ = true; }
    /// Ends partition() and blackhole(): connections cut stay cut, new connections are forwarded again.
    void heal() {
        std::lock_guard lock(mu_);
        partitioned_ = false;
        blackholed_ = false;
    }
    /// Connections accepted so far (including those refused by a partition).
    std::uint64_t connections() const { return connections_; }
    /// Bytes delivered so far, both directions together.
    std::uint64_t bytes() const { return bytes_; }

private:
    using clock = std::chrono::steady_clock;
    struct chunk {
        clock::time_point read_at;
        std::vector<char> data;
    };
    /// One direction of a connection: what the reader read and the writer has not delivered yet.
    struct direction {
        std::mutex m;
        std::condition_variable cv;
        std::deque<chunk> queue;
        bool eof = false;  // the reader ended; the writer half-closes once the queue is drained
    };
    /// Both fds stay open (and so never reused) until finish() has joined the four threads.
    struct connection {
        int client = -1, server = -1;
        std::atomic<bool> dead{false};
        std::atomic<int> running{0};
        direction up, down;  // up: client -> server
        std::vector<std::thread> threads;
    };

    static sockaddr_in loopback(std::uint16_t port) {
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(port);
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return addr;
    }
    /// Closes with a reset (linger 0), so the peer's next read or write fails at once.
    static void reset_close(int fd) {
        const linger hard{1, 0};
        (void)::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
        ::close(fd);
    }
    /// Kills a connection: both sockets shut down (both peers see it die) and every thread woken to end.
    static void cut(connection& c) {
        ::shutdown(c.client, SHUT_RDWR);
        ::shutdown(c.server, SHUT_RDWR);
        c.dead = true;
        for (direction* d : {&c.up, &c.down}) {
            std::lock_guard lock(d->m);  // so a writer between its check and its wait cannot miss it
            d->cv.notify_all();
        }
    }
    static void finish(connection& c) {
        for (auto& t : c.threads) t.join();
        ::close(c.client);
        ::close(c.server);
    }

    /// Chunks are forwarded as they come (libpq and PostgreSQL set TCP_NODELAY too): Nagle's
    /// algorithm against the peer's delayed ACK would add up to 40 ms stalls of its own.
    static void no_delay(int fd) {
        const int one = 1;
        (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }

    /// A socket connected to 127.0.0.1:target_, or -1. Sends (and a connect) give up every 100 ms so
    /// that the loops can look at their stop flags.
    int connect_target() {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        const timeval tick{0, 100'000};
        (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tick, sizeof tick);
        no_delay(fd);
        const sockaddr_in addr = loopback(target_);
        if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) return fd;
        if (errno == EINPROGRESS || errno == EINTR) {  // timed out or interrupted: it goes on in the background
            pollfd p{fd, POLLOUT, 0};
            int r = 0;
            while (!stop_ && ((r = ::poll(&p, 1, 100)) == 0 || (r < 0 && errno == EINTR))) {
            }
            int err = 0;
            socklen_t len = sizeof err;
            if (r > 0 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) return fd;
        }
        ::close(fd);
        return -1;
    }

    void accept_loop() {
        while (!stop_) {
            pollfd p{listen_fd_, POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;  // timeout or EINTR: look at stop_ again
            const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (client < 0) continue;
            ++connections_;
            const timeval tick{0, 100'000};
            (void)::setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &tick, sizeof tick);
            no_delay(client);
            const int server = is_partitioned() ? -1 : connect_target();
            std::lock_guard lock(mu_);
            reap();
            if (server < 0 || partitioned_) {
                reset_close(client);
                if (server >= 0) reset_close(server);
                continue;
            }
            auto c = std::make_shared<connection>();
            c->client = client;
            c->server = server;
            try {
                start(*c, [this, p = c.get()] { read_loop(*p, p->up, p->client); });
                start(*c, [this, p = c.get()] { write_loop(*p, p->up, p->server); });
                start(*c, [this, p = c.get()] { read_loop(*p, p->down, p->server); });
                start(*c, [this, p = c.get()] { write_loop(*p, p->down, p->client); });
            } catch (...) {  // no thread to be had: drop this connection
                cut(*c);
                finish(*c);
                continue;
            }
            conns_.push_back(std::move(c));
        }
    }
    template <class Fn>
    static void start(connection& c, Fn fn) {
        ++c.running;
        try {
            c.threads.emplace_back([&c, fn] {
                fn();
                --c.running;
            });
        } catch (...) {
            --c.running;
            throw;
        }
    }
    /// Joins and closes the connections whose four threads have ended. Called with mu_ held.
    void reap() {
        std::erase_if(conns_, [](const std::shared_ptr<connection>& c) {
            if (c->running != 0) return false;
            finish(*c);
            return true;
        });
    }
    bool is_partitioned() {
        std::lock_guard lock(mu_);
        return partitioned_;
    }

    /// Reads `from` into d's queue, each chunk stamped with the time it was read, until EOF (then the
    /// writer half-closes its side), an error (the connection is cut) or the connection dies.
    void read_loop(connection& c, direction& d, int from) {
        std::vector<char> buf(64 * 1024);
        while (!c.dead && !stop_) {
            pollfd p{from, POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;  // timeout or EINTR
            const ssize_t n = ::recv(from, buf.data(), buf.size(), 0);
            if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            if (n < 0) cut(c);
            if (n <= 0) break;
            if (blackholed_) continue;
            std::lock_guard lock(d.m);
            d.queue.push_back({clock::now(), std::vector<char>(buf.data(), buf.data() + n)});
            d.cv.notify_all();
        }
        std::lock_guard lock(d.m);
        d.eof = true;
        d.cv.notify_all();
    }
    /// Delivers d's chunks to `to`, each no earlier than its stamp plus the latency, in order.
    void write_loop(connection& c, direction& d, int to) {
        std::unique_lock lock(d.m);
        for (;;) {
            d.cv.wait(lock, [&] { return c.dead || !d.queue.empty() || d.eof; });
            if (c.dead) return;
            if (d.queue.empty()) {  // the reader saw EOF and everything is delivered: pass the FIN on
                ::shutdown(to, SHUT_WR);
                return;
            }
            const auto due = d.queue.front().read_at + std::chrono::milliseconds(latency_ms_.load());
            if (d.cv.wait_until(lock, due, [&] { return c.dead.load(); })) return;  // injected latency
            const chunk next = std::move(d.queue.front());
            d.queue.pop_front();
            lock.unlock();
            if (!blackholed_) {
                if (!send_all(c, to, next.data)) return cut(c);
                bytes_ += next.data.size();
            }
            lock.lock();
        }
    }
    /// Sends all of data; false when the peer is gone or the connection died meanwhile.
    bool send_all(connection& c, int to, const std::vector<char>& data) {
        std::size_t sent = 0;
        while (sent < data.size()) {
            if (c.dead || stop_) return false;
            const ssize_t n = ::send(to, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
            if (n > 0) sent += static_cast<std::size_t>(n);
            else if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) return false;
        }
        return true;
    }

    const std::uint16_t target_;
    std::uint16_t port_ = 0;
    int listen_fd_ = -1;
    std::atomic<bool> stop_{false};
    std::atomic<bool> blackholed_{false};
    std::atomic<std::int64_t> latency_ms_{0};
    std::atomic<std::uint64_t> connections_{0}, bytes_{0};
    std::mutex mu_;  // guards partitioned_ and conns_
    bool partitioned_ = false;
    std::vector<std::shared_ptr<connection>> conns_;
    std::thread acceptor_;
};

}  // namespace idem::tool::drill
