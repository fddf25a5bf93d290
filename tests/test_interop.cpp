// Eigen interop: tensors over Eigen matrices and Maps (both storage orders, outer and inner strides)
// and Eigen Maps over tensors (contiguous, transposed, stepped slices), all zero-copy; round trips
// through kiln ops checked against Eigen's own arithmetic.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <kiln/kiln.hpp>  // first: kiln's SIMD header must be the first to include the intrinsics (GCC 12)

#include <kiln/interop/eigen.hpp>  // Eigen interop is its own header (kiln.hpp does not include Eigen)

#include <Eigen/Core>

namespace {

using kiln::DType;
using kiln::Layout;
using kiln::Tensor;

using RowMatrixXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMatrixXf = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Fresh random values in [-4, 4) away from zero (|x| >= 0.25), through kiln's generator.
Tensor random_tensor(const kiln::Shape& s, DType d = DType::f32) {
    const Tensor u = kiln::rand(s, DType::f64);
    return Tensor(kiln::cast(kiln::where(u < 0.5, -0.25 - 7.5 * u, 0.25 + 7.5 * (u - 0.5)), d));
}

/// Fills an Eigen object with the same kind of values.
template <class M>
void randomize(M& m, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(0.25, 4.0);
    for (Eigen::Index j = 0; j < m.cols(); ++j)
        for (Eigen::Index i = 0; i < m.rows(); ++i)
            m(i, j) = static_cast<typename M::Scalar>((rng() & 1 ? 1.0 : -1.0) * u(rng));
}

/// Every element of the tensor equals the Eigen object's element (exact).
template <class T, class M>
void check_same_values(const Tensor& t, const M& m) {
    REQUIRE(t.rank() == 2);
    REQUIRE(t.size(0) == m.rows());
    REQUIRE(t.size(1) == m.cols());
    for (std::int64_t i = 0; i < t.size(0); ++i)
        for (std::int64_t j = 0; j < t.size(1); ++j) {
            INFO("(" << i << ", " << j << ")");
            CHECK(t.at<T>({i, j}) == m(i, j));
        }
}

std::uint32_t fresh_seed() { return std::random_device{}(); }

}  // namespace

// ============================================================================ Eigen -> tensor

TEST_CASE("from_eigen: a column-major MatrixXf is viewed in place") {
    Eigen::MatrixXf m(5, 7);
    randomize(m, fresh_seed());
    const Tensor t = kiln::from_eigen(m);
    CHECK(t.dtype() == DType::f32);
    CHECK(t.shape().str() == "(5, 7)");
    CHECK(t.strides().str() == "(1, 5)");
    CHECK_FALSE(t.is_contiguous());
    CHECK(t.data_ptr() == static_cast<void*>(m.data()));
    check_same_values<float>(t, m);
    t.at<float>({3, 4}) = 123.25f;  // writes through the tensor change the matrix
    CHECK(m(3, 4) == 123.25f);
    m(0, 6) = -9.5f;  // and the other way
    CHECK(t.at<float>({0, 6}) == -9.5f);
    t.select(0, 2).fill_(0.5);  // a whole row, strided in column-major memory
    for (Eigen::Index j = 0; j < 7; ++j) CHECK(m(2, j) == 0.5f);
    CHECK(m(1, 1) != 0.5f);
    // an expression writes its result into the matrix' memory
    Tensor view = kiln::from_eigen(m);
    const Eigen::MatrixXf before = m;
    view.assign(view * 2.0 - 1.0);
    CHECK(((before.array() * 2.0f - 1.0f).matrix() - m).cwiseAbs().maxCoeff() == 0.0f);
}

TEST_CASE("from_eigen: row-major matrices, integer and fixed-size matrices, vectors") {
    RowMatrixXd r(4, 6);
    randomize(r, fresh_seed());
    const Tensor t = kiln::from_eigen(r);
    CHECK(t.dtype() == DType::f64);
    CHECK(t.strides().str() == "(6, 1)");
    CHECK(t.is_contiguous());
    check_same_values<double>(t, r);
    t.at<double>({3, 5}) = -0.375;
    CHECK(r(3, 5) == -0.375);
    CHECK(kiln::sum(t).item<double>() == doctest::Approx(r.sum()).epsilon(1e-12));

    Eigen::Matrix<std::int32_t, 3, 2> fixed;
    fixed << 1, -2, 3, -4, 5, -6;
    const Tensor ti = kiln::from_eigen(fixed);
    CHECK(ti.dtype() == DType::i32);
    CHECK(ti.strides().str() == "(1, 3)");
    check_same_values<std::int32_t>(ti, fixed);

    Eigen::Matrix<std::int64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> big(2, 3);
    big << 1, 2, 3, 4, 5, std::int64_t{1} << 40;
    CHECK(kiln::from_eigen(big).at<std::int64_t>({1, 2}) == std::int64_t{1} << 40);

    Eigen::VectorXd v(5);
    randomize(v, fresh_seed());
    const Tensor tv = kiln::from_eigen(v);
    CHECK(tv.shape().str() == "(5, 1)");
    check_same_values<double>(tv, v);
}

TEST_CASE("from_eigen: Maps with outer and inner strides") {
    std::vector<float> buf(64);
    for (std::size_t k = 0; k < buf.size(); ++k) buf[k] = 0.5f + static_cast<float>(k);
    // column-major, 3 x 4 inside a buffer with 5 floats between columns
    Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>> cm(buf.data(), 3, 4, Eigen::OuterStride<>(5));
    const Tensor t = kiln::from_eigen(cm);
    CHECK(t.shape().str() == "(3, 4)");
    CHECK(t.strides().str() == "(1, 5)");
    for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = 0; j < 4; ++j) CHECK(t.at<float>({i, j}) == buf[static_cast<std::size_t>(i + 5 * j)]);
    t.at<float>({2, 3}) = -1.0f;
    CHECK(buf[17] == -1.0f);
    CHECK(cm(2, 3) == -1.0f);
    CHECK(buf[18] == 18.5f);  // the gap between columns is not part of the view

    // row-major, 4 x 3 with 7 floats between rows
    Eigen::Map<RowMatrixXf, 0, Eigen::OuterStride<>> rm(buf.data() + 1, 4, 3, Eigen::OuterStride<>(7));
    const Tensor tr = kiln::from_eigen(rm);
    CHECK(tr.strides().str() == "(7, 1)");
    check_same_values<float>(tr, rm);

    // both strides: rows 2 apart, columns 9 apart
    Eigen::Map<Eigen::MatrixXf, 0, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>> sm(
        buf.data(), 3, 5, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(9, 2));
    const Tensor ts = kiln::from_eigen(sm);
    CHECK(ts.strides().str() == "(2, 9)");
    check_same_values<float>(ts, sm);
    ts.at<float>({1, 4}) = 77.0f;
    CHECK(buf[2 + 36] == 77.0f);

    // a kiln computation over the strided map matches Eigen's
    const Tensor y = ts * ts + 0.5;
    const Eigen::MatrixXf ref = (sm.array() * sm.array() + 0.5f).matrix();
    check_same_values<float>(y, ref);
}

// ============================================================================ tensor -> Eigen

TEST_CASE("as_eigen over contiguous, transposed and stepped tensors, both layouts") {
    const Tensor base = random_tensor({6, 8});
    auto check_map = [](const Tensor& t, const auto& map) {
        REQUIRE(map.rows() == t.size(0));
        REQUIRE(map.cols() == (t.rank() == 2 ? t.size(1) : 1));
        for (Eigen::Index i = 0; i < map.rows(); ++i)
            for (Eigen::Index j = 0; j < map.cols(); ++j) {
                const float want = t.rank() == 2 ? t.at<float>({i, j}) : t.at<float>({i});
                REQUIRE(map(i, j) == want);
            }
    };
    const Tensor views[] = {
        base,                                   // contiguous
        base.t(),                               // transposed
        base.slice(1, 1, 8, 3),                 // columns 1, 4, 7
        base.slice(0, 0, 6, 2).slice(1, 7, 8),  // stepped rows, one column
        base.t().slice(0, 2, 8, 2),             // transposed and stepped
        base.select(0, 3),                      // 1-D: a column vector
        base.select(1, 5).slice(0, 1, 6, 2),    // 1-D, strided
    };
    for (const Tensor& v : views) {
        INFO("shape " << v.shape().str() << " strides " << v.strides().str());
        const auto rm = kiln::as_eigen<float, Layout::row_major>(v);
        const auto cm = kiln::as_eigen<float, Layout::col_major>(v);
        CHECK(rm.data() == v.data<float>());  // no copy
        check_map(v, rm);
        check_map(v, cm);
        // Eigen arithmetic on the maps agrees with kiln's on the tensor
        const Eigen::MatrixXf sq = (rm.array() * rm.array()).matrix();
        const Tensor ksq = v * v;
        for (Eigen::Index i = 0; i < sq.rows(); ++i)
            for (Eigen::Index j = 0; j < sq.cols(); ++j)
                CHECK(sq(i, j) == ksq.item<float>(i * sq.cols() + j));
    }
    // writes through either map land in the tensor
    const Tensor tt = base.t();
    auto rm = kiln::as_eigen<float, Layout::row_major>(tt);
    rm(5, 1) = 1234.0f;
    CHECK(base.at<float>({1, 5}) == 1234.0f);
    const Tensor st = base.slice(1, 1, 8, 3);
    auto cm = kiln::as_eigen<float, Layout::col_major>(st);
    cm(4, 2) = -4321.0f;
    CHECK(base.at<float>({4, 7}) == -4321.0f);
    cm.col(0).setConstant(2.5f);  // a whole strided column at once
    for (std::int64_t i = 0; i < 6; ++i) CHECK(base.at<float>({i, 1}) == 2.5f);
    CHECK(base.at<float>({0, 2}) != 2.5f);
}

TEST_CASE("as_eigen on f64 and i32 tensors, and a product through the maps") {
    const Tensor a = random_tensor({4, 3}, DType::f64), b = random_tensor({3, 5}, DType::f64);
    const auto am = kiln::as_eigen<double>(a);
    const Tensor bcol = b.t().contiguous().t();  // the same values in column-major memory
    CHECK(bcol.strides().str() == "(1, 3)");
    const auto bm = kiln::as_eigen<double, Layout::col_major>(bcol);
    const Eigen::MatrixXd ref = am * bm;
    const Tensor c = kiln::matmul(a, b);
    for (std::int64_t i = 0; i < 4; ++i)
        for (std::int64_t j = 0; j < 5; ++j) CHECK(c.at<double>({i, j}) == doctest::Approx(ref(i, j)).epsilon(1e-12));
    const Tensor n = kiln::arange(1, 13, 1, DType::i32).view({3, 4});
    const auto nm = kiln::as_eigen<std::int32_t>(n.t());
    CHECK(nm.rows() == 4);
    CHECK(nm(3, 2) == 12);
    CHECK(nm.sum() == 78);
}

TEST_CASE("as_eigen refuses rank 0 and rank 3 (ShapeError) and the wrong element type (DTypeError)") {
    const Tensor r3 = random_tensor({2, 3, 4});
    CHECK_THROWS_AS((void)kiln::as_eigen<float>(r3), kiln::ShapeError);
    CHECK_THROWS_AS((void)kiln::as_eigen<float>(kiln::full({}, 1.0)), kiln::ShapeError);
    try {
        (void)kiln::as_eigen<float, Layout::col_major>(r3);
        FAIL("no exception");
    } catch (const kiln::ShapeError& e) {
        const std::string msg = e.what();
        CHECK(msg.find("kiln::as_eigen") != std::string::npos);
        CHECK(msg.find("(2, 3, 4)") != std::string::npos);
        CHECK(msg.find("test_interop.cpp:") != std::string::npos);
    }
    const Tensor f = random_tensor({2, 2});
    CHECK_THROWS_AS((void)kiln::as_eigen<double>(f), kiln::DTypeError);
    CHECK_THROWS_AS((void)kiln::as_eigen<std::int32_t>(f), kiln::DTypeError);
    try {
        (void)kiln::as_eigen<double>(f);
        FAIL("no exception");
    } catch (const kiln::DTypeError& e) {
        const std::string msg = e.what();
        CHECK(msg.find("float64") != std::string::npos);
        CHECK(msg.find("float32") != std::string::npos);
        CHECK(msg.find("test_interop.cpp:") != std::string::npos);
    }
    CHECK_NOTHROW((void)kiln::as_eigen<float>(f));
}

// ============================================================================ round trips

TEST_CASE("Eigen -> tensor -> kiln ops -> compared with Eigen's own array arithmetic") {
    Eigen::MatrixXf m(33, 17);  // column-major: kiln reads it strided
    randomize(m, fresh_seed());
    const Tensor x = kiln::from_eigen(m);
    const Tensor y = x * 2.0f + 1.0f;
    CHECK(y.is_contiguous());
    const Eigen::ArrayXXf ref = m.array() * 2.0f + 1.0f;
    check_same_values<float>(y, ref);  // exact: x * 2 is exact, so one rounding on both sides
    // and back into Eigen without a copy
    const auto ym = kiln::as_eigen<float>(y);
    CHECK((ym.array() - ref).abs().maxCoeff() == 0.0f);

    // transcendental ops: kiln's SIMD math against Eigen's, within a few float ulps
    const Tensor z = kiln::exp(x * 0.5) - x * x + kiln::tanh(x);
    const Eigen::ArrayXXf zref = (m.array() * 0.5f).exp() - m.array().square() + m.array().tanh();
    for (std::int64_t i = 0; i < 33; ++i)
        for (std::int64_t j = 0; j < 17; ++j) {
            const double want = zref(i, j), got = z.at<float>({i, j});
            const double scale = std::exp(0.5 * std::fabs(m(i, j))) + m(i, j) * m(i, j) + 1;  // the terms' size
            CHECK(std::fabs(got - want) <= 1e-6 * scale);  // a few ulps of the largest term
        }

    // a reduction and a product against Eigen's
    CHECK(kiln::sum(x, 0).at<float>({16}) == doctest::Approx(m.col(16).sum()).epsilon(1e-5));
    CHECK(kiln::max(x).item<float>() == m.maxCoeff());
    RowMatrixXf w(17, 9);
    randomize(w, fresh_seed());
    const Tensor p = kiln::matmul(x, kiln::from_eigen(w));
    const Eigen::MatrixXf pref = m * w;
    for (std::int64_t i = 0; i < 33; ++i)
        for (std::int64_t j = 0; j < 9; ++j) CHECK(p.at<float>({i, j}) == doctest::Approx(pref(i, j)).epsilon(1e-5).scale(17));
}
