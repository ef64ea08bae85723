// The Eigen adapter (ckpt/adapters/eigen.hpp): Matrix, Array, Map, Tensor, TensorMap round
// trips in both storage orders; the stored layout, and the loads it refuses; how the layout
// travels (metadata.json, the shard index, gather messages, ckpt::reader).

#include "helpers.hpp"

#include <ckpt/adapters/eigen.hpp>
#include <ckpt/detail/commit.hpp>
#include <ckpt/in_process.hpp>
#include <ckpt/reader.hpp>

#include <fstream>
#include <sstream>
#include <thread>

namespace {

using cp_t = ckpt::checkpointer<ckpt::single_process, ckpt::posix>;
using ckpt::layout;

/// One tensor called "w".
template <class T>
struct one {
  T w;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", w);
  }
};

/// The tensor_ref the adapter makes for `x`.
template <class T>
ckpt::tensor_ref ref_of(T&& x) {
  ckpt::visitor v;
  v.tensor("x", std::forward<T>(x));
  return v.tensors().at(0).ref;
}

template <class M>
void fill(M& m, int seed) {
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<typename M::Scalar>((i * 7 + seed * 13) % 97);
}

/// Saves `a` and loads it into `b` (same type, already sized), which must then equal `a`.
template <class M>
void round_trip(const M& a, M b) {
  test::temp_dir dir;
  cp_t cp{{}, dir.path()};
  one<M> saved{a};
  cp.save(1, saved);
  one<M> loaded{std::move(b)};
  cp.load(loaded);
  CHECK(std::equal(saved.w.data(), saved.w.data() + saved.w.size(), loaded.w.data()));
}

template <class M>
void round_trip_matrix(Eigen::Index rows, Eigen::Index cols) {
  M a(rows, cols), b(rows, cols);
  fill(a, 1);
  fill(b, 2);
  round_trip(a, b);
}

std::string metadata_text(const test::temp_dir& dir, const std::string& tag) {
  std::ifstream f(dir.path() / tag / "metadata.json", std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

/// Rewrites the document inside metadata.json's envelope with `edit`, checksum recomputed.
template <class F>
void edit_metadata(const test::temp_dir& dir, const std::string& tag, F&& edit) {
  namespace d = ckpt::detail;
  auto text = metadata_text(dir, tag);
  const auto begin = d::envelope_head.size() + 16 + d::envelope_mid.size();
  auto doc = text.substr(begin, text.size() - begin - d::envelope_tail.size());
  edit(doc);
  std::ofstream(dir.path() / tag / "metadata.json", std::ios::binary | std::ios::trunc)
      << d::envelope_head << d::to_hex(d::xxh3(doc)) << d::envelope_mid << doc << d::envelope_tail;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (auto at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

/// A column-major and a row-major matrix.
struct col_and_row {
  Eigen::MatrixXf col = Eigen::MatrixXf::Ones(2, 3);
  Eigen::Matrix<float, 2, 3, Eigen::RowMajor> row = Eigen::Matrix<float, 2, 3, Eigen::RowMajor>::Ones();
  template <class V>
  void checkpoint(V& v) {
    v.tensor("col", col);
    v.tensor("row", row);
  }
};

/// Rank `rank`'s two columns of a column-major 3x4 "w": memory-order rows [2 rank, 2 rank + 2) of [4, 3].
struct column_half {
  Eigen::MatrixXf* m;
  int rank;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::tensor_traits<Eigen::MatrixXf>::ref(*m).sharded(
                      {.global_shape = {4, 3}, .offset = {static_cast<std::uint64_t>(2 * rank), 0}}));
  }
};

/// The same slice as column_half's, declared row-major: a load must refuse it.
struct row_half {
  std::vector<float>* m;
  int rank;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::view(m->data(), {2, 3}).sharded({.global_shape = {4, 3}, .offset = {static_cast<std::uint64_t>(2 * rank), 0}}));
  }
};

}  // namespace

TEST_CASE("Matrix and Array: memory-order shapes and layouts") {
  Eigen::MatrixXf col(2, 3);
  Eigen::Matrix<double, 2, 3, Eigen::RowMajor> row;
  auto c = ref_of(col), r = ref_of(row);
  CHECK(c.shape() == ckpt::shape_t{3, 2});
  CHECK(c.order() == layout::column_major);
  CHECK(c.type() == ckpt::dtype::f32);
  CHECK(r.shape() == ckpt::shape_t{2, 3});
  CHECK(r.order() == layout::row_major);
  CHECK(r.type() == ckpt::dtype::f64);
  // Vectors: 1-D, row-major, whatever their orientation.
  Eigen::VectorXd v(5);
  Eigen::RowVectorXf rv(4);
  Eigen::Array<std::int16_t, 1, 6> ra;
  for (const auto& t : {ref_of(v), ref_of(rv), ref_of(ra)}) {
    CHECK(t.shape().size() == 1);
    CHECK(t.order() == layout::row_major);
  }
  CHECK(ref_of(v).shape() == ckpt::shape_t{5});
  CHECK(ref_of(ra).type() == ckpt::dtype::i16);
  // A runtime 1 x n matrix is still a matrix: its type says so, and a load checks it as one.
  Eigen::MatrixXf thin(1, 4);
  CHECK(ref_of(thin).shape() == ckpt::shape_t{4, 1});
  // Scalars map to their dtypes, the 16-bit floats too.
  CHECK(ref_of(Eigen::Matrix<Eigen::half, 2, 2>()).type() == ckpt::dtype::f16);
  CHECK(ref_of(Eigen::Matrix<Eigen::bfloat16, 2, 2>()).type() == ckpt::dtype::bf16);
  CHECK(ref_of(Eigen::Matrix<std::uint64_t, 2, 2>()).type() == ckpt::dtype::u64);
  CHECK(ref_of(Eigen::Array<bool, 3, 1>()).type() == ckpt::dtype::boolean);
  // A const object saves but is read-only.
  const Eigen::Matrix3f k = Eigen::Matrix3f::Identity();
  CHECK_FALSE(ref_of(k).writable());
  CHECK(ref_of(col).writable());
}

TEST_CASE("Matrix and Array round-trip in both orders, fixed and dynamic, every scalar") {
  round_trip_matrix<Eigen::MatrixXf>(5, 3);
  round_trip_matrix<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(5, 3);
  round_trip_matrix<Eigen::MatrixXd>(4, 4);
  round_trip_matrix<Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(2, 7);
  round_trip_matrix<Eigen::Matrix<std::int64_t, Eigen::Dynamic, Eigen::Dynamic>>(3, 2);
  round_trip_matrix<Eigen::Matrix<std::uint8_t, Eigen::Dynamic, Eigen::Dynamic>>(6, 5);
  round_trip_matrix<Eigen::Matrix<Eigen::half, Eigen::Dynamic, Eigen::Dynamic>>(3, 4);
  round_trip_matrix<Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(3, 4);
  round_trip_matrix<Eigen::ArrayXXd>(3, 8);
  round_trip_matrix<Eigen::Array<std::int16_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(3, 8);
  round_trip_matrix<Eigen::MatrixXf>(0, 3);  // empty
  {
    Eigen::Matrix<double, 3, 4> a, b;  // fixed, column-major
    fill(a, 3);
    fill(b, 4);
    round_trip(a, b);
  }
  {
    Eigen::Array<std::int8_t, 2, 5, Eigen::RowMajor> a, b;  // fixed, row-major
    fill(a, 3);
    fill(b, 4);
    round_trip(a, b);
  }
  {
    Eigen::VectorXf a(9), b(9);
    fill(a, 5);
    fill(b, 6);
    round_trip(a, b);
  }
  {
    Eigen::RowVector4d a, b;
    fill(a, 5);
    fill(b, 6);
    round_trip(a, b);
  }
}

TEST_CASE("a load into the other storage order is refused, naming the tensor and both layouts") {
  test::temp_dir dir;
  cp_t cp{{}, dir.path()};
  SUBCASE("a square matrix, whose shapes agree in either order") {
    one<Eigen::Matrix3f> saved{Eigen::Matrix3f::Identity()};
    saved.w(0, 1) = 5;
    cp.save(1, saved);
    one<Eigen::Matrix<float, 3, 3, Eigen::RowMajor>> loaded{};
    loaded.w.setZero();
    const auto e = test::catch_error([&] { cp.load(loaded); });
    CHECK(e.kind() == ckpt::error_kind::mismatch);
    const std::string m = e.what();
    CHECK(test::mentions(m, "tensor 'w': saved f32 column-major [3, 3], live f32 row-major [3, 3]"));
    CHECK(test::mentions(m, "metadata.json"));
    CHECK(loaded.w.isZero());  // nothing was read
  }
  SUBCASE("a rectangular matrix: the shapes named are the logical ones") {
    one<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> saved{Eigen::MatrixXd::Zero(2, 3)};
    cp.save(1, saved);
    one<Eigen::MatrixXd> loaded{Eigen::MatrixXd::Zero(2, 3)};
    const auto e = test::catch_error([&] { cp.load(loaded); });
    CHECK(e.kind() == ckpt::error_kind::mismatch);
    CHECK(test::mentions(e.what(), "tensor 'w': saved f64 row-major [2, 3], live f64 column-major [2, 3]"));
  }
  SUBCASE("a column-major matrix into a row-major one of the transposed shape") {
    one<Eigen::MatrixXf> saved{Eigen::MatrixXf::Zero(2, 3)};
    cp.save(1, saved);
    one<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> loaded{Eigen::MatrixXf::Zero(3, 2)};
    const auto e = test::catch_error([&] { cp.load(loaded); });
    CHECK(test::mentions(e.what(), "saved f32 column-major [2, 3], live f32 row-major [3, 2]"));
  }
}

TEST_CASE("shape and dtype mismatches name the tensor, with logical shapes") {
  test::temp_dir dir;
  cp_t cp{{}, dir.path()};
  one<Eigen::MatrixXf> saved{Eigen::MatrixXf::Zero(2, 3)};
  cp.save(1, saved);
  {
    one<Eigen::MatrixXf> loaded{Eigen::MatrixXf::Zero(3, 2)};
    const auto e = test::catch_error([&] { cp.load(loaded); });
    CHECK(e.kind() == ckpt::error_kind::mismatch);
    CHECK(test::mentions(e.what(), "tensor 'w': saved f32 column-major [2, 3], live f32 column-major [3, 2]"));
  }
  {
    one<Eigen::MatrixXd> loaded{Eigen::MatrixXd::Zero(2, 3)};
    const auto e = test::catch_error([&] { cp.load(loaded); });
    CHECK(e.kind() == ckpt::error_kind::mismatch);
    CHECK(test::mentions(e.what(), "tensor 'w': saved f32 column-major [2, 3], live f64 column-major [2, 3]"));
  }
  {
    // Row-major tensors keep the message they always had.
    one<Eigen::Matrix<float, 2, 3, Eigen::RowMajor>> rm{};
    cp.save(2, rm);
    one<Eigen::Matrix<float, 3, 2, Eigen::RowMajor>> loaded{};
    const auto e = test::catch_error([&] { cp.load(loaded); });
    CHECK(test::mentions(e.what(), "tensor 'w': saved f32 [2, 3], live f32 [3, 2]"));
  }
}

TEST_CASE("Map: contiguous maps round-trip, const maps save and refuse a load, gaps are refused by name") {
  test::temp_dir dir;
  cp_t cp{{}, dir.path()};
  std::vector<float> src(12), dst(12, -1.0f);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  {
    one<Eigen::Map<Eigen::MatrixXf>> saved{Eigen::Map<Eigen::MatrixXf>(src.data(), 3, 4)};
    cp.save(1, saved);
    one<Eigen::Map<Eigen::MatrixXf>> loaded{Eigen::Map<Eigen::MatrixXf>(dst.data(), 3, 4)};
    cp.load(loaded);
    CHECK(dst == src);
    // A Map and the matrix it maps are the same tensor.
    one<Eigen::MatrixXf> m{Eigen::MatrixXf::Zero(3, 4)};
    cp.load(m);
    CHECK(m.w(2, 3) == 11.0f);
    CHECK(m.w(1, 0) == 1.0f);
  }
  {
    // Row-major fixed-size Map, and one with a Dynamic outer stride that happens to be contiguous.
    using rm = Eigen::Matrix<float, 3, 4, Eigen::RowMajor>;
    one<Eigen::Map<rm>> saved{Eigen::Map<rm>(src.data())};
    CHECK(ref_of(saved.w).shape() == ckpt::shape_t{3, 4});
    cp.save(2, saved);
    std::fill(dst.begin(), dst.end(), -1.0f);
    using strided = Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;
    one<strided> loaded{strided(dst.data(), 3, 4, Eigen::OuterStride<>(4))};
    cp.load(loaded);
    CHECK(dst == src);
  }
  {
    // Const maps: of a const type, and a const Map object.
    one<Eigen::Map<const Eigen::MatrixXf>> c{Eigen::Map<const Eigen::MatrixXf>(src.data(), 3, 4)};
    CHECK_FALSE(ref_of(c.w).writable());
    cp.save(3, c);
    const auto e = test::catch_error([&] { cp.load(c); });
    CHECK(e.kind() == ckpt::error_kind::invalid_argument);
    CHECK(test::mentions(e.what(), "tensor 'w' is read-only"));
    const Eigen::Map<Eigen::MatrixXf> cm(src.data(), 3, 4);
    CHECK_FALSE(ref_of(cm).writable());
    CHECK(ref_of(cm).order() == layout::column_major);
  }
  {
    // Strides known only at run time that leave gaps: v.tensor refuses, naming the tensor.
    using strided = Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>>;
    strided gappy(src.data(), 2, 4, Eigen::OuterStride<>(3));
    ckpt::visitor v;
    const auto e = test::catch_error([&] { v.tensor("layer.w", gappy); });
    CHECK(e.kind() == ckpt::error_kind::invalid_argument);
    CHECK(test::mentions(e.what(), "tensor 'layer.w': an Eigen::Map with inner stride 1 and outer stride 3"));
    using inner = Eigen::Map<Eigen::VectorXf, 0, Eigen::InnerStride<>>;
    inner every_other(src.data(), 6, Eigen::InnerStride<>(2));
    CHECK_THROWS_AS(v.tensor("v", every_other), ckpt::error);
    inner unit(src.data(), 6, Eigen::InnerStride<>(1));
    CHECK(ref_of(unit).shape() == ckpt::shape_t{6});
  }
}

TEST_CASE("Tensor, TensorFixedSize and TensorMap round-trip in both layouts") {
  static_assert(CKPT_EIGEN_TENSOR, "Debian's libeigen3-dev ships the unsupported Tensor module");
  Eigen::Tensor<float, 3> col(2, 3, 4);
  Eigen::Tensor<float, 3, Eigen::RowMajor> row(2, 3, 4);
  CHECK(ref_of(col).shape() == ckpt::shape_t{4, 3, 2});
  CHECK(ref_of(col).order() == layout::column_major);
  CHECK(ref_of(row).shape() == ckpt::shape_t{2, 3, 4});
  CHECK(ref_of(row).order() == layout::row_major);
  Eigen::Tensor<double, 1> vec(7);
  CHECK(ref_of(vec).shape() == ckpt::shape_t{7});
  CHECK(ref_of(vec).order() == layout::row_major);
  Eigen::Tensor<std::int32_t, 0> scalar;
  CHECK(ref_of(scalar).shape().empty());

  test::temp_dir dir;
  cp_t cp{{}, dir.path()};
  col.setRandom();
  row.setRandom();
  {
    one<Eigen::Tensor<float, 3>> saved{col}, loaded{Eigen::Tensor<float, 3>(2, 3, 4)};
    loaded.w.setZero();
    cp.save(1, saved);
    cp.load(loaded);
    CHECK(std::equal(col.data(), col.data() + col.size(), loaded.w.data()));
    // A TensorMap over other memory, in the same layout.
    std::vector<float> buf(24, 0.0f);
    one<Eigen::TensorMap<Eigen::Tensor<float, 3>>> map{Eigen::TensorMap<Eigen::Tensor<float, 3>>(buf.data(), 2, 3, 4)};
    cp.load(map);
    CHECK(std::equal(col.data(), col.data() + col.size(), buf.data()));
    // ... and never into the other one.
    one<Eigen::Tensor<float, 3, Eigen::RowMajor>> other{Eigen::Tensor<float, 3, Eigen::RowMajor>(2, 3, 4)};
    const auto e = test::catch_error([&] { cp.load(other); });
    CHECK(test::mentions(e.what(), "tensor 'w': saved f32 column-major [2, 3, 4], live f32 row-major [2, 3, 4]"));
  }
  {
    one<Eigen::Tensor<float, 3, Eigen::RowMajor>> saved{row}, loaded{Eigen::Tensor<float, 3, Eigen::RowMajor>(2, 3, 4)};
    loaded.w.setZero();
    cp.save(2, saved);
    cp.load(loaded);
    CHECK(std::equal(row.data(), row.data() + row.size(), loaded.w.data()));
    // A const TensorMap saves and is read-only.
    const std::vector<float> buf(row.data(), row.data() + row.size());
    Eigen::TensorMap<const Eigen::Tensor<float, 3, Eigen::RowMajor>> cmap(buf.data(), 2, 3, 4);
    CHECK_FALSE(ref_of(cmap).writable());
    CHECK(ref_of(cmap).shape() == ckpt::shape_t{2, 3, 4});
  }
  {
    Eigen::TensorFixedSize<double, Eigen::Sizes<2, 3, 4>> a, b;
    a.setRandom();
    b.setZero();
    CHECK(ref_of(a).shape() == ckpt::shape_t{4, 3, 2});
    one<decltype(a)> saved{a}, loaded{b};
    cp.save(3, saved);
    cp.load(loaded);
    CHECK(std::equal(a.data(), a.data() + a.size(), loaded.w.data()));
  }
}

TEST_CASE("metadata.json records column-major tensors only, and refuses an unknown layout as corrupt") {
  test::temp_dir dir;
  cp_t cp{{}, dir.path()};
  col_and_row s;
  cp.save(1, s);
  const auto text = metadata_text(dir, "global_step1");
  CHECK(test::mentions(text, "\"layout\":\"column_major\""));
  CHECK(text.find("\"layout\"") == text.rfind("\"layout\""));  // once: the row-major tensor has none

  // The reader shows the layout, and reads only into a buffer laid out the same.
  {
    ckpt::reader r{ckpt::posix(dir.path())};
    REQUIRE(r.find("col"));
    CHECK(r.find("col")->order == layout::column_major);
    CHECK(r.find("col")->shape == ckpt::shape_t{3, 2});
    CHECK(r.find("row")->order == layout::row_major);
    std::vector<float> buf(6, 0.0f);
    const auto e = test::catch_error([&] { r.read("col", ckpt::view(buf, {3, 2})); });
    CHECK(e.kind() == ckpt::error_kind::mismatch);
    CHECK(test::mentions(e.what(), "tensor 'col' is f32 column-major [3, 2]"));
    CHECK(test::mentions(e.what(), "the buffer given is f32 row-major [3, 2]"));
    r.read("col", ckpt::view(buf, {3, 2}).laid_out(layout::column_major));
    CHECK(buf == std::vector<float>(6, 1.0f));
  }

  // An explicit "row_major" reads as row-major; and here, where the shard file's footer says
  // column-major, a reader refuses the disagreement as damage.
  edit_metadata(dir, "global_step1", [](std::string& doc) { replace_all(doc, "\"column_major\"", "\"row_major\""); });
  {
    const auto md = ckpt::detail::decode_metadata(metadata_text(dir, "global_step1"), "metadata.json");
    for (const auto& t : md.tensors) CHECK(t.order == layout::row_major);
    ckpt::reader r{ckpt::posix(dir.path())};  // opens (inspect still works); reading it is refused
    std::vector<float> buf(6, 0.0f);
    const auto e = test::catch_error([&] { r.read("col", ckpt::view(buf, {3, 2})); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(test::mentions(e.what(), "tensor 'col': the footer index says f32 column-major [3, 2], metadata.json f32 row-major [3, 2]"));
    const auto rep = r.verify();
    REQUIRE(rep.problems.size() == 1);
    CHECK(rep.problems[0] == e.what());
  }
  // Anything else is corrupt, naming the tensor.
  edit_metadata(dir, "global_step1", [](std::string& doc) { replace_all(doc, "\"row_major\"", "\"diagonal\""); });
  const auto e = test::catch_error([&] { ckpt::reader r{ckpt::posix(dir.path())}; });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(test::mentions(e.what(), "unknown layout 'diagonal' of tensor 'col'"));
  one<Eigen::MatrixXf> live{Eigen::MatrixXf::Zero(2, 3)};
  CHECK(test::catch_error([&] { cp.load(live, {.strict = false}); }).kind() == ckpt::error_kind::corrupt);
}

TEST_CASE("the layout travels in the shard index and gather messages; row-major bytes are unchanged") {
  namespace d = ckpt::detail;
  d::shard_index idx;
  for (auto l : {layout::row_major, layout::column_major}) {
    auto& g = idx.tensors.emplace_back();
    g.name = l == layout::row_major ? "r" : "c";
    g.type = ckpt::dtype::f32;
    g.global_shape = {2, 2};
    g.order = l;
    g.chunks.ndim = 2;
    g.chunks.push(0, ckpt::shape_t{0, 0}, ckpt::shape_t{2, 2}, 0, 4096, 16, 0x1);
  }
  const auto bytes = d::encode_index(idx);
  const auto back = d::decode_index(std::as_bytes(std::span(bytes.data(), bytes.size())), "f");
  REQUIRE(back.tensors.size() == 2);
  CHECK(back.tensors[0].order == layout::row_major);
  CHECK(back.tensors[1].order == layout::column_major);
  CHECK(back.tensors[1].type == ckpt::dtype::f32);
  // The dtype byte: the plain id (2, f32) for a row-major tensor, as before layouts; bit 7 set
  // for a column-major one.
  CHECK(d::dtype_byte(ckpt::dtype::f32, layout::row_major) == 2);
  CHECK(d::dtype_byte(ckpt::dtype::f32, layout::column_major) == 0x82);

  // gather_to_root's message.
  std::vector<float> data(6, 1.0f);
  std::vector<d::stored_tensor> ts{{"w", ckpt::view(data.data(), {3, 2}).laid_out(layout::column_major)}, {"v", ckpt::view(data.data(), {6})}};
  ckpt::host_copy dev;
  const auto packed = d::pack_for_root(ts, {}, dev);
  d::gathered g;
  d::unpack_at_root(d::as_bytes(packed), 1, g);
  REQUIRE(g.tensors.size() == 2);
  CHECK(g.tensors[0].ref.order() == layout::column_major);
  CHECK(g.tensors[0].ref.type() == ckpt::dtype::f32);
  CHECK(g.tensors[1].ref.order() == layout::row_major);

  // Ranks that disagree on a tensor's layout cannot commit.
  auto report = [](std::uint32_t r, layout l) {
    d::written_shard w;
    w.path = "mp_rank_0" + std::to_string(r) + "/model_optim_rng.ckpt";
    w.index.rank = r;
    auto& t = w.index.tensors.emplace_back();
    t.name = "w";
    t.global_shape = {4, 2};
    t.order = l;
    t.chunks.ndim = 2;
    t.chunks.push(0, ckpt::shape_t{2 * r, 0}, ckpt::shape_t{2, 2}, 0, 4096, 16, 0);
    w.size = 8192;
    const auto s = d::encode_report(w, {});
    const auto* b = reinterpret_cast<const std::byte*>(s.data());
    return std::vector<std::byte>(b, b + s.size());
  };
  const std::vector<std::vector<std::byte>> mixed = {report(0, layout::column_major), report(1, layout::row_major)};
  const auto e = test::catch_error([&] { (void)d::merge_reports("global_step1", 1, {2, 1, 1, 2}, {}, mixed, 1); });
  CHECK(e.kind() == ckpt::error_kind::invalid_argument);
  CHECK(test::mentions(e.what(), "is saved as f32 column-major [4, 2] by one rank and as f32 row-major [4, 2] by rank 1"));
  const std::vector<std::vector<std::byte>> same = {report(0, layout::column_major), report(1, layout::column_major)};
  CHECK(d::merge_reports("global_step1", 1, {2, 1, 1, 2}, {}, same, 1).tensors.at(0).order == layout::column_major);
}

TEST_CASE("a column-major state saved through gather_to_root keeps its layout, and a scattered load checks it") {
  // Two ranks, each holding half of a column-major matrix's memory-order rows (its columns).
  test::temp_dir dir;
  auto world = std::make_shared<ckpt::in_process_world>(2);
  std::vector<std::string> failures(2), refusals(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        ckpt::checkpointer<ckpt::gather_to_root<ckpt::in_process>, ckpt::posix> cp{{.comm = {world, r}}, dir.path()};
        Eigen::MatrixXf half = Eigen::MatrixXf::Constant(3, 2, static_cast<float>(r + 1));  // columns 2r, 2r+1 of a 3x4
        column_half s{&half, r};
        cp.save(1, s);
        // Rank 0 reads and scatters: each rank's half comes back, checked against its layout.
        Eigen::MatrixXf back = Eigen::MatrixXf::Zero(3, 2);
        column_half b{&back, r};
        cp.load(b);
        if (!back.isConstant(static_cast<float>(r + 1))) throw std::runtime_error("rank " + std::to_string(r) + " got other data");
        std::vector<float> rows(6);
        row_half wrong{&rows, r};
        try {
          cp.load(wrong);
          refusals[static_cast<std::size_t>(r)] = "loaded";
        } catch (const ckpt::error& e) {
          refusals[static_cast<std::size_t>(r)] = e.what();
        }
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  CHECK(failures[0] == "");
  CHECK(failures[1] == "");
  for (const auto& m : refusals) CHECK(test::mentions(m, "tensor 'w': saved f32 column-major [3, 4], live f32 row-major [4, 3]"));
  cp_t cp{{}, dir.path()};
  one<Eigen::MatrixXf> whole{Eigen::MatrixXf::Zero(3, 4)};
  cp.load(whole);
  CHECK(whole.w(2, 1) == 1.0f);
  CHECK(whole.w(0, 2) == 2.0f);
  CHECK(whole.w(1, 3) == 2.0f);
}
