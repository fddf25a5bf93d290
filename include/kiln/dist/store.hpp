// The store of a process group: a small key-value server on TCP that rank 0 runs, and a client
// per connection. Ranks meet through it (who joined, with which world size, NCCL's unique id),
// wait on it (get blocks until another rank sets the key), and learn through it that a rank died:
// a connection that closes without saying bye marks its rank dead, and from then on every wait,
// and every watch (a connection that only waits for that news), fails with the reason.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::dist {

/// The server (rank 0 runs it on a thread of its own). Listens on host:port; port 0 takes any
/// free port (port() says which).
class StoreServer {
public:
    KILN_DECL StoreServer(const std::string& host, int port);
    KILN_DECL ~StoreServer();
    StoreServer(const StoreServer&) = delete;
    StoreServer& operator=(const StoreServer&) = delete;
    int port() const { return port_; }
    /// Waits until every connection that named its rank has said bye or closed (each rank's
    /// exit, orderly or after a failure the store told it of), at most timeout_s.
    KILN_DECL void wait_for_ranks(double timeout_s);

    struct State;

private:
    std::unique_ptr<State> s_;
    int port_ = 0;
};

/// One connection to the server. Methods throw DistError (message without an op: the process
/// group adds the user's op and line) when the server is gone, a wait times out, a rank died or
/// the store was aborted.
class StoreClient {
public:
    /// Connects, retrying until connect_timeout_s (rank 0 may not listen yet).
    KILN_DECL StoreClient(const std::string& host, int port, double connect_timeout_s);
    KILN_DECL ~StoreClient();
    StoreClient(const StoreClient&) = delete;
    StoreClient& operator=(const StoreClient&) = delete;

    /// Names this connection's rank: if it closes without bye(), the rank is dead for everyone.
    KILN_DECL void hello(int rank);
    KILN_DECL void set(const std::string& key, const std::string& value);
    /// The value of key, waiting at most timeout_s for a rank to set it.
    KILN_DECL std::string get(const std::string& key, double timeout_s);
    /// Adds delta to the integer at key (absent: 0) and returns the sum.
    KILN_DECL std::int64_t add(const std::string& key, std::int64_t delta);
    /// Sets key if it is absent (true); otherwise returns false and its value in `existing`.
    KILN_DECL bool set_if_absent(const std::string& key, const std::string& value, std::string* existing);
    KILN_DECL void erase(const std::string& key);
    /// Fails the store for everyone: every waiting and later get, and every watch, fails with `why`.
    KILN_DECL void abort(const std::string& why);
    /// An orderly goodbye: this connection's rank is not dead when it closes.
    KILN_DECL void bye();
    /// Starts a watch: the server answers once a rank died or the store was aborted. fd() becomes
    /// readable then (or when the server itself goes away); watch_result() reads the reason.
    KILN_DECL void watch();
    KILN_DECL std::string watch_result();
    int fd() const { return fd_; }
    const std::string& address() const { return address_; }

private:
    struct Reply;
    Reply request(unsigned char cmd, const std::string& key, const std::string& value, double wait_s);
    Reply read_reply(std::chrono::steady_clock::time_point deadline);
    std::string lost_text() const;
    int fd_ = -1;
    std::string address_;
};

}  // namespace kiln::dist

#if KILN_HEADER_ONLY
#include "kiln/dist/store_impl.hpp"
#endif
