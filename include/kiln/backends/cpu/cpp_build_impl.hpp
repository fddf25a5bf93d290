// Building generated C++ kernels: toolchain discovery, the precompiled prelude, the compiler run,
// disk entries and dlopen, the background builders.
#pragma once
// Included at the end of kiln/backends/cpu/cpp_build.hpp (in header-only mode, or by kiln/src.hpp), never on its own.

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/backends/cpu/cpp_codegen.hpp"
#include "kiln/cache/files.hpp"
#include "kiln/debug/logs.hpp"
#include "kiln/version.hpp"

namespace kiln::detail::cppgen {

/// The compiler and everything a kernel's cache key holds besides its source.
struct Toolchain {
    std::string cxx;           ///< the compiler command
    std::string flags;         ///< flags of every build
    std::string includes;      ///< -I flags (kiln's headers, xsimd)
    std::string fingerprint;   ///< the compiler's file (path, size, mtime), flags, CPU, the headers' text, kiln's version
    std::filesystem::path dir; ///< <cache_dir()>/cpu
    std::filesystem::path prelude_dir;  ///< where kiln_cpu_prelude.hpp (and its .gch) live
    std::string unavailable;   ///< why nothing can be built ("" when it can)
};

inline std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

/// Runs a shell command; its exit status, and stdout+stderr in `out`.
inline int run_command(const std::string& cmd, std::string& out) {
    out.clear();
    FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
    if (!f) return -1;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    const int st = ::pclose(f);
    return st;
}

inline std::string read_text(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) return {};
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// The CPU's model and feature flags (what -march=native resolves from).
inline std::string cpu_identity() {
    std::ifstream in("/proc/cpuinfo");
    std::string line, model, flags;
    while (std::getline(in, line) && (model.empty() || flags.empty())) {
        if (model.empty() && line.rfind("model name", 0) == 0) model = line;
        if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
    }
    return model + "\n" + cache::to_hex(cache::hash64(flags));
}

inline std::vector<std::string> split_list(const std::string& s, char sep) {
    std::vector<std::string> parts;
    std::string cur;
    for (char c : s) {
        if (c == sep) {
            if (!cur.empty()) parts.push_back(cur);
            cur.clear();
        } else {
            cur += c;
        }
    }
    if (!cur.empty()) parts.push_back(cur);
    return parts;
}

inline Toolchain find_toolchain() {
    Toolchain t;
    namespace fs = std::filesystem;
    if (const char* e = std::getenv("KILN_CXX"); e && *e) t.cxx = e;
#ifdef KILN_CODEGEN_CXX
    if (t.cxx.empty()) t.cxx = KILN_CODEGEN_CXX;
#endif
    if (t.cxx.empty()) t.cxx = "c++";
    t.flags = "-std=c++20 -O3 -march=native -fPIC -DNDEBUG -w";
    if (const char* e = std::getenv("KILN_CXXFLAGS"); e && *e) t.flags += std::string(" ") + e;
    // kiln's own headers: where this file is (an absolute path when kiln is found through -I<abs>),
    // unless KILN_CODEGEN_INCLUDE names directories first
    std::vector<std::string> dirs;
    if (const char* e = std::getenv("KILN_CODEGEN_INCLUDE"); e && *e) dirs = split_list(e, ':');
    {
        fs::path here(__FILE__);
        if (here.is_absolute()) dirs.push_back(here.parent_path().parent_path().parent_path().parent_path().string());
    }
#ifdef KILN_CODEGEN_INCLUDE_DIRS
    for (const std::string& d : split_list(KILN_CODEGEN_INCLUDE_DIRS, ';')) dirs.push_back(d);
#endif
    std::string kiln_dir;
    std::error_code ec;
    for (const std::string& d : dirs)
        if (kiln_dir.empty() && fs::is_regular_file(fs::path(d) / "kiln" / "tables" / "op_table.hpp", ec)) kiln_dir = d;
    if (kiln_dir.empty()) {
        t.unavailable = "kiln's headers were not found (set KILN_CODEGEN_INCLUDE to the directory holding kiln/)";
        return t;
    }
    for (const std::string& d : dirs) t.includes += " -I" + shell_quote(d);
    // the compiler by its file (found on PATH as the shell would), not by running it: a first call
    // with every kernel on disk starts no process
    fs::path exe;
    if (t.cxx.find('/') != std::string::npos) {
        exe = t.cxx;
    } else if (const char* path = std::getenv("PATH")) {
        for (const std::string& d : split_list(path, ':'))
            if (exe.empty() && fs::is_regular_file(fs::path(d) / t.cxx, ec)) exe = fs::path(d) / t.cxx;
    }
    if (exe.empty() || !fs::is_regular_file(exe, ec)) {
        t.unavailable = "no C++ compiler '" + t.cxx + "' (set KILN_CXX)";
        return t;
    }
    exe = fs::canonical(exe, ec);
    const auto size = fs::file_size(exe, ec);
    const auto mtime = fs::last_write_time(exe, ec).time_since_epoch().count();
    const std::string version = exe.string() + " " + std::to_string(size) + " " + std::to_string(mtime);
    // the headers the kernels include, by content: an edited formula is a new key
    std::string headers;
    for (const char* h : {"kiln/tables/op_table.hpp", "kiln/tables/reduce_table.hpp", "kiln/tables/simd.hpp", "kiln/core/dtype.hpp", "kiln/core/half.hpp"})
        headers += read_text(fs::path(kiln_dir) / h);
    t.fingerprint = "kiln " KILN_VERSION_STRING "\n" + t.cxx + "\n" + version + "\n" + t.flags + "\n" + cpu_identity() + "\n" +
                    cache::to_hex(cache::hash64(headers)) + "\n" + cache::to_hex(cache::hash64(prelude)) + "\n";
    try {
        t.dir = fs::path(cache::cache_dir()) / "cpu";
        t.prelude_dir = t.dir / ("prelude-" + cache::to_hex(cache::hash64(t.fingerprint + t.includes)));
    } catch (const std::exception& e) {
        t.unavailable = std::string("no cache directory: ") + e.what();
    }
    return t;
}

/// Never destroyed: a builder thread still compiling at exit reads it until the engine joins it.
inline const Toolchain& toolchain() {
    static const Toolchain* t = new Toolchain(find_toolchain());
    return *t;
}

/// The disk entry of a kernel: <hex>.so and <hex>.meta (format line, the .so's size and
/// checksum, then the whole key text: read back only where every byte matches).
inline std::string key_text(const Toolchain& t, const std::string& source) { return t.fingerprint + source; }
inline std::string meta_text(const std::string& key, const std::string& so) {
    return "kiln-cpu-kernel 1\n" + std::to_string(so.size()) + "\n" + cache::to_hex(cache::hash64(so)) + "\n" + key;
}

struct Slot {
    std::atomic<void*> fn{nullptr};
    std::atomic<int> state{0};  // 0 queued, 1 loaded, 2 failed
    std::string source;
};

struct Engine {
    std::mutex mu;
    std::condition_variable done;  // a build finished
    std::condition_variable work;  // a build was queued
    std::unordered_map<std::string, std::shared_ptr<Slot>> slots;
    std::deque<std::shared_ptr<Slot>> queue;
    std::vector<std::thread> workers;
    int active = 0;
    bool stop = false;
    bool prelude_ready = false;
    bool prelude_probed = false;   // after the first failed build: does the prelude itself compile?
    std::string broken;            // why no kernel can build (the prelude does not compile): every group stays on the interpreter
    std::mutex prelude_mu;
    CpuCodegenStats stats;
    std::atomic<int> mode{-1};

    static Engine& instance() {
        static Engine e;
        return e;
    }
    // fork (the fuzzer's children, a user's worker processes): the builder threads do not exist in
    // the child, so it forgets them, starts its own on the next build, and queues again what the
    // parent's threads were building; the locks are held across the fork so none is copied taken.
    Engine() {
        ::pthread_atfork([] { Engine::instance().prelude_mu.lock(), Engine::instance().mu.lock(); },
                         [] { Engine::instance().mu.unlock(), Engine::instance().prelude_mu.unlock(); },
                         [] {
                             Engine& e = Engine::instance();
                             // the parent's std::thread objects are left alone (never joined or destroyed)
                             new std::vector<std::thread>(std::move(e.workers));
                             e.workers.clear();
                             e.active = 0;
                             e.queue.clear();
                             for (auto& [src, slot] : e.slots)
                                 if (slot->state.load() == 0) e.queue.push_back(slot);
                             e.mu.unlock();
                             e.prelude_mu.unlock();
                         });
    }
    ~Engine() {
        {
            std::lock_guard lock(mu);
            stop = true;
            queue.clear();
        }
        work.notify_all();
        for (std::thread& w : workers) w.join();
    }


    /// Writes the prelude header (and, with GCC, precompiles it) once per toolchain; false when
    /// the header cannot be written. A failed precompile only costs speed.
    bool ensure_prelude(const Toolchain& t) {
        std::lock_guard lock(prelude_mu);
        if (prelude_ready) return true;
        namespace fs = std::filesystem;
        const fs::path hdr = t.prelude_dir / "kiln_cpu_prelude.hpp", gch = t.prelude_dir / "kiln_cpu_prelude.hpp.gch";
        std::string why;
        if (read_text(hdr) != prelude && !cache::detail::write_file_atomically(hdr, std::string(prelude), why)) {
            debug::log("cache", "cpu codegen: cannot write " + hdr.string() + ": " + why);
            return false;
        }
        std::error_code ec;
        // GCC's precompiled headers (clang's work differently: kernels include the prelude instead)
        std::string version;
        const bool gcc = run_command(shell_quote(t.cxx) + " --version", version) == 0 &&
                         version.find("clang") == std::string::npos && version.find("Free Software Foundation") != std::string::npos;
        if (gcc && !fs::is_regular_file(gch, ec)) {
            const fs::path tmp = cache::detail::unique_temp_path(gch);
            std::string out;
            const auto t0 = std::chrono::steady_clock::now();
            const std::string cmd = shell_quote(t.cxx) + " " + t.flags + t.includes + " -x c++-header " + shell_quote(hdr.string()) +
                                    " -o " + shell_quote(tmp.string());
            if (run_command(cmd, out) == 0) {
                fs::rename(tmp, gch, ec);
                if (debug::log_on("cache"))
                    debug::log("cache", "cpu codegen: precompiled the prelude in " +
                                            std::to_string(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()) +
                                            " ms: " + gch.string());
            } else {
                debug::log("cache", "cpu codegen: precompiling the prelude failed (kernels include it instead): " + out);
            }
            fs::remove(tmp, ec);
        }
        prelude_ready = true;
        return true;
    }

    /// After a failed build: whether kiln's prelude compiles by itself with this toolchain (once per
    /// process). When it does not (its headers, xsimd's, are missing here, say), no kernel can
    /// build, so none is tried again: one failed compile per process, not one per kernel.
    void probe_prelude(const Toolchain& t) {
        std::lock_guard lock(prelude_mu);
        if (prelude_probed) return;
        prelude_probed = true;
        const std::filesystem::path hdr = t.prelude_dir / "kiln_cpu_prelude.hpp";
        std::string out;
        if (run_command(shell_quote(t.cxx) + " " + t.flags + t.includes + " -fsyntax-only -x c++ " + shell_quote(hdr.string()), out) == 0) return;
        std::string first = out.substr(0, out.find('\n'));
        if (first.size() > 300) first.resize(300);
        std::lock_guard l2(mu);
        broken = "kiln's CPU kernel prelude does not compile with " + t.cxx + " (" + first +
                 "); every compiled group runs on the interpreter in this process";
        debug::log("cache", "cpu codegen: " + broken);
    }

    /// The kernel of a disk entry, or nullptr (missing: `rejected` false; corrupt or foreign: true).
    void* load_entry(const std::filesystem::path& stem, const std::string& key, bool& rejected) {
        namespace fs = std::filesystem;
        rejected = false;
        std::error_code ec;
        const fs::path so = stem.string() + ".so", meta = stem.string() + ".meta";
        if (!fs::is_regular_file(meta, ec) || !fs::is_regular_file(so, ec)) return nullptr;
        const std::string m = read_text(meta), bytes = read_text(so);
        if (m != meta_text(key, bytes)) {
            rejected = true;
            debug::log("cache", "cpu codegen: rejected " + so.string() + " (checksum or key mismatch); rebuilding");
            return nullptr;
        }
        void* h = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
        void* f = h ? ::dlsym(h, "kiln_kernel") : nullptr;
        if (!f) {
            rejected = true;
            const char* e = ::dlerror();
            debug::log("cache", "cpu codegen: cannot load " + so.string() + ": " + (e ? e : "no kiln_kernel") + "; rebuilding");
            return nullptr;
        }
        return f;
    }

    /// Compiles a slot's source, stores the entry, loads it. Runs on a builder thread.
    void* build(const std::string& source) {
        namespace fs = std::filesystem;
        const Toolchain& t = toolchain();
        const std::string key = key_text(t, source), hex = cache::to_hex(cache::hash64(key));
        const fs::path stem = t.dir / hex;
        {
            std::lock_guard lock(mu);
            if (!broken.empty()) return nullptr;
        }
        if (!ensure_prelude(t)) return nullptr;
        std::string why;
        const fs::path src = stem.string() + ".cpp";
        if (!cache::detail::write_file_atomically(src, source, why)) {
            debug::log("cache", "cpu codegen: " + why);
            return nullptr;
        }
        const fs::path tmp = cache::detail::unique_temp_path(stem.string() + ".so");
        const std::string cmd = shell_quote(t.cxx) + " " + t.flags + " -shared -I" + shell_quote(t.prelude_dir.string()) + t.includes + " " +
                                shell_quote(src.string()) + " -o " + shell_quote(tmp.string());
        const auto t0 = std::chrono::steady_clock::now();
        std::string out;
        const int rc = run_command(cmd, out);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        {
            std::lock_guard lock(mu);
            ++stats.builds;
            stats.build_ms += ms;
            if (rc != 0) ++stats.build_failures;
        }
        std::error_code ec;
        if (rc != 0) {
            fs::remove(tmp, ec);
            debug::log("cache", "cpu codegen: building " + src.string() + " failed (the interpreter runs this group): " + cmd + "\n" + out);
            probe_prelude(t);
            return nullptr;
        }
        const std::string bytes = read_text(tmp);
        fs::rename(tmp, stem.string() + ".so", ec);
        if (ec || !cache::detail::write_file_atomically(stem.string() + ".meta", meta_text(key, bytes), why)) {
            fs::remove(tmp, ec);
            debug::log("cache", "cpu codegen: cannot store " + stem.string() + ".so: " + (ec ? ec.message() : why));
            return nullptr;
        }
        if (debug::log_on("cache")) debug::log("cache", "cpu codegen: built " + stem.string() + ".so in " + std::to_string(ms) + " ms");
        bool rejected = false;
        return load_entry(stem, key, rejected);
    }

    /// Forgets every kernel this process found (they stay loaded): the next ask reads the disk (tests).
    void forget() {
        std::unique_lock lock(mu);
        done.wait(lock, [&] { return queue.empty() && active == 0; });
        slots.clear();
    }

    void worker() {
        std::unique_lock lock(mu);
        for (;;) {
            work.wait(lock, [&] { return stop || !queue.empty(); });
            if (stop) return;
            std::shared_ptr<Slot> s = queue.front();
            queue.pop_front();
            ++active;
            lock.unlock();
            void* fn = nullptr;
            try {
                fn = build(s->source);
            } catch (const std::exception& e) {
                debug::log("cache", std::string("cpu codegen: build failed: ") + e.what());
            }
            lock.lock();
            s->fn.store(fn);
            s->state.store(fn ? 1 : 2);
            --active;
            done.notify_all();
        }
    }

    /// Queues a slot (lock held); starts the builder threads on first use.
    void enqueue(const std::shared_ptr<Slot>& s) {
        queue.push_back(s);
        if (workers.empty()) {
            const unsigned n = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
            for (unsigned i = 0; i < n; ++i) workers.emplace_back([this] { worker(); });
        }
        work.notify_one();
    }

    void* get(const std::string& source, CpuCodegen m) {
        std::unique_lock lock(mu);
        auto it = slots.find(source);
        if (it != slots.end()) {
            std::shared_ptr<Slot> s = it->second;
            if (s->state.load() == 0 && m == CpuCodegen::sync) done.wait(lock, [&] { return s->state.load() != 0; });
            if (s->state.load() == 1) ++stats.memory_hits;
            return s->fn.load();
        }
        auto s = std::make_shared<Slot>();
        s->source = source;
        slots.emplace(source, s);
        lock.unlock();
        // a warm disk entry is loaded right here: a first call never waits for a compiler then
        const Toolchain& t = toolchain();
        const std::string key = key_text(t, source);
        if (debug::log_on("output_code"))
            debug::log("output_code", "cpu kernel " + cache::to_hex(cache::hash64(key)) + ":\n" + source);
        bool rejected = false;
        if (void* fn = load_entry(t.dir / cache::to_hex(cache::hash64(key)), key, rejected)) {
            lock.lock();
            ++stats.disk_hits;
            s->fn.store(fn);
            s->state.store(1);
            done.notify_all();
            return fn;
        }
        lock.lock();
        if (rejected) ++stats.disk_rejected;
        enqueue(s);
        if (m == CpuCodegen::sync) {
            done.wait(lock, [&] { return s->state.load() != 0; });
            return s->fn.load();
        }
        if (debug::log_on("cache"))
            debug::log("cache", "cpu codegen: building a kernel in the background; the tile interpreter runs its group meanwhile");
        return nullptr;
    }
};

KILN_DECL void* kernel_for(const std::string& source) {
    const CpuCodegen m = cpu_codegen();
    if (m == CpuCodegen::off || source.empty() || !toolchain().unavailable.empty()) return nullptr;
    return Engine::instance().get(source, m);
}

KILN_DECL void forget_loaded() { Engine::instance().forget(); }

KILN_DECL std::string entry_stem(const std::string& source) {
    const Toolchain& t = toolchain();
    return (t.dir / cache::to_hex(cache::hash64(key_text(t, source)))).string();
}

}  // namespace kiln::detail::cppgen

namespace kiln {

KILN_DECL CpuCodegen cpu_codegen() {
    auto& e = detail::cppgen::Engine::instance();
    int m = e.mode.load();
    if (m < 0) {
        const char* v = std::getenv("KILN_CPU_CODEGEN");
        const std::string s = v ? v : "";
        m = static_cast<int>(s == "off" || s == "0" ? CpuCodegen::off : s == "sync" ? CpuCodegen::sync : CpuCodegen::async);
        int expected = -1;
        e.mode.compare_exchange_strong(expected, m);
        m = e.mode.load();
    }
    return static_cast<CpuCodegen>(m);
}

KILN_DECL void set_cpu_codegen(CpuCodegen mode) { detail::cppgen::Engine::instance().mode.store(static_cast<int>(mode)); }

KILN_DECL void cpu_codegen_wait() {
    auto& e = detail::cppgen::Engine::instance();
    std::unique_lock lock(e.mu);
    e.done.wait(lock, [&] { return e.queue.empty() && e.active == 0; });
}

KILN_DECL void detail::cppgen::note_matmul_epilogue() {
    auto& e = detail::cppgen::Engine::instance();
    std::lock_guard lock(e.mu);
    ++e.stats.matmul_epilogues;
}

KILN_DECL CpuCodegenStats cpu_codegen_stats() {
    auto& e = detail::cppgen::Engine::instance();
    std::lock_guard lock(e.mu);
    return e.stats;
}

KILN_DECL std::string cpu_codegen_unavailable() {
    const std::string& u = detail::cppgen::toolchain().unavailable;
    if (!u.empty()) return u;
    detail::cppgen::Engine& e = detail::cppgen::Engine::instance();
    std::lock_guard lock(e.mu);
    return e.broken;
}

}  // namespace kiln
