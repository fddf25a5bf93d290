// NVRTC compilation and the kernel caches (memory, disk, compile-once); runs without a GPU.
#include <doctest/doctest.h>

#include <kiln/backends/cuda/nvrtc.hpp>
#include <kiln/backends/cuda/kernel_cache.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

#if !defined(KILN_WITH_CUDA)

TEST_CASE("cuda_nvrtc: without the CUDA toolkit NVRTC is unavailable and compiles throw DeviceError") {
    CHECK_FALSE(kiln::cuda::nvrtc_available());
    CHECK(kiln::cuda::nvrtc_version() == 0);
    const std::string src = "extern \"C\" __global__ void k() {}";
    CHECK_THROWS_AS(kiln::cuda::compile_to_cubin(src, "k", 90), kiln::DeviceError);
    CHECK_THROWS_AS(kiln::cache::cubin_for(src, "k", 90), kiln::DeviceError);
}

#else

namespace {

/// Sets KILN_CACHE_DIR to a fresh empty directory for the life of the object, then restores it.
struct TempCacheDir {
    fs::path root;  ///< the fresh directory (KILN_CACHE_DIR points here unless a test repoints it)
    std::string saved;
    bool had_saved = false;

    TempCacheDir() {
        static std::atomic<int> counter{0};
        std::random_device rd;
        root = fs::temp_directory_path() /
               ("kiln-test-nvrtc-" + std::to_string(rd()) + "-" + std::to_string(counter.fetch_add(1)));
        fs::remove_all(root);
        fs::create_directories(root);
        if (const char* old = std::getenv("KILN_CACHE_DIR")) {
            saved = old;
            had_saved = true;
        }
        point_at(root);
    }
    ~TempCacheDir() {
        if (had_saved) setenv("KILN_CACHE_DIR", saved.c_str(), 1);
        else unsetenv("KILN_CACHE_DIR");
        std::error_code ec;
        fs::remove_all(root, ec);
    }
    static void point_at(const fs::path& p) { setenv("KILN_CACHE_DIR", p.c_str(), 1); }
};

/// A small elementwise kernel; `tag` goes into a comment so each test gets a source no earlier test compiled
/// (the in-memory cache lives for the whole process).
std::string elementwise_source(const std::string& tag) {
    return "// kiln test kernel " + tag +
           "\n"
           "#ifndef SCALE\n"
           "#define SCALE 2.0f\n"
           "#endif\n"
           "extern \"C\" __global__ void k(float* y, const float* x, int n) {\n"
           "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
           "    if (i < n) y[i] = x[i] * SCALE + 1.0f;\n"
           "}\n";
}

bool is_elf(const std::string& bytes) { return bytes.size() > 4 && bytes.compare(0, 4, "\x7f" "ELF") == 0; }

std::string read_all(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const fs::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// The cubin held by the entry file at `p`, or "" when the entry is not valid.
std::string decode_file(const fs::path& p, const std::string& source, int arch, const std::vector<std::string>& flags = {}) {
    std::string why;
    return kiln::cache::detail::decode_entry(read_all(p), arch,
                                             kiln::cache::detail::key_check(kiln::cache::detail::key_string(source, flags, arch)),
                                             why);
}

/// The path after "source saved to " in a CompileError message ("" if absent).
std::string saved_path(const std::string& msg) {
    const std::string marker = "source saved to ";
    const auto b = msg.find(marker);
    if (b == std::string::npos) return {};
    const auto e = msg.find('\n', b);
    return msg.substr(b + marker.size(), e == std::string::npos ? std::string::npos : e - b - marker.size());
}

std::size_t count_files(const fs::path& dir, const std::string& ext) {
    std::error_code ec;
    std::size_t n = 0;
    if (!fs::is_directory(dir, ec)) return 0;
    for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ext;
    return n;
}

const std::string bad_source = "extern \"C\" __global__ void broken(float* y) {\n    y[0] = 1.0f +;\n}\n";

}  // namespace

TEST_CASE("cuda_nvrtc: version, hash and cache_dir") {
    REQUIRE(kiln::cuda::nvrtc_available());
    CHECK(kiln::cuda::nvrtc_version() >= 11000);
    CHECK(kiln::cuda::nvrtc_version() % 10 == 0);

    // FNV-1a 64 reference values.
    CHECK(kiln::cache::hash64("") == 0xcbf29ce484222325ull);
    CHECK(kiln::cache::hash64("a") == 0xaf63dc4c8601ec8cull);
    CHECK(kiln::cache::hash64("foobar") == 0x85944171f73967e8ull);
    CHECK(kiln::cache::to_hex(0x0123456789abcdefull) == "0123456789abcdef");

    TempCacheDir tmp;
    CHECK(kiln::cache::cache_dir() == tmp.root.string());
    std::string xdg, home;
    if (const char* v = std::getenv("XDG_CACHE_HOME")) xdg = v;
    if (const char* v = std::getenv("HOME")) home = v;
    unsetenv("KILN_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    CHECK(kiln::cache::cache_dir() == "/x/cache/kiln");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/h", 1);
    CHECK(kiln::cache::cache_dir() == "/h/.cache/kiln");
    unsetenv("HOME");
    CHECK(kiln::cache::cache_dir().find("kiln") != std::string::npos);
    if (!xdg.empty()) setenv("XDG_CACHE_HOME", xdg.c_str(), 1);
    if (!home.empty()) setenv("HOME", home.c_str(), 1);
}

TEST_CASE("cuda_nvrtc: an elementwise kernel compiles to an ELF cubin for sm_80 and sm_90") {
    TempCacheDir tmp;
    const std::string src = elementwise_source("arch");
    const std::string c90 = kiln::cuda::compile_to_cubin(src, "k", 90);
    const std::string c80 = kiln::cuda::compile_to_cubin(src, "k", 80);
    CHECK(is_elf(c90));
    CHECK(is_elf(c80));
    CHECK(c80 != c90);
    // compile_to_cubin itself never caches.
    CHECK(count_files(tmp.root / "cubin", ".cubin") == 0);
}

TEST_CASE("cuda_nvrtc: kiln's programs leave out the runtime's declarations (-minimal) unless a caller keeps them") {
    TempCacheDir tmp;
    // cudaStream_t is one of the runtime's types -minimal leaves out (NVRTC 12.4 on)
    const std::string src = "extern \"C\" __global__ void k(float* p) { cudaStream_t s = nullptr; p[threadIdx.x] = s ? 1.0f : 0.0f; }\n";
    const std::vector<std::string> full{kiln::cuda::full_declarations};
    CHECK(is_elf(kiln::cuda::compile_to_cubin(src, "runtime_types", 90, full)));  // the pseudo-flag is not passed to NVRTC
    if (kiln::cuda::nvrtc_version() >= 12040) {
        CHECK_THROWS_AS((void)kiln::cuda::compile_to_cubin(src, "runtime_types", 90), kiln::CompileError);
        // the flag is part of the cache key: the cache compiles each form of the program
        CHECK(kiln::cache::kernel_key(src, 90, full) != kiln::cache::kernel_key(src, 90));
    } else {
        CHECK(is_elf(kiln::cuda::compile_to_cubin(src, "runtime_types", 90)));
    }
    // kiln's own options: -minimal where NVRTC takes it, then the caller's flags
    const std::vector<std::string> opts = kiln::cuda::detail::nvrtc_options(90, {"-lineinfo"});
    CHECK(std::count(opts.begin(), opts.end(), std::string("-minimal")) == (kiln::cuda::nvrtc_version() >= 12040 ? 1 : 0));
    CHECK(opts.back() == "-lineinfo");
    const std::vector<std::string> kept = kiln::cuda::detail::nvrtc_options(90, full);
    CHECK(std::count(kept.begin(), kept.end(), std::string("-minimal")) == 0);
    CHECK(std::count(kept.begin(), kept.end(), std::string(kiln::cuda::full_declarations)) == 0);
}

TEST_CASE("cuda_nvrtc: a syntax error throws CompileError with the log and the saved source; nothing is cached") {
    TempCacheDir tmp;
    std::string msg;
    try {
        (void)kiln::cuda::compile_to_cubin(bad_source, "broken", 90);
        FAIL("compile_to_cubin accepted a syntax error");
    } catch (const kiln::CompileError& e) {
        msg = e.what();
    }
    CHECK(msg.find("broken") != std::string::npos);
    CHECK(msg.find("error") != std::string::npos);         // NVRTC's log text
    CHECK(msg.find("expected") != std::string::npos);      // "expected an expression"
    const fs::path saved = saved_path(msg);
    REQUIRE_MESSAGE(!saved.empty(), msg);
    CHECK(saved.parent_path() == tmp.root / "failed");
    CHECK(saved.filename().string().rfind("broken-", 0) == 0);
    CHECK(saved.extension() == ".cu");
    REQUIRE(fs::exists(saved));
    CHECK(read_all(saved) == bad_source);

    // Through the cache: each call compiles again and throws again; no entry is written.
    const auto s0 = kiln::cache::kernel_cache_stats();
    CHECK_THROWS_AS((void)kiln::cache::cubin_for(bad_source, "broken", 90), kiln::CompileError);
    CHECK_THROWS_AS((void)kiln::cache::cubin_for(bad_source, "broken", 90), kiln::CompileError);
    const auto s1 = kiln::cache::kernel_cache_stats();
    CHECK(s1.compiles == s0.compiles + 2);
    CHECK(s1.memory_hits == s0.memory_hits);
    CHECK(count_files(tmp.root / "cubin", ".cubin") == 0);
}

TEST_CASE("cuda_nvrtc: memory hit, then disk hit after clear_memory_kernel_cache") {
    TempCacheDir tmp;
    const std::string src = elementwise_source("hits");
    const auto s0 = kiln::cache::kernel_cache_stats();
    const std::string& first = kiln::cache::cubin_for(src, "k", 90);
    const auto s1 = kiln::cache::kernel_cache_stats();
    CHECK(is_elf(first));
    CHECK(s1.compiles == s0.compiles + 1);
    CHECK(s1.compile_ms > s0.compile_ms);
    const fs::path entry = kiln::cache::kernel_cache_entry_path(src, 90);
    CHECK(entry.parent_path() == tmp.root / "cubin");
    REQUIRE(fs::exists(entry));
    CHECK(decode_file(entry, src, 90) == first);
    CHECK(count_files(tmp.root / "cubin", ".cubin") == 1);
    CHECK(std::distance(fs::directory_iterator(tmp.root / "cubin"), fs::directory_iterator{}) == 1);  // no temp left

    const std::string& second = kiln::cache::cubin_for(src, "k", 90);
    const auto s2 = kiln::cache::kernel_cache_stats();
    CHECK(&second == &first);
    CHECK(s2.memory_hits == s1.memory_hits + 1);
    CHECK(s2.compiles == s1.compiles);

    kiln::cache::clear_memory_kernel_cache();
    const std::string& third = kiln::cache::cubin_for(src, "k", 90);
    const auto s3 = kiln::cache::kernel_cache_stats();
    CHECK(third == first);
    CHECK(s3.disk_hits == s2.disk_hits + 1);
    CHECK(s3.compiles == s2.compiles);
    CHECK(s3.disk_rejected == s2.disk_rejected);
    CHECK(first.size() > 0);  // still valid after the clear
}

TEST_CASE("cuda_nvrtc: truncated, flipped and wrong-magic entries are rejected, rebuilt and rewritten") {
    TempCacheDir tmp;
    const std::string src = elementwise_source("corrupt");
    const std::string good = kiln::cache::cubin_for(src, "k", 90);
    const fs::path entry = kiln::cache::kernel_cache_entry_path(src, 90);
    const std::string good_file = read_all(entry);
    REQUIRE(good_file.size() > good.size());

    auto check_rebuilt = [&](const std::string& damaged, const char* what) {
        CAPTURE(what);
        write_all(entry, damaged);
        kiln::cache::clear_memory_kernel_cache();
        const auto s0 = kiln::cache::kernel_cache_stats();
        const std::string& again = kiln::cache::cubin_for(src, "k", 90);
        const auto s1 = kiln::cache::kernel_cache_stats();
        CHECK(s1.disk_rejected == s0.disk_rejected + 1);
        CHECK(s1.compiles == s0.compiles + 1);
        CHECK(s1.disk_hits == s0.disk_hits);
        CHECK(is_elf(again));
        CHECK(decode_file(entry, src, 90) == again);  // rewritten valid
    };
    check_rebuilt(good_file.substr(0, good_file.size() / 2), "truncated payload");
    check_rebuilt(good_file.substr(0, 10), "truncated header");
    std::string flipped = good_file;
    flipped[flipped.size() - 100] = static_cast<char>(flipped[flipped.size() - 100] ^ 0x20);
    check_rebuilt(flipped, "flipped payload byte");
    std::string magic = good_file;
    magic[0] = 'X';
    check_rebuilt(magic, "wrong magic");

    // The rewritten entry now serves a disk hit.
    kiln::cache::clear_memory_kernel_cache();
    const auto s0 = kiln::cache::kernel_cache_stats();
    CHECK(kiln::cache::cubin_for(src, "k", 90) == decode_file(entry, src, 90));
    CHECK(kiln::cache::kernel_cache_stats().disk_hits == s0.disk_hits + 1);
}

TEST_CASE("cuda_nvrtc: arch, flags and source each change the key") {
    TempCacheDir tmp;
    const std::string src = elementwise_source("keys");
    const std::string k90 = kiln::cache::kernel_key(src, 90);
    CHECK(k90.size() == 16);
    CHECK(k90 == kiln::cache::kernel_key(src, 90));
    CHECK(k90 != kiln::cache::kernel_key(src, 80));
    CHECK(k90 != kiln::cache::kernel_key(src, 90, {"-DSCALE=3.0f"}));
    CHECK(kiln::cache::kernel_key(src, 90, {"-DA", "-DB"}) != kiln::cache::kernel_key(src, 90, {"-DAB"}));
    CHECK(k90 != kiln::cache::kernel_key(src + " ", 90));

    const auto s0 = kiln::cache::kernel_cache_stats();
    const std::string plain = kiln::cache::cubin_for(src, "k", 90);
    const std::string scaled = kiln::cache::cubin_for(src, "k", 90, {"-DSCALE=3.0f"});
    const auto s1 = kiln::cache::kernel_cache_stats();
    CHECK(s1.compiles == s0.compiles + 2);
    CHECK(plain != scaled);
    CHECK(count_files(tmp.root / "cubin", ".cubin") == 2);
}

TEST_CASE("cuda_nvrtc: an unwritable cache dir still compiles; failures say the source was not saved") {
    TempCacheDir tmp;
    const fs::path file = tmp.root / "not-a-dir";
    write_all(file, "x");
    TempCacheDir::point_at(file / "cache");

    const auto s0 = kiln::cache::kernel_cache_stats();
    const std::string src = elementwise_source("unwritable");
    std::string cubin;
    CHECK_NOTHROW(cubin = kiln::cache::cubin_for(src, "k", 90));
    CHECK(is_elf(cubin));
    CHECK(kiln::cache::kernel_cache_stats().compiles == s0.compiles + 1);

    std::string msg;
    try {
        (void)kiln::cuda::compile_to_cubin(bad_source, "broken", 90);
    } catch (const kiln::CompileError& e) {
        msg = e.what();
    }
    CHECK(msg.find("could not be saved") != std::string::npos);
    CHECK(msg.find("error") != std::string::npos);
}

TEST_CASE("cuda_nvrtc: 8 threads asking for one new kernel compile it once") {
    TempCacheDir tmp;
    const std::string src = elementwise_source("threads");
    constexpr int n = 8;
    std::latch start(n);
    std::vector<const std::string*> got(n, nullptr);
    std::vector<std::string> errors(n);
    const auto s0 = kiln::cache::kernel_cache_stats();
    std::vector<std::thread> threads;
    for (int t = 0; t < n; ++t)
        threads.emplace_back([&, t] {
            start.arrive_and_wait();
            try {
                got[static_cast<std::size_t>(t)] = &kiln::cache::cubin_for(src, "k", 90);
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(t)] = e.what();
            }
        });
    for (auto& th : threads) th.join();
    const auto s1 = kiln::cache::kernel_cache_stats();
    CHECK(s1.compiles == s0.compiles + 1);
    CHECK(s1.memory_hits == s0.memory_hits + n - 1);
    for (int t = 0; t < n; ++t) {
        CHECK(errors[static_cast<std::size_t>(t)] == "");
        REQUIRE(got[static_cast<std::size_t>(t)] != nullptr);
        CHECK(*got[static_cast<std::size_t>(t)] == *got[0]);
    }
    CHECK(is_elf(*got[0]));
}

TEST_CASE("cuda_nvrtc: cubins_for compiles a program's kernels in parallel, results in order") {
    TempCacheDir tmp;
    const std::vector<kiln::cache::KernelSource> sources = {
        {elementwise_source("many-0"), "k0", {}},
        {elementwise_source("many-1"), "k1", {}},
        {elementwise_source("many-0"), "k0", {"-DSCALE=5.0f"}},
        {elementwise_source("many-1"), "k1", {}},  // a repeat: compiled once
    };
    const auto s0 = kiln::cache::kernel_cache_stats();
    const std::vector<std::string> out = kiln::cache::cubins_for(sources, 90);
    const auto s1 = kiln::cache::kernel_cache_stats();
    REQUIRE(out.size() == sources.size());
    CHECK(s1.compiles == s0.compiles + 3);
    for (std::size_t i = 0; i < sources.size(); ++i) {
        CAPTURE(i);
        CHECK(is_elf(out[i]));
        CHECK(out[i] == kiln::cache::cubin_for(sources[i].source, sources[i].name, 90, sources[i].flags));
    }
    CHECK(out[0] != out[2]);
    CHECK(out[1] == out[3]);
    CHECK(kiln::cache::kernel_cache_stats().compiles == s1.compiles);  // the lookups above were hits
    CHECK(kiln::cache::cubins_for({}, 90).empty());

    // One failing kernel: the call throws CompileError, the good kernels are still cached.
    const std::vector<kiln::cache::KernelSource> with_bad = {sources[0], {bad_source, "broken", {}}, sources[1]};
    CHECK_THROWS_AS((void)kiln::cache::cubins_for(with_bad, 90), kiln::CompileError);
    CHECK(kiln::cache::kernel_cache_stats().compiles == s1.compiles + 1);
}

#endif
