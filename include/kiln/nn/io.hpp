// Parameter files: NumPy .npy (one tensor) and safetensors (named tensors), read and written.
//
// Formats
//   .npy (NumPy's format, versions 1.0, 2.0 and 3.0 read; 1.0 written): the magic "\x93NUMPY", the
//   version, a little-endian header length, then a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces to a multiple of
//   64 bytes and ending in '\n', then the elements in C order. descr -> dtype:
//     '<f2' f16   '<f4' f32   '<f8' f64   '<i4' i32   '<i8' i64   '|b1' bool
//   bf16 has no NumPy dtype, so save_npy rejects it (use safetensors, or convert first).
//
//   .safetensors (Hugging Face's format): an 8-byte little-endian header length N, N bytes of JSON
//     {"__metadata__": {"key": "value", ...},            (optional, strings only)
//      "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   (padded with spaces), then the data buffer; offsets are relative to the buffer's start. dtypes:
//     "F16" f16   "BF16" bf16   "F32" f32   "F64" f64   "I32" i32   "I64" i64   "BOOL" bool
//   Written as the reference implementation writes it: tensors ordered by element size (largest
//   first) then name, so every tensor is aligned, and the header padded to a multiple of 8 bytes.
//
// Rejected, each with a typed exception whose message names the file, what was expected and what
// was found, and the caller's file:line:
//   ValueError  missing or unreadable file (kiln has no IOError); bad .npy magic or version; a
//               truncated preamble, header or data; trailing bytes; a malformed header (Python
//               literal or strict JSON: no comments or trailing commas, valid UTF-8, nesting at
//               most 32 / 64 deep); missing, unknown or repeated keys or tensor names; non-integer
//               dims; Fortran-order arrays; data_offsets out of the file, reversed, overlapping,
//               leaving gaps, or not matching dtype size * element count; non-string metadata;
//               a safetensors header over the reference implementation's 100 MB limit.
//   DTypeError  a dtype kiln does not hold (.npy: big-endian, structured, '|u1', '<i2', ...;
//               safetensors: U8, I8, F8_E4M3, ...), named with the tensor.
//   ShapeError  negative dims, rank above 8, a dim beyond int64, or more bytes than int64 counts.
// Sizes are checked against the file's size before anything is allocated, so a corrupt header
// cannot make kiln allocate more than the file holds. Loads return CPU tensors (call .to(device));
// saves copy CUDA tensors to the host and write every tensor in C order. Files are written to a
// temporary name in the target's directory and renamed into place, so a failed save leaves no
// half-written file. Data is little-endian on disk; big-endian hosts are refused. A bool byte
// other than 0 reads as true.
//
// Using them: nn::take(params, name, shape, dtype) hands out one checked parameter; ParamDict::load
// reads a .safetensors file, one .npy file or a directory of .npy files ("fc.weight.npy" holds
// "fc.weight"), and its take() and expect_all_taken() name the file in their errors.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <source_location>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/copy.hpp"  // Tensor::cpu, Tensor::contiguous

namespace kiln::nn {

namespace detail {

using Loc = std::source_location;
namespace fs = std::filesystem;

/// Throws E with "kiln::nn::<op>: <file>: <what> at <caller's file:line>".
template <class E>
[[noreturn]] void file_error(std::string_view op, const fs::path& file, const std::string& what, const Loc& loc) {
    kiln::detail::fail<E>("nn::" + std::string(op), file.string() + ": " + what, loc);
}

inline void require_little_endian_host([[maybe_unused]] std::string_view op, [[maybe_unused]] const fs::path& file,
                                       [[maybe_unused]] const Loc& loc) {
    if constexpr (std::endian::native != std::endian::little)
        file_error<ValueError>(op, file, "kiln reads and writes parameter files on little-endian hosts only", loc);
}

/// "(2, 3)" like a Python tuple, for dims that may not fit a Shape (too many, negative).
inline std::string dims_str(const std::vector<std::int64_t>& dims) {
    std::string s = "(";
    for (std::size_t i = 0; i < dims.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(dims[i]);
    }
    return s + (dims.size() == 1 ? ",)" : ")");
}

/// a * b when it fits in int64 (both non-negative).
inline std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
    if (a != 0 && b > std::numeric_limits<std::int64_t>::max() / a) return std::nullopt;
    return a * b;
}

/// Why dims read from a file cannot be a kiln Shape of `itemsize`-byte elements (empty: they can).
/// Besides rank and signs, the product of max(dim, 1) must fit in int64 bytes: kiln's strides and
/// element counts are int64, and a zero dim must not hide an overflow in the others.
inline std::string shape_problem(const std::vector<std::int64_t>& dims, std::size_t itemsize) {
    if (dims.size() > static_cast<std::size_t>(max_rank))
        return "shape " + dims_str(dims) + " has rank " + std::to_string(dims.size()) + ", above kiln's maximum rank " +
               std::to_string(max_rank);
    for (std::size_t i = 0; i < dims.size(); ++i)
        if (dims[i] < 0)
            return "shape " + dims_str(dims) + " has a negative dimension (" + std::to_string(dims[i]) + " at dim " +
                   std::to_string(i) + ")";
    std::optional<std::int64_t> span = static_cast<std::int64_t>(itemsize);
    for (auto d : dims)
        if (span) span = checked_mul(*span, std::max<std::int64_t>(d, 1));
    if (!span) return "shape " + dims_str(dims) + " holds more bytes than a 64-bit size can count";
    return {};
}

/// Element count of dims that passed shape_problem.
inline std::int64_t numel_of(const std::vector<std::int64_t>& dims) {
    std::int64_t n = 1;
    for (auto d : dims) n *= d;
    return n;
}

/// Length of the well-formed UTF-8 sequence at s[i] (1 to 4), or 0 where it is malformed
/// (overlong forms, surrogates and code points above U+10FFFF are malformed).
inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
    const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = byte(i);
    if (c < 0x80) return 1;
    std::size_t n;
    std::uint32_t cp;
    if ((c & 0xe0) == 0xc0) { n = 2; cp = c & 0x1fu; }
    else if ((c & 0xf0) == 0xe0) { n = 3; cp = c & 0x0fu; }
    else if ((c & 0xf8) == 0xf0) { n = 4; cp = c & 0x07u; }
    else return 0;
    if (s.size() - i < n) return 0;
    for (std::size_t k = 1; k < n; ++k) {
        if ((byte(i + k) & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (byte(i + k) & 0x3fu);
    }
    static constexpr std::uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

/// Appends code point cp (at most 0x10FFFF) as UTF-8.
inline void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xc0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xe0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
        out += static_cast<char>(0xf0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (cp & 0x3f));
    }
}

inline bool valid_utf8(std::string_view s) {
    for (std::size_t i = 0; i < s.size();) {
        const std::size_t n = utf8_sequence_length(s, i);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

/// A short, printable excerpt of file text for messages: quoted, escaped, cut after `max` bytes.
inline std::string excerpt(std::string_view s, std::size_t max = 120) {
    std::string out = "\"";
    for (std::size_t i = 0; i < s.size() && i < max; ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c == '"' || c == '\\') { out += '\\'; out += static_cast<char>(c); }
        else if (c == '\n') out += "\\n";
        else if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
        else {
            static constexpr char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        }
    }
    return out + (s.size() > max ? "\"..." : "\"");
}

/// s[pos] for a parse error: "'x'", "byte 0x93" or "end of header".
inline std::string describe_byte(std::string_view s, std::size_t pos) {
    if (pos >= s.size()) return "end of header";
    const auto c = static_cast<unsigned char>(s[pos]);
    if (c >= 0x20 && c < 0x7f) return "'" + std::string(1, static_cast<char>(c)) + "'";
    static constexpr char hex[] = "0123456789abcdef";
    return std::string("byte 0x") + hex[c >> 4] + hex[c & 15];
}

// ---------------------------------------------------------------------------------------------
// Files

/// A file opened for reading, with its size, that reports every failure as a kiln error.
class InFile {
public:
    InFile(std::string_view op, const fs::path& path, const Loc& loc) : op_(op), path_(path), loc_(loc) {
        require_little_endian_host(op, path, loc);
        std::error_code ec;
        const fs::file_status st = fs::status(path, ec);
        if (st.type() == fs::file_type::not_found) fail<ValueError>("no such file");
        if (ec) fail<ValueError>("cannot open it: " + ec.message());
        if (st.type() == fs::file_type::directory) fail<ValueError>("is a directory, not a file");
        if (st.type() != fs::file_type::regular) fail<ValueError>("is not a regular file");
        errno = 0;
        in_.open(path, std::ios::binary);
        if (!in_) fail<ValueError>("cannot open it for reading" + (errno ? ": " + std::generic_category().message(errno) : ""));
        in_.seekg(0, std::ios::end);
        const std::streamoff end = in_.tellg();
        if (!in_ || end < 0) fail<ValueError>("cannot determine its size");
        size_ = static_cast<std::uint64_t>(end);
    }

    std::uint64_t size() const { return size_; }
    const fs::path& path() const { return path_; }

    /// Reads n bytes at `offset` into dst; the caller has checked that they lie inside the file.
    void read(std::uint64_t offset, void* dst, std::uint64_t n, const std::string& what) {
        if (n == 0) return;
        in_.clear();
        in_.seekg(static_cast<std::streamoff>(offset));
        in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
        if (!in_ || static_cast<std::uint64_t>(in_.gcount()) != n)
            fail<ValueError>("could read only " + std::to_string(std::max<std::streamsize>(in_.gcount(), 0)) + " of the " +
                             std::to_string(n) + " bytes of " + what + " at byte " + std::to_string(offset) +
                             " (the file changed or shrank while being read?)");
    }
    std::string read_string(std::uint64_t offset, std::uint64_t n, const std::string& what) {
        std::string s(static_cast<std::size_t>(n), '\0');
        read(offset, s.data(), n, what);
        return s;
    }

    template <class E>
    [[noreturn]] void fail(const std::string& what) const {
        file_error<E>(op_, path_, what, loc_);
    }

private:
    std::string_view op_;
    fs::path path_;
    Loc loc_;
    std::ifstream in_;
    std::uint64_t size_ = 0;
};

/// A file written under a temporary name next to `target` and renamed over it by commit(); when
/// it is destroyed uncommitted (an error) the temporary file is removed and `target` is untouched.
class OutFile {
public:
    OutFile(std::string_view op, const fs::path& target, const Loc& loc) : op_(op), target_(target), loc_(loc) {
        require_little_endian_host(op, target, loc);
        std::error_code ec;
        if (fs::is_directory(target, ec)) fail("is a directory");
        const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
        if (!fs::is_directory(dir, ec)) fail("cannot write it: directory " + dir.string() + " does not exist");
        tmp_ = temp_name(target);
        errno = 0;
        out_.open(tmp_, std::ios::binary | std::ios::trunc);
        if (!out_) fail("cannot create " + tmp_.string() + (errno ? ": " + std::generic_category().message(errno) : ""));
    }
    OutFile(const OutFile&) = delete;
    OutFile& operator=(const OutFile&) = delete;
    ~OutFile() {
        if (committed_) return;
        out_.close();
        std::error_code ec;
        fs::remove(tmp_, ec);
    }

    void write(const void* data, std::uint64_t n) {
        if (n == 0) return;
        out_.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
        if (!out_) fail("cannot write " + tmp_.string() + " (disk full?)");
    }
    void write(std::string_view s) { write(s.data(), s.size()); }

    void commit() {
        out_.close();
        if (!out_) fail("cannot write " + tmp_.string() + " (disk full?)");
        std::error_code ec;
        fs::rename(tmp_, target_, ec);
        if (ec) fail("cannot rename " + tmp_.string() + " to it: " + ec.message());
        committed_ = true;
    }

private:
    [[noreturn]] void fail(const std::string& what) const { file_error<ValueError>(op_, target_, what, loc_); }

    /// "<name>.tmp.<random>.<n>": no other writer, thread or process, uses it at the same time.
    static fs::path temp_name(const fs::path& target) {
        static const std::uint64_t nonce = [] {
            std::random_device rd;
            return ((static_cast<std::uint64_t>(rd()) << 32) ^ rd()) ^
                   static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
        }();
        static std::atomic<std::uint64_t> counter{0};
        return target.parent_path() /
               (target.filename().string() + ".tmp." + std::to_string(nonce) + "." + std::to_string(counter.fetch_add(1)));
    }

    std::string_view op_;
    fs::path target_, tmp_;
    Loc loc_;
    std::ofstream out_;
    bool committed_ = false;
};

/// Bool bytes other than 0 and 1 (written by other tools) would be undefined as C++ bools.
inline void normalize_bools(Tensor& t) {
    if (t.dtype() != DType::boolean) return;
    auto* p = static_cast<unsigned char*>(t.data_ptr());
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = p[i] != 0;
}

/// A tensor's elements in C order on the host: a contiguous CPU tensor (a copy where needed).
inline Tensor host_c_order(const Tensor& t, const Loc& loc) {
    Tensor c = t.cpu(loc);
    return c.is_contiguous() ? c : c.contiguous();
}

// ---------------------------------------------------------------------------------------------
// .npy

inline constexpr std::string_view npy_magic{"\x93NUMPY", 6};

/// The .npy descr of a dtype kiln writes (bf16 has none).
inline std::optional<std::string_view> npy_descr(DType d) {
    switch (d) {
        case DType::f16: return "<f2";
        case DType::f32: return "<f4";
        case DType::f64: return "<f8";
        case DType::i32: return "<i4";
        case DType::i64: return "<i8";
        case DType::boolean: return "|b1";
        case DType::bf16: break;
    }
    return std::nullopt;
}

inline std::optional<DType> npy_dtype(std::string_view descr) {
    for (DType d : all_dtypes)
        if (auto s = npy_descr(d); s && *s == descr) return d;
    return std::nullopt;
}

/// A value of the Python literal in a .npy header: str, bool, None, int, tuple or list.
struct PyValue {
    enum class Kind { str, boolean, none, integer, tuple, list, dict };
    Kind kind = Kind::none;
    std::string text;  // str: the value; integer: the digits as written
    bool boolean = false;
    std::optional<std::int64_t> integer;  // empty when the literal does not fit in int64
    std::vector<PyValue> items;           // tuple, list; dict: keys and values alternate
};

inline const char* py_kind_name(PyValue::Kind k) {
    switch (k) {
        case PyValue::Kind::str: return "a string";
        case PyValue::Kind::boolean: return "a bool";
        case PyValue::Kind::none: return "None";
        case PyValue::Kind::integer: return "an integer";
        case PyValue::Kind::tuple: return "a tuple";
        case PyValue::Kind::list: return "a list";
        case PyValue::Kind::dict: return "a dict";
    }
    return "?";
}

/// The state both header parsers share: the text, a position, the first error and the helpers
/// around them. `Parser` supplies `bool value(V&, int depth)`.
template <class Parser, class V> class TextCursor {
public:
    /// `unit` names positions in errors ("header byte 12").
    explicit TextCursor(std::string_view s, std::string_view unit = "header byte") : s_(s), unit_(unit) {}

    /// The document's value, or nothing with `error` saying what is wrong and at which byte.
    std::optional<V> parse_document(std::string& error) {
        V v;
        bool ok = static_cast<Parser*>(this)->value(v, 0);
        if (ok) {
            skip_ws();
            if (pos_ != s_.size()) ok = err("unexpected " + found() + " after " + Parser::document_name);
        }
        if (!ok) {
            error = error_ + " at " + std::string(unit_) + " " + std::to_string(pos_);
            return std::nullopt;
        }
        return v;
    }

protected:
    std::string found() const { return describe_byte(s_, pos_); }
    bool err(std::string what) {
        error_ = std::move(what);
        return false;
    }
    void skip_ws() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
    }

    std::string_view s_;
    std::string_view unit_;
    std::size_t pos_ = 0;
    std::string error_;
};

/// Parses the Python literal subset NumPy writes in .npy headers (ast.literal_eval's strings,
/// True/False/None, integers, tuples, lists, dicts); `error` says what is wrong where otherwise.
class PyLiteralParser : public TextCursor<PyLiteralParser, PyValue> {
    friend class TextCursor<PyLiteralParser, PyValue>;

public:
    using TextCursor::TextCursor;
    static constexpr const char* document_name = "the header's value";

private:
    static constexpr int max_depth = 32;
    bool value(PyValue& v, int depth) {
        skip_ws();
        if (depth > max_depth) return err("nesting deeper than " + std::to_string(max_depth) + " levels");
        if (pos_ >= s_.size()) return err("unexpected end of header, expected a value");
        const char c = s_[pos_];
        if (c == '\'' || c == '"') return string(v);
        if (c == '(' || c == '[' || c == '{') return sequence(v, depth);
        if (c == '-' || c == '+' || (c >= '0' && c <= '9')) return integer(v);
        for (auto [word, kind, b] : {std::tuple{"True", PyValue::Kind::boolean, true},
                                     std::tuple{"False", PyValue::Kind::boolean, false},
                                     std::tuple{"None", PyValue::Kind::none, false}}) {
            const std::string_view w(word);
            if (s_.substr(pos_, w.size()) == w) {
                pos_ += w.size();
                v.kind = kind;
                v.boolean = b;
                return true;
            }
        }
        return err("unexpected " + found() + ", expected a value");
    }
    bool string(PyValue& v) {
        const char quote = s_[pos_++];
        v.kind = PyValue::Kind::str;
        while (pos_ < s_.size() && s_[pos_] != quote) {
            char c = s_[pos_++];
            if (c == '\n') return err("newline inside a string");
            if (c == '\\') {
                if (pos_ >= s_.size()) break;
                c = s_[pos_++];
                if (c != '\\' && c != '\'' && c != '"') return err("unsupported escape '\\" + std::string(1, c) + "' in a string");
            }
            v.text += c;
        }
        if (pos_ >= s_.size()) return err("unterminated string");
        ++pos_;
        return true;
    }
    bool integer(PyValue& v) {
        v.kind = PyValue::Kind::integer;
        const std::size_t start = pos_;
        const bool negative = s_[pos_] == '-';
        if (s_[pos_] == '-' || s_[pos_] == '+') ++pos_;
        std::uint64_t mag = 0;
        bool overflow = false, any = false;
        while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
            const auto d = static_cast<std::uint64_t>(s_[pos_++] - '0');
            overflow |= mag > (std::numeric_limits<std::uint64_t>::max() - d) / 10;
            if (!overflow) mag = mag * 10 + d;
            any = true;
        }
        if (!any) return err("expected digits");
        if (pos_ < s_.size() && (s_[pos_] == 'L' || s_[pos_] == 'l')) ++pos_;  // Python 2's long suffix
        if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E' || s_[pos_] == 'x'))
            return err("expected an integer, found a number of another kind");
        v.text = std::string(s_.substr(start, pos_ - start));
        constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
        if (!overflow && mag <= max) v.integer = negative ? -static_cast<std::int64_t>(mag) : static_cast<std::int64_t>(mag);
        return true;
    }
    bool sequence(PyValue& v, int depth) {
        const char open = s_[pos_++];
        const char close = open == '(' ? ')' : open == '[' ? ']' : '}';
        v.kind = open == '(' ? PyValue::Kind::tuple : open == '[' ? PyValue::Kind::list : PyValue::Kind::dict;
        bool comma = false;  // whether the last item was followed by a comma
        for (;;) {
            skip_ws();
            if (pos_ < s_.size() && s_[pos_] == close) {
                ++pos_;
                break;
            }
            if (!v.items.empty() && !comma) return err("expected ',' or '" + std::string(1, close) + "', found " + found());
            PyValue item;
            if (!value(item, depth + 1)) return false;
            v.items.push_back(std::move(item));
            if (v.kind == PyValue::Kind::dict) {
                skip_ws();
                if (pos_ >= s_.size() || s_[pos_] != ':') return err("expected ':' after a dict key, found " + found());
                ++pos_;
                PyValue val;
                if (!value(val, depth + 1)) return false;
                v.items.push_back(std::move(val));
            }
            skip_ws();
            comma = pos_ < s_.size() && s_[pos_] == ',';
            if (comma) ++pos_;
        }
        // Python: "(1)" is the integer 1, not a tuple; NumPy writes "(5,)" for one dim.
        if (v.kind == PyValue::Kind::tuple && v.items.size() == 1 && !comma) {
            PyValue inner = std::move(v.items[0]);
            v = std::move(inner);
        }
        return true;
    }

};

/// What a .npy header describes.
struct NpyHeader {
    DType dtype = DType::f32;
    std::vector<std::int64_t> dims;
};

/// Checks the dict of a .npy header: exactly descr, fortran_order and shape, with kiln-supported values.
inline NpyHeader parse_npy_header(InFile& f, std::string_view text) {
    std::string error;
    PyLiteralParser parser(text);
    const std::optional<PyValue> doc = parser.parse_document(error);
    const std::string quoted = " (header: " + excerpt(text) + ")";
    if (!doc) f.fail<ValueError>("malformed .npy header: " + error + quoted);
    if (doc->kind != PyValue::Kind::dict) f.fail<ValueError>(std::string("malformed .npy header: expected a dict, found ") + py_kind_name(doc->kind) + quoted);
    const PyValue *descr = nullptr, *fortran = nullptr, *shape = nullptr;
    for (std::size_t i = 0; i + 1 < doc->items.size(); i += 2) {
        const PyValue& key = doc->items[i];
        if (key.kind != PyValue::Kind::str) f.fail<ValueError>(std::string("malformed .npy header: a key is ") + py_kind_name(key.kind) + ", not a string" + quoted);
        const PyValue** slot = key.text == "descr" ? &descr : key.text == "fortran_order" ? &fortran : key.text == "shape" ? &shape : nullptr;
        if (!slot) f.fail<ValueError>("malformed .npy header: unexpected key '" + key.text + "' (expected descr, fortran_order, shape)" + quoted);
        if (*slot) f.fail<ValueError>("malformed .npy header: key '" + key.text + "' appears twice" + quoted);
        *slot = &doc->items[i + 1];
    }
    for (auto [p, name] : {std::pair{descr, "descr"}, std::pair{fortran, "fortran_order"}, std::pair{shape, "shape"}})
        if (!p) f.fail<ValueError>(std::string("malformed .npy header: no '") + name + "' key" + quoted);

    NpyHeader h;
    if (descr->kind != PyValue::Kind::str)
        f.fail<DTypeError>(std::string("descr is ") + py_kind_name(descr->kind) +
                           " (a structured dtype), which kiln cannot hold; kiln reads <f2 <f4 <f8 <i4 <i8 |b1");
    const auto dt = npy_dtype(descr->text);
    if (!dt) {
        const bool big = descr->text.size() == 3 && descr->text[0] == '>' && npy_dtype("<" + descr->text.substr(1));
        f.fail<DTypeError>("unsupported descr '" + descr->text + "'" +
                           (big ? " (big-endian; save it little-endian, e.g. a.astype('<" + descr->text.substr(1) + "'))" : "") +
                           "; kiln reads <f2 <f4 <f8 <i4 <i8 |b1");
    }
    h.dtype = *dt;
    if (fortran->kind != PyValue::Kind::boolean)
        f.fail<ValueError>(std::string("malformed .npy header: fortran_order is ") + py_kind_name(fortran->kind) + ", not True or False" + quoted);
    if (fortran->boolean)
        f.fail<ValueError>("fortran_order is True: kiln reads C-order arrays only (save np.ascontiguousarray(a))");
    if (shape->kind != PyValue::Kind::tuple)
        f.fail<ValueError>(std::string("malformed .npy header: shape is ") + py_kind_name(shape->kind) + ", not a tuple" + quoted);
    for (const PyValue& d : shape->items) {
        if (d.kind != PyValue::Kind::integer)
            f.fail<ValueError>(std::string("malformed .npy header: a dim of shape is ") + py_kind_name(d.kind) + ", not an integer" + quoted);
        if (!d.integer) f.fail<ShapeError>("dim " + d.text + " of shape does not fit in int64");
        h.dims.push_back(*d.integer);
    }
    if (auto why = shape_problem(h.dims, dtype_size(h.dtype)); !why.empty()) f.fail<ShapeError>(why);
    return h;
}

inline std::uint64_t read_le(const unsigned char* p, int n) {
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

inline std::string npy_header_text(DType dtype, const Shape& shape) {
    std::string s = "{'descr': '" + std::string(*npy_descr(dtype)) + "', 'fortran_order': False, 'shape': " +
                    shape.str() + ", }";
    // NumPy's padding: spaces, then '\n', so that magic + version + length + header is a multiple of 64.
    const std::size_t unpadded = npy_magic.size() + 2 + 2 + s.size() + 1;
    s.append(64 - unpadded % 64, ' ');
    return s + '\n';
}

// ---------------------------------------------------------------------------------------------
// JSON (the safetensors header)

/// A JSON value: strict RFC 8259 syntax; numbers keep their text and, when integral, their value.
struct JsonValue {
    enum class Kind { null, boolean, number, string, array, object };
    Kind kind = Kind::null;
    bool boolean = false;
    std::string text;                     // string: the value (UTF-8); number: as written
    std::optional<std::int64_t> integer;  // number: set when it is an integer that fits in int64
    std::vector<JsonValue> items;         // array items; object values
    std::vector<std::string> keys;        // object keys, in file order
};

inline const char* json_kind_name(JsonValue::Kind k) {
    switch (k) {
        case JsonValue::Kind::null: return "null";
        case JsonValue::Kind::boolean: return "a boolean";
        case JsonValue::Kind::number: return "a number";
        case JsonValue::Kind::string: return "a string";
        case JsonValue::Kind::array: return "an array";
        case JsonValue::Kind::object: return "an object";
    }
    return "?";
}

/// A strict JSON parser for headers: no comments, no trailing commas, no repeated object keys,
/// valid UTF-8, nesting at most 64 deep; trailing whitespace (safetensors' padding) is allowed.
class JsonParser : public TextCursor<JsonParser, JsonValue> {
    friend class TextCursor<JsonParser, JsonValue>;

public:
    using TextCursor::TextCursor;
    static constexpr const char* document_name = "the top-level value";

private:
    static constexpr int max_depth = 64;
    bool literal(std::string_view word) {
        if (s_.substr(pos_, word.size()) != word) return err("unexpected " + found() + ", expected a value");
        pos_ += word.size();
        return true;
    }
    bool value(JsonValue& v, int depth) {
        skip_ws();
        if (depth > max_depth) return err("nesting deeper than " + std::to_string(max_depth) + " levels");
        if (pos_ >= s_.size()) return err("unexpected end of header, expected a value");
        switch (s_[pos_]) {
            case '{': return object(v, depth);
            case '[': return array(v, depth);
            case '"': v.kind = JsonValue::Kind::string; return string(v.text);
            case 't': v.kind = JsonValue::Kind::boolean; v.boolean = true; return literal("true");
            case 'f': v.kind = JsonValue::Kind::boolean; return literal("false");
            case 'n': v.kind = JsonValue::Kind::null; return literal("null");
            default: break;
        }
        if (s_[pos_] == '-' || (s_[pos_] >= '0' && s_[pos_] <= '9')) return number(v);
        return err("unexpected " + found() + ", expected a value");
    }
    bool object(JsonValue& v, int depth) {
        v.kind = JsonValue::Kind::object;
        ++pos_;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == '}') {
            ++pos_;
            return true;
        }
        std::set<std::string> seen;
        for (;;) {
            skip_ws();
            if (pos_ >= s_.size() || s_[pos_] != '"') return err("expected a string key, found " + found());
            const std::size_t key_pos = pos_;
            std::string key;
            if (!string(key)) return false;
            if (!seen.insert(key).second) {
                pos_ = key_pos;
                return err("key " + excerpt(key) + " appears twice in one object");
            }
            skip_ws();
            if (pos_ >= s_.size() || s_[pos_] != ':') return err("expected ':' after a key, found " + found());
            ++pos_;
            JsonValue item;
            if (!value(item, depth + 1)) return false;
            v.keys.push_back(std::move(key));
            v.items.push_back(std::move(item));
            skip_ws();
            if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
            if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return true; }
            return err("expected ',' or '}' after an object member, found " + found());
        }
    }
    bool array(JsonValue& v, int depth) {
        v.kind = JsonValue::Kind::array;
        ++pos_;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ']') {
            ++pos_;
            return true;
        }
        for (;;) {
            JsonValue item;
            if (!value(item, depth + 1)) return false;
            v.items.push_back(std::move(item));
            skip_ws();
            if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
            if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return true; }
            return err("expected ',' or ']' after an array item, found " + found());
        }
    }
    bool hex4(std::uint32_t& out) {
        out = 0;
        for (int i = 0; i < 4; ++i, ++pos_) {
            if (pos_ >= s_.size()) return err("unterminated \\u escape");
            const char c = s_[pos_];
            const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) return err("invalid hex digit " + found() + " in a \\u escape");
            out = out * 16 + static_cast<std::uint32_t>(d);
        }
        return true;
    }

    bool string(std::string& out) {
        ++pos_;  // the opening quote
        for (;;) {
            if (pos_ >= s_.size()) return err("unterminated string");
            const auto c = static_cast<unsigned char>(s_[pos_]);
            if (c == '"') {
                ++pos_;
                return true;
            }
            if (c < 0x20) return err("unescaped control character " + found() + " in a string");
            if (c >= 0x80) {
                const std::size_t n = utf8_sequence_length(s_, pos_);
                if (n == 0) return err("invalid UTF-8 in a string");
                out.append(s_.substr(pos_, n));
                pos_ += n;
                continue;
            }
            ++pos_;
            if (c != '\\') {
                out += static_cast<char>(c);
                continue;
            }
            if (pos_ >= s_.size()) return err("unterminated string");
            const char e = s_[pos_++];
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    std::uint32_t cp;
                    if (!hex4(cp)) return false;
                    if (cp >= 0xdc00 && cp <= 0xdfff) return err("unpaired low surrogate in a \\u escape");
                    if (cp >= 0xd800 && cp <= 0xdbff) {
                        std::uint32_t lo;
                        if (s_.substr(pos_, 2) != "\\u") return err("unpaired high surrogate in a \\u escape");
                        pos_ += 2;
                        if (!hex4(lo)) return false;
                        if (lo < 0xdc00 || lo > 0xdfff) return err("unpaired high surrogate in a \\u escape");
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    }
                    append_utf8(out, cp);
                    break;
                }
                default:
                    --pos_;
                    return err("invalid escape '\\" + std::string(1, e) + "' in a string");
            }
        }
    }
    bool number(JsonValue& v) {
        v.kind = JsonValue::Kind::number;
        const std::size_t start = pos_;
        const auto digit = [&] { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
        const bool negative = s_[pos_] == '-';
        if (negative) ++pos_;
        if (!digit()) return err("expected a digit, found " + found());
        std::uint64_t mag = 0;
        bool overflow = false;
        if (s_[pos_] == '0') {
            ++pos_;
            if (digit()) return err("leading zero in a number");
        } else {
            while (digit()) {
                const auto d = static_cast<std::uint64_t>(s_[pos_++] - '0');
                overflow |= mag > (std::numeric_limits<std::uint64_t>::max() - d) / 10;
                if (!overflow) mag = mag * 10 + d;
            }
        }
        bool integral = true;
        if (pos_ < s_.size() && s_[pos_] == '.') {
            ++pos_;
            if (!digit()) return err("expected a digit after '.', found " + found());
            while (digit()) ++pos_;
            integral = false;
        }
        if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
            ++pos_;
            if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
            if (!digit()) return err("expected a digit in an exponent, found " + found());
            while (digit()) ++pos_;
            integral = false;
        }
        v.text = std::string(s_.substr(start, pos_ - start));
        constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
        if (integral && !overflow && mag <= max) v.integer = negative ? -static_cast<std::int64_t>(mag) : static_cast<std::int64_t>(mag);
        return true;
    }

};

/// `s` as a JSON string literal (UTF-8 passes through; quotes, backslashes, controls escaped).
inline std::string json_quote(std::string_view s) {
    std::string out = "\"";
    for (char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '"') out += "\\\"";
        else if (c == '\\') out += "\\\\";
        else if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else if (c < 0x20) {
            static constexpr char hex[] = "0123456789abcdef";
            out += "\\u00";
            out += hex[c >> 4];
            out += hex[c & 15];
        } else out += ch;
    }
    return out + "\"";
}

/// A whole JSON file (a model's config.json), as JsonParser reads it: ValueError naming the file
/// and the byte for anything malformed.
inline JsonValue read_json_file(std::string_view op, const fs::path& path, const Loc& loc) {
    InFile f(op, path, loc);
    constexpr std::uint64_t max_bytes = 64u << 20;
    if (f.size() > max_bytes) f.fail<ValueError>("is " + std::to_string(f.size()) + " bytes, over the 64 MiB kiln reads as JSON");
    const std::string text = f.read_string(0, f.size(), "the JSON text");
    JsonParser parser(text, "byte");
    std::string error;
    std::optional<JsonValue> doc = parser.parse_document(error);
    if (!doc) f.fail<ValueError>("invalid JSON: " + error);
    if (doc->kind != JsonValue::Kind::object) f.fail<ValueError>(std::string("holds ") + json_kind_name(doc->kind) + ", not a JSON object");
    return std::move(*doc);
}

// ---------------------------------------------------------------------------------------------
// safetensors

/// Largest header the reference implementation accepts (its MAX_HEADER_SIZE).
inline constexpr std::uint64_t safetensors_max_header = 100'000'000;

inline constexpr std::string_view safetensors_dtype_name(DType d) {
    switch (d) {
        case DType::boolean: return "BOOL";
        case DType::i32: return "I32";
        case DType::i64: return "I64";
        case DType::f16: return "F16";
        case DType::bf16: return "BF16";
        case DType::f32: return "F32";
        case DType::f64: return "F64";
    }
    return "?";
}

inline std::optional<DType> safetensors_dtype(std::string_view name) {
    for (DType d : all_dtypes)
        if (safetensors_dtype_name(d) == name) return d;
    return std::nullopt;
}

/// A parsed safetensors file: tensors (read when asked) and metadata.
struct SafetensorsContents {
    std::map<std::string, Tensor> tensors;
    std::map<std::string, std::string> metadata;
};

/// Reads and validates a safetensors file; reads the tensors' data only when `with_data`.
inline SafetensorsContents read_safetensors(std::string_view op, const fs::path& path, bool with_data, const Loc& loc) {
    InFile f(op, path, loc);
    if (f.size() < 8)
        f.fail<ValueError>("truncated: " + std::to_string(f.size()) +
                           " bytes, shorter than the 8-byte header length that starts a safetensors file");
    unsigned char len_bytes[8];
    f.read(0, len_bytes, 8, "the header length");
    const std::uint64_t n = read_le(len_bytes, 8);
    if (n > f.size() - 8)
        f.fail<ValueError>("header length " + std::to_string(n) + " runs past the end of the file (" +
                           std::to_string(f.size()) + " bytes; is it a safetensors file?)");
    if (n > safetensors_max_header)
        f.fail<ValueError>("header length " + std::to_string(n) + " exceeds safetensors' limit of " +
                           std::to_string(safetensors_max_header) + " bytes");
    const std::string header = f.read_string(8, n, "the header");
    const std::uint64_t data_start = 8 + n, data_size = f.size() - data_start;

    std::string error;
    JsonParser parser(header);
    const std::optional<JsonValue> doc = parser.parse_document(error);
    if (!doc) f.fail<ValueError>("invalid JSON header: " + error + " (header: " + excerpt(header) + ")");
    if (doc->kind != JsonValue::Kind::object)
        f.fail<ValueError>(std::string("invalid header: expected a JSON object, found ") + json_kind_name(doc->kind));

    struct Entry {
        std::string name;
        DType dtype;
        std::vector<std::int64_t> dims;
        std::uint64_t begin, end;
    };
    std::vector<Entry> entries;
    SafetensorsContents out;
    for (std::size_t i = 0; i < doc->keys.size(); ++i) {
        const std::string& name = doc->keys[i];
        const JsonValue& v = doc->items[i];
        if (name == "__metadata__") {
            if (v.kind != JsonValue::Kind::object)
                f.fail<ValueError>(std::string("__metadata__ is ") + json_kind_name(v.kind) + ", not an object of strings");
            for (std::size_t k = 0; k < v.keys.size(); ++k) {
                if (v.items[k].kind != JsonValue::Kind::string)
                    f.fail<ValueError>("__metadata__ entry '" + v.keys[k] + "' is " + json_kind_name(v.items[k].kind) +
                                       "; safetensors metadata values must be strings");
                out.metadata.emplace(v.keys[k], v.items[k].text);
            }
            continue;
        }
        const std::string t = "tensor '" + name + "'";
        if (v.kind != JsonValue::Kind::object)
            f.fail<ValueError>(t + " is described by " + json_kind_name(v.kind) + ", not an object");
        const JsonValue *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
        for (std::size_t k = 0; k < v.keys.size(); ++k) {
            const std::string& key = v.keys[k];
            const JsonValue** slot = key == "dtype" ? &dtype : key == "shape" ? &shape : key == "data_offsets" ? &offsets : nullptr;
            if (!slot) f.fail<ValueError>(t + " has an unexpected key '" + key + "' (expected dtype, shape, data_offsets)");
            *slot = &v.items[k];
        }
        for (auto [p, key] : {std::pair{dtype, "dtype"}, std::pair{shape, "shape"}, std::pair{offsets, "data_offsets"}})
            if (!p) f.fail<ValueError>(t + " has no '" + key + "'");

        Entry e{name, DType::f32, {}, 0, 0};
        if (dtype->kind != JsonValue::Kind::string)
            f.fail<ValueError>(t + " has a dtype that is " + json_kind_name(dtype->kind) + ", not a string");
        const auto dt = safetensors_dtype(dtype->text);
        if (!dt)
            f.fail<DTypeError>(t + " has dtype " + excerpt(dtype->text, 40) +
                               ", which kiln does not support (kiln reads F16, BF16, F32, F64, I32, I64, BOOL)");
        e.dtype = *dt;
        if (shape->kind != JsonValue::Kind::array)
            f.fail<ValueError>(t + " has a shape that is " + json_kind_name(shape->kind) + ", not an array");
        for (const JsonValue& d : shape->items) {
            if (d.kind != JsonValue::Kind::number)
                f.fail<ValueError>(t + " has a shape entry that is " + json_kind_name(d.kind) + ", not an integer");
            if (d.text.find_first_of(".eE") != std::string::npos)
                f.fail<ValueError>(t + " has shape entry " + d.text + ", not an integer");
            if (!d.integer) f.fail<ShapeError>(t + " has shape entry " + d.text + ", which does not fit in int64");
            e.dims.push_back(*d.integer);
        }
        if (auto why = shape_problem(e.dims, dtype_size(e.dtype)); !why.empty()) f.fail<ShapeError>(t + ": " + why);
        if (offsets->kind != JsonValue::Kind::array || offsets->items.size() != 2)
            f.fail<ValueError>(t + " has data_offsets that are not an array of two integers");
        for (int k = 0; k < 2; ++k) {
            const JsonValue& o = offsets->items[static_cast<std::size_t>(k)];
            if (o.kind != JsonValue::Kind::number || !o.integer || *o.integer < 0)
                f.fail<ValueError>(t + " has data_offsets entry " + (o.kind == JsonValue::Kind::number ? o.text : json_kind_name(o.kind)) +
                                   ", not a non-negative integer that fits in int64");
            (k == 0 ? e.begin : e.end) = static_cast<std::uint64_t>(*o.integer);
        }
        const std::string range = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
        if (e.end < e.begin) f.fail<ValueError>(t + " has data_offsets " + range + " that end before they begin");
        const auto need = static_cast<std::uint64_t>(numel_of(e.dims)) * dtype_size(e.dtype);
        if (e.end - e.begin != need)
            f.fail<ValueError>(t + " of shape " + dims_str(e.dims) + " and dtype " + dtype->text + " needs " +
                               std::to_string(need) + " bytes, but its data_offsets " + range + " span " +
                               std::to_string(e.end - e.begin));
        if (e.end > data_size)
            f.fail<ValueError>(t + " data_offsets " + range + " run past the end of the file (" +
                               std::to_string(data_size) + " bytes of data)");
        entries.push_back(std::move(e));
    }

    // The tensors must tile the data buffer exactly, as the reference implementation requires.
    std::vector<const Entry*> order;
    for (const auto& e : entries) order.push_back(&e);
    std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
        return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    std::uint64_t covered = 0;
    const Entry* prev = nullptr;
    const auto describe = [](const Entry* e) {
        return "tensor '" + e->name + "' [" + std::to_string(e->begin) + ", " + std::to_string(e->end) + "]";
    };
    for (const Entry* e : order) {
        if (e->begin < covered)
            f.fail<ValueError>(describe(prev) + " and " + describe(e) + " overlap");
        if (e->begin > covered)
            f.fail<ValueError>("bytes [" + std::to_string(covered) + ", " + std::to_string(e->begin) +
                               ") of the data belong to no tensor (" + (prev ? "after " + describe(prev) + ", " : "") +
                               "before " + describe(e) + ")");
        covered = e->end;
        prev = e;
    }
    if (covered != data_size)
        f.fail<ValueError>(std::to_string(data_size - covered) + " bytes after the last tensor's data belong to no tensor (" +
                           "the tensors cover " + std::to_string(covered) + " of " + std::to_string(data_size) + " bytes of data)");

    for (const auto& e : entries) {
        if (!with_data) continue;
        Tensor t(Shape(e.dims, loc), e.dtype, Device::cpu(), loc);
        f.read(data_start + e.begin, t.data_ptr(), e.end - e.begin, "tensor '" + e.name + "'");
        normalize_bools(t);
        out.tensors.emplace(e.name, std::move(t));
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// take

inline std::string name_list(const std::map<std::string, Tensor>& params) {
    if (params.empty()) return "no tensors";
    std::string s = std::to_string(params.size()) + (params.size() == 1 ? " tensor: " : " tensors: ");
    std::size_t i = 0;
    for (const auto& [name, t] : params) {
        if (i == 8) return s + ", ...";
        s += i++ ? ", '" : "'";
        s += name + "'";
    }
    return s;
}

inline Tensor take(const std::map<std::string, Tensor>& params, const std::string& name, const Shape& expect,
                   DType expect_dtype, const std::string& source, const Loc& loc) {
    const std::string in = source.empty() ? "" : " in " + source;
    const auto it = params.find(name);
    if (it == params.end())
        kiln::detail::fail<ValueError>("nn::take", "missing parameter '" + name + "'" + in + " (it holds " + name_list(params) + ")", loc);
    const Tensor& t = it->second;
    if (!(t.shape() == expect))
        kiln::detail::fail<ShapeError>("nn::take", "parameter '" + name + "'" + in + " has shape " + t.shape().str() +
                                                      ", expected " + expect.str(), loc);
    if (t.dtype() != expect_dtype)
        kiln::detail::fail<DTypeError>("nn::take", "parameter '" + name + "'" + in + " has dtype " +
                                                       std::string(dtype_name(t.dtype())) + ", expected " +
                                                       std::string(dtype_name(expect_dtype)), loc);
    return t;
}

}  // namespace detail

// -------------------------------------------------------------------------------------------------
// .npy

/// Reads one tensor from a NumPy .npy file (versions 1.0-3.0, C order) into a new CPU tensor.
inline Tensor load_npy(const std::filesystem::path& path, std::source_location loc = std::source_location::current()) {
    detail::InFile f("load_npy", path, loc);
    const std::size_t magic_len = detail::npy_magic.size();
    unsigned char pre[12] = {};
    const std::uint64_t have = std::min<std::uint64_t>(f.size(), 12);
    f.read(0, pre, have, "the preamble");
    const std::string_view magic(reinterpret_cast<const char*>(pre), std::min<std::uint64_t>(have, magic_len));
    if (have == 0) f.fail<ValueError>("truncated: the file is empty");
    if (magic != detail::npy_magic.substr(0, magic.size()))
        f.fail<ValueError>("not a .npy file: it starts with " + detail::excerpt(magic) + ", not the magic \"\\x93NUMPY\"");
    if (have < magic_len + 2)
        f.fail<ValueError>("truncated: " + std::to_string(f.size()) + " bytes, shorter than the .npy preamble");
    const int major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0)
        f.fail<ValueError>("unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                           " (kiln reads 1.0, 2.0 and 3.0)");
    const int len_bytes = major == 1 ? 2 : 4;
    const std::uint64_t prefix = magic_len + 2 + static_cast<std::uint64_t>(len_bytes);
    if (f.size() < prefix)
        f.fail<ValueError>("truncated: " + std::to_string(f.size()) + " bytes, shorter than the " +
                           std::to_string(prefix) + "-byte preamble of a version " + std::to_string(major) + ".0 .npy file");
    const std::uint64_t header_len = detail::read_le(pre + 8, len_bytes);
    if (header_len > f.size() - prefix)
        f.fail<ValueError>("header length " + std::to_string(header_len) + " runs past the end of the file (" +
                           std::to_string(f.size()) + " bytes)");
    const std::string header = f.read_string(prefix, header_len, "the header");
    const detail::NpyHeader h = detail::parse_npy_header(f, header);

    const std::uint64_t data_start = prefix + header_len, data_size = f.size() - data_start;
    const auto need = static_cast<std::uint64_t>(detail::numel_of(h.dims)) * dtype_size(h.dtype);
    const std::string what = "shape " + detail::dims_str(h.dims) + " of " + std::string(*detail::npy_descr(h.dtype)) +
                             " needs " + std::to_string(need) + " bytes of data";
    if (data_size < need)
        f.fail<ValueError>("truncated: " + what + ", but the file has " + std::to_string(data_size) + " after the header");
    if (data_size > need)
        f.fail<ValueError>(what + ", but the file has " + std::to_string(data_size) + " after the header (" +
                           std::to_string(data_size - need) + " trailing bytes)");
    Tensor t(Shape(h.dims, loc), h.dtype, Device::cpu(), loc);
    f.read(data_start, t.data_ptr(), need, "the data");
    detail::normalize_bools(t);
    return t;
}

/// Writes t to a NumPy .npy file (version 1.0, C order; a CUDA tensor is copied to the host).
/// bf16 has no NumPy dtype: DTypeError (use save_safetensors, or t.to(DType::f32)).
inline void save_npy(const std::filesystem::path& path, const Tensor& t,
                     std::source_location loc = std::source_location::current()) {
    if (!t.defined()) detail::file_error<ValueError>("save_npy", path, "the tensor is undefined", loc);
    const auto descr = detail::npy_descr(t.dtype());
    if (!descr)
        detail::file_error<DTypeError>("save_npy", path, std::string(dtype_name(t.dtype())) +
                                                             " has no NumPy dtype; save it with save_safetensors or "
                                                             "convert it first (t.to(DType::f32))", loc);
    const Tensor c = detail::host_c_order(t, loc);
    const std::string header = detail::npy_header_text(c.dtype(), c.shape());
    std::string preamble(detail::npy_magic);
    preamble += '\x01';
    preamble += '\x00';
    preamble += static_cast<char>(header.size() & 0xff);
    preamble += static_cast<char>(header.size() >> 8);
    detail::OutFile out("save_npy", path, loc);
    out.write(preamble);
    out.write(header);
    out.write(c.data_ptr(), c.nbytes());
    out.commit();
}

// -------------------------------------------------------------------------------------------------
// safetensors

/// Reads every tensor of a safetensors file into new CPU tensors, by name.
inline std::map<std::string, Tensor> load_safetensors(const std::filesystem::path& path,
                                                      std::source_location loc = std::source_location::current()) {
    return detail::read_safetensors("load_safetensors", path, true, loc).tensors;
}

/// The "__metadata__" of a safetensors file (empty when it has none); validates the whole header
/// but reads no tensor data.
inline std::map<std::string, std::string> load_safetensors_metadata(
    const std::filesystem::path& path, std::source_location loc = std::source_location::current()) {
    return detail::read_safetensors("load_safetensors_metadata", path, false, loc).metadata;
}

/// Writes named tensors (and optional string metadata) to a safetensors file, each in C order;
/// CUDA tensors are copied to the host one at a time.
inline void save_safetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {},
                             std::source_location loc = std::source_location::current()) {
    const auto fail = [&](const std::string& what) { detail::file_error<ValueError>("save_safetensors", path, what, loc); };
    std::vector<const std::pair<const std::string, Tensor>*> order;
    for (const auto& kv : tensors) {
        if (kv.first == "__metadata__") fail("'__metadata__' is reserved and cannot name a tensor");
        if (!detail::valid_utf8(kv.first)) fail("tensor name " + detail::excerpt(kv.first) + " is not valid UTF-8");
        if (!kv.second.defined()) fail("tensor '" + kv.first + "' is undefined");
        order.push_back(&kv);
    }
    for (const auto& [k, v] : metadata)
        if (!detail::valid_utf8(k) || !detail::valid_utf8(v))
            fail("metadata entry " + detail::excerpt(k) + " is not valid UTF-8");
    // Largest elements first, so every tensor starts at a multiple of its element size.
    std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) {
        return a->second.element_size() > b->second.element_size();
    });

    std::string header = "{";
    if (!metadata.empty()) {
        header += "\"__metadata__\":{";
        bool first = true;
        for (const auto& [k, v] : metadata) {
            if (!first) header += ',';
            header += detail::json_quote(k) + ":" + detail::json_quote(v);
            first = false;
        }
        header += "}";
    }
    std::uint64_t offset = 0;
    for (const auto* kv : order) {
        const Tensor& t = kv->second;
        if (header.size() > 1) header += ",";
        header += detail::json_quote(kv->first) + ":{\"dtype\":\"" + std::string(detail::safetensors_dtype_name(t.dtype())) +
                  "\",\"shape\":[";
        for (int d = 0; d < t.rank(); ++d) {
            if (d) header += ',';
            header += std::to_string(t.shape()[d]);
        }
        header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.nbytes()) + "]}";
        offset += t.nbytes();
    }
    header += "}";
    header.append((8 - header.size() % 8) % 8, ' ');

    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
    detail::OutFile out("save_safetensors", path, loc);
    out.write(len, 8);
    out.write(header);
    for (const auto* kv : order) {
        const Tensor c = detail::host_c_order(kv->second, loc);
        out.write(c.data_ptr(), c.nbytes());
    }
    out.commit();
}

// -------------------------------------------------------------------------------------------------
// Taking parameters

/// params[name], checked: ValueError when it is missing, ShapeError / DTypeError when its shape or
/// dtype is not the expected one; each message names the parameter and both values.
inline Tensor take(const std::map<std::string, Tensor>& params, const std::string& name, const Shape& expect,
                   DType expect_dtype, std::source_location loc = std::source_location::current()) {
    return detail::take(params, name, expect, expect_dtype, "", loc);
}

/// Named tensors loaded from a file, handed out with checks by take(), which also records what
/// was taken so that expect_all_taken() can find parameters the file holds but no module used.
class ParamDict {
public:
    ParamDict() = default;
    /// Tensors from anywhere; `source` (may be empty) is named in error messages.
    explicit ParamDict(std::map<std::string, Tensor> tensors, std::filesystem::path source = {},
                       std::map<std::string, std::string> metadata = {})
        : tensors_(std::move(tensors)), metadata_(std::move(metadata)), source_(std::move(source)) {}

    /// Loads a safetensors file, a .npy file (one tensor, named after the file's stem: "fc.weight.npy"
    /// holds "fc.weight") or a directory of .npy files (each named so; other files are ignored).
    /// A file is read as .npy when its name ends in ".npy", as safetensors otherwise.
    static ParamDict load(const std::filesystem::path& path, std::source_location loc = std::source_location::current()) {
        namespace fs = std::filesystem;
        std::error_code ec;
        if (fs::is_directory(path, ec)) {
            std::vector<fs::path> files;
            fs::directory_iterator it(path, ec);
            for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
                std::error_code type_ec;
                if (it->path().extension() == ".npy" && it->is_regular_file(type_ec)) files.push_back(it->path());
            }
            if (ec) detail::file_error<ValueError>("ParamDict::load", path, "cannot list the directory: " + ec.message(), loc);
            if (files.empty()) detail::file_error<ValueError>("ParamDict::load", path, "the directory holds no .npy files", loc);
            std::map<std::string, Tensor> tensors;
            for (const auto& file : files) tensors.emplace(file.stem().string(), load_npy(file, loc));
            return ParamDict(std::move(tensors), path);
        }
        if (path.extension() == ".npy") {
            std::map<std::string, Tensor> one;
            one.emplace(path.stem().string(), load_npy(path, loc));
            return ParamDict(std::move(one), path);
        }
        auto contents = detail::read_safetensors("ParamDict::load", path, true, loc);
        return ParamDict(std::move(contents.tensors), path, std::move(contents.metadata));
    }

    /// The tensor `name`, checked as nn::take checks it (messages also name the source file).
    Tensor take(const std::string& name, const Shape& expect, DType expect_dtype,
                std::source_location loc = std::source_location::current()) {
        Tensor t = detail::take(tensors_, name, expect, expect_dtype, source_.string(), loc);
        taken_.insert(name);
        return t;
    }
    /// Names held but never taken, in order.
    std::vector<std::string> untaken() const {
        std::vector<std::string> out;
        for (const auto& kv : tensors_)
            if (!taken_.count(kv.first)) out.push_back(kv.first);
        return out;
    }
    /// ValueError naming the tensors never taken (like PyTorch's strict load_state_dict).
    void expect_all_taken(std::source_location loc = std::source_location::current()) const {
        const auto left = untaken();
        if (left.empty()) return;
        std::string names;
        for (std::size_t i = 0; i < left.size() && i < 8; ++i) {
            names += i ? ", '" : "'";
            names += left[i] + "'";
        }
        if (left.size() > 8) names += ", ...";
        kiln::detail::fail<ValueError>("nn::ParamDict::expect_all_taken",
                                       std::to_string(left.size()) + " unused parameter" + (left.size() == 1 ? "" : "s") +
                                           (source_.empty() ? "" : " in " + source_.string()) + ": " + names, loc);
    }

    bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
    std::size_t size() const { return tensors_.size(); }
    const std::map<std::string, Tensor>& tensors() const { return tensors_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    const std::filesystem::path& source() const { return source_; }

private:
    std::map<std::string, Tensor> tensors_;
    std::map<std::string, std::string> metadata_;
    std::filesystem::path source_;
    std::set<std::string> taken_;
};

}  // namespace kiln::nn
