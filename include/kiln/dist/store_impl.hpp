// The store's server and client (compiled once in separate compilation). Included at the end of
// kiln/dist/store.hpp (header-only mode, or by kiln/src.hpp), never on its own.
//
// Wire format, both ways little-endian as the host writes it (loopback or one cluster):
//   request: cmd (1 byte), key length (4), value length (8), key, value
//   reply:   status (1 byte), value length (8), value
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::dist {

namespace store_detail {

enum Cmd : unsigned char { hello = 1, set = 2, get = 3, add = 4, set_if_absent = 5, erase = 6, abort = 7, bye = 8, watch = 9 };
enum Status : unsigned char { ok = 0, timed_out = 1, failed = 2, exists = 3, bad = 4 };

using Clock = std::chrono::steady_clock;

inline std::string pack_reply(Status st, const std::string& v) {
    std::string r(9, '\0');
    r[0] = static_cast<char>(st);
    const std::uint64_t n = v.size();
    std::memcpy(&r[1], &n, 8);
    return r + v;
}

/// Sends all of s (false when the peer is gone). MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE.
inline bool send_all(int fd, const std::string& s) {
    std::size_t off = 0;
    while (off < s.size()) {
        const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += static_cast<std::size_t>(n);
    }
    return true;
}

/// Reads exactly n bytes, waiting at most until `deadline` (false: the peer closed or time ran out;
/// `closed` says which).
inline bool recv_all(int fd, char* out, std::size_t n, Clock::time_point deadline, bool& closed) {
    std::size_t off = 0;
    closed = false;
    while (off < n) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) return false;
        pollfd p{fd, POLLIN, 0};
        const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        const ssize_t k = ::recv(fd, out + off, n - off, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            closed = true;
            return false;
        }
        off += static_cast<std::size_t>(k);
    }
    return true;
}

/// "1.5" for 1.5 seconds (messages).
inline std::string seconds_text(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", s);
    return b;
}

inline int millis(double seconds) {
    return seconds >= 2e6 ? -1 : static_cast<int>(std::ceil(std::max(0.0, seconds) * 1000));
}

}  // namespace store_detail

// ---------------------------------------------------------------- server
struct StoreServer::State {
    struct Conn {
        int fd = -1;
        std::string in;  // bytes received, not yet a whole request
        int rank = -1;   // named by hello
        bool bye = false;
    };
    struct Waiter {
        int fd;
        std::string key;
        store_detail::Clock::time_point deadline;
        bool forever;
    };
    int listen_fd = -1;
    int wake[2] = {-1, -1};
    std::thread loop;
    std::mutex m;  // guards what wait_for_ranks reads: conns' rank/bye, failure
    std::map<int, Conn> conns;
    std::map<std::string, std::string> kv;
    std::vector<Waiter> waiters;
    std::vector<int> watchers;
    std::string failure;  // non-empty: why every wait fails (a rank died, or abort)
    bool stop = false;

    void reply(int fd, store_detail::Status st, const std::string& v = {}) { store_detail::send_all(fd, store_detail::pack_reply(st, v)); }

    /// Fails every waiter and watcher with `why` (the first reason sticks).
    void fail(const std::string& why) {
        if (failure.empty()) failure = why;
        for (const Waiter& w : waiters) reply(w.fd, store_detail::failed, failure);
        waiters.clear();
        for (int fd : watchers) reply(fd, store_detail::failed, failure);
        watchers.clear();
    }
    void wake_waiters(const std::string& key) {
        const auto it = kv.find(key);
        std::vector<Waiter> keep;
        for (Waiter& w : waiters) {
            if (w.key == key) reply(w.fd, store_detail::ok, it->second);
            else keep.push_back(std::move(w));
        }
        waiters = std::move(keep);
    }
    void handle(Conn& c, unsigned char cmd, const std::string& key, const std::string& val) {
        using namespace store_detail;
        switch (cmd) {
            case hello: {
                std::lock_guard l(m);
                c.rank = std::atoi(val.c_str());
                reply(c.fd, ok);
                return;
            }
            case set:
                kv[key] = val;
                reply(c.fd, ok);
                wake_waiters(key);
                return;
            case get: {
                if (auto it = kv.find(key); it != kv.end()) return reply(c.fd, ok, it->second);
                if (!failure.empty()) return reply(c.fd, failed, failure);
                const bool forever = val.empty() || val[0] == '-';
                const auto deadline = Clock::now() + std::chrono::milliseconds(forever ? 0 : std::atoll(val.c_str()));
                waiters.push_back({c.fd, key, deadline, forever});
                return;
            }
            case add: {
                const std::int64_t v = (kv.count(key) ? std::atoll(kv[key].c_str()) : 0) + std::atoll(val.c_str());
                kv[key] = std::to_string(v);
                reply(c.fd, ok, kv[key]);
                wake_waiters(key);
                return;
            }
            case set_if_absent:
                if (auto it = kv.find(key); it != kv.end()) return reply(c.fd, exists, it->second);
                kv[key] = val;
                reply(c.fd, ok);
                wake_waiters(key);
                return;
            case erase:
                kv.erase(key);
                reply(c.fd, ok);
                return;
            case abort: {
                std::lock_guard l(m);
                reply(c.fd, ok);
                fail(val);
                return;
            }
            case bye: {
                std::lock_guard l(m);
                c.bye = true;
                reply(c.fd, ok);
                return;
            }
            case watch:
                if (!failure.empty()) return reply(c.fd, failed, failure);
                watchers.push_back(c.fd);
                return;
            default: reply(c.fd, bad, "unknown request " + std::to_string(cmd));
        }
    }
    /// Parses and handles every whole request in c.in.
    void drain(Conn& c) {
        while (c.in.size() >= 13) {
            std::uint32_t kl = 0;
            std::uint64_t vl = 0;
            std::memcpy(&kl, c.in.data() + 1, 4);
            std::memcpy(&vl, c.in.data() + 5, 8);
            if (c.in.size() < 13 + kl + vl) return;
            const unsigned char cmd = static_cast<unsigned char>(c.in[0]);
            std::string key = c.in.substr(13, kl), val = c.in.substr(13 + kl, vl);
            c.in.erase(0, 13 + kl + vl);
            handle(c, cmd, key, val);
        }
    }
    void close_conn(int fd) {
        std::lock_guard l(m);
        const auto it = conns.find(fd);
        if (it == conns.end()) return;
        const Conn c = it->second;
        conns.erase(it);
        ::close(fd);
        waiters.erase(std::remove_if(waiters.begin(), waiters.end(), [&](const Waiter& w) { return w.fd == fd; }), waiters.end());
        watchers.erase(std::remove(watchers.begin(), watchers.end(), fd), watchers.end());
        if (c.rank >= 0 && !c.bye)
            fail("rank " + std::to_string(c.rank) + " exited or lost its connection to the store (it closed without saying goodbye)");
    }
    void run() {
        using namespace store_detail;
        std::vector<pollfd> fds;
        while (true) {
            fds.clear();
            fds.push_back({wake[0], POLLIN, 0});
            fds.push_back({listen_fd, POLLIN, 0});
            for (const auto& [fd, c] : conns) fds.push_back({fd, POLLIN, 0});
            int timeout = 200;
            const auto now = Clock::now();
            for (const Waiter& w : waiters)
                if (!w.forever)
                    timeout = std::min<int>(timeout, static_cast<int>(std::max<long long>(
                                                         0, std::chrono::duration_cast<std::chrono::milliseconds>(w.deadline - now).count() + 1)));
            const int r = ::poll(fds.data(), fds.size(), timeout);
            if (r < 0 && errno != EINTR) break;
            if (fds[0].revents) {
                char b[16];
                (void)!::read(wake[0], b, sizeof b);
                if (stop) break;
            }
            if (fds[1].revents & POLLIN) {
                const int fd = ::accept(listen_fd, nullptr, nullptr);
                if (fd >= 0) {
                    const int one = 1;
                    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    std::lock_guard l(m);
                    conns[fd].fd = fd;
                }
            }
            for (std::size_t i = 2; i < fds.size(); ++i) {
                if (!fds[i].revents) continue;
                const int fd = fds[i].fd;
                char buf[1 << 16];
                const ssize_t k = ::recv(fd, buf, sizeof buf, 0);
                if (k < 0 && errno == EINTR) continue;
                if (k <= 0) {
                    close_conn(fd);
                    continue;
                }
                Conn& c = conns[fd];
                c.in.append(buf, static_cast<std::size_t>(k));
                drain(c);
            }
            // waits whose time ran out
            const auto t = Clock::now();
            std::vector<Waiter> keep;
            for (Waiter& w : waiters) {
                if (!w.forever && w.deadline <= t) reply(w.fd, timed_out);
                else keep.push_back(std::move(w));
            }
            waiters = std::move(keep);
        }
    }
};

KILN_DECL StoreServer::StoreServer(const std::string& host, int port) : s_(std::make_unique<State>()) {
    State& s = *s_;
    s.listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s.listen_fd < 0) throw DistError(std::string("cannot make the store's socket: ") + std::strerror(errno));
    const int one = 1;
    ::setsockopt(s.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (host.empty() || host == "0.0.0.0") a.sin_addr.s_addr = htonl(INADDR_ANY);
    else if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
        ::close(s.listen_fd);
        throw DistError("the store's address '" + host + "' is not an IPv4 address");
    }
    if (::bind(s.listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s.listen_fd, 128) != 0) {
        const std::string why = std::strerror(errno);
        ::close(s.listen_fd);
        throw DistError("cannot listen on " + host + ":" + std::to_string(port) + " for the store (" + why +
                        "); is another job using MASTER_PORT " + std::to_string(port) + "?");
    }
    socklen_t len = sizeof a;
    ::getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    if (::pipe2(s.wake, O_CLOEXEC) != 0) {
        ::close(s.listen_fd);
        throw DistError(std::string("cannot make the store's wake pipe: ") + std::strerror(errno));
    }
    s.loop = std::thread([&s] { s.run(); });
}

KILN_DECL StoreServer::~StoreServer() {
    State& s = *s_;
    s.stop = true;
    (void)!::write(s.wake[1], "x", 1);
    if (s.loop.joinable()) s.loop.join();
    for (const auto& [fd, c] : s.conns) ::close(fd);
    ::close(s.listen_fd);
    ::close(s.wake[0]);
    ::close(s.wake[1]);
}

KILN_DECL void StoreServer::wait_for_ranks(double timeout_s) {
    const auto deadline = store_detail::Clock::now() + std::chrono::milliseconds(store_detail::millis(timeout_s));
    while (store_detail::Clock::now() < deadline) {
        {
            std::lock_guard l(s_->m);
            bool pending = false;
            for (const auto& [fd, c] : s_->conns) pending = pending || (c.rank >= 0 && !c.bye);
            if (!pending) return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

// ---------------------------------------------------------------- client
struct StoreClient::Reply {
    store_detail::Status status;
    std::string value;
};

KILN_DECL StoreClient::StoreClient(const std::string& host, int port, double connect_timeout_s)
    : address_(host + ":" + std::to_string(port)) {
    using namespace store_detail;
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (const int e = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); e != 0)
        throw DistError("cannot resolve the store's host '" + host + "': " + ::gai_strerror(e));
    const auto deadline = Clock::now() + std::chrono::milliseconds(millis(connect_timeout_s));
    std::string why;
    while (true) {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd_ >= 0 && ::connect(fd_, res->ai_addr, res->ai_addrlen) == 0) break;
        why = std::strerror(errno);
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
        if (Clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::freeaddrinfo(res);
    if (fd_ < 0)
        throw DistError("cannot reach the store at " + address_ + " within " + store_detail::seconds_text(connect_timeout_s) + " s (" + why +
                        "); is rank 0 running?");
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

KILN_DECL StoreClient::~StoreClient() {
    if (fd_ >= 0) ::close(fd_);
}

KILN_DECL StoreClient::Reply StoreClient::request(unsigned char cmd, const std::string& key, const std::string& value,
                                                  double wait_s) {
    using namespace store_detail;
    std::string msg(13, '\0');
    msg[0] = static_cast<char>(cmd);
    const std::uint32_t kl = static_cast<std::uint32_t>(key.size());
    const std::uint64_t vl = value.size();
    std::memcpy(&msg[1], &kl, 4);
    std::memcpy(&msg[5], &vl, 8);
    msg += key;
    msg += value;
    if (!send_all(fd_, msg)) throw DistError(lost_text());
    if (cmd == store_detail::watch) return {ok, {}};
    // the server answers a timed wait itself; the margin covers a server that is gone silently
    Reply r = read_reply(wait_s < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(millis(wait_s) + 30000));
    if (r.status == failed) throw DistError(r.value);
    if (r.status == bad) throw InternalError("kiln::dist: the store rejected a request: " + r.value);
    return r;
}

KILN_DECL StoreClient::Reply StoreClient::read_reply(std::chrono::steady_clock::time_point deadline) {
    using namespace store_detail;
    char head[9];
    bool closed = false;
    if (!recv_all(fd_, head, 9, deadline, closed))
        throw DistError(closed ? lost_text() : "the store at " + address_ + " stopped answering");
    Reply r{static_cast<Status>(static_cast<unsigned char>(head[0])), {}};
    std::uint64_t n = 0;
    std::memcpy(&n, head + 1, 8);
    r.value.resize(n);
    if (n && !recv_all(fd_, r.value.data(), n, deadline, closed)) throw DistError(lost_text());
    return r;
}

KILN_DECL std::string StoreClient::lost_text() const {
    return "lost the connection to the store at " + address_ + " (rank 0, which runs it, exited?)";
}

KILN_DECL void StoreClient::hello(int rank) { request(store_detail::hello, "", std::to_string(rank), 0); }
KILN_DECL void StoreClient::set(const std::string& key, const std::string& value) { request(store_detail::set, key, value, 0); }
KILN_DECL std::string StoreClient::get(const std::string& key, double timeout_s) {
    const int ms = store_detail::millis(timeout_s);
    Reply r = request(store_detail::get, key, std::to_string(ms), ms < 0 ? -1.0 : timeout_s);
    if (r.status == store_detail::timed_out)
        throw DistError("waited " + store_detail::seconds_text(timeout_s) + " s for '" + key + "' in the store; a rank did not reach this point");
    return std::move(r.value);
}
KILN_DECL std::int64_t StoreClient::add(const std::string& key, std::int64_t delta) {
    return std::atoll(request(store_detail::add, key, std::to_string(delta), 0).value.c_str());
}
KILN_DECL bool StoreClient::set_if_absent(const std::string& key, const std::string& value, std::string* existing) {
    Reply r = request(store_detail::set_if_absent, key, value, 0);
    if (r.status == store_detail::exists && existing) *existing = std::move(r.value);
    return r.status == store_detail::ok;
}
KILN_DECL void StoreClient::erase(const std::string& key) { request(store_detail::erase, key, "", 0); }
KILN_DECL void StoreClient::abort(const std::string& why) { request(store_detail::abort, "", why, 0); }
KILN_DECL void StoreClient::bye() { request(store_detail::bye, "", "", 0); }
KILN_DECL void StoreClient::watch() { request(store_detail::watch, "", "", 0); }
KILN_DECL std::string StoreClient::watch_result() {
    try {
        return read_reply(store_detail::Clock::now() + std::chrono::seconds(5)).value;
    } catch (const DistError& e) {
        return e.what();
    }
}

}  // namespace kiln::dist
