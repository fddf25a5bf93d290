// KILN_LOGS: named log channels (graph_breaks, recompiles, guards, fusion, output_code, cache, graph,
// profile, combo).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <set>
#include <string>

namespace kiln::debug {

/// The channels KILN_LOGS turns on ("all" for every one), plus any set_log_channels adds.
class Logs {
public:
    static Logs& instance() {
        static Logs l;
        return l;
    }
    bool on(const std::string& channel) const {
        std::lock_guard lock(mu_);
        return all_ || channels_.count(channel) > 0;
    }
    void set(const std::string& spec) {
        std::lock_guard lock(mu_);
        parse(spec);
    }
    /// Where log lines go (stderr by default); tests capture them here.
    void set_sink(std::function<void(const std::string&)> sink) {
        std::lock_guard lock(mu_);
        sink_ = std::move(sink);
    }
    void write(const std::string& channel, const std::string& line) {
        std::function<void(const std::string&)> sink;
        {
            std::lock_guard lock(mu_);
            if (!(all_ || channels_.count(channel))) return;
            sink = sink_;
        }
        const std::string msg = "[kiln:" + channel + "] " + line;
        if (sink) sink(msg);
        else std::fprintf(stderr, "%s\n", msg.c_str());
    }

private:
    Logs() {
        if (const char* env = std::getenv("KILN_LOGS")) parse(env);
    }
    void parse(const std::string& spec) {
        channels_.clear();
        all_ = false;
        std::size_t b = 0;
        while (b <= spec.size()) {
            std::size_t e = spec.find(',', b);
            if (e == std::string::npos) e = spec.size();
            const std::string c = spec.substr(b, e - b);
            if (c == "all") all_ = true;
            else if (!c.empty()) channels_.insert(c);
            b = e + 1;
        }
    }
    mutable std::mutex mu_;
    std::set<std::string> channels_;
    bool all_ = false;
    std::function<void(const std::string&)> sink_;
};

inline bool log_on(const std::string& channel) { return Logs::instance().on(channel); }
inline void log(const std::string& channel, const std::string& line) { Logs::instance().write(channel, line); }

}  // namespace kiln::debug

namespace kiln {
/// Turns log channels on, like KILN_LOGS ("graph_breaks,recompiles", "all", "" for none).
inline void set_logs(const std::string& spec) { debug::Logs::instance().set(spec); }
}  // namespace kiln
