// Kernel caches for the CUDA backend: process-wide memory cache -> on-disk cubin cache -> NVRTC.
#pragma once

// Namespace kiln::cache (with guards.hpp); internals in kiln::cache::detail.
//
// Lookup order in cubin_for: the in-memory map (compile-once: a key maps to a shared_future, so
// concurrent askers wait on one compile), then <cache_dir()>/cubin/<hexkey>.cubin, then NVRTC
// (compile_to_cubin), whose result is written to disk through a temp file and a rename.
//
// The cache directory, key hashing and atomic file writes are kiln/cache/files.hpp (NVRTC saves
// failing sources there too).

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/backends/cuda/driver.hpp"
#include "kiln/backends/cuda/nvrtc.hpp"
#include "kiln/cache/files.hpp"
#include "kiln/core/error.hpp"
#include "kiln/debug/logs.hpp"
#include "kiln/version.hpp"


namespace kiln::cache {

/// One kernel of a program, for cubins_for.
struct KernelSource {
    std::string source;              ///< self-contained CUDA C++ text
    std::string name;                ///< kernel name, for messages and file names
    std::vector<std::string> flags;  ///< NVRTC flags on top of the defaults
};

/// Counters of the kernel caches since the process started (read with kernel_cache_stats()).
struct KernelCacheStats {
    std::size_t memory_hits = 0;    ///< lookups answered by the in-memory cache (or by waiting on its compile)
    std::size_t disk_hits = 0;      ///< lookups answered by a valid on-disk entry
    std::size_t compiles = 0;       ///< NVRTC compiles run, failed ones included
    std::size_t disk_rejected = 0;  ///< on-disk entries ignored as corrupt (then rebuilt)
    double compile_ms = 0;          ///< wall time spent in those compiles
};

namespace detail {

/// Bumped when the entry layout or the key recipe changes, so old entries become misses.
inline constexpr std::uint32_t cubin_format_version = 1;
inline constexpr std::array<char, 8> cubin_magic = {'K', 'I', 'L', 'N', 'C', 'U', 'B', '\0'};
/// magic[8] | u32 format version | u32 arch | u64 payload length | u64 payload FNV-1a | u64 key check.
inline constexpr std::size_t cubin_header_size = 8 + 4 + 4 + 8 + 8 + 8;

/// A second hash of the key string, independent of FNV-1a, stored in the entry to catch a file-name collision.
inline std::uint64_t key_check(std::string_view data) {
    std::uint64_t h = 0x243f6a8885a308d3ull ^ data.size();
    for (unsigned char c : data) {
        h = (h ^ c) * 0x9e3779b97f4a7c15ull;
        h ^= h >> 29;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

/// Everything that decides the cubin, as one unambiguous string (each piece length-prefixed).
inline std::string key_string(const std::string& source, const std::vector<std::string>& flags, int arch) {
    std::string k = "kiln-cubin/" + std::to_string(cubin_format_version);
    auto add = [&k](std::string_view tag, std::string_view v) {
        k += '\n';
        k += tag;
        k += ':';
        k += std::to_string(v.size());
        k += ':';
        k += v;
    };
    add("kiln", KILN_VERSION_STRING);
    add("nvrtc", std::to_string(kiln::cuda::nvrtc_version()));
    add("arch", std::to_string(arch));
    for (const std::string& f : kiln::cuda::detail::nvrtc_options(arch, flags)) add("flag", f);
    add("source", source);
    return k;
}

/// Appends `v` little-endian (entry headers are little-endian on every host).
inline void put_u32(std::string& out, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
/// Appends `v` little-endian.
inline void put_u64(std::string& out, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
/// The little-endian unsigned integer of `bytes` bytes at `at`.
inline std::uint64_t get_le(std::string_view in, std::size_t at, int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i)
        v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[at + static_cast<std::size_t>(i)])) << (8 * i);
    return v;
}

/// The bytes of an entry file: header then cubin.
inline std::string encode_entry(const std::string& cubin, int arch, std::uint64_t check) {
    std::string out(cubin_magic.data(), cubin_magic.size());
    put_u32(out, cubin_format_version);
    put_u32(out, static_cast<std::uint32_t>(arch));
    put_u64(out, cubin.size());
    put_u64(out, hash64(cubin));
    put_u64(out, check);
    out += cubin;
    return out;
}

/// The cubin in entry bytes `file`, or an empty string with `why` set when the entry is not valid.
inline std::string decode_entry(std::string_view file, int arch, std::uint64_t check, std::string& why) {
    if (file.size() < cubin_header_size) {
        why = "truncated header (" + std::to_string(file.size()) + " bytes)";
        return {};
    }
    if (!std::equal(cubin_magic.begin(), cubin_magic.end(), file.begin())) {
        why = "wrong magic";
        return {};
    }
    if (get_le(file, 8, 4) != cubin_format_version) {
        why = "format version " + std::to_string(get_le(file, 8, 4)) + ", expected " + std::to_string(cubin_format_version);
        return {};
    }
    if (get_le(file, 12, 4) != static_cast<std::uint32_t>(arch)) {
        why = "arch mismatch";
        return {};
    }
    const std::uint64_t length = get_le(file, 16, 8);
    if (length == 0 || length != file.size() - cubin_header_size) {
        why = "payload length " + std::to_string(file.size() - cubin_header_size) + ", header says " + std::to_string(length);
        return {};
    }
    if (get_le(file, 32, 8) != check) {
        why = "key check mismatch (hash collision or foreign entry)";
        return {};
    }
    std::string cubin(file.substr(cubin_header_size));
    if (hash64(cubin) != get_le(file, 24, 8)) {
        why = "payload checksum mismatch";
        return {};
    }
    return cubin;
}

/// Outcome of a disk lookup.
enum class DiskLookup { hit, miss, rejected };

/// Reads the entry at `path`; never throws (disk errors are logged and read as a miss).
inline DiskLookup read_entry(const std::filesystem::path& path, int arch, std::uint64_t check, std::string& cubin) {
    try {
        std::error_code ec;
        if (!std::filesystem::is_regular_file(path, ec)) return DiskLookup::miss;
        std::ifstream in(path, std::ios::binary);
        if (!in) {
            kiln::debug::log("cache", "cannot open " + path.string() + "; not using the disk cache for it");
            return DiskLookup::miss;
        }
        std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (in.bad()) {
            kiln::debug::log("cache", "cannot read " + path.string() + "; not using the disk cache for it");
            return DiskLookup::miss;
        }
        std::string why;
        cubin = decode_entry(bytes, arch, check, why);
        if (cubin.empty()) {
            kiln::debug::log("cache", "rejected " + path.string() + ": " + why + "; rebuilding");
            return DiskLookup::rejected;
        }
        return DiskLookup::hit;
    } catch (const std::exception& e) {
        kiln::debug::log("cache", "cannot read " + path.string() + ": " + e.what());
        return DiskLookup::miss;
    }
}

/// The process-wide in-memory cache and the counters; one instance, a function-local static.
struct MemoryCache {
    struct Slot {
        std::shared_future<std::string> cubin;
    };
    std::mutex mu;
    std::unordered_map<std::string, std::shared_ptr<Slot>> slots;  // full key string -> slot
    std::vector<std::shared_ptr<Slot>> retired;  // cleared slots, kept so returned references stay valid
    KernelCacheStats stats;

    static MemoryCache& instance() {
        static MemoryCache c;
        return c;
    }
};

/// "k (sm_90, key 0123abcd...)" for log lines.
inline std::string describe(const std::string& name, int arch, const std::string& hex) {
    return name + " (sm_" + std::to_string(arch) + ", key " + hex + ")";
}

/// Disk, then NVRTC; stores a fresh compile on disk. Counts into `stats` under `mu`.
inline std::string load_or_compile(const std::string& source, const std::string& name, int arch,
                                   const std::vector<std::string>& flags, const std::string& key) {
    MemoryCache& mc = MemoryCache::instance();
    const std::string hex = to_hex(hash64(key));
    const std::uint64_t check = key_check(key);
    std::filesystem::path entry;
    try {
        entry = std::filesystem::path(cache_dir()) / "cubin" / (hex + ".cubin");
    } catch (const std::exception& e) {
        kiln::debug::log("cache", std::string("no cache dir: ") + e.what());
    }

    if (!entry.empty()) {
        std::string cubin;
        switch (read_entry(entry, arch, check, cubin)) {
            case DiskLookup::hit: {
                {
                    std::lock_guard lock(mc.mu);
                    ++mc.stats.disk_hits;
                }
                if (kiln::debug::log_on("cache"))
                    kiln::debug::log("cache", "disk hit " + describe(name, arch, hex) + " from " + entry.string());
                return cubin;
            }
            case DiskLookup::rejected: {
                std::lock_guard lock(mc.mu);
                ++mc.stats.disk_rejected;
                break;
            }
            case DiskLookup::miss: break;
        }
    }

    if (kiln::debug::log_on("cache")) kiln::debug::log("cache", "miss " + describe(name, arch, hex) + ": compiling");
    const auto t0 = std::chrono::steady_clock::now();
    auto count_compile = [&] {
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        std::lock_guard lock(mc.mu);
        ++mc.stats.compiles;
        mc.stats.compile_ms += ms;
        return ms;
    };
    std::string cubin;
    try {
        cubin = kiln::cuda::compile_to_cubin(source, name, arch, flags);
    } catch (const std::exception& e) {
        const double ms = count_compile();
        if (kiln::debug::log_on("cache"))
            kiln::debug::log("cache", "compile of " + describe(name, arch, hex) + " failed after " + std::to_string(ms) +
                                          " ms; nothing cached: " + e.what());
        throw;
    } catch (...) {
        count_compile();
        throw;
    }
    const double ms = count_compile();
    if (kiln::debug::log_on("cache"))
        kiln::debug::log("cache", "compiled " + describe(name, arch, hex) + " in " + std::to_string(ms) + " ms, " +
                                      std::to_string(cubin.size()) + " bytes");

    if (!entry.empty()) {
        std::string why;
        if (write_file_atomically(entry, encode_entry(cubin, arch, check), why)) {
            if (kiln::debug::log_on("cache")) kiln::debug::log("cache", "stored " + entry.string());
        } else {
            kiln::debug::log("cache", "not using the disk cache for " + describe(name, arch, hex) + ": " + why);
        }
    }
    return cubin;
}

}  // namespace detail

/// The cache key of a kernel (source, flags, arch, NVRTC version, kiln version) as 16 hex digits: its entry file's stem.
inline std::string kernel_key(const std::string& source, int arch, const std::vector<std::string>& flags = {}) {
    return to_hex(hash64(detail::key_string(source, flags, arch)));
}

/// Path of the on-disk entry for a kernel under the current cache_dir() (it may not exist).
inline std::string kernel_cache_entry_path(const std::string& source, int arch, const std::vector<std::string>& flags = {}) {
    return (std::filesystem::path(cache_dir()) / "cubin" / (kernel_key(source, arch, flags) + ".cubin")).string();
}

/// The cubin of `source` for sm_<arch>: from memory, else disk, else NVRTC (then stored); compiles once across threads.
/// The reference stays valid for the life of the process. Throws CompileError (nothing is cached) or DeviceError.
inline const std::string& cubin_for(const std::string& source, const std::string& name, int arch,
                                    const std::vector<std::string>& flags = {}) {
    if (!kiln::cuda::nvrtc_available())
        throw DeviceError("kiln::cache::cubin_for: cannot compile kernel '" + name +
                          "': kiln was built without the CUDA toolkit (NVRTC)");
    detail::MemoryCache& mc = detail::MemoryCache::instance();
    const std::string key = detail::key_string(source, flags, arch);

    std::shared_ptr<detail::MemoryCache::Slot> slot;
    std::promise<std::string> promise;
    bool producer = false;
    {
        std::lock_guard lock(mc.mu);
        if (auto it = mc.slots.find(key); it != mc.slots.end()) {
            ++mc.stats.memory_hits;
            slot = it->second;
        } else {
            slot = std::make_shared<detail::MemoryCache::Slot>();
            slot->cubin = promise.get_future().share();
            mc.slots.emplace(key, slot);
            producer = true;
        }
    }
    if (!producer) {
        if (kiln::debug::log_on("cache"))
            kiln::debug::log("cache", "memory hit " + detail::describe(name, arch, to_hex(hash64(key))));
        return slot->cubin.get();  // waits if another thread is still compiling it; rethrows its failure
    }

    try {
        promise.set_value(detail::load_or_compile(source, name, arch, flags, key));
    } catch (...) {
        {
            // A failed compile leaves nothing behind: the next caller retries.
            std::lock_guard lock(mc.mu);
            if (auto it = mc.slots.find(key); it != mc.slots.end() && it->second == slot) mc.slots.erase(it);
        }
        promise.set_exception(std::current_exception());
        throw;
    }
    return slot->cubin.get();
}

namespace detail {
/// f(i) for i in [0, n) on up to hardware_concurrency() threads (this one among them); an exception
/// from f(i) is rethrown after all have run, the first by index.
template <class F>
void parallel_each(std::size_t n, F&& f) {
    std::vector<std::exception_ptr> errors(n);
    std::atomic<std::size_t> next{0};
    auto work = [&] {
        for (std::size_t i; (i = next.fetch_add(1)) < n;) {
            try {
                f(i);
            } catch (...) {
                errors[i] = std::current_exception();
            }
        }
    };
    const std::size_t hw = std::max<std::size_t>(1, std::thread::hardware_concurrency());
    const std::size_t helpers = std::min(hw, n) > 0 ? std::min(hw, n) - 1 : 0;
    std::vector<std::thread> threads;
    threads.reserve(helpers);
    for (std::size_t t = 0; t < helpers; ++t) {
        try {
            threads.emplace_back(work);
        } catch (const std::system_error&) {
            break;  // no more threads: the ones started (and this one) do the rest
        }
    }
    work();
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);
}
}  // namespace detail

/// The cubins of a program's kernels, in order, compiled in parallel (at most hardware_concurrency at once) through cubin_for.
/// When some fail, all are still attempted, then the first failure (in order) is rethrown.
inline std::vector<std::string> cubins_for(const std::vector<KernelSource>& sources, int arch) {
    std::vector<std::string> out(sources.size());
    detail::parallel_each(sources.size(), [&](std::size_t i) { out[i] = cubin_for(sources[i].source, sources[i].name, arch, sources[i].flags); });
    return out;
}

/// A snapshot of the kernel cache counters.
inline KernelCacheStats kernel_cache_stats() {
    detail::MemoryCache& mc = detail::MemoryCache::instance();
    std::lock_guard lock(mc.mu);
    return mc.stats;
}

/// Empties the in-memory kernel cache so the next lookups go to disk (for tests); earlier references stay valid.
inline void clear_memory_kernel_cache() {
    detail::MemoryCache& mc = detail::MemoryCache::instance();
    std::lock_guard lock(mc.mu);
    for (auto& [key, slot] : mc.slots) mc.retired.push_back(std::move(slot));
    mc.slots.clear();
}

}  // namespace kiln::cache

namespace kiln::cuda::detail {

/// The source with every kernel beginning with griddepcontrol.wait, then (where the grid has at
/// most `trigger_threads` threads, so its dependents' blocks find room without delaying its own)
/// griddepcontrol.launch_dependents: what a kernel launched for PDL (driver.hpp) needs. Kernels
/// that place these themselves (a weight prefetch before the wait) are left as they are.
inline std::string with_pdl_entry(const std::string& source, long long trigger_threads) {
    if (source.find("griddepcontrol.wait") != std::string::npos) return source;
    const std::string entry = "\n  asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n"
                              "  if ((long long)gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z <= " +
                              std::to_string(trigger_threads) + "ll) asm volatile(\"griddepcontrol.launch_dependents;\");\n";
    std::string out = source;
    for (std::size_t at = out.find("__global__"); at != std::string::npos; at = out.find("__global__", at + 1)) {
        const std::size_t body = out.find('{', at);
        if (body == std::string::npos) break;
        out.insert(body + 1, entry);
    }
    return out;
}

/// Threads a PDL kernel's early-launch test counts: half of what the device holds at once.
inline long long pdl_half_device(const DeviceProperties& p) { return static_cast<long long>(p.sm_count) * 1024; }

/// The text NVRTC compiles for `source` on `device` (kernel_function's, with the PDL entry where
/// the device takes it): what warming the caches ahead of kernel_function must compile.
inline std::string device_kernel_text(const std::string& source, int device) {
    const DeviceProperties& p = properties(device);
    return pdl_enabled(p.arch()) ? with_pdl_entry(source, pdl_half_device(p)) : source;
}

/// The loaded function `name` of a kernel's source on a device: compiled once per source (memory
/// and disk caches, cubin_for), loaded once per device. For PDL (sm_90+, driver.hpp) the source
/// gets its entry (with_pdl_entry) and the function is marked for PDL launches.
inline CUfunction kernel_function(const std::string& name, const std::string& source, int device) {
    static std::shared_mutex mu;
    static std::unordered_map<std::string, CUfunction> loaded;
    const std::string key = std::to_string(device) + "/" + name;
    {
        std::shared_lock lock(mu);
        if (auto it = loaded.find(key); it != loaded.end()) return it->second;
    }
    const DeviceProperties& p = properties(device);
    const bool pdl = pdl_enabled(p.arch());
    const long long half_device = pdl_half_device(p);
    const std::string text = device_kernel_text(source, device);
    if (debug::log_on("output_code")) debug::log("output_code", "kernel " + name + ":\n" + text);
    const std::string& cubin = kiln::cache::cubin_for(text, name, p.arch());
    std::unique_lock lock(mu);
    if (auto it = loaded.find(key); it != loaded.end()) return it->second;
    use_device(device);
    const CUfunction f = load_kernel(cubin, name).fn;
    if (pdl) mark_pdl(f, half_device);
    loaded.emplace(key, f);
    return f;
}

}  // namespace kiln::cuda::detail
