// Zero-copy interop with Eigen: tensors over Eigen storage, Eigen maps over tensors.
#pragma once

#include <Eigen/Core>

#include "kiln/core/tensor.hpp"

namespace kiln {

/// A 2-D tensor viewing an Eigen matrix, Map or Block without copying; the Eigen object must
/// outlive the tensor. Row- and column-major are read from Eigen's strides.
template <class Derived>
Tensor from_eigen(Eigen::PlainObjectBase<Derived>& m) {
    using T = typename Derived::Scalar;
    const std::int64_t rs = m.rowStride(), cs = m.colStride();
    auto storage = std::make_shared<detail::Storage>(m.data(), static_cast<std::size_t>(m.size()) * sizeof(T), Device::cpu(), nullptr);
    return Tensor(storage, 0, Shape{m.rows(), m.cols()}, Strides{rs, cs}, dtype_of<T>);
}
template <class PlainObjectType, int MapOptions, class StrideType>
Tensor from_eigen(const Eigen::Map<PlainObjectType, MapOptions, StrideType>& m) {
    using T = typename PlainObjectType::Scalar;
    const std::int64_t rs = m.rowStride(), cs = m.colStride();
    const std::int64_t span = m.size() == 0 ? 0 : (m.rows() - 1) * rs + (m.cols() - 1) * cs + 1;
    auto storage = std::make_shared<detail::Storage>(const_cast<T*>(m.data()), static_cast<std::size_t>(span) * sizeof(T),
                                                     Device::cpu(), nullptr);
    return Tensor(storage, 0, Shape{m.rows(), m.cols()}, Strides{rs, cs}, dtype_of<T>);
}

/// Storage order of the Eigen view over a tensor.
enum class Layout { row_major, col_major };

template <class T, Layout L>
using EigenMatrixMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, L == Layout::row_major ? Eigen::RowMajor : Eigen::ColMajor>,
                                  Eigen::Unaligned, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>;

/// An Eigen::Map over a 2-D (or 1-D, as a column) tensor without copying; any strides work.
/// T must be the tensor's dtype. Writes through the map change the tensor. Host tensors only:
/// a CUDA tensor throws DeviceError (copy it with cpu() first).
template <class T, Layout L = Layout::row_major>
EigenMatrixMap<T, L> as_eigen(const Tensor& t, std::source_location loc = std::source_location::current()) {
    if (!t.device().is_cpu())
        detail::fail<DeviceError>("as_eigen", "tensor is on " + t.device().str() +
                                                  "; Eigen maps host memory only, copy it with .cpu()", loc);
    if (t.rank() > 2 || t.rank() == 0)
        detail::fail<ShapeError>("as_eigen", "needs a 1-D or 2-D tensor, got shape " + t.shape().str(), loc);
    const std::int64_t rows = t.size(0), cols = t.rank() == 2 ? t.size(1) : 1;
    const std::int64_t rs = t.stride(0), cs = t.rank() == 2 ? t.stride(1) : 1;
    // Eigen's Stride is (outer, inner): for row-major the outer step is between rows
    const auto stride = L == Layout::row_major ? Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(rs, cs)
                                               : Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(cs, rs);
    return EigenMatrixMap<T, L>(t.data<T>(loc), rows, cols, stride);
}

}  // namespace kiln
