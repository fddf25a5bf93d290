// nn parameter files: .npy and safetensors round trips for every dtype and shape kind, hand-written
// files as NumPy and safetensors write them, every malformed-file error, and checked take().
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/nn.hpp>

#include "test_util.hpp"
#include <kiln/nn/io.hpp>

namespace {

namespace fs = std::filesystem;
using kiln::DType;
using kiln::Shape;
using kiln::Tensor;

/// A fresh directory under the system's temp directory, removed with everything in it.
struct TempDir {
    fs::path path;
    TempDir() {
        static std::atomic<int> counter{0};
        static const unsigned nonce = std::random_device{}();
        path = fs::temp_directory_path() /
               ("kiln-nn-io-test-" + std::to_string(nonce) + "-" + std::to_string(counter.fetch_add(1)));
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    fs::path operator/(const std::string& name) const { return path / name; }
    /// Names of the files in the directory (to check that no temporary file was left behind).
    std::vector<std::string> files() const {
        std::vector<std::string> out;
        for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
        std::sort(out.begin(), out.end());
        return out;
    }
};

void write_bytes(const fs::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
}

std::string read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void append_le(std::string& s, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
    std::string s(v.size() * sizeof(T), '\0');
    if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
    return s;
}

/// A .npy file as NumPy writes it: magic, version, header length, `dict` padded with spaces so the
/// preamble and header fill a multiple of 64 bytes, '\n', then `data`.
std::string npy_file(const std::string& dict, const std::string& data, int major = 1) {
    const std::size_t prefix = major == 1 ? 10 : 12;
    std::string header = dict;
    header.append(64 - (prefix + header.size() + 1) % 64, ' ');
    header += '\n';
    std::string s("\x93NUMPY", 6);
    s += static_cast<char>(major);
    s += '\0';
    append_le(s, header.size(), major == 1 ? 2 : 4);
    return s + header + data;
}

/// A safetensors file: 8-byte little-endian header length, the JSON header, then `data`.
std::string safetensors_file(const std::string& json, const std::string& data) {
    std::string s;
    append_le(s, json.size(), 8);
    return s + json + data;
}

/// A tensor of `shape` and `dtype` with fresh random, nonzero, distinct-looking elements (bools mixed).
Tensor random_tensor(const Shape& shape, DType dtype, std::uint32_t seed) {
    Tensor t(shape, dtype);
    std::mt19937_64 rng(seed);
    kiln::visit_dtype(dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        auto* p = t.data<T>();
        for (std::int64_t i = 0; i < t.numel(); ++i) {
            if constexpr (std::is_same_v<T, bool>) {
                p[i] = (rng() & 1) != 0;
            } else if constexpr (std::is_integral_v<T>) {
                T v = static_cast<T>(rng());  // all bytes in use, both signs
                p[i] = v == 0 ? T(1) : v;
            } else {
                std::uniform_real_distribution<float> u(0.25f, 4.0f);
                p[i] = T((rng() & 1 ? 1.0f : -1.0f) * u(rng));
            }
        }
    });
    return t;
}

/// Same dtype, shape, and bytes in C order (bitwise, so NaN payloads and -0 count).
bool same_tensor(const Tensor& a, const Tensor& b) {
    if (a.dtype() != b.dtype() || !(a.shape() == b.shape())) return false;
    const Tensor ca = a.cpu().contiguous(), cb = b.cpu().contiguous();
    return ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

using kiln_test::message_of;

/// Checks "kiln::<op>: ... at test_nn_io.cpp:<line>" and that every part appears.
void check_message(const std::string& msg, int line, std::initializer_list<std::string> parts) {
    INFO("message: \"" << msg << "\"");
    CHECK_MESSAGE(msg.rfind("kiln::nn::", 0) == 0, "does not start with kiln::nn::");
    const std::string where = " at test_nn_io.cpp:" + std::to_string(line);
    const bool ends_here = msg.size() >= where.size() && msg.compare(msg.size() - where.size(), where.size(), where) == 0;
    CHECK_MESSAGE(ends_here, "does not end with \"" << where << "\"");
    for (const auto& p : parts) CHECK_MESSAGE(msg.find(p) != std::string::npos, "does not contain \"" << p << "\"");
}

}  // namespace

/// `stmt` must throw exactly `Type` from this line; the message must name this line and contain
/// every further argument. Keep each use on one line: the line is part of the check.
#define EXPECT_KILN_ERROR(Type, stmt, ...)                                       \
    do {                                                                         \
        const int expect_line_ = __LINE__;                                       \
        const std::string expect_msg_ = message_of<Type>([&] { stmt; });         \
        check_message(expect_msg_, expect_line_, {__VA_ARGS__});                 \
    } while (0)

namespace {

/// load_npy of a file holding `bytes` must throw E naming the file and every part.
template <class E>
void expect_bad_npy(const std::string& bytes, std::initializer_list<std::string> parts, int line) {
    TempDir dir;
    const fs::path p = dir / "broken.npy";
    write_bytes(p, bytes);
    const std::string msg = message_of<E>([&] { kiln::nn::load_npy(p); });
    INFO("from the test at line " << line);
    check_message(msg, __LINE__ - 2, parts);
    CHECK_MESSAGE(msg.find(p.string() + ": ") != std::string::npos, "does not name the file");
    CHECK(msg.rfind("kiln::nn::load_npy: ", 0) == 0);
}

/// load_safetensors (and load_safetensors_metadata) of a file holding `bytes` must throw E naming
/// the file and every part.
template <class E>
void expect_bad_safetensors(const std::string& bytes, std::initializer_list<std::string> parts, int line) {
    TempDir dir;
    const fs::path p = dir / "broken.safetensors";
    write_bytes(p, bytes);
    INFO("from the test at line " << line);
    const std::string msg = message_of<E>([&] { kiln::nn::load_safetensors(p); });
    check_message(msg, __LINE__ - 1, parts);
    CHECK_MESSAGE(msg.find(p.string() + ": ") != std::string::npos, "does not name the file");
    CHECK(msg.rfind("kiln::nn::load_safetensors: ", 0) == 0);
    const std::string meta = message_of<E>([&] { kiln::nn::load_safetensors_metadata(p); });
    check_message(meta, __LINE__ - 1, parts);
}

const std::string good_f4_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
const std::string six_floats = bytes_of(std::vector<float>{0.5f, -1.5f, 2.5f, -3.5f, 4.5f, -5.5f});

}  // namespace

// =================================================================================================
// .npy: round trips

TEST_CASE("npy: every dtype NumPy has round-trips bit for bit") {
    TempDir dir;
    std::uint32_t seed = 1;
    for (DType d : {DType::f16, DType::f32, DType::f64, DType::i32, DType::i64, DType::boolean}) {
        INFO("dtype " << kiln::dtype_name(d));
        const Tensor t = random_tensor({2, 3, 4}, d, seed++);
        const fs::path p = dir / (std::string(kiln::dtype_name(d)) + ".npy");
        kiln::nn::save_npy(p, t);
        const Tensor u = kiln::nn::load_npy(p);
        CHECK(u.device() == kiln::Device::cpu());
        CHECK(u.is_contiguous());
        CHECK(same_tensor(t, u));
        CHECK_FALSE(u.is_same(t));
    }
}

TEST_CASE("npy: special float values survive (NaN, infinities, -0, subnormals)") {
    TempDir dir;
    const std::vector<float> v = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::infinity(), -0.0f,
                                  std::numeric_limits<float>::denorm_min(), 3.0f};
    Tensor t({6}, DType::f32);
    std::memcpy(t.data_ptr(), v.data(), sizeof(float) * 6);
    kiln::nn::save_npy(dir / "s.npy", t);
    CHECK(same_tensor(t, kiln::nn::load_npy(dir / "s.npy")));
}

TEST_CASE("npy: 0-d, empty, one-dim and rank-8 shapes") {
    TempDir dir;
    for (const Shape& s : {Shape{}, Shape{0}, Shape{3, 0, 2}, Shape{5}, Shape{1, 2, 1, 2, 1, 2, 1, 2}}) {
        INFO("shape " << s.str());
        const Tensor t = random_tensor(s, DType::f64, 7);
        kiln::nn::save_npy(dir / "t.npy", t);
        const Tensor u = kiln::nn::load_npy(dir / "t.npy");
        CHECK(u.shape() == s);
        CHECK(u.rank() == s.rank());
        CHECK(same_tensor(t, u));
    }
}

TEST_CASE("npy: non-contiguous tensors are written in C order") {
    TempDir dir;
    const Tensor base = random_tensor({4, 6}, DType::i64, 11);
    const Tensor views[] = {base.transpose(0, 1), base.slice(1, 1, 6, 2), base.select(1, 3),
                            base.slice(0, 0, 1).expand({3, 6}), base.permute({1, 0}).slice(0, 1, 5)};
    for (const Tensor& v : views) {
        INFO("shape " << v.shape().str() << " strides " << v.strides().str());
        REQUIRE_FALSE(v.is_contiguous());
        kiln::nn::save_npy(dir / "v.npy", v);
        const Tensor u = kiln::nn::load_npy(dir / "v.npy");
        CHECK(u.is_contiguous());
        REQUIRE(u.shape() == v.shape());
        for (std::int64_t i = 0; i < v.numel(); ++i) CHECK(u.item<std::int64_t>(i) == v.item<std::int64_t>(i));
    }
}

TEST_CASE("npy: the writer writes NumPy's preamble and header") {
    TempDir dir;
    Tensor t({2, 3}, DType::f32);
    std::memcpy(t.data_ptr(), six_floats.data(), 24);
    kiln::nn::save_npy(dir / "w.npy", t);
    CHECK(read_bytes(dir / "w.npy") == npy_file(good_f4_dict, six_floats));

    const std::string b = read_bytes(dir / "w.npy");
    CHECK(b.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
    const std::size_t header_len = static_cast<unsigned char>(b[8]) | (static_cast<unsigned char>(b[9]) << 8);
    CHECK((10 + header_len) % 64 == 0);
    CHECK(b[10 + header_len - 1] == '\n');
    CHECK(b.size() == 10 + header_len + 24);

    kiln::nn::save_npy(dir / "s.npy", kiln::full({}, 2.0, DType::f64));
    CHECK(read_bytes(dir / "s.npy").find("{'descr': '<f8', 'fortran_order': False, 'shape': (), }") == 10);
    kiln::nn::save_npy(dir / "v.npy", kiln::ones({5}, DType::boolean));
    CHECK(read_bytes(dir / "v.npy").find("{'descr': '|b1', 'fortran_order': False, 'shape': (5,), }") == 10);
}

TEST_CASE("npy: hand-written files as NumPy writes them load with their values") {
    TempDir dir;
    SUBCASE("version 1.0, <f4, (2, 3)") {
        write_bytes(dir / "a.npy", npy_file(good_f4_dict, six_floats));
        const Tensor t = kiln::nn::load_npy(dir / "a.npy");
        CHECK(t.dtype() == DType::f32);
        CHECK(t.shape() == Shape{2, 3});
        CHECK(t.at<float>({0, 0}) == 0.5f);
        CHECK(t.at<float>({0, 2}) == 2.5f);
        CHECK(t.at<float>({1, 0}) == -3.5f);
        CHECK(t.at<float>({1, 2}) == -5.5f);
    }
    SUBCASE("version 2.0, <i8, (3,)") {
        const std::string data = bytes_of(std::vector<std::int64_t>{-7, 1LL << 40, 9});
        write_bytes(dir / "b.npy", npy_file("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", data, 2));
        const Tensor t = kiln::nn::load_npy(dir / "b.npy");
        CHECK(t.dtype() == DType::i64);
        CHECK(t.shape() == Shape{3});
        CHECK(t.at<std::int64_t>({0}) == -7);
        CHECK(t.at<std::int64_t>({1}) == (1LL << 40));
        CHECK(t.at<std::int64_t>({2}) == 9);
    }
    SUBCASE("version 3.0, |b1, (4,); a nonzero byte other than 1 reads as true") {
        write_bytes(dir / "c.npy", npy_file("{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }",
                                            std::string("\x00\x01\x01\x02", 4), 3));
        const Tensor t = kiln::nn::load_npy(dir / "c.npy");
        CHECK(t.dtype() == DType::boolean);
        CHECK(t.item<double>(0) == 0.0);
        CHECK(t.item<double>(1) == 1.0);
        CHECK(t.item<double>(3) == 1.0);
        CHECK(*static_cast<const unsigned char*>(t.data_ptr()) == 0);
        CHECK(static_cast<const unsigned char*>(t.data_ptr())[3] == 1);
    }
    SUBCASE("0-d <f8, <f2 and <i4; older NumPy's 16-byte padding, other key order, Python 2 longs") {
        write_bytes(dir / "d.npy", npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (), }",
                                            bytes_of(std::vector<double>{-2.25})));
        const Tensor d = kiln::nn::load_npy(dir / "d.npy");
        CHECK(d.rank() == 0);
        CHECK(d.item<double>() == -2.25);

        // half 1.0 = 0x3c00, -2.0 = 0xc000
        write_bytes(dir / "e.npy", npy_file("{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }",
                                            std::string("\x00\x3c\x00\xc0", 4)));
        const Tensor e = kiln::nn::load_npy(dir / "e.npy");
        CHECK(e.dtype() == DType::f16);
        CHECK(e.item<float>(0) == 1.0f);
        CHECK(e.item<float>(1) == -2.0f);

        std::string old("\x93NUMPY\x01\x00", 8);
        const std::string dict = "{\"shape\": (1L, 2L), 'fortran_order': False, \"descr\": '<i4'}";
        std::string header = dict + std::string((16 - (10 + dict.size() + 1) % 16) % 16, ' ') + "\n";
        append_le(old, header.size(), 2);
        write_bytes(dir / "f.npy", old + header + bytes_of(std::vector<std::int32_t>{-3, 4}));
        const Tensor f = kiln::nn::load_npy(dir / "f.npy");
        CHECK(f.dtype() == DType::i32);
        CHECK(f.shape() == Shape{1, 2});
        CHECK(f.at<std::int32_t>({0, 1}) == 4);
    }
}

TEST_CASE("npy: bf16 has no NumPy dtype and is refused before the file is touched") {
    TempDir dir;
    const fs::path p = dir / "bf.npy";
    write_bytes(p, "keep me");
    EXPECT_KILN_ERROR(kiln::DTypeError, kiln::nn::save_npy(p, kiln::ones({2}, DType::bf16)), "kiln::nn::save_npy: ", p.string(), "bfloat16 has no NumPy dtype", "save_safetensors");
    CHECK(read_bytes(p) == "keep me");
    CHECK(dir.files() == std::vector<std::string>{"bf.npy"});
}

TEST_CASE("npy: save errors (undefined tensor, missing directory) leave nothing behind") {
    TempDir dir;
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::save_npy(dir / "u.npy", Tensor()), "u.npy", "the tensor is undefined");
    const fs::path nowhere = dir / "no-such-dir" / "x.npy";
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::save_npy(nowhere, kiln::ones({2})), nowhere.string(), "does not exist");
    CHECK(dir.files().empty());
    // overwriting an existing file replaces it whole
    kiln::nn::save_npy(dir / "o.npy", kiln::ones({100}));
    kiln::nn::save_npy(dir / "o.npy", kiln::full({2}, 3.0));
    CHECK(kiln::nn::load_npy(dir / "o.npy").numel() == 2);
    CHECK(dir.files() == std::vector<std::string>{"o.npy"});
}

// =================================================================================================
// .npy: malformed files

TEST_CASE("npy malformed: a missing file and a directory") {
    TempDir dir;
    const fs::path missing = dir / "missing.npy";
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::load_npy(missing), "kiln::nn::load_npy: ", missing.string(), "no such file");
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::load_npy(dir.path), dir.path.string(), "is a directory");
}

TEST_CASE("npy malformed: empty file") {
    expect_bad_npy<kiln::ValueError>("", {"truncated: the file is empty"}, __LINE__);
}

TEST_CASE("npy malformed: bad magic (an .npz archive, a text file)") {
    expect_bad_npy<kiln::ValueError>(std::string("PK\x03\x04\x14\x00\x00\x00", 8) + std::string(64, 'x'), {"not a .npy file", "\\x93NUMPY", "PK\\x03\\x04"}, __LINE__);
    expect_bad_npy<kiln::ValueError>("hello world, not numpy", {"not a .npy file", "\"hello "}, __LINE__);
}

TEST_CASE("npy malformed: truncated preamble") {
    expect_bad_npy<kiln::ValueError>(std::string("\x93NUM", 4), {"truncated", "4 bytes"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(std::string("\x93NUMPY\x01\x00\x10", 9), {"truncated", "9 bytes", "10-byte preamble"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(std::string("\x93NUMPY\x02\x00\x10\x00", 10), {"truncated", "12-byte preamble", "version 2.0"}, __LINE__);
}

TEST_CASE("npy malformed: unsupported format version") {
    std::string b = npy_file(good_f4_dict, six_floats);
    b[6] = 4;
    expect_bad_npy<kiln::ValueError>(b, {"unsupported .npy format version 4.0", "1.0, 2.0 and 3.0"}, __LINE__);
    b[6] = 1;
    b[7] = 1;
    expect_bad_npy<kiln::ValueError>(b, {"version 1.1"}, __LINE__);
}

TEST_CASE("npy malformed: header length past the end of the file") {
    std::string b = std::string("\x93NUMPY\x01\x00", 8);
    append_le(b, 4096, 2);
    b += good_f4_dict;
    expect_bad_npy<kiln::ValueError>(b, {"header length 4096 runs past the end of the file (" + std::to_string(b.size()) + " bytes)"}, __LINE__);
    std::string v2 = std::string("\x93NUMPY\x02\x00", 8);
    append_le(v2, 0xffffffffu, 4);  // 4 GiB: must be refused, not allocated
    expect_bad_npy<kiln::ValueError>(v2 + good_f4_dict, {"header length 4294967295 runs past the end"}, __LINE__);
}

TEST_CASE("npy malformed: header is not a valid Python literal") {
    expect_bad_npy<kiln::ValueError>(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, }", six_floats), {"malformed .npy header", "expected a value", "(header: \"{'descr'"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(npy_file("{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3), }", six_floats), {"malformed .npy header", "expected ',' or '}'"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(npy_file("{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3), }", six_floats), {"malformed .npy header"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } junk", six_floats), {"malformed .npy header", "after the header's value"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(npy_file("[1, 2]", six_floats), {"expected a dict, found a list"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5, 3), }", six_floats), {"malformed .npy header", "expected an integer"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(npy_file("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }", six_floats), {"fortran_order is an integer"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", six_floats), {"shape is a list, not a tuple"}, __LINE__);
}

TEST_CASE("npy malformed: deep nesting is refused, not recursed into") {
    expect_bad_npy<kiln::ValueError>(npy_file(std::string(100000, '('), "", 2), {"nesting deeper than 32 levels"}, __LINE__);
}

TEST_CASE("npy malformed: missing, unexpected and repeated keys") {
    expect_bad_npy<kiln::ValueError>(npy_file("{'descr': '<f4', 'fortran_order': False, }", six_floats), {"no 'shape' key"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'extra': 1}", six_floats), {"unexpected key 'extra'"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(npy_file("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", six_floats), {"key 'descr' appears twice"}, __LINE__);
}

TEST_CASE("npy malformed: fortran_order True") {
    expect_bad_npy<kiln::ValueError>(npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", six_floats), {"fortran_order is True", "C-order", "np.ascontiguousarray"}, __LINE__);
}

TEST_CASE("npy malformed: unsupported descr") {
    expect_bad_npy<kiln::DTypeError>(npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (6,), }", std::string(6, '\1')), {"unsupported descr '|u1'", "<f2 <f4 <f8 <i4 <i8 |b1"}, __LINE__);
    expect_bad_npy<kiln::DTypeError>(npy_file("{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", six_floats), {"unsupported descr '<c8'"}, __LINE__);
    expect_bad_npy<kiln::DTypeError>(npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", six_floats), {"unsupported descr '>f4'", "big-endian", "astype('<f4')"}, __LINE__);
    expect_bad_npy<kiln::DTypeError>(npy_file("{'descr': [('x', '<f4'), ('y', '<f4')], 'fortran_order': False, 'shape': (3,), }", six_floats), {"descr is a list", "structured dtype"}, __LINE__);
}

TEST_CASE("npy malformed: negative, too many and too large dims") {
    expect_bad_npy<kiln::ShapeError>(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }", six_floats), {"shape (-2, 3) has a negative dimension"}, __LINE__);
    expect_bad_npy<kiln::ShapeError>(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }", std::string(4, '\0')), {"rank 9", "maximum rank 8"}, __LINE__);
    expect_bad_npy<kiln::ShapeError>(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", six_floats), {"more bytes than a 64-bit size can count"}, __LINE__);
    // a zero dim must not hide an overflow in the others (kiln's strides multiply them all)
    expect_bad_npy<kiln::ShapeError>(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4294967296, 4294967296), }", ""), {"more bytes than a 64-bit size can count"}, __LINE__);
    expect_bad_npy<kiln::ShapeError>(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", six_floats), {"99999999999999999999", "does not fit in int64"}, __LINE__);
}

TEST_CASE("npy malformed: a huge declared shape is refused without allocating it") {
    // 2^40 floats = 4 TiB: the size check against the file must come before any allocation.
    expect_bad_npy<kiln::ValueError>(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }", six_floats), {"truncated", "needs 4398046511104 bytes of data", "has 24 after the header"}, __LINE__);
}

TEST_CASE("npy malformed: truncated and trailing data") {
    expect_bad_npy<kiln::ValueError>(npy_file(good_f4_dict, six_floats.substr(0, 20)), {"truncated: shape (2, 3) of <f4 needs 24 bytes of data, but the file has 20 after the header"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(npy_file(good_f4_dict, ""), {"needs 24 bytes", "has 0 after the header"}, __LINE__);
    expect_bad_npy<kiln::ValueError>(npy_file(good_f4_dict, six_floats + "abcd"), {"needs 24 bytes of data, but the file has 28 after the header (4 trailing bytes)"}, __LINE__);
}

// =================================================================================================
// safetensors: round trips

TEST_CASE("safetensors: every dtype round-trips bit for bit in one file") {
    TempDir dir;
    std::map<std::string, Tensor> tensors;
    std::uint32_t seed = 100;
    for (DType d : kiln::all_dtypes) tensors.emplace("w." + std::string(kiln::dtype_name(d)), random_tensor({3, 5}, d, seed++));
    kiln::nn::save_safetensors(dir / "all.safetensors", tensors);
    const auto loaded = kiln::nn::load_safetensors(dir / "all.safetensors");
    REQUIRE(loaded.size() == tensors.size());
    for (const auto& [name, t] : tensors) {
        INFO("tensor " << name);
        REQUIRE(loaded.count(name) == 1);
        const Tensor& u = loaded.at(name);
        CHECK(u.device() == kiln::Device::cpu());
        CHECK(same_tensor(t, u));
    }
    CHECK(kiln::nn::load_safetensors_metadata(dir / "all.safetensors").empty());
}

TEST_CASE("safetensors: 0-d, empty and rank-8 tensors; an empty file of no tensors") {
    TempDir dir;
    const std::map<std::string, Tensor> tensors = {
        {"scalar", random_tensor({}, DType::f32, 1)},         {"empty", random_tensor({0}, DType::f64, 2)},
        {"empty3", random_tensor({2, 0, 3}, DType::i32, 3)},  {"rank8", random_tensor({1, 2, 1, 2, 1, 2, 1, 2}, DType::bf16, 4)},
        {"one", random_tensor({1}, DType::boolean, 5)},
    };
    kiln::nn::save_safetensors(dir / "s.safetensors", tensors);
    const auto loaded = kiln::nn::load_safetensors(dir / "s.safetensors");
    REQUIRE(loaded.size() == tensors.size());
    for (const auto& [name, t] : tensors) {
        INFO("tensor " << name);
        CHECK(same_tensor(t, loaded.at(name)));
    }
    CHECK(loaded.at("scalar").rank() == 0);

    kiln::nn::save_safetensors(dir / "none.safetensors", {});
    CHECK(read_bytes(dir / "none.safetensors") == safetensors_file("{}      ", ""));
    CHECK(kiln::nn::load_safetensors(dir / "none.safetensors").empty());
}

TEST_CASE("safetensors: non-contiguous tensors are written in C order") {
    TempDir dir;
    const Tensor base = random_tensor({4, 6}, DType::f32, 21);
    const std::map<std::string, Tensor> views = {
        {"t", base.t()}, {"strided", base.slice(1, 0, 6, 3)}, {"expanded", base.select(0, 2).unsqueeze(0).expand({5, 6})}};
    kiln::nn::save_safetensors(dir / "v.safetensors", views);
    const auto loaded = kiln::nn::load_safetensors(dir / "v.safetensors");
    for (const auto& [name, v] : views) {
        INFO("tensor " << name);
        REQUIRE_FALSE(v.is_contiguous());
        const Tensor& u = loaded.at(name);
        REQUIRE(u.shape() == v.shape());
        CHECK(u.is_contiguous());
        for (std::int64_t i = 0; i < v.numel(); ++i) CHECK(u.item<float>(i) == v.item<float>(i));
    }
}

TEST_CASE("safetensors: metadata and unusual names round-trip") {
    TempDir dir;
    const std::map<std::string, std::string> meta = {
        {"format", "pt"}, {"note", "quote \" backslash \\ newline \n tab \t bell \x07 caf\xc3\xa9 \xe2\x9c\x93"}, {"", "empty key"}};
    const std::map<std::string, Tensor> tensors = {{"layers.0.attn.q_proj.weight", random_tensor({2, 2}, DType::f16, 1)},
                                                   {"we\"ird\\name\n\xf0\x9f\x98\x80", random_tensor({3}, DType::i64, 2)},
                                                   {"", random_tensor({1}, DType::f32, 3)}};
    kiln::nn::save_safetensors(dir / "m.safetensors", tensors, meta);
    CHECK(kiln::nn::load_safetensors_metadata(dir / "m.safetensors") == meta);
    const auto loaded = kiln::nn::load_safetensors(dir / "m.safetensors");
    REQUIRE(loaded.size() == 3);
    for (const auto& [name, t] : tensors) CHECK(same_tensor(t, loaded.at(name)));
}

TEST_CASE("safetensors: the writer's layout (header padded to 8 bytes, tensors aligned, largest elements first)") {
    TempDir dir;
    Tensor h({3}, DType::f16), d({2}, DType::f64), b({1}, DType::boolean);
    h.fill_(1.0);
    d.fill_(-2.0);
    b.fill_(true);
    kiln::nn::save_safetensors(dir / "l.safetensors", {{"a_half", h}, {"b_double", d}, {"c_bool", b}}, {{"format", "pt"}});
    const std::string bytes = read_bytes(dir / "l.safetensors");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
    CHECK(n % 8 == 0);
    const std::string header = bytes.substr(8, n);
    CHECK(header.rfind(
              "{\"__metadata__\":{\"format\":\"pt\"},"
              "\"b_double\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
              "\"a_half\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[16,22]},"
              "\"c_bool\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[22,23]}}",
              0) == 0);
    CHECK(header.find_first_not_of(' ', header.find_last_of('}') + 1) == std::string::npos);
    CHECK(bytes.size() == 8 + n + 23);
    double first;
    std::memcpy(&first, bytes.data() + 8 + n, 8);
    CHECK(first == -2.0);
}

TEST_CASE("safetensors: a hand-written file as the reference implementation writes it loads with its values") {
    TempDir dir;
    // {"__metadata__":{"format":"pt"},"a":F32 [2,2],"b":I64 [],"c":BF16 [2],"d":BOOL [3]}, offsets by hand
    std::string json =
        "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]},"
        "\"b\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
        "\"c\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[24,28]},"
        "\"d\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[28,31]}}";
    json.append((8 - json.size() % 8) % 8, ' ');
    const std::string data = bytes_of(std::vector<std::int64_t>{-42}) + bytes_of(std::vector<float>{1.0f, 2.0f, -3.0f, 0.25f}) +
                             std::string("\x80\x3f\x00\xc0", 4) /* bf16 1.0, -2.0 */ + std::string("\x01\x00\x01", 3);
    write_bytes(dir / "h.safetensors", safetensors_file(json, data));
    const auto t = kiln::nn::load_safetensors(dir / "h.safetensors");
    REQUIRE(t.size() == 4);
    CHECK(t.at("a").dtype() == DType::f32);
    CHECK(t.at("a").shape() == Shape{2, 2});
    CHECK(t.at("a").at<float>({1, 0}) == -3.0f);
    CHECK(t.at("a").at<float>({1, 1}) == 0.25f);
    CHECK(t.at("b").rank() == 0);
    CHECK(t.at("b").item<std::int64_t>() == -42);
    CHECK(t.at("c").dtype() == DType::bf16);
    CHECK(t.at("c").item<float>(0) == 1.0f);
    CHECK(t.at("c").item<float>(1) == -2.0f);
    CHECK(t.at("d").dtype() == DType::boolean);
    CHECK(t.at("d").item<double>(0) == 1.0);
    CHECK(t.at("d").item<double>(1) == 0.0);
    CHECK(kiln::nn::load_safetensors_metadata(dir / "h.safetensors") == std::map<std::string, std::string>{{"format", "pt"}});

    // Pretty-printed JSON with escapes: whitespace anywhere, \u escapes (a surrogate pair too), "\/".
    const std::string pretty =
        "{\n  \"caf\\u00e9\\/\\ud83d\\ude00\" : {\n    \"data_offsets\" : [ 0 , 8 ],\n    \"shape\" : [ 2 ],\n"
        "    \"dtype\" : \"I32\"\n  }\n}\n";
    write_bytes(dir / "p.safetensors", safetensors_file(pretty, bytes_of(std::vector<std::int32_t>{5, -6})));
    const auto p = kiln::nn::load_safetensors(dir / "p.safetensors");
    REQUIRE(p.size() == 1);
    const std::string name = "caf\xc3\xa9/\xf0\x9f\x98\x80";
    REQUIRE(p.count(name) == 1);
    CHECK(p.at(name).item<std::int32_t>(1) == -6);
}

TEST_CASE("safetensors: save errors (reserved and invalid names, undefined tensors) leave nothing behind") {
    TempDir dir;
    const fs::path p = dir / "e.safetensors";
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::save_safetensors(p, {{"__metadata__", kiln::ones({1})}}), "kiln::nn::save_safetensors: ", p.string(), "'__metadata__' is reserved");
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::save_safetensors(p, {{"bad\xff", kiln::ones({1})}}), "is not valid UTF-8");
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::save_safetensors(p, {{"w", Tensor()}}), "tensor 'w' is undefined");
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::save_safetensors(p, {{"w", kiln::ones({1})}}, {{"k", "\xc3"}}), "metadata entry \"k\" is not valid UTF-8");
    CHECK(dir.files().empty());
}

TEST_CASE("safetensors and npy: CUDA tensors are saved from the host and load on the CPU" * doctest::skip(kiln_test::no_cuda())) {
    TempDir dir;
    const Tensor host = random_tensor({4, 8}, DType::f32, 5);
    const Tensor dev = host.to(kiln::Device::cuda());
    kiln::nn::save_npy(dir / "g.npy", dev.t());  // a strided device view
    kiln::nn::save_safetensors(dir / "g.safetensors", {{"g", dev}, {"gt", dev.t()}});
    const Tensor u = kiln::nn::load_npy(dir / "g.npy");
    CHECK(u.device() == kiln::Device::cpu());
    CHECK(same_tensor(host.t(), u));
    const auto m = kiln::nn::load_safetensors(dir / "g.safetensors");
    CHECK(same_tensor(host, m.at("g")));
    CHECK(same_tensor(host.t(), m.at("gt")));
    CHECK(same_tensor(host, m.at("g").to(kiln::Device::cuda())));
}

// =================================================================================================
// safetensors: malformed files

namespace {
/// One F32 tensor "w" of shape [2, 3] at [0, 24] plus its 24 bytes of data, with the JSON for
/// the entry replaceable.
std::string st_one(const std::string& entry, const std::string& data = six_floats) {
    return safetensors_file("{\"w\":" + entry + "}", data);
}
const std::string good_entry = "{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}";
}  // namespace

TEST_CASE("safetensors malformed: a missing file and a directory") {
    TempDir dir;
    const fs::path missing = dir / "missing.safetensors";
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::load_safetensors(missing), "kiln::nn::load_safetensors: ", missing.string(), "no such file");
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::load_safetensors(dir.path), "is a directory");
}

TEST_CASE("safetensors malformed: the control file is fine") {
    TempDir dir;
    write_bytes(dir / "ok.safetensors", st_one(good_entry));
    CHECK(kiln::nn::load_safetensors(dir / "ok.safetensors").at("w").item<float>(5) == -5.5f);
}

TEST_CASE("safetensors malformed: truncated header length") {
    expect_bad_safetensors<kiln::ValueError>("", {"truncated: 0 bytes, shorter than the 8-byte header length"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(std::string("\x10\x00\x00", 3), {"truncated: 3 bytes"}, __LINE__);
}

TEST_CASE("safetensors malformed: header length larger than the file") {
    std::string b;
    append_le(b, 1000, 8);
    b += "{}";
    expect_bad_safetensors<kiln::ValueError>(b, {"header length 1000 runs past the end of the file (10 bytes"}, __LINE__);
    std::string huge;
    append_le(huge, 0xffffffffffffff00ull, 8);  // must be refused, not allocated
    expect_bad_safetensors<kiln::ValueError>(huge + "{}", {"header length 18446744073709551360 runs past the end"}, __LINE__);
    // an .npy file read as safetensors: its first 8 bytes make an absurd length
    expect_bad_safetensors<kiln::ValueError>(npy_file(good_f4_dict, six_floats), {"runs past the end of the file", "is it a safetensors file?"}, __LINE__);
}

TEST_CASE("safetensors malformed: header length over safetensors' 100 MB limit") {
    TempDir dir;
    const fs::path p = dir / "big.safetensors";
    std::string b;
    append_le(b, 200'000'000, 8);
    write_bytes(p, b + "{}");
    fs::resize_file(p, 200'000'016);  // sparse where the file system allows; never read
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::load_safetensors(p), "header length 200000000 exceeds safetensors' limit of 100000000 bytes");
}

TEST_CASE("safetensors malformed: invalid JSON") {
    const std::pair<std::string, std::string> cases[] = {
        {"", "unexpected end of header, expected a value at header byte 0"},
        {"{\"w\":" + good_entry + ",}", "expected a string key, found '}'"},
        {"{\"w\":" + good_entry, "expected ',' or '}' after an object member, found end of header"},
        {"{\"w\":{\"dtype\":\"F32,\"shape\":[2,3],\"data_offsets\":[0,24]}}", "expected ',' or '}'"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}", "found end of header"},
        {"{\"w\" {}}", "expected ':' after a key"},
        {"{'w':{}}", "expected a string key, found '''"},
        {"{\"w\":{\"dtype\":\"F\\q32\"}}", "invalid escape '\\q'"},
        {"{\"w\":{\"dtype\":\"F32\\u00zz\"}}", "invalid hex digit"},
        {"{\"w\\ud800\":{}}", "unpaired high surrogate"},
        {"{\"w\\udc00\":{}}", "unpaired low surrogate"},
        {"{\"w\xff\":{}}", "invalid UTF-8"},
        {"{\"w\xc0\xaf\":{}}", "invalid UTF-8"},  // an overlong '/'
        {"{\"w\x01\":{}}", "unescaped control character byte 0x01"},
        {"{\"w\":{\"shape\":[01]}}", "leading zero"},
        {"{\"w\":{\"shape\":[NaN]}}", "unexpected 'N', expected a value"},
        {"{\"w\":{\"shape\":[-]}}", "expected a digit"},
        {"{\"w\":{\"shape\":[1.]}}", "expected a digit after '.'"},
        {"{\"w\":tru}", "expected a value"},
        {"{} {}", "unexpected '{' after the top-level value"},
        {"{\"w\":" + good_entry + std::string("}\x00\x00", 3), "unexpected byte 0x00 after the top-level value"},
        {"{/* comment */}", "expected a string key, found '/'"},
    };
    for (const auto& [json, what] : cases) {
        INFO("header " << json);
        expect_bad_safetensors<kiln::ValueError>(safetensors_file(json, six_floats), {"invalid JSON header: ", what}, __LINE__);
    }
}

TEST_CASE("safetensors malformed: deep nesting is refused, not recursed into") {
    expect_bad_safetensors<kiln::ValueError>(safetensors_file(std::string(1'000'000, '['), ""), {"invalid JSON header: nesting deeper than 64 levels"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(safetensors_file("{\"a\":" + std::string(70, '[') + std::string(70, ']') + "}", ""), {"nesting deeper than 64 levels"}, __LINE__);
}

TEST_CASE("safetensors malformed: wrong JSON structure") {
    expect_bad_safetensors<kiln::ValueError>(safetensors_file("[1, 2]", ""), {"invalid header: expected a JSON object, found an array"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("[0, 24]"), {"tensor 'w' is described by an array, not an object"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"shape\":[2,3],\"data_offsets\":[0,24]}"), {"tensor 'w' has no 'dtype'"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"data_offsets\":[0,24]}"), {"tensor 'w' has no 'shape'"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"shape\":[2,3]}"), {"tensor 'w' has no 'data_offsets'"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],\"scale\":2}"), {"tensor 'w' has an unexpected key 'scale'"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":32,\"shape\":[2,3],\"data_offsets\":[0,24]}"), {"tensor 'w' has a dtype that is a number"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"shape\":6,\"data_offsets\":[0,24]}"), {"tensor 'w' has a shape that is a number"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"shape\":[\"2\",3],\"data_offsets\":[0,24]}"), {"tensor 'w' has a shape entry that is a string"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(safetensors_file("{\"__metadata__\":{\"format\":1}}", ""), {"__metadata__ entry 'format' is a number", "must be strings"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(safetensors_file("{\"__metadata__\":[\"pt\"]}", ""), {"__metadata__ is an array"}, __LINE__);
}

TEST_CASE("safetensors malformed: data_offsets past the end of the file") {
    // fc.weight: 32 x 32 floats = 4096 bytes, but the file holds 2048 bytes of data
    const std::string b = safetensors_file("{\"fc.weight\":{\"dtype\":\"F32\",\"shape\":[32,32],\"data_offsets\":[0,4096]}}", std::string(2048, '\1'));
    expect_bad_safetensors<kiln::ValueError>(b, {"tensor 'fc.weight' data_offsets [0, 4096] run past the end of the file (2048 bytes of data)"}, __LINE__);
    TempDir dir;
    write_bytes(dir / "model.safetensors", b);
    const fs::path p = dir / "model.safetensors";
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::load_safetensors(p), "kiln::nn::load_safetensors: " + p.string() + ": tensor 'fc.weight' data_offsets [0, 4096] run past the end of the file (2048 bytes of data)");
}

TEST_CASE("safetensors malformed: data_offsets overlapping, leaving a gap or trailing bytes") {
    const std::string two = bytes_of(std::vector<float>(8, 1.0f));  // 32 bytes
    expect_bad_safetensors<kiln::ValueError>(safetensors_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", two.substr(0, 24)), {"tensor 'a' [0, 16] and tensor 'b' [8, 24] overlap"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(safetensors_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", two.substr(0, 16)), {"tensor 'a' [0, 16] and tensor 'b' [0, 16] overlap"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(safetensors_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]}}", two), {"bytes [16, 24) of the data belong to no tensor (after tensor 'a' [0, 16], before tensor 'b' [24, 32])"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(safetensors_file("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", two.substr(0, 16)), {"bytes [0, 8) of the data belong to no tensor (before tensor 'b' [8, 16])"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one(good_entry, six_floats + "xyz"), {"3 bytes after the last tensor's data belong to no tensor", "cover 24 of 27"}, __LINE__);
}

TEST_CASE("safetensors malformed: data_offsets not matching dtype size times element count") {
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}", six_floats.substr(0, 20)), {"tensor 'w' of shape (2, 3) and dtype F32 needs 24 bytes, but its data_offsets [0, 20] span 20"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F64\",\"shape\":[2,3],\"data_offsets\":[0,24]}"), {"dtype F64 needs 48 bytes", "span 24"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[24,0]}"), {"tensor 'w' has data_offsets [24, 0] that end before they begin"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24,48]}"), {"tensor 'w' has data_offsets that are not an array of two integers"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,2.4e1]}"), {"data_offsets entry 2.4e1, not a non-negative integer"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[-24,0]}"), {"data_offsets entry -24"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,99999999999999999999]}"), {"data_offsets entry 99999999999999999999"}, __LINE__);
}

TEST_CASE("safetensors malformed: negative, too many and too large dims") {
    expect_bad_safetensors<kiln::ShapeError>(st_one("{\"dtype\":\"F32\",\"shape\":[-2,-3],\"data_offsets\":[0,24]}"), {"tensor 'w': shape (-2, -3) has a negative dimension"}, __LINE__);
    expect_bad_safetensors<kiln::ShapeError>(st_one("{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,2,3,1],\"data_offsets\":[0,24]}"), {"tensor 'w': shape (1, 1, 1, 1, 1, 1, 2, 3, 1) has rank 9"}, __LINE__);
    expect_bad_safetensors<kiln::ShapeError>(st_one("{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]}", ""), {"tensor 'w': shape (4294967296, 4294967296, 0) holds more bytes"}, __LINE__);
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"shape\":[6e0],\"data_offsets\":[0,24]}"), {"tensor 'w' has shape entry 6e0, not an integer"}, __LINE__);
    expect_bad_safetensors<kiln::ShapeError>(st_one("{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,24]}"), {"tensor 'w' has shape entry 99999999999999999999, which does not fit in int64"}, __LINE__);
    // a declared 4 TiB tensor in a small file: refused by the size checks, never allocated
    expect_bad_safetensors<kiln::ValueError>(st_one("{\"dtype\":\"F32\",\"shape\":[1099511627776],\"data_offsets\":[0,4398046511104]}"), {"run past the end of the file (24 bytes of data)"}, __LINE__);
}

TEST_CASE("safetensors malformed: duplicate tensor names") {
    expect_bad_safetensors<kiln::ValueError>(safetensors_file("{\"w\":" + good_entry + ",\"w\":" + good_entry + "}", six_floats), {"invalid JSON header: key \"w\" appears twice"}, __LINE__);
}

TEST_CASE("safetensors malformed: unsupported dtypes name the tensor and the dtype") {
    expect_bad_safetensors<kiln::DTypeError>(safetensors_file("{\"ids\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", "abcd"), {"tensor 'ids' has dtype \"U8\", which kiln does not support", "F16, BF16, F32, F64, I32, I64, BOOL"}, __LINE__);
    expect_bad_safetensors<kiln::DTypeError>(safetensors_file("{\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", "abcd"), {"tensor 'q' has dtype \"F8_E4M3\""}, __LINE__);
    expect_bad_safetensors<kiln::DTypeError>(safetensors_file("{\"z\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "abcd"), {"tensor 'z' has dtype \"f32\""}, __LINE__);
}

// =================================================================================================
// take and ParamDict

TEST_CASE("take: returns the parameter, or names what is missing or mismatched") {
    const Tensor w = random_tensor({4, 3}, DType::f32, 9);
    const std::map<std::string, Tensor> params = {{"fc.weight", w}, {"fc.bias", random_tensor({4}, DType::f16, 10)}};
    CHECK(kiln::nn::take(params, "fc.weight", {4, 3}, DType::f32).is_same(w));
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::take(params, "fc.scale", {4}, DType::f32), "kiln::nn::take: missing parameter 'fc.scale' (it holds 2 tensors: 'fc.bias', 'fc.weight')");
    EXPECT_KILN_ERROR(kiln::ShapeError, kiln::nn::take(params, "fc.weight", {3, 4}, DType::f32), "parameter 'fc.weight' has shape (4, 3), expected (3, 4)");
    EXPECT_KILN_ERROR(kiln::DTypeError, kiln::nn::take(params, "fc.bias", {4}, DType::f32), "parameter 'fc.bias' has dtype float16, expected float32");
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::take({}, "x", {1}, DType::f32), "missing parameter 'x' (it holds no tensors)");
}

TEST_CASE("ParamDict: loads safetensors, checks, and finds parameters no one took") {
    TempDir dir;
    const fs::path p = dir / "model.safetensors";
    const Tensor w = random_tensor({2, 3}, DType::f32, 1), b = random_tensor({2}, DType::f32, 2);
    kiln::nn::save_safetensors(p, {{"fc.weight", w}, {"fc.bias", b}, {"extra", kiln::ones({1})}}, {{"format", "pt"}});
    kiln::nn::ParamDict params = kiln::nn::ParamDict::load(p);
    CHECK(params.size() == 3);
    CHECK(params.source() == p);
    CHECK(params.metadata().at("format") == "pt");
    CHECK(params.contains("fc.bias"));
    CHECK(same_tensor(params.take("fc.weight", {2, 3}, DType::f32), w));
    CHECK(same_tensor(params.take("fc.bias", {2}, DType::f32), b));
    CHECK(params.untaken() == std::vector<std::string>{"extra"});
    EXPECT_KILN_ERROR(kiln::ValueError, params.expect_all_taken(), "kiln::nn::ParamDict::expect_all_taken: 1 unused parameter in " + p.string() + ": 'extra'");
    EXPECT_KILN_ERROR(kiln::ShapeError, params.take("fc.weight", {3, 2}, DType::f32), "parameter 'fc.weight' in " + p.string() + " has shape (2, 3), expected (3, 2)");
    EXPECT_KILN_ERROR(kiln::DTypeError, params.take("fc.bias", {2}, DType::f64), "parameter 'fc.bias' in " + p.string() + " has dtype float32, expected float64");
    EXPECT_KILN_ERROR(kiln::ValueError, params.take("fc2.weight", {2, 3}, DType::f32), "missing parameter 'fc2.weight' in " + p.string() + " (it holds 3 tensors: 'extra', 'fc.bias', 'fc.weight')");
    params.take("extra", {1}, DType::f32);
    params.expect_all_taken();
    CHECK(params.untaken().empty());
}

TEST_CASE("ParamDict: loads one .npy file or a directory of them, named by file stem") {
    TempDir dir;
    fs::create_directories(dir / "npys");
    const Tensor w = random_tensor({3, 2}, DType::f64, 3), b = random_tensor({3}, DType::i32, 4);
    kiln::nn::save_npy(dir / "npys" / "fc.weight.npy", w);
    kiln::nn::save_npy(dir / "npys" / "fc.bias.npy", b);
    write_bytes(dir / "npys" / "README.txt", "ignored");
    kiln::nn::ParamDict d = kiln::nn::ParamDict::load(dir / "npys");
    CHECK(d.size() == 2);
    CHECK(same_tensor(d.take("fc.weight", {3, 2}, DType::f64), w));
    CHECK(same_tensor(d.take("fc.bias", {3}, DType::i32), b));
    d.expect_all_taken();

    kiln::nn::ParamDict one = kiln::nn::ParamDict::load(dir / "npys" / "fc.bias.npy");
    CHECK(one.size() == 1);
    CHECK(same_tensor(one.take("fc.bias", {3}, DType::i32), b));

    fs::create_directories(dir / "empty");
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::ParamDict::load(dir / "empty"), "kiln::nn::ParamDict::load: ", "the directory holds no .npy files");
    write_bytes(dir / "npys" / "broken.npy", "garbage");
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::ParamDict::load(dir / "npys"), "kiln::nn::load_npy: ", "broken.npy", "not a .npy file");
    EXPECT_KILN_ERROR(kiln::ValueError, kiln::nn::ParamDict::load(dir / "nothing.safetensors"), "kiln::nn::ParamDict::load: ", "nothing.safetensors", "no such file");
}

// =================================================================================================
// Robustness: whatever the bytes, a load returns a tensor or throws a kiln::Error (under the
// sanitizer build: without reading out of bounds or allocating more than the file holds).

namespace {
/// Loads the file with `load`; true when it threw a kiln::Error, false when it loaded; fails the
/// test on any other exception.
template <class Load>
bool throws_kiln_error(Load&& load) {
    try {
        load();
    } catch (const kiln::Error&) {
        return true;
    } catch (const std::exception& e) {
        FAIL_CHECK("threw " << typeid(e).name() << ", not a kiln::Error: " << e.what());
        return true;
    }
    return false;
}
}  // namespace

TEST_CASE("fuzz: every truncation and seeded corruptions of valid files load or throw a kiln::Error") {
    TempDir dir;
    kiln::nn::save_npy(dir / "src.npy", random_tensor({2, 3}, DType::f32, 1));
    kiln::nn::save_safetensors(dir / "src.safetensors",
                               {{"a", random_tensor({2, 3}, DType::f32, 2)}, {"b", random_tensor({3}, DType::bf16, 3)},
                                {"c", random_tensor({}, DType::boolean, 4)}},
                               {{"format", "pt"}});
    struct Kind {
        std::string file;
        std::function<void(const fs::path&)> load;
        std::size_t header_end;  // corruptions land in the header half of the time
    };
    const std::string npy = read_bytes(dir / "src.npy"), st = read_bytes(dir / "src.safetensors");
    const std::size_t st_header_end = 8 + (static_cast<unsigned char>(st[0]) | (static_cast<unsigned char>(st[1]) << 8));
    const Kind kinds[] = {{"src.npy", [](const fs::path& p) { kiln::nn::load_npy(p); }, 128},
                          {"src.safetensors", [](const fs::path& p) { kiln::nn::load_safetensors(p); }, st_header_end}};
    std::mt19937 rng(20261121);
    for (const Kind& k : kinds) {
        INFO("file " << k.file);
        const std::string good = read_bytes(dir / k.file);
        REQUIRE_FALSE(throws_kiln_error([&] { k.load(dir / k.file); }));
        const fs::path p = dir / ("fuzz-" + k.file);
        for (std::size_t len = 0; len < good.size(); ++len) {  // every truncation is an error
            write_bytes(p, good.substr(0, len));
            CHECK_MESSAGE(throws_kiln_error([&] { k.load(p); }), "a truncation to " << len << " bytes loaded");
        }
        int errors = 0;
        for (int iter = 0; iter < 1500; ++iter) {
            std::string bad = good;
            const int flips = 1 + static_cast<int>(rng() % 3);
            for (int f = 0; f < flips; ++f) {
                const std::size_t span = rng() % 2 ? k.header_end : bad.size();
                bad[rng() % span] = static_cast<char>(rng() % 4 ? rng() : "{}[]\",:0 \\"[rng() % 10]);
            }
            write_bytes(p, bad);
            errors += throws_kiln_error([&] { k.load(p); });
        }
        MESSAGE(k.file << ": " << errors << " of 1500 corrupted files were rejected, the rest loaded");
        CHECK(errors > 0);
    }
}
