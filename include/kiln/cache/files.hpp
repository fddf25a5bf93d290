// kiln's on-disk cache files: where they live, their names (64-bit FNV-1a of the content, hex), and
// writes that leave no half-written file (a temp file renamed into place).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

namespace kiln::cache {

/// Where kiln keeps compiled kernels: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln, else <temp>/kiln-cache.
inline std::string cache_dir() {
    auto env = [](const char* name) -> std::string {
        const char* v = std::getenv(name);
        return v ? std::string(v) : std::string();
    };
    if (std::string d = env("KILN_CACHE_DIR"); !d.empty()) return d;
    if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return (std::filesystem::path(d) / "kiln").string();
    if (std::string d = env("HOME"); !d.empty()) return (std::filesystem::path(d) / ".cache" / "kiln").string();
    std::error_code ec;
    std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    if (ec || tmp.empty()) tmp = "/tmp";
    return (tmp / "kiln-cache").string();
}

/// 64-bit FNV-1a of `data`, continuing from `h` (pass a previous result to hash several pieces).
inline std::uint64_t hash64(std::string_view data, std::uint64_t h = 0xcbf29ce484222325ull) {
    for (unsigned char c : data) {
        h ^= c;
        h *= 0x100000001b3ull;
    }
    return h;
}

/// `v` as 16 lowercase hex digits (file names of cache entries and failed sources).
inline std::string to_hex(std::uint64_t v) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(16, '0');
    for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 0xf];
    return s;
}

namespace detail {

/// A file name no other writer (thread or process) uses at the same time: "<stem>.tmp.<nonce>.<n>".
inline std::filesystem::path unique_temp_path(const std::filesystem::path& target) {
    static const std::uint64_t nonce = [] {
        std::random_device rd;
        std::uint64_t n = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
        n ^= static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
        return n;
    }();
    static std::atomic<std::uint64_t> counter{0};
    std::string name = target.filename().string() + ".tmp." + to_hex(nonce) + "." +
                       std::to_string(counter.fetch_add(1)) + "." +
                       to_hex(std::hash<std::thread::id>{}(std::this_thread::get_id()));
    return target.parent_path() / name;
}

/// Writes `bytes` to `target` atomically (temp file in the same dir, then rename); false and `why` on failure.
inline bool write_file_atomically(const std::filesystem::path& target, const std::string& bytes, std::string& why) {
    try {
        std::error_code ec;
        std::filesystem::create_directories(target.parent_path(), ec);
        if (ec) {
            why = "cannot create " + target.parent_path().string() + ": " + ec.message();
            return false;
        }
        const std::filesystem::path tmp = unique_temp_path(target);
        {
            std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
            if (!out) {
                why = "cannot create " + tmp.string();
                return false;
            }
            out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
            out.close();
            if (!out) {
                std::filesystem::remove(tmp, ec);
                why = "cannot write " + tmp.string() + " (disk full?)";
                return false;
            }
        }
        std::filesystem::rename(tmp, target, ec);
        if (ec) {
            why = "cannot rename " + tmp.string() + " to " + target.string() + ": " + ec.message();
            std::filesystem::remove(tmp, ec);
            return false;
        }
        return true;
    } catch (const std::exception& e) {
        why = e.what();
        return false;
    }
}

}  // namespace detail
}  // namespace kiln::cache
