// CUDA runtime layer: driver loading, the caching device allocator, host<->device transfers, CUDA
// tensors, factories on a device. Tests that need a GPU return early with a MESSAGE where none is
// present; the rest (errors without a driver, size classes, overloads, device-memory guards) run anywhere.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/interop/eigen.hpp>

#include "test_util.hpp"

namespace {

using kiln::Device;
using kiln::DType;
using kiln::Shape;
using kiln::Tensor;
namespace cuda = kiln::cuda;

constexpr const char* this_file = "test_cuda_runtime.cpp:";

using kiln_test::message_of;

/// Checks that every part appears in msg.
void check_contains(const std::string& msg, std::initializer_list<std::string> parts) {
    INFO("message: \"" << msg << "\"");
    for (const std::string& p : parts) CHECK_MESSAGE(msg.find(p) != std::string::npos, "missing \"" << p << "\"");
}

std::string at_line(int line) { return this_file + std::to_string(line); }

/// Why there is no CUDA device here, as kiln's messages say it.
std::string no_device_reason() {
    const auto& d = cuda::detail::driver_state();
    return d.ok() ? std::string("no CUDA device 0") : d.error;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    REQUIRE(a.device().is_cpu());
    REQUIRE(b.device().is_cpu());
    if (!(a.shape() == b.shape()) || a.dtype() != b.dtype()) return false;
    const Tensor ca = a.contiguous(), cb = b.contiguous();
    return a.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), a.nbytes()) == 0;
}

/// Fresh random values of any dtype (no zeros for the floating types, both values for bool).
Tensor random_host(const Shape& s, DType dt) {
    if (kiln::is_floating(dt)) return kiln::randn(s, dt);
    if (dt == DType::boolean) return kiln::randint(0, 2, s, DType::boolean);
    if (dt == DType::i64) return kiln::randint(-(std::int64_t{1} << 50), std::int64_t{1} << 50, s, DType::i64);
    return kiln::randint(-1000000000, 1000000000, s, dt);
}

/// A CUDA tensor over a made-up device address: lets the guards that must never touch device
/// memory be tested without a GPU (nothing here reads or frees it).
Tensor fake_cuda_tensor() {
    void* p = reinterpret_cast<void*>(std::uintptr_t{0x7000000});
    auto storage = std::make_shared<kiln::detail::Storage>(p, 64, Device::cuda(0), nullptr);
    return Tensor(storage, 0, Shape{4, 4}, kiln::contiguous_strides(Shape{4, 4}), DType::f32);
}

}  // namespace

// ------------------------------------------------------------------ anywhere (no GPU needed)

TEST_CASE("without a driver: nothing is available and properties() says why" * doctest::test_suite("no_gpu") * doctest::skip(kiln_test::has_cuda())) {
    CHECK_FALSE(cuda::is_available());
    CHECK(cuda::device_count() == 0);
    check_contains(message_of<kiln::DeviceError>([] { (void)cuda::properties(0); }),
                   {"kiln::cuda::properties:", no_device_reason()});
    if (!cuda::detail::driver_state().ok() && cuda::detail::driver_state().error.rfind("no CUDA driver", 0) == 0)
        check_contains(message_of<kiln::DeviceError>([] { (void)cuda::properties(0); }), {"no CUDA driver"});
    // every entry point reports the same reason instead of crashing
    check_contains(message_of<kiln::DeviceError>([] { (void)cuda::memory_stats(0); }), {no_device_reason()});
    check_contains(message_of<kiln::DeviceError>([] { cuda::empty_cache(0); }), {no_device_reason()});
    check_contains(message_of<kiln::DeviceError>([] { (void)cuda::device_allocator(0); }), {no_device_reason()});
    check_contains(message_of<kiln::DeviceError>([] { (void)cuda::current_stream(0); }), {no_device_reason()});
    check_contains(message_of<kiln::DeviceError>([] { cuda::synchronize(0); }), {no_device_reason()});
    check_contains(message_of<kiln::DeviceError>([] { cuda::Stream s(0); }), {no_device_reason()});
    check_contains(message_of<kiln::DeviceError>([] { cuda::Event e(0); }), {no_device_reason()});
}

TEST_CASE("without a driver: creating or moving a CUDA tensor throws DeviceError naming the caller's line" * doctest::test_suite("no_gpu") * doctest::skip(kiln_test::has_cuda())) {
    const std::string why = no_device_reason();
    const Tensor h = kiln::arange(0, 6, 1, DType::f32).view({2, 3});
    struct Case {
        const char* what;
        int line;
        std::string msg;
    };
    std::vector<Case> cases;
    // each call sits on the line recorded with it, so the message must name exactly that line
    { const int l = __LINE__; cases.push_back({"Tensor()", l, message_of<kiln::DeviceError>([] { (void)Tensor(Shape{2, 3}, DType::f32, Device::cuda()); })}); }
    { const int l = __LINE__; cases.push_back({"empty", l, message_of<kiln::DeviceError>([] { (void)kiln::empty({2}, Device::cuda()); })}); }
    { const int l = __LINE__; cases.push_back({"zeros", l, message_of<kiln::DeviceError>([] { (void)kiln::zeros({4, 4}, DType::f16, Device::cuda()); })}); }
    { const int l = __LINE__; cases.push_back({"ones", l, message_of<kiln::DeviceError>([] { (void)kiln::ones({4}, Device::cuda()); })}); }
    { const int l = __LINE__; cases.push_back({"full", l, message_of<kiln::DeviceError>([] { (void)kiln::full({4}, 2.5, DType::f64, Device::cuda()); })}); }
    { const int l = __LINE__; cases.push_back({"arange", l, message_of<kiln::DeviceError>([] { (void)kiln::arange(0, 10, 1, DType::f32, Device::cuda()); })}); }
    { const int l = __LINE__; cases.push_back({"arange(n)", l, message_of<kiln::DeviceError>([] { (void)kiln::arange(10, Device::cuda()); })}); }
    { const int l = __LINE__; cases.push_back({"linspace", l, message_of<kiln::DeviceError>([] { (void)kiln::linspace(0, 1, 5, DType::f32, Device::cuda()); })}); }
    { const int l = __LINE__; cases.push_back({"rand", l, message_of<kiln::DeviceError>([] { (void)kiln::rand({8}, Device::cuda()); })}); }
    { const int l = __LINE__; cases.push_back({"randn", l, message_of<kiln::DeviceError>([] { (void)kiln::randn({1 << 24}, Device::cuda()); })}); }
    { const int l = __LINE__; cases.push_back({"randint", l, message_of<kiln::DeviceError>([] { (void)kiln::randint(0, 9, {8}, DType::i32, Device::cuda()); })}); }
    { const int l = __LINE__; cases.push_back({"to", l, message_of<kiln::DeviceError>([&] { (void)h.to(Device::cuda()); })}); }
    { const int l = __LINE__; cases.push_back({"cuda()", l, message_of<kiln::DeviceError>([&] { (void)h.cuda(); })}); }
    for (const Case& c : cases) {
        INFO(c.what);
        check_contains(c.msg, {"kiln::empty: cannot create a tensor on cuda:0: ", why, " at " + at_line(c.line)});
        CHECK(c.msg.find("kiln::cuda") == std::string::npos);  // the inner prefix is not repeated
    }
    check_contains(message_of<kiln::DeviceError>([] { (void)Tensor(Shape{2}, DType::f32, Device::cuda(3)); }), {"cuda:3"});
    // a failed device factory does not advance the generator: the next CPU draw is the first one
    kiln::manual_seed(11);
    const Tensor first = kiln::randn({16});
    kiln::manual_seed(11);
    CHECK_THROWS_AS((void)kiln::randn({16}, Device::cuda()), kiln::DeviceError);
    CHECK(same_bytes(kiln::randn({16}), first));
}

TEST_CASE("invalid device indices throw DeviceError everywhere") {
    check_contains(message_of<kiln::DeviceError>([] { (void)cuda::memory_stats(-1); }), {"kiln::cuda::memory_stats:"});
    check_contains(message_of<kiln::DeviceError>([] { (void)cuda::device_allocator(cuda::detail::max_devices); }),
                   {"kiln::cuda::device_allocator:"});
    const int l = __LINE__; const std::string m = message_of<kiln::DeviceError>([] { (void)kiln::empty({2}, Device::cuda(-1)); });
    check_contains(m, {"kiln::empty:", "cuda:-1", at_line(l)});
}

TEST_CASE("kiln.hpp installs the CUDA allocator hook") {
    CHECK(static_cast<bool>(kiln::cuda_allocator_hook()));
    CHECK(cuda::detail::device_allocator_hook_installed);
}

namespace {
/// An allocator that always fails the way the CUDA allocator does when the device is full.
struct FullDevice final : kiln::Allocator {
    void* allocate(std::size_t) override { throw kiln::OutOfMemory("kiln::cuda: out of memory on cuda:0: tried to allocate 2.00 MiB"); }
    void deallocate(void*, std::size_t) noexcept override {}
};
kiln::Allocator* full_device_hook(int) {
    static FullDevice a;
    return &a;
}
/// Swaps the CUDA allocator hook for a scope.
struct HookSwap {
    kiln::DeviceAllocatorHook saved = kiln::cuda_allocator_hook();
    explicit HookSwap(kiln::DeviceAllocatorHook h) { kiln::cuda_allocator_hook() = h; }
    HookSwap(const HookSwap&) = delete;
    HookSwap& operator=(const HookSwap&) = delete;
    ~HookSwap() { kiln::cuda_allocator_hook() = saved; }
};
}  // namespace

TEST_CASE("without the allocator hook, or with a full device, CUDA tensors fail with the caller's line") {
    {
        const HookSwap none(nullptr);
        const int l = __LINE__; const std::string m = message_of<kiln::DeviceError>([] { (void)kiln::zeros({2}, Device::cuda()); });
        check_contains(m, {"kiln::empty: cannot create a tensor on cuda:0: ", "allocator is not compiled in", at_line(l)});
    }
    {
        const HookSwap full(&full_device_hook);
        const int l = __LINE__; const std::string m = message_of<kiln::OutOfMemory>([] { (void)Tensor(Shape{1 << 19}, DType::f32, Device::cuda()); });
        check_contains(m, {"kiln::empty: cannot create a tensor on cuda:0: out of memory on cuda:0: tried to allocate 2.00 MiB at " + at_line(l)});
    }
    CHECK(static_cast<bool>(kiln::cuda_allocator_hook()));
}

TEST_CASE("device size classes: 512 B minimum, 512 B steps below 1 MiB, 2 MiB steps above") {
    using cuda::detail::device_size_class;
    constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;
    CHECK(device_size_class(0) == 512);
    CHECK(device_size_class(1) == 512);
    CHECK(device_size_class(512) == 512);
    CHECK(device_size_class(513) == 1024);
    CHECK(device_size_class(4000) == 4096);
    CHECK(device_size_class(100 * KiB + 1) == 100 * KiB + 512);
    CHECK(device_size_class(MiB - 1) == MiB);
    CHECK(device_size_class(MiB) == 2 * MiB);
    CHECK(device_size_class(2 * MiB) == 2 * MiB);
    CHECK(device_size_class(2 * MiB + 1) == 4 * MiB);
    CHECK(device_size_class(3 * MiB) == 4 * MiB);
    CHECK(device_size_class(1000 * MiB + 7) == 1002 * MiB);
}

TEST_CASE("a CUDA tensor's memory is never read on the host") {
    const Tensor d = fake_cuda_tensor();
    CHECK(d.device() == Device::cuda(0));
    CHECK(d.to(Device::cuda(0)).is_same(d));  // already there: no copy, no driver
    CHECK(d.cuda(0).is_same(d));
    CHECK(d.data<float>() == reinterpret_cast<float*>(std::uintptr_t{0x7000000}));  // the device address
    {
        const int l = __LINE__; const std::string m = message_of<kiln::DeviceError>([&] { (void)d.at<float>({1, 2}); });
        check_contains(m, {"kiln::at: tensor is on cuda:0; copy it with .cpu()", at_line(l)});
    }
    {
        const int l = __LINE__; const std::string m = message_of<kiln::DeviceError>([&] { (void)kiln::as_eigen<float>(d); });
        check_contains(m, {"kiln::as_eigen:", "cuda:0", ".cpu()", at_line(l)});
    }
    // shapes are checked before anything moves
    CHECK_THROWS_AS(kiln::zeros({3, 3}).copy_(d), kiln::ShapeError);
    if (!cuda::is_available()) {  // every path that would move data needs the driver, and says so
        const std::string why = no_device_reason();
        check_contains(message_of<kiln::DeviceError>([&] { (void)d.item<float>(0); }), {why});
        check_contains(message_of<kiln::DeviceError>([&] { (void)d.cpu(); }), {why});
        check_contains(message_of<kiln::DeviceError>([&] { (void)kiln::to_string(d); }), {why});
        check_contains(message_of<kiln::DeviceError>([&] { kiln::zeros({4, 4}).copy_(d); }), {why});
        check_contains(message_of<kiln::DeviceError>([&] { Tensor(d).copy_(kiln::ones({4, 4})); }), {why});
        check_contains(message_of<kiln::DeviceError>([&] { Tensor(d).fill_(1.0); }), {why});
    }
}

TEST_CASE("device overloads of the factories on the CPU equal the plain ones") {
    const Device cpu = Device::cpu();
    CHECK(same_bytes(kiln::zeros({2, 3}, DType::f16, cpu), kiln::zeros({2, 3}, DType::f16)));
    CHECK(same_bytes(kiln::zeros({2, 3}, cpu), kiln::zeros({2, 3})));
    CHECK(same_bytes(kiln::ones({5}, DType::i32, cpu), kiln::ones({5}, DType::i32)));
    CHECK(same_bytes(kiln::ones({5}, cpu), kiln::ones({5})));
    CHECK(same_bytes(kiln::full({3}, 2.5, DType::bf16, cpu), kiln::full({3}, 2.5, DType::bf16)));
    CHECK(same_bytes(kiln::full({3}, 2.5, cpu), kiln::full({3}, 2.5)));
    CHECK(same_bytes(kiln::arange(1, 7, 2, DType::f64, cpu), kiln::arange(1, 7, 2, DType::f64)));
    CHECK(same_bytes(kiln::arange(6, DType::i32, cpu), kiln::arange(6, DType::i32)));
    CHECK(same_bytes(kiln::arange(6, cpu), kiln::arange(6)));
    CHECK(same_bytes(kiln::linspace(-1, 1, 9, DType::f32, cpu), kiln::linspace(-1, 1, 9)));
    CHECK(kiln::empty({2, 2}, cpu).device() == cpu);
    kiln::Generator g1(5), g2(5);
    CHECK(same_bytes(kiln::rand({100}, DType::f64, cpu, g1), kiln::rand({100}, DType::f64, g2)));
    CHECK(same_bytes(kiln::randn({100}, DType::f16, cpu, g1), kiln::randn({100}, DType::f16, g2)));
    CHECK(same_bytes(kiln::randint(-5, 5, {100}, DType::i32, cpu, g1), kiln::randint(-5, 5, {100}, DType::i32, g2)));
    kiln::manual_seed(3);
    const Tensor a = kiln::randn({50}, cpu);
    kiln::manual_seed(3);
    CHECK(same_bytes(a, kiln::randn({50})));
    const Tensor h = kiln::ones({2, 2});
    CHECK(h.to(cpu).is_same(h));
    CHECK(h.cpu().is_same(h));
    CHECK(kiln::to_string(h).find("device=") == std::string::npos);
}

// ------------------------------------------------------------------ with a GPU

TEST_CASE("gpu: device properties are sane" * doctest::skip(kiln_test::no_cuda())) {
    CHECK(cuda::device_count() >= 1);
    const cuda::DeviceProperties& p = cuda::properties(0);
    MESSAGE("cuda:0 is " << p.name << ", sm_" << p.arch() << ", " << p.sm_count << " SMs, " << (p.total_memory >> 20) << " MiB");
    CHECK(!p.name.empty());
    CHECK(p.sm_count > 0);
    CHECK(p.arch() >= 70);
    CHECK(p.total_memory > 0);
}

TEST_CASE("gpu: to(cuda) then cpu() is bitwise exact for every dtype and size" * doctest::skip(kiln_test::no_cuda())) {
    for (DType dt : kiln::all_dtypes) {
        for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}, std::int64_t{3000000}}) {
            INFO(kiln::dtype_name(dt) << " x " << n);
            const Tensor h = random_host({n}, dt);
            const Tensor d = h.to(Device::cuda());
            CHECK(d.device() == Device::cuda(0));
            CHECK(d.dtype() == dt);
            CHECK(d.is_contiguous());
            CHECK(d.shape() == h.shape());
            const Tensor back = d.cpu();
            CHECK(back.device().is_cpu());
            CHECK(same_bytes(back, h));
            CHECK(same_bytes(h.cuda().cpu(), h));
        }
    }
}

TEST_CASE("gpu: a strided host source is made contiguous first" * doctest::skip(kiln_test::no_cuda())) {
    for (Shape s : {Shape{30, 50}, Shape{1500, 1000}}) {  // small, and large enough for the pinned path
        const Tensor h = kiln::randn(s).t();
        REQUIRE_FALSE(h.is_contiguous());
        const Tensor d = h.to(Device::cuda());
        CHECK(d.is_contiguous());
        CHECK(d.shape() == h.shape());
        CHECK(same_bytes(d.cpu(), h.contiguous()));
    }
    const Tensor b = kiln::randn({7}).expand({3, 7});  // a broadcast view
    CHECK(same_bytes(b.cuda().cpu(), b.contiguous()));
}

TEST_CASE("gpu: a strided CUDA source is made contiguous on its device before it moves" * doctest::skip(kiln_test::no_cuda())) {
    // contiguous() of a strided CUDA view runs a generated kernel (the expression evaluator's CUDA path)
    const Tensor h = kiln::randn({300, 500});
    const Tensor d = h.cuda();
    CHECK(same_bytes(d.t().cpu(), h.t().contiguous()));
    CHECK(same_bytes(d.slice(1, 3, 400, 7).cpu(), h.slice(1, 3, 400, 7).contiguous()));
    Tensor back(Shape{500, 300}, DType::f64);
    back.copy_(d.t());  // strided device source, converted on the host
    CHECK(same_bytes(back, h.t().to(DType::f64)));
}

TEST_CASE("gpu: copy_ across devices converts and broadcasts" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor h64 = kiln::randn({4, 5}, DType::f64);
    Tensor d = kiln::empty({4, 5}, DType::f32, Device::cuda());
    d.copy_(h64);  // converted on the host, then moved
    CHECK(same_bytes(d.cpu(), h64.to(DType::f32)));
    const Tensor row = kiln::randn({5});
    d.copy_(row);  // broadcast on the host
    CHECK(same_bytes(d.cpu(), row.expand({4, 5}).contiguous()));
    Tensor back(Shape{4, 5}, DType::f64);
    back.copy_(d);  // device -> host with a conversion
    CHECK(same_bytes(back, row.expand({4, 5}).to(DType::f64)));
    Tensor strided = kiln::full({5, 4}, -1.0).t();  // a non-contiguous host destination
    strided.copy_(d);
    CHECK(same_bytes(strided.contiguous(), row.expand({4, 5}).contiguous()));
    Tensor same(Shape{4, 5}, DType::f32);  // straight device -> host
    same.fill_(9.0);
    same.copy_(d);
    CHECK(same_bytes(same, row.expand({4, 5}).contiguous()));
}

TEST_CASE("gpu: clone and copies on one device use device-to-device copies" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor h = kiln::randn({1000});
    Tensor d = h.cuda();
    const Tensor c = d.clone();
    CHECK(c.device() == Device::cuda(0));
    CHECK(c.data_ptr() != d.data_ptr());
    CHECK(same_bytes(c.cpu(), h));
    d.fill_(7.0);  // the clone owns its memory
    CHECK(same_bytes(c.cpu(), h));
    CHECK(same_bytes(d.cpu(), kiln::full({1000}, 7.0)));
    Tensor e = kiln::empty({1000}, Device::cuda());
    e.copy_(c);
    CHECK(same_bytes(e.cpu(), h));
    // overlapping ranges of one storage: 0..9 shifted left by two
    Tensor r = kiln::arange(0, 10, 1, DType::f32, Device::cuda());
    r.slice(0, 0, 8).copy_(r.slice(0, 2, 10));
    const float want[10] = {2, 3, 4, 5, 6, 7, 8, 9, 8, 9};
    const Tensor rh = r.cpu();
    CHECK(std::memcmp(rh.data_ptr(), want, sizeof want) == 0);
}

TEST_CASE("gpu: factories on a device give the CPU factory's values" * doctest::skip(kiln_test::no_cuda())) {
    const Device gpu = Device::cuda();
    for (DType dt : kiln::all_dtypes) {
        INFO(kiln::dtype_name(dt));
        const Shape s{3000};
        for (double v : {0.0, 1.0, -3.0, 2.5}) {
            INFO("value " << v);
            // poison: the block the factory gets back from the cache held other values
            { const Tensor poison = kiln::full(s, 77.0, dt, gpu); }
            const Tensor d = kiln::full(s, v, dt, gpu);
            CHECK(same_bytes(d.cpu(), kiln::full(s, v, dt)));
        }
        { const Tensor poison = kiln::full(s, 5.0, dt, gpu); }
        CHECK(same_bytes(kiln::zeros(s, dt, gpu).cpu(), kiln::zeros(s, dt)));
        { const Tensor poison = kiln::full(s, 5.0, dt, gpu); }
        CHECK(same_bytes(kiln::ones(s, dt, gpu).cpu(), kiln::ones(s, dt)));
        kiln::Generator g1(42), g2(42);
        CHECK(same_bytes(kiln::rand(s, dt, gpu, g1).cpu(), kiln::rand(s, dt, g2)));
        CHECK(same_bytes(kiln::randn(s, dt, gpu, g1).cpu(), kiln::randn(s, dt, g2)));
        CHECK(same_bytes(kiln::randint(-100, 100, s, dt, gpu, g1).cpu(), kiln::randint(-100, 100, s, dt, g2)));
        CHECK(same_bytes(kiln::arange(-5, 25, 0.5, dt, gpu).cpu(), kiln::arange(-5, 25, 0.5, dt)));
        CHECK(same_bytes(kiln::linspace(-2, 3, 101, dt, gpu).cpu(), kiln::linspace(-2, 3, 101, dt)));
    }
    CHECK(same_bytes(kiln::zeros({4, 4}, DType::f16, Device::cuda()).cpu(), kiln::zeros({4, 4}, DType::f16)));
    kiln::manual_seed(9);
    const Tensor big = kiln::randn({1 << 24}, Device::cuda());
    kiln::manual_seed(9);
    CHECK(same_bytes(big.cpu(), kiln::randn({1 << 24})));
    CHECK(same_bytes(kiln::arange(10, gpu).cpu(), kiln::arange(10)));
    // fill_ of a transposed (dense) view and of a strided one
    Tensor m = kiln::zeros({64, 32}, gpu);
    m.t().fill_(3.0);
    CHECK(same_bytes(m.cpu(), kiln::full({64, 32}, 3.0)));
}

TEST_CASE("gpu: the allocator reuses freed blocks and keeps its statistics" * doctest::skip(kiln_test::no_cuda())) {
    cuda::empty_cache();
    const cuda::DeviceMemoryStats s0 = cuda::memory_stats();
    CHECK(s0.bytes_cached == 0);
    void* first = nullptr;
    {
        const Tensor a(Shape{1 << 20}, DType::f32, Device::cuda());  // 4 MiB
        first = a.data_ptr();
        const cuda::DeviceMemoryStats s1 = cuda::memory_stats();
        CHECK(s1.allocations == s0.allocations + 1);
        CHECK(s1.driver_allocs == s0.driver_allocs + 1);
        CHECK(s1.bytes_in_use == s0.bytes_in_use + (std::size_t{4} << 20));
        CHECK(s1.peak_bytes_in_use >= s1.bytes_in_use);
    }
    const cuda::DeviceMemoryStats s2 = cuda::memory_stats();
    CHECK(s2.bytes_in_use == s0.bytes_in_use);
    CHECK(s2.bytes_cached == std::size_t{4} << 20);
    {
        const Tensor b(Shape{1 << 20}, DType::f32, Device::cuda());  // same size class: the cached block
        CHECK(b.data_ptr() == first);
        const cuda::DeviceMemoryStats s3 = cuda::memory_stats();
        CHECK(s3.cache_hits == s2.cache_hits + 1);
        CHECK(s3.driver_allocs == s2.driver_allocs);
        CHECK(s3.bytes_cached == 0);
    }
    // zero-byte requests: valid, distinct blocks of the smallest class
    {
        const Tensor z1(Shape{0}, DType::f32, Device::cuda()), z2(Shape{0}, DType::f32, Device::cuda());
        CHECK(z1.storage()->data() != nullptr);
        CHECK(z1.storage()->data() != z2.storage()->data());
        CHECK(cuda::memory_stats().bytes_in_use == s0.bytes_in_use + 1024);
        kiln::Allocator& a = cuda::device_allocator(0);
        void* p = a.allocate(0);
        void* q = a.allocate(0);
        CHECK(p != nullptr);
        CHECK(p != q);
        a.deallocate(p, 0);
        a.deallocate(q, 0);
    }
    const cuda::DeviceMemoryStats s4 = cuda::memory_stats();
    CHECK(s4.bytes_cached > 0);
    cuda::empty_cache();
    const cuda::DeviceMemoryStats s5 = cuda::memory_stats();
    CHECK(s5.bytes_cached == 0);
    CHECK(s5.driver_frees > s4.driver_frees);
    CHECK(s5.bytes_in_use == s0.bytes_in_use);
}

TEST_CASE("gpu: out of memory frees the cache, retries, then throws OutOfMemory with the numbers" * doctest::skip(kiln_test::no_cuda())) {
    const std::size_t total = cuda::properties(0).total_memory;
    { const Tensor cached(Shape{1 << 20}, DType::f32, Device::cuda()); }  // something for the retry to free
    const cuda::DeviceMemoryStats s0 = cuda::memory_stats();
    CHECK(s0.bytes_cached > 0);
    const std::string m = message_of<kiln::OutOfMemory>([&] { (void)cuda::device_allocator(0).allocate(total + (std::size_t{1} << 30)); });
    check_contains(m, {"out of memory", "cuda:0", "MiB", "in use", "cached", "free of"});
    const cuda::DeviceMemoryStats s1 = cuda::memory_stats();
    CHECK(s1.oom_retries == s0.oom_retries + 1);
    CHECK(s1.bytes_cached == 0);  // the retry freed the cache
    CHECK(s1.bytes_in_use == s0.bytes_in_use);
    const std::int64_t n = static_cast<std::int64_t>((total + (std::size_t{1} << 30)) / 4);
    const int l = __LINE__; const std::string t = message_of<kiln::OutOfMemory>([&] { (void)Tensor(Shape{n}, DType::f32, Device::cuda()); });
    check_contains(t, {"kiln::empty:", "out of memory", "MiB", at_line(l)});
    // and the allocator still works
    const Tensor h = kiln::randn({1000});
    CHECK(same_bytes(h.cuda().cpu(), h));
}

TEST_CASE("gpu: a block freed on another stream is reused only on that stream" * doctest::skip(kiln_test::no_cuda())) {
    const Shape s{12345};  // a size class no other test uses
    cuda::empty_cache();
    {
        cuda::Stream side(0);
        void* p = nullptr;
        {
            const cuda::StreamGuard g(side);
            CHECK(cuda::current_stream(0) == side.handle());
            const Tensor a(s, DType::f32, Device::cuda());
            p = a.data_ptr();
        }
        CHECK(cuda::current_stream(0) != side.handle());
        const cuda::DeviceMemoryStats s0 = cuda::memory_stats();
        {
            const Tensor b(s, DType::f32, Device::cuda());  // kiln's stream: must not get the side stream's block
            CHECK(b.data_ptr() != p);
            CHECK(cuda::memory_stats().cache_hits == s0.cache_hits);
        }
        {
            const cuda::StreamGuard g(side);
            const Tensor c(s, DType::f32, Device::cuda());
            CHECK(c.data_ptr() == p);
            CHECK(cuda::memory_stats().cache_hits == s0.cache_hits + 1);
            // work on the guarded stream round-trips too
            const Tensor h = kiln::randn({2000});
            CHECK(same_bytes(h.cuda().cpu(), h));
        }
        side.synchronize();
    }
    cuda::empty_cache();  // the side stream is gone: drop its bins
}

TEST_CASE("gpu: element access on a CUDA tensor" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor x = kiln::arange(0, 10, 1, DType::f32, Device::cuda());
    CHECK(x.select(0, 3).item<float>() == 3.0f);
    CHECK(x.item<float>(7) == 7.0f);
    CHECK(x.view({2, 5}).select(0, 1).item<double>(4) == 9.0);
    CHECK(kiln::full({}, 1.5, DType::f16, Device::cuda()).item<float>() == 1.5f);
    const int l = __LINE__; const std::string m = message_of<kiln::DeviceError>([&] { (void)x.at<float>({0}); });
    check_contains(m, {"kiln::at: tensor is on cuda:0; copy it with .cpu()", at_line(l)});
    CHECK_THROWS_AS((void)kiln::as_eigen<float>(x.view({2, 5})), kiln::DeviceError);
    // printing copies to the host first and names the device
    const std::string host = kiln::to_string(x.cpu());
    CHECK(kiln::to_string(x) == host.substr(0, host.size() - 1) + ", device=cuda:0)");
    MESSAGE(kiln::to_string(kiln::ones({2, 2}, DType::f16, Device::cuda())));
}

TEST_CASE("gpu: events time a large copy" * doctest::skip(kiln_test::no_cuda())) {
    const Tensor h = kiln::randn({1 << 24});  // 64 MiB
    cuda::Event start(0), stop(0);
    start.record(cuda::current_stream(0));
    const Tensor d = h.to(Device::cuda());
    stop.record(cuda::current_stream(0));
    const float ms = stop.elapsed_ms(start);
    MESSAGE("64 MiB host -> device: " << ms << " ms");
    CHECK(ms > 0.0f);
    cuda::Event a(0), b(0);
    a.record(cuda::current_stream(0));
    const Tensor back = d.cpu();
    b.record(cuda::current_stream(0));
    CHECK(b.elapsed_ms(a) > 0.0f);
    CHECK(same_bytes(back, h));
}

TEST_CASE("gpu: concurrent allocations and transfers from 4 threads" * doctest::skip(kiln_test::no_cuda())) {
    const cuda::DeviceMemoryStats s0 = cuda::memory_stats();
    std::mutex failures_mutex;
    std::vector<std::string> failures;
    std::atomic<int> checked{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            try {
                std::vector<Tensor> keep;
                for (int i = 0; i < 200; ++i) {
                    const std::int64_t n = 1 + (static_cast<std::int64_t>(i) * 7919 + t * 104729) % 300000;
                    Tensor d(Shape{n}, DType::i32, Device::cuda());
                    d.fill_(t * 1000 + i);
                    if (d.item<std::int32_t>(n - 1) != t * 1000 + i) throw std::runtime_error("wrong value read back");
                    ++checked;
                    if (i % 3 == 0) keep.push_back(d);
                    if (keep.size() > 8) keep.erase(keep.begin());
                }
            } catch (const std::exception& e) {
                const std::lock_guard lock(failures_mutex);
                failures.push_back(e.what());
            }
        });
    }
    for (auto& th : threads) th.join();
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(checked.load() == 800);
    const cuda::DeviceMemoryStats s1 = cuda::memory_stats();
    CHECK(s1.bytes_in_use == s0.bytes_in_use);
    CHECK(s1.allocations >= s0.allocations + 800);
}

TEST_CASE("gpu: copies between two devices go through the host" * doctest::skip(kiln_test::no_cuda())) {
    if (cuda::device_count() < 2) {
        MESSAGE("skipped: one CUDA device");
        return;
    }
    const Tensor h = kiln::randn({3000}, DType::f64);
    const Tensor d0 = h.cuda(0);
    const Tensor d1 = d0.to(Device::cuda(1));
    CHECK(d1.device() == Device::cuda(1));
    CHECK(same_bytes(d1.cpu(), h));
    Tensor e1 = kiln::empty({3000}, DType::f32, Device::cuda(1));
    e1.copy_(d0);
    CHECK(same_bytes(e1.cpu(), h.to(DType::f32)));
}
