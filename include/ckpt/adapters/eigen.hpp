#pragma once
/// @file eigen.hpp
/// Eigen's dense types as ckpt tensors: `Eigen::Matrix`, `Eigen::Array`, `Eigen::Map` of them
/// with contiguous strides, and (when `<unsupported/Eigen/CXX11/Tensor>` is available)
/// `Eigen::Tensor`, `Eigen::TensorFixedSize` and `Eigen::TensorMap`. Never included by
/// ckpt.hpp: include it yourself, and link Eigen (Meson: `ckpt_eigen_dep`).
///
/// Each type is saved as it lies in memory, with its storage order recorded (`ckpt::layout`):
/// a column-major (Eigen's default) rows x cols matrix is registered with the memory-order shape
/// {cols, rows} and `layout::column_major`, a row-major one with {rows, cols}. Loading into the
/// other storage order is refused (`error_kind::mismatch`, naming the tensor and both layouts),
/// even for a square matrix whose shapes agree, rather than transposing it silently. Vectors
/// (one dimension 1 at compile time) are stored 1-D with shape [n], whatever their order.
///
/// Dynamic-size objects must have their final size before a load: ckpt fills the memory they
/// own and refuses a checkpoint of another shape.
///
/// @code
/// #include <ckpt/adapters/eigen.hpp>
///
/// struct model {
///   Eigen::MatrixXf w{256, 128};                              // column-major
///   Eigen::Matrix<float, 4, 4, Eigen::RowMajor> proj;        // row-major
///   Eigen::VectorXd bias{256};                                // 1-D [256]
///   template <class V> void checkpoint(V& v) {
///     v.tensor("w", w);
///     v.tensor("proj", proj);
///     v.tensor("bias", bias);
///   }
/// };
/// @endcode

#if !__has_include(<Eigen/Core>)
#error "ckpt/adapters/eigen.hpp needs Eigen 3.4 (<Eigen/Core>): install it (Debian: libeigen3-dev) and add it to the include path (Meson: ckpt_eigen_dep, pkg-config eigen3)"
#endif

#include <Eigen/Core>

#if __has_include(<unsupported/Eigen/CXX11/Tensor>) && !defined(CKPT_EIGEN_NO_TENSOR)
#include <unsupported/Eigen/CXX11/Tensor>
/// 1 when the adapter handles `Eigen::Tensor` and `Eigen::TensorMap` (Eigen's unsupported Tensor
/// module was found; define CKPT_EIGEN_NO_TENSOR to leave it out and save its compile time).
#define CKPT_EIGEN_TENSOR 1
#else
#define CKPT_EIGEN_TENSOR 0
#endif

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../dtype.hpp"
#include "../tensor.hpp"
#include "../visitor.hpp"

static_assert(EIGEN_VERSION_AT_LEAST(3, 4, 0), "ckpt/adapters/eigen.hpp needs Eigen 3.4 or newer");

namespace ckpt {

// Eigen's 16-bit floats hold IEEE binary16 and bfloat16 bit patterns, as ckpt's own do.
static_assert(sizeof(Eigen::half) == 2 && sizeof(Eigen::bfloat16) == 2, "ckpt: Eigen::half and Eigen::bfloat16 must be 2 bytes");
template <> struct dtype_of<Eigen::half> : std::integral_constant<dtype, dtype::f16> {};
template <> struct dtype_of<Eigen::bfloat16> : std::integral_constant<dtype, dtype::bf16> {};

namespace detail::eigen {

/// The dtype of an Eigen scalar, or a static_assert naming what is supported.
template <class S>
constexpr dtype dtype_for() {
  static_assert(element_type<S>,
                "ckpt: this Eigen scalar type has no ckpt dtype: use float, double, Eigen::half, Eigen::bfloat16, "
                "std::int8_t ... std::int64_t, std::uint8_t ... std::uint64_t or bool (complex scalars are not supported)");
  if constexpr (element_type<S>)
    return dtype_of<std::remove_cv_t<S>>::value;
  else
    return dtype::f32;
}

/// A tensor over `data`: 1-D [size] for a vector, else the memory-order shape of a rows x cols
/// matrix with the layout it is stored in.
template <class S>
tensor_ref matrix_ref(S* data, Eigen::Index rows, Eigen::Index cols, bool vector, bool row_major) {
  using E = std::remove_cv_t<S>;
  constexpr dtype type = dtype_for<E>();
  auto* bytes = reinterpret_cast<std::byte*>(const_cast<E*>(data));
  const auto r = static_cast<std::uint64_t>(rows), c = static_cast<std::uint64_t>(cols);
  if (vector) return tensor_ref::checked_later(type, {r * c}, bytes, !std::is_const_v<S>);
  auto t = tensor_ref::checked_later(type, row_major ? shape_t{r, c} : shape_t{c, r}, bytes, !std::is_const_v<S>);
  if (!row_major) t.laid_out(layout::column_major);
  return t;
}

/// Matrix and Array, and Maps of them: anything with Eigen's dense-object interface.
template <class M, class S>
tensor_ref dense_ref(const M& m, S* data) {
  constexpr bool vector = M::IsVectorAtCompileTime;
  return matrix_ref(data, m.rows(), m.cols(), vector, static_cast<bool>(M::IsRowMajor));
}

/// A rank-N tensor: its dimensions in memory order, column-major when it is (N >= 2).
template <int N, class S, class Dims>
tensor_ref tensor_like_ref(S* data, const Dims& dims, bool row_major) {
  using E = std::remove_cv_t<S>;
  constexpr dtype type = dtype_for<E>();
  auto* bytes = reinterpret_cast<std::byte*>(const_cast<E*>(data));
  shape_t shape(static_cast<std::size_t>(N));
  for (int d = 0; d < N; ++d) {
    const auto at = row_major ? d : N - 1 - d;
    shape[static_cast<std::size_t>(d)] = static_cast<std::uint64_t>(dims[at]);
  }
  auto t = tensor_ref::checked_later(type, std::move(shape), bytes, !std::is_const_v<S>);
  if (!row_major && N >= 2) t.laid_out(layout::column_major);
  return t;
}

/// False for an inner stride that is known at compile time to leave gaps: anything but 0 (the
/// default), 1, or Eigen::Dynamic (checked at run time).
constexpr bool natural_inner(int s) { return s == 0 || s == 1 || s == Eigen::Dynamic; }

}  // namespace detail::eigen

/// `Eigen::Matrix` of any size and storage order (see the file's documentation).
///
/// @code
/// Eigen::Matrix3d r = Eigen::Matrix3d::Identity();
/// v.tensor("rotation", r);  // column-major [3, 3]
/// @endcode
template <class S, int R, int C, int O, int MR, int MC>
struct tensor_traits<Eigen::Matrix<S, R, C, O, MR, MC>> {
  using type = Eigen::Matrix<S, R, C, O, MR, MC>;
  static tensor_ref ref(type& m) { return detail::eigen::dense_ref(m, m.data()); }
  /// A const matrix saves; loading into it is refused.
  static tensor_ref ref(const type& m) { return detail::eigen::dense_ref(m, m.data()); }
};

/// `Eigen::Array` of any size and storage order, stored as `Eigen::Matrix` is.
///
/// @code
/// Eigen::ArrayXXf counts(16, 8);
/// v.tensor("counts", counts);  // column-major, memory-order shape [8, 16]
/// @endcode
template <class S, int R, int C, int O, int MR, int MC>
struct tensor_traits<Eigen::Array<S, R, C, O, MR, MC>> {
  using type = Eigen::Array<S, R, C, O, MR, MC>;
  static tensor_ref ref(type& a) { return detail::eigen::dense_ref(a, a.data()); }
  static tensor_ref ref(const type& a) { return detail::eigen::dense_ref(a, a.data()); }
};

/// `Eigen::Map` of a Matrix or Array whose elements are contiguous: the default stride, or
/// `Eigen::Stride`s that (checked at run time when they are `Eigen::Dynamic`) leave no gap. A
/// stride that is known at compile time to leave gaps is a compile error; one found at run time
/// is refused by `v.tensor`, naming the tensor. A Map of a const type (`Eigen::Map<const
/// Eigen::MatrixXf>`) or a const Map saves but cannot be loaded into.
///
/// @code
/// float* w = engine.weights();
/// v.tensor("w", Eigen::Map<Eigen::MatrixXf>(w, 64, 32));
/// @endcode
template <class P, int MO, class St>
struct tensor_traits<Eigen::Map<P, MO, St>> {
  using type = Eigen::Map<P, MO, St>;
  using plain = std::remove_const_t<P>;
  static_assert(detail::eigen::natural_inner(int{St::InnerStrideAtCompileTime}),
                "ckpt: this Eigen::Map has a fixed inner stride other than 1: its elements are not contiguous, and ckpt "
                "stores contiguous tensors only. Copy it into a Matrix (or Array) and save that.");
  static constexpr int outer_stride = St::OuterStrideAtCompileTime;
  static constexpr int inner_size = plain::IsRowMajor ? int{plain::ColsAtCompileTime} : int{plain::RowsAtCompileTime};
  static_assert(plain::IsVectorAtCompileTime || outer_stride == 0 || outer_stride == Eigen::Dynamic ||
                    inner_size == Eigen::Dynamic || outer_stride == inner_size,
                "ckpt: this Eigen::Map has a fixed outer stride that leaves gaps between its columns (rows): its elements "
                "are not contiguous, and ckpt stores contiguous tensors only. Copy it into a Matrix (or Array) and save that.");

  template <class M>
  static tensor_ref make(M& m) {
    if (m.size() > 1 && !contiguous(m))
      return tensor_ref::refused("an Eigen::Map with inner stride " + std::to_string(m.innerStride()) + " and outer stride " +
                                 std::to_string(m.outerStride()) + " over " + std::to_string(m.rows()) + "x" + std::to_string(m.cols()) +
                                 " elements is not contiguous; ckpt stores contiguous tensors only");
    return detail::eigen::dense_ref(m, m.data());
  }
  static tensor_ref ref(type& m) { return make(m); }
  /// A const Map saves; loading into it is refused.
  static tensor_ref ref(const type& m) { return make(m); }  // a const Map's data() is const

 private:
  static bool contiguous(const type& m) {
    if (m.innerStride() != 1) return false;
    if (plain::IsVectorAtCompileTime || m.outerSize() <= 1) return true;
    return m.outerStride() == m.innerSize();
  }
};

#if CKPT_EIGEN_TENSOR
/// `Eigen::Tensor` of any rank and either layout. Rank 0 is a scalar, rank 1 a vector [n]; a
/// column-major tensor (Eigen's default) of rank 2 or more is stored with its dimensions
/// reversed and `layout::column_major`.
///
/// @code
/// Eigen::Tensor<float, 3> kv(2, 16, 64);                  // column-major
/// Eigen::Tensor<float, 3, Eigen::RowMajor> q(2, 16, 64);  // row-major [2, 16, 64]
/// v.tensor("kv", kv);
/// v.tensor("q", q);
/// @endcode
template <class S, int N, int O, class I>
struct tensor_traits<Eigen::Tensor<S, N, O, I>> {
  using type = Eigen::Tensor<S, N, O, I>;
  static constexpr bool row_major = (O & Eigen::RowMajor) != 0;
  static tensor_ref ref(type& t) { return detail::eigen::tensor_like_ref<N>(t.data(), t.dimensions(), row_major); }
  static tensor_ref ref(const type& t) { return detail::eigen::tensor_like_ref<N>(t.data(), t.dimensions(), row_major); }
};

/// `Eigen::TensorFixedSize`, as `Eigen::Tensor`.
///
/// @code
/// Eigen::TensorFixedSize<double, Eigen::Sizes<2, 3, 4>> t;
/// v.tensor("t", t);
/// @endcode
template <class S, class D, int O, class I>
struct tensor_traits<Eigen::TensorFixedSize<S, D, O, I>> {
  using type = Eigen::TensorFixedSize<S, D, O, I>;
  static constexpr bool row_major = (O & Eigen::RowMajor) != 0;
  static constexpr int rank = type::NumIndices;
  static tensor_ref ref(type& t) { return detail::eigen::tensor_like_ref<rank>(t.data(), t.dimensions(), row_major); }
  static tensor_ref ref(const type& t) { return detail::eigen::tensor_like_ref<rank>(t.data(), t.dimensions(), row_major); }
};

/// `Eigen::TensorMap` of a Tensor (always contiguous), in its tensor's layout. A map of a const
/// tensor (`Eigen::TensorMap<const Eigen::Tensor<float, 2>>`) or a const map saves but cannot
/// be loaded into.
///
/// @code
/// Eigen::TensorMap<Eigen::Tensor<float, 2, Eigen::RowMajor>> w(engine.weights(), 64, 32);
/// v.tensor("w", w);
/// @endcode
template <class P, int O, template <class> class MP>
struct tensor_traits<Eigen::TensorMap<P, O, MP>> {
  using type = Eigen::TensorMap<P, O, MP>;
  using plain = std::remove_const_t<P>;
  static constexpr bool row_major = static_cast<int>(plain::Layout) == static_cast<int>(Eigen::RowMajor);
  static constexpr int rank = plain::NumIndices;
  static tensor_ref ref(type& t) { return detail::eigen::tensor_like_ref<rank>(t.data(), t.dimensions(), row_major); }
  static tensor_ref ref(const type& t) {
    const typename plain::Scalar* data = t.data();
    return detail::eigen::tensor_like_ref<rank>(data, t.dimensions(), row_major);
  }
};
#endif

}  // namespace ckpt
