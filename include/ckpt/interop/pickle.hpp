#pragma once
/// @file interop/pickle.hpp
/// `ckpt::interop::py_object`, the Python values a PyTorch checkpoint holds, and the two ends
/// of Python's pickle format for them: a restricted unpickler (what `torch.load(weights_only=
/// True)` accepts, and nothing that could run code) and a protocol-2 pickler that writes
/// tensors the way `torch.save` does.
///
/// The unpickler never calls anything: the few globals it accepts (OrderedDict, the torch
/// tensor rebuild functions, torch storage types) are interpreted by ckpt itself, everything
/// else is refused by name. Every length is checked against the remaining input before
/// anything is allocated, memo indices live in a map, objects are counted and nesting depth is
/// limited, so hostile input costs at most a bounded amount of memory and time.

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "../dtype.hpp"
#include "../error.hpp"
#include "../names.hpp"
#include "../tensor.hpp"
#include "host_tensor.hpp"

namespace ckpt::interop {

/// Where a tensor's elements sit inside a `.pt` archive: the storage record and the strided
/// view of it, as `torch._utils._rebuild_tensor_v2` describes them. Counts are in elements.
///
/// @code
/// // a 3x2 transposed view of a 2x3 storage "0"
/// ckpt::interop::torch_storage s{.key = "0", .numel = 6, .offset = 0, .stride = {1, 3}};
/// @endcode
struct torch_storage {
  std::string key;                    ///< the record `<archive>/data/<key>`; empty: not written yet
  std::uint64_t numel = 0;            ///< elements in the whole storage
  std::string location = "cpu";       ///< where torch had it ("cpu", "cuda:0")
  std::uint64_t offset = 0;           ///< first element of the view
  std::vector<std::uint64_t> stride;  ///< one per dimension
  friend bool operator==(const torch_storage&, const torch_storage&) = default;
};

/// A tensor inside a Python value tree. `value` always has the dtype and shape; its bytes are
/// the contiguous, row-major elements once `load_torch` has read them (or the elements to
/// write, for a tensor built in C++). `storage` says where the elements live in the archive.
///
/// @code
/// const ckpt::interop::py_tensor& w = sd.at("weight").as_tensor();
/// std::span<const float> v(reinterpret_cast<const float*>(w.value.data.data()), w.value.numel());
/// @endcode
struct py_tensor {
  host_tensor value;
  torch_storage storage;
  bool requires_grad = false;
  friend bool operator==(const py_tensor& a, const py_tensor& b) {
    return a.value.type == b.value.type && a.value.shape == b.value.shape && a.value.data == b.value.data &&
           a.requires_grad == b.requires_grad;
  }
};

/// What a `py_object` holds.
///
/// @code
/// if (v.kind() == ckpt::interop::py_kind::tensor) use(v.as_tensor());
/// @endcode
enum class py_kind : std::uint8_t { none, boolean, integer, floating, string, bytes, list, tuple, dict, tensor };

/// Name of a kind as Python spells the type ("NoneType", "int", "dict", "Tensor", ...).
///
/// @code
/// std::cout << ckpt::interop::to_string(v.kind());  // "dict"
/// @endcode
constexpr std::string_view to_string(py_kind k) noexcept {
  switch (k) {
    case py_kind::none: return "NoneType";
    case py_kind::boolean: return "bool";
    case py_kind::integer: return "int";
    case py_kind::floating: return "float";
    case py_kind::string: return "str";
    case py_kind::bytes: return "bytes";
    case py_kind::list: return "list";
    case py_kind::tuple: return "tuple";
    case py_kind::dict: return "dict";
    case py_kind::tensor: return "Tensor";
  }
  return "unknown";
}

namespace detail {
/// Value semantics for a heap-held T, so a rarely used large alternative (a tensor) does not
/// make every small Python value as large as itself.
template <class T>
class boxed {
 public:
  explicit boxed(T v) : p_(std::make_unique<T>(std::move(v))) {}
  boxed(const boxed& o) : p_(std::make_unique<T>(*o.p_)) {}
  boxed(boxed&&) noexcept = default;
  boxed& operator=(const boxed& o) {
    if (this != &o) p_ = std::make_unique<T>(*o.p_);
    return *this;
  }
  boxed& operator=(boxed&&) noexcept = default;
  T& get() noexcept { return *p_; }
  const T& get() const noexcept { return *p_; }
  friend bool operator==(const boxed& a, const boxed& b) { return a.get() == b.get(); }

 private:
  std::unique_ptr<T> p_;
};
class unpickler;
}  // namespace detail

/// A Python value of the kinds a checkpoint holds: None, bool, int (64-bit), float, str,
/// bytes, list, tuple, dict (insertion-ordered, any hashable keys) and torch tensors.
///
/// Scalars and strings convert implicitly, containers are built with the static factories,
/// and values are read back with `is_*`, `as_*`, `at` and `find`. Accessors throw a
/// `ckpt::error` naming the expected and the actual kind.
///
/// @code
/// using ckpt::interop::py_object;
/// py_object ckpt = py_object::dict({
///     {"iteration", 100},
///     {"args", py_object::dict({{"lr", 3e-4}, {"precision", "bf16"}, {"fp16", false}})},
///     {"model", py_object::ordered_dict({{"w", w}})},  // w: a py_object holding a tensor
///     {"shapes", py_object::list({py_object::tuple({2, 3}), py_object()})},
/// });
/// std::int64_t it = ckpt.at("iteration").as_int();
/// if (const py_object* a = ckpt.find("args")) std::string p = a->at("precision").as_str();
/// @endcode
class py_object {
 public:
  using list_type = std::vector<py_object>;
  using dict_type = std::vector<std::pair<py_object, py_object>>;

  /// None.
  py_object() noexcept = default;
  py_object(std::nullptr_t) noexcept {}  // NOLINT: implicit on purpose, None
  py_object(bool b) : kind_(py_kind::boolean), v_(b) {}  // NOLINT
  template <std::integral T>
    requires(!std::same_as<T, bool> && !std::same_as<T, char>)
  py_object(T v) : kind_(py_kind::integer) {  // NOLINT
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(std::int64_t)) {
      if (v > static_cast<T>(std::numeric_limits<std::int64_t>::max()))
        throw error(error_kind::invalid_argument, "integer " + std::to_string(v) + " does not fit a 64-bit Python int");
    }
    v_ = static_cast<std::int64_t>(v);
  }
  template <std::floating_point T>
  py_object(T v) : kind_(py_kind::floating), v_(static_cast<double>(v)) {}  // NOLINT
  py_object(const char* s) : kind_(py_kind::string), v_(std::string(s)) {}   // NOLINT
  py_object(std::string s) : kind_(py_kind::string), v_(std::move(s)) {}     // NOLINT
  py_object(std::string_view s) : kind_(py_kind::string), v_(std::string(s)) {}  // NOLINT
  /// A tensor with the given elements (written as a new storage by `torch_writer::finish`).
  py_object(host_tensor t) : py_object(py_tensor{std::move(t), {}, false}) {}  // NOLINT
  py_object(py_tensor t) : kind_(py_kind::tensor), v_(detail::boxed<py_tensor>(std::move(t))) {}  // NOLINT

  /// A list.
  static py_object list(std::initializer_list<py_object> items = {}) { return list(list_type(items)); }
  static py_object list(list_type items) { return sequence(py_kind::list, std::move(items)); }
  /// A tuple.
  static py_object tuple(std::initializer_list<py_object> items = {}) { return tuple(list_type(items)); }
  static py_object tuple(list_type items) { return sequence(py_kind::tuple, std::move(items)); }
  /// A dict; a repeated key keeps its first position and takes the last value, as in Python.
  static py_object dict(std::initializer_list<std::pair<py_object, py_object>> items = {}) {
    return make_dict(items, false);
  }
  /// A `collections.OrderedDict` (what `nn.Module.state_dict()` returns); pickled as one.
  static py_object ordered_dict(std::initializer_list<std::pair<py_object, py_object>> items = {}) {
    return make_dict(items, true);
  }
  /// A bytes object.
  static py_object bytes(std::span<const std::byte> b) {
    py_object o;
    o.kind_ = py_kind::bytes;
    o.v_ = std::string(reinterpret_cast<const char*>(b.data()), b.size());
    return o;
  }
  static py_object bytes(std::string_view b) { return bytes(std::as_bytes(std::span(b.data(), b.size()))); }

  py_kind kind() const noexcept { return kind_; }
  bool is_none() const noexcept { return kind_ == py_kind::none; }
  bool is_bool() const noexcept { return kind_ == py_kind::boolean; }
  bool is_int() const noexcept { return kind_ == py_kind::integer; }
  bool is_float() const noexcept { return kind_ == py_kind::floating; }
  bool is_str() const noexcept { return kind_ == py_kind::string; }
  bool is_bytes() const noexcept { return kind_ == py_kind::bytes; }
  bool is_list() const noexcept { return kind_ == py_kind::list; }
  bool is_tuple() const noexcept { return kind_ == py_kind::tuple; }
  bool is_dict() const noexcept { return kind_ == py_kind::dict; }
  bool is_tensor() const noexcept { return kind_ == py_kind::tensor; }
  /// True for a dict that came from (or is pickled as) `collections.OrderedDict`.
  bool is_ordered_dict() const noexcept { return kind_ == py_kind::dict && ordered_; }

  bool as_bool() const { return std::get<bool>(expect(py_kind::boolean).v_); }
  std::int64_t as_int() const { return std::get<std::int64_t>(expect(py_kind::integer).v_); }
  /// The float, or an int converted to double (Python code often writes `lr = 0`).
  double as_float() const {
    if (kind_ == py_kind::integer) return static_cast<double>(std::get<std::int64_t>(v_));
    return std::get<double>(expect(py_kind::floating).v_);
  }
  const std::string& as_str() const { return std::get<std::string>(expect(py_kind::string).v_); }
  std::span<const std::byte> as_bytes() const {
    const auto& s = std::get<std::string>(expect(py_kind::bytes).v_);
    return std::as_bytes(std::span(s.data(), s.size()));
  }
  const py_tensor& as_tensor() const { return std::get<detail::boxed<py_tensor>>(expect(py_kind::tensor).v_).get(); }
  py_tensor& as_tensor() {
    expect(py_kind::tensor);
    return std::get<detail::boxed<py_tensor>>(v_).get();
  }
  /// The items of a list or tuple.
  const list_type& items() const {
    if (kind_ != py_kind::list && kind_ != py_kind::tuple) wrong("list or tuple");
    return std::get<list_type>(v_);
  }
  list_type& items() {
    if (kind_ != py_kind::list && kind_ != py_kind::tuple) wrong("list or tuple");
    return std::get<list_type>(v_);
  }
  /// The (key, value) pairs of a dict, in insertion order.
  const dict_type& entries() const { return std::get<dict_type>(expect(py_kind::dict).v_); }
  /// Mutable pairs, to change values in place; keys must stay distinct (use `set` to add).
  dict_type& entries() {
    expect(py_kind::dict);
    return std::get<dict_type>(v_);
  }

  /// Elements of a list, tuple, dict, str or bytes.
  std::size_t size() const {
    switch (kind_) {
      case py_kind::list: case py_kind::tuple: return std::get<list_type>(v_).size();
      case py_kind::dict: return std::get<dict_type>(v_).size();
      case py_kind::string: case py_kind::bytes: return std::get<std::string>(v_).size();
      default: wrong("list, tuple, dict, str or bytes");
    }
  }

  /// The value of `key` in a dict, or nullptr. Keys compare as in Python (1 == 1.0 == True).
  /// A linear scan: to visit every entry of a large dict, iterate `entries()` instead.
  const py_object* find(const py_object& key) const {
    for (const auto& [k, v] : entries())
      if (key_equal(k, key)) return &v;
    return nullptr;
  }
  py_object* find(const py_object& key) { return const_cast<py_object*>(std::as_const(*this).find(key)); }
  bool contains(const py_object& key) const { return find(key) != nullptr; }
  /// `d[key]` of a dict; `not_found` naming the key when absent.
  const py_object& at(const py_object& key) const {
    if (const auto* v = find(key)) return *v;
    throw error(error_kind::not_found, "dict has no key " + key.repr());
  }
  py_object& at(const py_object& key) { return const_cast<py_object&>(std::as_const(*this).at(key)); }
  /// `x[i]` of a list or tuple (negative `i` counts from the end), or `d[i]` (the int key
  /// `i`) of a dict. A template so that only integers pick it, never `at(2.5)`.
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  const py_object& at(I i) const {
    if (kind_ == py_kind::dict) return at(py_object(i));
    const auto& v = items();
    const auto n = static_cast<std::int64_t>(v.size());
    std::int64_t k = 0;
    if constexpr (std::is_signed_v<I>) k = i < 0 ? n + static_cast<std::int64_t>(i) : static_cast<std::int64_t>(i);
    else k = i > static_cast<std::uint64_t>(n) ? n : static_cast<std::int64_t>(i);
    if (k < 0 || k >= n)
      throw error(error_kind::not_found, "index " + std::to_string(i) + " out of range of a " + std::string(to_string(kind_)) +
                                             " of " + std::to_string(v.size()));
    return v[static_cast<std::size_t>(k)];
  }
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  py_object& at(I i) {
    return const_cast<py_object&>(std::as_const(*this).at(i));
  }

  /// Sets `d[key] = value` in a dict (replacing an equal key's value in place).
  void set(py_object key, py_object value) {
    expect(py_kind::dict);
    if (auto* v = find(key)) {
      *v = std::move(value);
      return;
    }
    std::get<dict_type>(v_).emplace_back(std::move(key), std::move(value));
  }
  /// Appends to a list.
  void append(py_object value) {
    expect(py_kind::list);
    std::get<list_type>(v_).push_back(std::move(value));
  }

  /// A Python-like rendering for messages and debugging (tensors as `tensor(f32, [2, 3])`).
  std::string repr() const {
    std::string out;
    repr_into(out, 0);
    return out;
  }

  /// Deep equality; dicts compare in order, tensors by dtype, shape and elements.
  friend bool operator==(const py_object& a, const py_object& b) {
    if (a.kind_ != b.kind_) return false;
    if (a.kind_ == py_kind::floating) {
      const double x = std::get<double>(a.v_), y = std::get<double>(b.v_);
      return x == y || (std::isnan(x) && std::isnan(y));
    }
    return a.v_ == b.v_;
  }

  /// Python's `==` for hashable keys: numbers compare by value across bool, int and float.
  static bool key_equal(const py_object& a, const py_object& b) {
    auto numeric = [](const py_object& o) {
      return o.kind_ == py_kind::boolean || o.kind_ == py_kind::integer || o.kind_ == py_kind::floating;
    };
    if (numeric(a) && numeric(b)) {
      if (a.kind_ == py_kind::floating && b.kind_ == py_kind::floating) return std::get<double>(a.v_) == std::get<double>(b.v_);
      if (a.kind_ != py_kind::floating && b.kind_ != py_kind::floating) return a.whole() == b.whole();
      // int against float, exactly (converting the int to double could round it)
      const double f = std::get<double>((a.kind_ == py_kind::floating ? a : b).v_);
      const std::int64_t i = (a.kind_ == py_kind::floating ? b : a).whole();
      return std::trunc(f) == f && f >= -9223372036854775808.0 && f < 9223372036854775808.0 &&
             static_cast<std::int64_t>(f) == i;
    }
    if (a.kind_ != b.kind_) return false;
    if (a.kind_ == py_kind::tuple) {
      const auto &x = std::get<list_type>(a.v_), &y = std::get<list_type>(b.v_);
      if (x.size() != y.size()) return false;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!key_equal(x[i], y[i])) return false;
      return true;
    }
    return a == b;
  }

 private:
  friend class detail::unpickler;  // fills dicts whose keys it has already deduplicated

  static py_object sequence(py_kind k, list_type items) {
    py_object o;
    o.kind_ = k;
    o.v_ = std::move(items);
    return o;
  }
  static py_object make_dict(std::initializer_list<std::pair<py_object, py_object>> items, bool ordered) {
    py_object o;
    o.kind_ = py_kind::dict;
    o.ordered_ = ordered;
    o.v_ = dict_type{};
    for (const auto& [k, v] : items) o.set(k, v);
    return o;
  }
  std::int64_t whole() const {
    return kind_ == py_kind::boolean ? (std::get<bool>(v_) ? 1 : 0) : std::get<std::int64_t>(v_);
  }
  const py_object& expect(py_kind k) const {
    if (kind_ != k) wrong(std::string(to_string(k)));
    return *this;
  }
  [[noreturn]] void wrong(const std::string& wanted) const {
    throw error(error_kind::mismatch, "expected " + wanted + ", got " + std::string(to_string(kind_)));
  }
  void repr_into(std::string& out, int depth) const {
    if (depth > 200) {
      out += "...";
      return;
    }
    switch (kind_) {
      case py_kind::none: out += "None"; break;
      case py_kind::boolean: out += std::get<bool>(v_) ? "True" : "False"; break;
      case py_kind::integer: out += std::to_string(std::get<std::int64_t>(v_)); break;
      case py_kind::floating: {
        char buf[64];
        const auto r = std::to_chars(buf, buf + sizeof buf, std::get<double>(v_));
        std::string s(buf, r.ptr);
        if (s.find_first_of(".ein") == std::string::npos) s += ".0";
        out += s;
        break;
      }
      case py_kind::string: out += ckpt::detail::printable(std::get<std::string>(v_)); break;
      case py_kind::bytes: out += "b" + ckpt::detail::printable(std::get<std::string>(v_)); break;
      case py_kind::list: case py_kind::tuple: {
        const auto& v = std::get<list_type>(v_);
        out += kind_ == py_kind::list ? "[" : "(";
        for (std::size_t i = 0; i < v.size(); ++i) {
          if (i) out += ", ";
          v[i].repr_into(out, depth + 1);
        }
        if (kind_ == py_kind::tuple && v.size() == 1) out += ",";
        out += kind_ == py_kind::list ? "]" : ")";
        break;
      }
      case py_kind::dict: {
        out += "{";
        bool first = true;
        for (const auto& [k, v] : std::get<dict_type>(v_)) {
          if (!first) out += ", ";
          first = false;
          k.repr_into(out, depth + 1);
          out += ": ";
          v.repr_into(out, depth + 1);
        }
        out += "}";
        break;
      }
      case py_kind::tensor: {
        const auto& t = std::get<detail::boxed<py_tensor>>(v_).get();
        out += "tensor(" + std::string(ckpt::to_string(t.value.type)) + ", " + ckpt::detail::to_string(t.value.shape) + ")";
        break;
      }
    }
  }

  py_kind kind_ = py_kind::none;
  bool ordered_ = false;
  std::variant<std::monostate, bool, std::int64_t, double, std::string, list_type, dict_type, detail::boxed<py_tensor>> v_;
};

namespace detail {
/// One past the highest storage element a strided view touches (0 for an empty view), or an
/// empty optional when that overflows 64 bits.
inline std::optional<std::uint64_t> view_extent(std::span<const std::uint64_t> shape, std::span<const std::uint64_t> stride,
                                                std::uint64_t offset) {
  std::uint64_t last = offset;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return 0;
    const std::uint64_t steps = shape[i] - 1;
    if (stride[i] != 0 && steps > std::numeric_limits<std::uint64_t>::max() / stride[i]) return std::nullopt;
    const std::uint64_t span = steps * stride[i];
    if (span > std::numeric_limits<std::uint64_t>::max() - last) return std::nullopt;
    last += span;
  }
  if (last == std::numeric_limits<std::uint64_t>::max()) return std::nullopt;
  return last + 1;
}

/// Why the view of `t` does not fit its storage, or an empty string.
inline std::string view_problem(const py_tensor& t) {
  const auto& s = t.storage;
  if (s.stride.size() != t.value.shape.size())
    return "has " + std::to_string(t.value.shape.size()) + " dimensions but " + std::to_string(s.stride.size()) + " strides";
  std::uint64_t n = 1;
  for (auto d : t.value.shape) {
    if (d != 0 && n > std::numeric_limits<std::uint64_t>::max() / d)
      return "has shape " + ckpt::detail::to_string(t.value.shape) + " whose element count overflows 64 bits";
    n *= d;
  }
  if (n > std::numeric_limits<std::uint64_t>::max() / size_of(t.value.type))
    return "has shape " + ckpt::detail::to_string(t.value.shape) + " whose byte size overflows 64 bits";
  const auto extent = view_extent(t.value.shape, s.stride, s.offset);
  if (!extent || *extent > s.numel)
    return "with shape " + ckpt::detail::to_string(t.value.shape) + ", strides " + ckpt::detail::to_string(s.stride) +
           " and storage offset " + std::to_string(s.offset) + " reaches element " +
           (extent ? std::to_string(*extent - 1) : std::string("past 2^64")) + " but its storage " +
           ckpt::detail::printable(s.key) + " holds " + std::to_string(s.numel) + " elements";
  return {};
}

/// The torch storage class of each ckpt dtype, as pickles name it ("FloatStorage").
constexpr std::string_view torch_storage_name(dtype t) noexcept {
  switch (t) {
    case dtype::f64: return "DoubleStorage";
    case dtype::f32: return "FloatStorage";
    case dtype::f16: return "HalfStorage";
    case dtype::bf16: return "BFloat16Storage";
    case dtype::i64: return "LongStorage";
    case dtype::i32: return "IntStorage";
    case dtype::i16: return "ShortStorage";
    case dtype::i8: return "CharStorage";
    case dtype::u8: return "ByteStorage";
    case dtype::boolean: return "BoolStorage";
  }
  return "";
}
/// The dtype of a torch storage class name, or nothing for the ones ckpt lacks (complex, quantized).
inline std::optional<dtype> dtype_of_torch_storage(std::string_view name) noexcept {
  for (std::uint8_t id = 1; id <= 10; ++id)
    if (torch_storage_name(static_cast<dtype>(id)) == name) return static_cast<dtype>(id);
  return std::nullopt;
}

/// "['model']['w']" for messages; "<root>" for the top.
inline std::string path_or_root(const std::string& path) { return path.empty() ? "<root>" : path; }
/// The path step to a dict value or list item, as Python indexing.
inline std::string path_step(const py_object& key) {
  if (key.is_str()) return "[" + ckpt::detail::printable(key.as_str()) + "]";
  if (key.is_int()) return "[" + std::to_string(key.as_int()) + "]";
  std::string r = key.repr();
  if (r.size() > 60) r = r.substr(0, 60) + "...";
  return "[" + r + "]";
}
}  // namespace detail

/// Bounds on what an unpickler may build from one pickle.
///
/// @code
/// auto root = ckpt::interop::unpickle(bytes, "data.pkl", {.max_depth = 100, .max_objects = 1 << 16});
/// @endcode
struct unpickle_limits {
  std::size_t max_depth = 1000;             ///< nesting of containers in the result
  std::uint64_t max_objects = 1u << 22;     ///< values created while unpickling, and in the result
  /// Approximate bytes of the result. Shared references are copied into the tree, so a small
  /// pickle that references one long string a million times would otherwise be huge.
  std::uint64_t max_result_bytes = std::uint64_t{1} << 30;
  std::size_t max_rank = 64;                ///< dimensions of one tensor
};

namespace detail {

namespace op {
inline constexpr std::uint8_t MARK = '(', STOP = '.', BININT = 'J', BININT1 = 'K', BININT2 = 'M', NONE = 'N',
                              BINPERSID = 'Q', REDUCE = 'R', BINUNICODE = 'X', APPEND = 'a', BUILD = 'b', GLOBAL = 'c',
                              DICT = 'd', EMPTY_DICT = '}', APPENDS = 'e', BINGET = 'h', LONG_BINGET = 'j', LIST = 'l',
                              EMPTY_LIST = ']', BINPUT = 'q', LONG_BINPUT = 'r', SETITEM = 's', TUPLE = 't',
                              EMPTY_TUPLE = ')', SETITEMS = 'u', BINFLOAT = 'G', PROTO = 0x80, TUPLE1 = 0x85,
                              TUPLE2 = 0x86, TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, LONG4 = 0x8b,
                              SHORT_BINBYTES = 'C', BINBYTES = 'B', SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d,
                              BINBYTES8 = 0x8e, STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95;
}  // namespace op

/// Name of a pickle opcode, for messages (including those refused).
inline std::string opcode_name(std::uint8_t c) {
  switch (c) {
    case '(': return "MARK"; case '.': return "STOP"; case '0': return "POP"; case '1': return "POP_MARK";
    case '2': return "DUP"; case 'F': return "FLOAT"; case 'I': return "INT"; case 'J': return "BININT";
    case 'K': return "BININT1"; case 'L': return "LONG"; case 'M': return "BININT2"; case 'N': return "NONE";
    case 'P': return "PERSID"; case 'Q': return "BINPERSID"; case 'R': return "REDUCE"; case 'S': return "STRING";
    case 'T': return "BINSTRING"; case 'U': return "SHORT_BINSTRING"; case 'V': return "UNICODE";
    case 'X': return "BINUNICODE"; case 'a': return "APPEND"; case 'b': return "BUILD"; case 'c': return "GLOBAL";
    case 'd': return "DICT"; case '}': return "EMPTY_DICT"; case 'e': return "APPENDS"; case 'g': return "GET";
    case 'h': return "BINGET"; case 'i': return "INST"; case 'j': return "LONG_BINGET"; case 'l': return "LIST";
    case ']': return "EMPTY_LIST"; case 'o': return "OBJ"; case 'p': return "PUT"; case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT"; case 's': return "SETITEM"; case 't': return "TUPLE"; case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS"; case 'G': return "BINFLOAT"; case 'B': return "BINBYTES"; case 'C': return "SHORT_BINBYTES";
    case 0x80: return "PROTO"; case 0x81: return "NEWOBJ"; case 0x82: return "EXT1"; case 0x83: return "EXT2";
    case 0x84: return "EXT4"; case 0x85: return "TUPLE1"; case 0x86: return "TUPLE2"; case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE"; case 0x89: return "NEWFALSE"; case 0x8a: return "LONG1"; case 0x8b: return "LONG4";
    case 0x8c: return "SHORT_BINUNICODE"; case 0x8d: return "BINUNICODE8"; case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET"; case 0x90: return "ADDITEMS"; case 0x91: return "FROZENSET"; case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL"; case 0x94: return "MEMOIZE"; case 0x95: return "FRAME"; case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER"; case 0x98: return "READONLY_BUFFER";
    default: {
      static constexpr char hex[] = "0123456789abcdef";
      return std::string("0x") + hex[c >> 4] + hex[c & 15];
    }
  }
}

/// The restricted unpickler. Values live in an arena and refer to each other by index, so
/// shared and even cyclic references (which a hostile memo can make) cost nothing to hold and
/// free; the result is converted into a `py_object` tree at STOP, where depth, cycles and the
/// total object count are checked.
class unpickler {
 public:
  unpickler(std::span<const std::byte> in, std::string source, unpickle_limits limits)
      : in_(in), source_(std::move(source)), limits_(limits) {}

  py_object run() {
    while (true) {
      op_pos_ = pos_;
      const std::uint8_t c = u8();
      switch (c) {
        case op::PROTO: {
          const auto v = u8();
          if (v > 5) fail("unknown pickle protocol " + std::to_string(v));
          break;
        }
        case op::FRAME: le(8); break;  // framing only groups opcodes; nothing to check
        case op::STOP: {
          const auto result = pop(c);
          on_path_.assign(nodes_.size(), 0);
          std::string path;
          return convert(result, 0, path);
        }
        case op::MARK: marks_.push_back(stack_.size()); break;
        case op::NONE: push(make(pk::none)); break;
        case op::NEWTRUE: case op::NEWFALSE: {
          const auto n = make(pk::boolean);
          nodes_[n].flag = c == op::NEWTRUE;
          push(n);
          break;
        }
        case op::BININT1: push_int(static_cast<std::int64_t>(u8())); break;
        case op::BININT2: push_int(static_cast<std::int64_t>(le(2))); break;
        case op::BININT: push_int(static_cast<std::int32_t>(static_cast<std::uint32_t>(le(4)))); break;
        case op::LONG1: case op::LONG4: {
          const std::uint64_t n = c == op::LONG1 ? u8() : le(4);
          if (n > 8) fail("integer of " + std::to_string(n) + " bytes does not fit in 64 bits");
          const auto b = take(n);
          std::uint64_t v = 0;
          for (std::size_t i = n; i-- > 0;) v = (v << 8) | static_cast<std::uint8_t>(b[i]);
          if (n > 0 && n < 8 && (static_cast<std::uint8_t>(b[n - 1]) & 0x80)) v |= ~std::uint64_t{0} << (8 * n);
          push_int(static_cast<std::int64_t>(v));
          break;
        }
        case op::BINFLOAT: {
          const auto b = take(8);
          std::uint64_t bits = 0;
          for (std::size_t i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<std::uint8_t>(b[i]);  // big-endian
          const auto n = make(pk::floating);
          nodes_[n].f = std::bit_cast<double>(bits);
          push(n);
          break;
        }
        case op::SHORT_BINUNICODE: push_text(pk::string, u8()); break;
        case op::BINUNICODE: push_text(pk::string, le(4)); break;
        case op::BINUNICODE8: push_text(pk::string, le(8)); break;
        case op::SHORT_BINBYTES: push_text(pk::bytes, u8()); break;
        case op::BINBYTES: push_text(pk::bytes, le(4)); break;
        case op::BINBYTES8: push_text(pk::bytes, le(8)); break;
        case op::EMPTY_TUPLE: push(make(pk::tuple)); break;
        case op::TUPLE1: case op::TUPLE2: case op::TUPLE3: {
          const std::size_t k = c - op::TUPLE1 + 1;
          std::vector<std::uint32_t> items(k);
          for (std::size_t i = k; i-- > 0;) items[i] = pop(c);
          const auto n = make(pk::tuple);
          nodes_[n].items = std::move(items);
          push(n);
          break;
        }
        case op::TUPLE: {
          auto items = pop_mark(c);
          const auto n = make(pk::tuple);
          nodes_[n].items = std::move(items);
          push(n);
          break;
        }
        case op::EMPTY_LIST: push(make(pk::list)); break;
        case op::LIST: {
          auto items = pop_mark(c);
          const auto n = make(pk::list);
          nodes_[n].items = std::move(items);
          push(n);
          break;
        }
        case op::APPEND: {
          const auto v = pop(c);
          nodes_[container(c, pk::list)].items.push_back(v);
          break;
        }
        case op::APPENDS: {
          const auto items = pop_mark(c);
          auto& l = nodes_[container(c, pk::list)].items;
          l.insert(l.end(), items.begin(), items.end());
          break;
        }
        case op::EMPTY_DICT: push(make(pk::dict)); break;
        case op::DICT: {
          const auto items = pop_mark(c);
          const auto d = make(pk::dict);
          set_items(d, items);
          push(d);
          break;
        }
        case op::SETITEM: {
          const auto v = pop(c);
          const auto k = pop(c);
          const std::uint32_t kv[2] = {k, v};
          set_items(container(c, pk::dict), kv);
          break;
        }
        case op::SETITEMS: {
          const auto items = pop_mark(c);
          set_items(container(c, pk::dict), items);
          break;
        }
        case op::BINPUT: put_memo(c, u8()); break;
        case op::LONG_BINPUT: put_memo(c, le(4)); break;
        case op::MEMOIZE: put_memo(c, memo_.size()); break;
        case op::BINGET: case op::LONG_BINGET: {
          const std::uint64_t idx = c == op::BINGET ? u8() : le(4);
          if (idx >= memo_.size())
            fail("memo index " + std::to_string(idx) + " was never stored (" + opcode_name(c) + "; " +
                 std::to_string(memo_.size()) + " entries so far)");
          push(memo_[idx]);
          break;
        }
        case op::GLOBAL: {
          const auto module = line();
          const auto name = line();
          push(resolve(module, name));
          break;
        }
        case op::STACK_GLOBAL: {
          const auto name = pop(c), module = pop(c);
          if (nodes_[name].kind != pk::string || nodes_[module].kind != pk::string)
            fail("STACK_GLOBAL needs two strings");
          push(resolve(nodes_[module].s, nodes_[name].s));
          break;
        }
        case op::REDUCE: {
          const auto args = pop(c);
          const auto fn = top(c);
          if (nodes_[fn].kind != pk::callable)
            fail("REDUCE may only call an allowed global, not a " + describe(fn));
          if (nodes_[args].kind != pk::tuple) fail("REDUCE arguments must be a tuple, not a " + describe(args));
          stack_.back() = call(fn, nodes_[args].items);
          break;
        }
        case op::BUILD: {
          // The only BUILD torch.save emits sets attributes of an OrderedDict (a state_dict's
          // `_metadata`); the attributes are not part of the data, so they are dropped.
          const auto state = pop(c);
          const auto target = top(c);
          if (nodes_[target].kind != pk::dict || !nodes_[target].flag)
            fail("BUILD is only allowed on an OrderedDict, not on a " + describe(target));
          if (nodes_[state].kind != pk::dict && nodes_[state].kind != pk::none)
            fail("BUILD state of an OrderedDict must be a dict, not a " + describe(state));
          break;
        }
        case op::BINPERSID: push(persistent(pop(c))); break;
        default:
          fail("opcode " + opcode_name(c) + " is not allowed (only the opcodes of plain containers, numbers, strings and "
               "tensors are)");
      }
    }
  }

 private:
  enum class pk : std::uint8_t {
    none, boolean, integer, floating, string, bytes, list, tuple, dict, tensor, callable, storage_type, storage
  };
  enum class fn : std::uint8_t {
    ordered_dict, rebuild_tensor_v2, rebuild_tensor, rebuild_parameter, rebuild_parameter_with_state, codecs_encode,
    empty_bytes
  };
  struct pnode {
    pk kind = pk::none;
    bool flag = false;        // bool value; dict made by OrderedDict; tensor requires_grad
    std::int64_t i = 0;       // int; callable: fn; storage_type: dtype id (0: unsupported); tensor/storage: side index
    double f = 0;
    std::string s;            // str, bytes; callable and storage_type: the global's full name
    std::vector<std::uint32_t> items;  // list, tuple; dict: key, value, key, value, ...
  };
  struct pstorage {
    std::uint32_t type = 0;  // storage_type node
    std::string key, location;
    std::uint64_t numel = 0;
  };
  struct ptensor {
    std::uint32_t storage = 0;  // storage node
    std::uint64_t offset = 0;
    shape_t shape;
    std::vector<std::uint64_t> stride;
  };

  [[noreturn]] void fail(const std::string& what) const {
    throw error(error_kind::corrupt, source_ + ": pickle offset " + std::to_string(op_pos_) + ": " + what);
  }
  [[noreturn]] void fail_at(const std::string& path, const std::string& what) const {
    throw error(error_kind::corrupt, source_ + ": " + path_or_root(path) + ": " + what);
  }

  void need(std::uint64_t n) const {
    if (n > in_.size() - pos_)
      fail("needs " + std::to_string(n) + " bytes but only " + std::to_string(in_.size() - pos_) +
           " remain (truncated pickle or bad length)");
  }
  std::uint8_t u8() {
    if (pos_ >= in_.size()) fail("pickle ends without STOP (truncated)");
    return static_cast<std::uint8_t>(in_[pos_++]);
  }
  std::uint64_t le(std::size_t n) {
    need(n);
    std::uint64_t v = 0;
    for (std::size_t i = n; i-- > 0;) v = (v << 8) | static_cast<std::uint8_t>(in_[pos_ + i]);
    pos_ += n;
    return v;
  }
  std::span<const std::byte> take(std::uint64_t n) {
    need(n);
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  std::string line() {
    constexpr std::size_t max_line = 256;
    std::string s;
    while (true) {
      if (pos_ >= in_.size()) fail("GLOBAL name is not terminated (truncated)");
      const char ch = static_cast<char>(in_[pos_++]);
      if (ch == '\n') return s;
      if (s.size() == max_line) fail("GLOBAL name longer than " + std::to_string(max_line) + " bytes");
      s += ch;
    }
  }

  std::uint32_t make(pk k) {
    if (nodes_.size() >= limits_.max_objects)
      fail("more than " + std::to_string(limits_.max_objects) + " objects");
    nodes_.emplace_back();
    nodes_.back().kind = k;
    return static_cast<std::uint32_t>(nodes_.size() - 1);
  }
  void push(std::uint32_t n) { stack_.push_back(n); }
  void push_int(std::int64_t v) {
    const auto n = make(pk::integer);
    nodes_[n].i = v;
    push(n);
  }
  void push_text(pk k, std::uint64_t len) {
    const auto b = take(len);
    std::string s(reinterpret_cast<const char*>(b.data()), b.size());
    if (k == pk::string && !ckpt::detail::valid_utf8(s)) fail("string is not valid UTF-8");
    const auto n = make(k);
    nodes_[n].s = std::move(s);
    push(n);
  }
  /// Pickler memo indices count up from 0, so an index past the entries so far is refused
  /// rather than stored: the memo stays a dense vector no larger than the input.
  void put_memo(std::uint8_t c, std::uint64_t idx) {
    const auto v = top(c);
    if (idx > memo_.size())
      fail("memo index " + std::to_string(idx) + " skips past the " + std::to_string(memo_.size()) + " entries so far (" +
           opcode_name(c) + ")");
    if (idx == memo_.size()) memo_.push_back(v);
    else memo_[idx] = v;
  }
  bool at_mark() const { return stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back()); }
  std::uint32_t pop(std::uint8_t c) {
    if (at_mark()) fail(opcode_name(c) + " on an empty stack");
    const auto n = stack_.back();
    stack_.pop_back();
    return n;
  }
  std::uint32_t top(std::uint8_t c) const {
    if (at_mark()) fail(opcode_name(c) + " on an empty stack");
    return stack_.back();
  }
  std::vector<std::uint32_t> pop_mark(std::uint8_t c) {
    if (marks_.empty()) fail(opcode_name(c) + " without a MARK");
    const auto m = marks_.back();
    marks_.pop_back();
    std::vector<std::uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  /// The list or dict under the top of the stack that APPEND(S)/SETITEM(S) add to.
  std::uint32_t container(std::uint8_t c, pk want) const {
    const auto n = top(c);
    if (nodes_[n].kind != want)
      fail(opcode_name(c) + " needs a " + std::string(want == pk::list ? "list" : "dict") + ", not a " + describe(n));
    return n;
  }
  std::string describe(std::uint32_t n) const {
    const auto& x = nodes_[n];
    switch (x.kind) {
      case pk::callable: case pk::storage_type: return "global " + ckpt::detail::printable(x.s);
      case pk::storage: return "storage";
      case pk::none: return "None";
      case pk::boolean: return "bool";
      case pk::integer: return "int";
      case pk::floating: return "float";
      case pk::string: return "str";
      case pk::bytes: return "bytes";
      case pk::list: return "list";
      case pk::tuple: return "tuple";
      case pk::dict: return "dict";
      case pk::tensor: return "tensor";
    }
    return "value";
  }

  /// The equality class of a hashable key: equal keys (1, 1.0 and True; equal strings held by
  /// different nodes; tuples of equal items) share a class. Computed once per node and kept in
  /// ordered maps, so hostile keys cost time and memory in proportion to the input, never more.
  std::uint32_t key_class(std::uint32_t n, std::size_t depth) {
    if (n < key_class_.size() && key_class_[n] != 0) return key_class_[n];
    if (depth > limits_.max_depth) fail("dict key nested deeper than " + std::to_string(limits_.max_depth) + " levels");
    const auto of = [&](auto& classes, auto&& key) {
      const auto [it, fresh] = classes.try_emplace(std::forward<decltype(key)>(key), next_class_);
      if (fresh) ++next_class_;
      return it->second;
    };
    const pnode& x = nodes_[n];
    std::uint32_t c = 0;
    switch (x.kind) {
      case pk::none: c = of(int_classes_, std::pair<int, std::int64_t>{0, 0}); break;
      case pk::boolean: c = of(int_classes_, std::pair<int, std::int64_t>{1, x.flag ? 1 : 0}); break;
      case pk::integer: c = of(int_classes_, std::pair<int, std::int64_t>{1, x.i}); break;
      case pk::floating:
        if (std::trunc(x.f) == x.f && x.f >= -9223372036854775808.0 && x.f < 9223372036854775808.0) {
          c = of(int_classes_, std::pair<int, std::int64_t>{1, static_cast<std::int64_t>(x.f)});
        } else {
          c = of(int_classes_, std::pair<int, std::int64_t>{2, std::bit_cast<std::int64_t>(x.f)});
        }
        break;
      case pk::string: c = of(text_classes_, std::pair<bool, std::string>{false, x.s}); break;
      case pk::bytes: c = of(text_classes_, std::pair<bool, std::string>{true, x.s}); break;
      case pk::tuple: {
        std::vector<std::uint32_t> items;
        items.reserve(x.items.size());
        for (auto item : nodes_[n].items) items.push_back(key_class(item, depth + 1));
        c = of(tuple_classes_, std::move(items));
        break;
      }
      default: fail("dict key of type " + describe(n) + " is not hashable");
    }
    if (key_class_.size() <= n) key_class_.resize(nodes_.size(), 0);
    key_class_[n] = c;
    return c;
  }
  void set_items(std::uint32_t d, std::span<const std::uint32_t> kv) {
    if (kv.size() % 2 != 0) fail("SETITEMS with an odd number of items");
    for (std::size_t i = 0; i < kv.size(); i += 2) {
      const auto [it, fresh] = dict_index_.try_emplace({d, key_class(kv[i], 0)}, nodes_[d].items.size());
      if (fresh) {
        nodes_[d].items.push_back(kv[i]);
        nodes_[d].items.push_back(kv[i + 1]);
      } else {
        nodes_[d].items[it->second + 1] = kv[i + 1];  // Python keeps the first key and position
      }
    }
  }

  std::uint32_t resolve(const std::string& module, const std::string& name) {
    const std::string full = module + "." + name;
    auto callable = [&](fn f) {
      const auto n = make(pk::callable);
      nodes_[n].i = static_cast<std::int64_t>(f);
      nodes_[n].s = full;
      return n;
    };
    if (full == "collections.OrderedDict") return callable(fn::ordered_dict);
    if (full == "torch._utils._rebuild_tensor_v2") return callable(fn::rebuild_tensor_v2);
    if (full == "torch._utils._rebuild_tensor") return callable(fn::rebuild_tensor);
    if (full == "torch._utils._rebuild_parameter") return callable(fn::rebuild_parameter);
    if (full == "torch._utils._rebuild_parameter_with_state") return callable(fn::rebuild_parameter_with_state);
    if (full == "_codecs.encode") return callable(fn::codecs_encode);
    if (full == "builtins.bytes" || full == "__builtin__.bytes") return callable(fn::empty_bytes);
    // A storage class is only a type tag inside a persistent id; it is never called. Classes
    // ckpt has no dtype for (complex, quantized) are kept so the error can name the tensor.
    const bool word = !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
      return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
    });
    if (module == "torch" && word && name.ends_with("Storage") && name != "Storage") {
      const auto n = make(pk::storage_type);
      const auto t = dtype_of_torch_storage(name);
      nodes_[n].i = t ? static_cast<std::int64_t>(*t) : 0;
      nodes_[n].s = full;
      return n;
    }
    fail("global " + ckpt::detail::printable(full) +
         " is not allowed (a state dict may only use collections.OrderedDict, the torch._utils tensor rebuild "
         "functions and torch storage types)");
  }

  /// ('storage', torch.XStorage, key, location, numel) -> a storage node.
  std::uint32_t persistent(std::uint32_t pid) {
    const auto& t = nodes_[pid];
    if (t.kind != pk::tuple || t.items.size() != 5)
      fail("persistent id must be a 5-tuple ('storage', type, key, location, numel), not a " + describe(pid) +
           (t.kind == pk::tuple ? " of " + std::to_string(t.items.size()) : std::string()));
    const auto &tag = nodes_[t.items[0]], &type = nodes_[t.items[1]], &key = nodes_[t.items[2]],
               &loc = nodes_[t.items[3]], &numel = nodes_[t.items[4]];
    if ((tag.kind != pk::string && tag.kind != pk::bytes) || tag.s != "storage")
      fail("only persistent ids of storages are allowed");
    if (type.kind != pk::storage_type) fail("persistent id names " + describe(t.items[1]) + " instead of a torch storage type");
    if (key.kind != pk::string || key.s.empty() || key.s.size() > 256 ||
        !std::all_of(key.s.begin(), key.s.end(), [](char ch) {
          return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
        }))
      fail("storage key must be a short string of letters, digits, '_' and '-'" +
           (key.kind == pk::string ? ", not " + ckpt::detail::printable(key.s) : std::string()));
    if (loc.kind != pk::string || loc.s.size() > 64) fail("storage location must be a short string");
    if (numel.kind != pk::integer || numel.i < 0) fail("storage size must be a non-negative int");
    storages_.push_back({t.items[1], key.s, loc.s, static_cast<std::uint64_t>(numel.i)});
    const auto n = make(pk::storage);
    nodes_[n].i = static_cast<std::int64_t>(storages_.size() - 1);
    return n;
  }

  std::uint64_t arg_uint(std::uint32_t n, const char* what) const {
    if (nodes_[n].kind != pk::integer || nodes_[n].i < 0)
      fail(std::string(what) + " must be a non-negative int, not a " + describe(n));
    return static_cast<std::uint64_t>(nodes_[n].i);
  }
  std::vector<std::uint64_t> arg_dims(std::uint32_t n, const char* what) const {
    if (nodes_[n].kind != pk::tuple) fail(std::string(what) + " must be a tuple, not a " + describe(n));
    if (nodes_[n].items.size() > limits_.max_rank)
      fail(std::string(what) + " has " + std::to_string(nodes_[n].items.size()) + " dimensions (the limit is " +
           std::to_string(limits_.max_rank) + ")");
    std::vector<std::uint64_t> v;
    for (auto i : nodes_[n].items) v.push_back(arg_uint(i, what));
    return v;
  }
  bool arg_bool(std::uint32_t n, const char* what) const {
    if (nodes_[n].kind != pk::boolean) fail(std::string(what) + " must be a bool, not a " + describe(n));
    return nodes_[n].flag;
  }
  void arity(const std::string& f, std::size_t got, std::size_t lo, std::size_t hi) const {
    if (got < lo || got > hi)
      fail(f + " takes " + std::to_string(lo) + (hi != lo ? " to " + std::to_string(hi) : std::string()) +
           " arguments, got " + std::to_string(got));
  }

  std::uint32_t call(std::uint32_t callee, std::vector<std::uint32_t> args) {
    const auto f = static_cast<fn>(nodes_[callee].i);
    const std::string name = nodes_[callee].s;
    switch (f) {
      case fn::ordered_dict: {
        arity(name, args.size(), 0, 0);
        const auto d = make(pk::dict);
        nodes_[d].flag = true;
        return d;
      }
      case fn::rebuild_tensor: case fn::rebuild_tensor_v2: {
        // (storage, storage_offset, size, stride[, requires_grad, backward_hooks[, metadata]])
        if (f == fn::rebuild_tensor) arity(name, args.size(), 4, 4);
        else arity(name, args.size(), 6, 7);
        if (nodes_[args[0]].kind != pk::storage) fail(name + " needs a storage, not a " + describe(args[0]));
        ptensor t;
        t.storage = args[0];
        t.offset = arg_uint(args[1], "storage offset");
        t.shape = arg_dims(args[2], "tensor size");
        t.stride = arg_dims(args[3], "tensor stride");
        if (t.shape.size() != t.stride.size())
          fail("tensor size has " + std::to_string(t.shape.size()) + " dimensions but stride has " +
               std::to_string(t.stride.size()));
        bool requires_grad = false;
        if (args.size() >= 6) {
          requires_grad = arg_bool(args[4], "requires_grad");
          if (nodes_[args[5]].kind != pk::dict) fail("backward hooks must be a dict, not a " + describe(args[5]));
        }
        if (args.size() == 7 && nodes_[args[6]].kind != pk::none && nodes_[args[6]].kind != pk::dict)
          fail("tensor metadata must be None or a dict, not a " + describe(args[6]));
        tensors_.push_back(std::move(t));
        const auto n = make(pk::tensor);
        nodes_[n].i = static_cast<std::int64_t>(tensors_.size() - 1);
        nodes_[n].flag = requires_grad;
        return n;
      }
      case fn::rebuild_parameter: case fn::rebuild_parameter_with_state: {
        // (data, requires_grad, backward_hooks[, state]): an nn.Parameter comes back as its tensor.
        arity(name, args.size(), f == fn::rebuild_parameter ? 3 : 4, f == fn::rebuild_parameter ? 3 : 4);
        if (nodes_[args[0]].kind != pk::tensor) fail(name + " needs a tensor, not a " + describe(args[0]));
        const bool requires_grad = arg_bool(args[1], "requires_grad");
        if (nodes_[args[2]].kind != pk::dict) fail("backward hooks must be a dict, not a " + describe(args[2]));
        const auto n = make(pk::tensor);
        nodes_[n].i = nodes_[args[0]].i;
        nodes_[n].flag = requires_grad;
        return n;
      }
      case fn::codecs_encode: {
        // How protocol 2 pickles bytes: _codecs.encode(<the bytes as latin-1 text>, 'latin1').
        arity(name, args.size(), 2, 2);
        if (nodes_[args[0]].kind != pk::string || nodes_[args[1]].kind != pk::string ||
            (nodes_[args[1]].s != "latin1" && nodes_[args[1]].s != "latin-1"))
          fail(name + " is only allowed as _codecs.encode(str, 'latin1')");
        std::string out;
        const std::string& s = nodes_[args[0]].s;  // valid UTF-8, checked when read
        for (std::size_t i = 0; i < s.size();) {
          const auto b = static_cast<unsigned char>(s[i]);
          if (b < 0x80) {
            out += static_cast<char>(b);
            i += 1;
          } else if ((b & 0xe0) == 0xc0 && b <= 0xc3) {
            out += static_cast<char>(((b & 0x03) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3f));
            i += 2;
          } else {
            fail("_codecs.encode: text has a character outside latin-1");
          }
        }
        const auto n = make(pk::bytes);
        nodes_[n].s = std::move(out);
        return n;
      }
      case fn::empty_bytes: {
        arity(name, args.size(), 0, 0);
        return make(pk::bytes);
      }
    }
    fail("internal: unknown callable");
  }

  py_object convert(std::uint32_t n, std::size_t depth, std::string& path) {
    if (depth > limits_.max_depth)
      fail_at(path, "nesting deeper than " + std::to_string(limits_.max_depth) + " levels");
    if (++converted_ > limits_.max_objects)
      fail_at(path, "more than " + std::to_string(limits_.max_objects) + " objects (shared references included)");
    const pnode& x = nodes_[n];
    result_bytes_ += sizeof(py_object) + x.s.size();
    if (x.kind == pk::tensor) {
      const auto& t = tensors_[static_cast<std::size_t>(x.i)];
      const auto& st = storages_[static_cast<std::size_t>(nodes_[t.storage].i)];
      result_bytes_ += sizeof(py_tensor) + 2 * sizeof(std::uint64_t) * t.shape.size() + st.key.size() + st.location.size();
    }
    if (result_bytes_ > limits_.max_result_bytes)
      fail_at(path, "the result would exceed " + std::to_string(limits_.max_result_bytes) +
                        " bytes (shared references are copied)");
    switch (x.kind) {
      case pk::none: return py_object();
      case pk::boolean: return py_object(x.flag);
      case pk::integer: return py_object(x.i);
      case pk::floating: return py_object(x.f);
      case pk::string: return py_object(x.s);
      case pk::bytes: return py_object::bytes(x.s);
      case pk::callable: case pk::storage_type:
        fail_at(path, "global " + ckpt::detail::printable(x.s) + " cannot be used as a value");
      case pk::storage: fail_at(path, "a bare storage cannot be used as a value");
      case pk::tensor: return tensor(n, path);
      case pk::list: case pk::tuple: case pk::dict: break;
    }
    if (on_path_[n]) fail_at(path, "recursive structure (a container contains itself)");
    on_path_[n] = 1;
    const std::size_t mark = path.size();
    py_object out;
    if (x.kind == pk::dict) {
      out = nodes_[n].flag ? py_object::ordered_dict() : py_object::dict();
      auto& entries = std::get<py_object::dict_type>(out.v_);
      entries.reserve(x.items.size() / 2);
      for (std::size_t i = 0; i < x.items.size(); i += 2) {
        path.resize(mark);
        py_object key = convert(x.items[i], depth + 1, path);
        path.resize(mark);
        path += path_step(key);
        py_object value = convert(x.items[i + 1], depth + 1, path);
        entries.emplace_back(std::move(key), std::move(value));  // keys were deduplicated when set
      }
    } else {
      py_object::list_type items;
      items.reserve(x.items.size());
      for (std::size_t i = 0; i < x.items.size(); ++i) {
        path.resize(mark);
        path += "[" + std::to_string(i) + "]";
        items.push_back(convert(x.items[i], depth + 1, path));
      }
      out = x.kind == pk::list ? py_object::list(std::move(items)) : py_object::tuple(std::move(items));
    }
    path.resize(mark);
    on_path_[n] = 0;
    return out;
  }

  py_object tensor(std::uint32_t n, const std::string& path) const {
    const auto& t = tensors_[static_cast<std::size_t>(nodes_[n].i)];
    const auto& s = storages_[static_cast<std::size_t>(nodes_[t.storage].i)];
    const auto& type = nodes_[s.type];
    if (type.i == 0)
      throw error(error_kind::invalid_argument,
                  source_ + ": tensor " + path_or_root(path) + " has storage type " + ckpt::detail::printable(type.s) +
                      ", a dtype ckpt does not support (supported: float64, float32, float16, bfloat16, int64, int32, "
                      "int16, int8, uint8, bool)");
    py_tensor out;
    out.value.type = static_cast<dtype>(type.i);
    out.value.shape = t.shape;
    out.storage = torch_storage{s.key, s.numel, s.location, t.offset, t.stride};
    out.requires_grad = nodes_[n].flag;
    if (auto p = view_problem(out); !p.empty()) fail_at(path, "tensor " + p);
    return py_object(std::move(out));
  }

  std::span<const std::byte> in_;
  std::string source_;
  unpickle_limits limits_;
  std::size_t pos_ = 0, op_pos_ = 0;
  std::vector<pnode> nodes_;
  std::vector<pstorage> storages_;
  std::vector<ptensor> tensors_;
  std::vector<std::uint32_t> stack_;
  std::vector<std::size_t> marks_;
  std::vector<std::uint32_t> memo_;
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::size_t> dict_index_;  // (dict, key class) -> position
  std::vector<std::uint32_t> key_class_;                                         // per node; 0: not computed
  std::map<std::pair<int, std::int64_t>, std::uint32_t> int_classes_;  // None, numbers (by value), other floats (by bits)
  std::map<std::pair<bool, std::string>, std::uint32_t> text_classes_;
  std::map<std::vector<std::uint32_t>, std::uint32_t> tuple_classes_;
  std::uint32_t next_class_ = 1;
  std::vector<std::uint8_t> on_path_;
  std::uint64_t converted_ = 0, result_bytes_ = 0;
};

/// The protocol-2 pickler, emitting what CPython's pickler emits for the same values (memo
/// entries for strings, globals and containers; batches of 1000) and tensors as torch 1.13 does.
class pickler {
 public:
  std::vector<std::byte> run(const py_object& root) {
    put(op::PROTO);
    put(2);
    std::string path;
    save(root, 0, path);
    put(op::STOP);
    return std::move(out_);
  }

 private:
  static constexpr std::size_t max_depth = 1000;
  static constexpr std::size_t batch = 1000;

  void put(std::uint8_t b) { out_.push_back(static_cast<std::byte>(b)); }
  void put_le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) put(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void put_raw(std::string_view s) {
    for (char c : s) put(static_cast<std::uint8_t>(c));
  }
  void memoize() {
    const auto i = next_++;
    if (i < 256) {
      put(op::BINPUT);
      put(static_cast<std::uint8_t>(i));
    } else {
      put(op::LONG_BINPUT);
      put_le(i, 4);
    }
  }
  /// Emits a memo reference when `key` was memoized; otherwise records it and returns false.
  bool recall(const std::string& key) {
    const auto [it, fresh] = memo_.try_emplace(key, next_);
    if (fresh) return false;
    if (it->second < 256) {
      put(op::BINGET);
      put(static_cast<std::uint8_t>(it->second));
    } else {
      put(op::LONG_BINGET);
      put_le(it->second, 4);
    }
    return true;
  }
  void global(std::string_view module, std::string_view name) {
    if (recall("g" + std::string(module) + "\n" + std::string(name))) return;
    put(op::GLOBAL);
    put_raw(module);
    put('\n');
    put_raw(name);
    put('\n');
    memoize();
  }
  void str(std::string_view s, const std::string& path) {
    if (!ckpt::detail::valid_utf8(s))
      throw error(error_kind::invalid_argument, "pickle: " + path_or_root(path) + ": string " +
                                                    ckpt::detail::printable(s) + " is not valid UTF-8");
    if (s.size() > 0xffffffffu)
      throw error(error_kind::invalid_argument, "pickle: " + path_or_root(path) + ": string longer than 4 GiB");
    if (recall("s" + std::string(s))) return;
    put(op::BINUNICODE);
    put_le(s.size(), 4);
    put_raw(s);
    memoize();
  }
  void integer(std::int64_t v) {
    if (v >= 0 && v <= 0xff) {
      put(op::BININT1);
      put(static_cast<std::uint8_t>(v));
    } else if (v >= 0 && v <= 0xffff) {
      put(op::BININT2);
      put_le(static_cast<std::uint64_t>(v), 2);
    } else if (v >= std::numeric_limits<std::int32_t>::min() && v <= std::numeric_limits<std::int32_t>::max()) {
      put(op::BININT);
      put_le(static_cast<std::uint32_t>(static_cast<std::int32_t>(v)), 4);
    } else {
      // CPython's encode_long: the fewest little-endian two's-complement bytes.
      const auto u = static_cast<std::uint64_t>(v);
      int n = 8;
      while (n > 1) {
        const auto b = static_cast<std::uint8_t>(u >> (8 * (n - 1)));
        const auto below = static_cast<std::uint8_t>(u >> (8 * (n - 2)));
        if ((b == 0x00 && !(below & 0x80)) || (b == 0xff && (below & 0x80))) --n;
        else break;
      }
      put(op::LONG1);
      put(static_cast<std::uint8_t>(n));
      put_le(u, n);
    }
  }
  void tuple_of(const std::vector<std::uint64_t>& dims) {
    py_object::list_type items;
    for (auto d : dims) items.emplace_back(static_cast<std::int64_t>(d));
    std::string path;
    save(py_object::tuple(std::move(items)), 1, path);
  }
  void tensor(const py_tensor& t, const std::string& path) {
    const auto& s = t.storage;
    if (s.key.empty())
      throw error(error_kind::invalid_argument, "pickle: " + path_or_root(path) +
                                                    ": tensor has no storage record yet (torch_writer assigns one)");
    if (auto p = view_problem(t); !p.empty())
      throw error(error_kind::invalid_argument, "pickle: " + path_or_root(path) + ": tensor " + p);
    if (s.numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        s.offset > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw error(error_kind::invalid_argument, "pickle: " + path_or_root(path) + ": storage too large");
    global("torch._utils", "_rebuild_tensor_v2");
    put(op::MARK);
    put(op::MARK);
    str("storage", path);
    global("torch", torch_storage_name(t.value.type));
    str(s.key, path);
    str(s.location, path);
    integer(static_cast<std::int64_t>(s.numel));
    put(op::TUPLE);
    memoize();
    put(op::BINPERSID);
    integer(static_cast<std::int64_t>(s.offset));
    tuple_of(t.value.shape);
    tuple_of(s.stride);
    put(t.requires_grad ? op::NEWTRUE : op::NEWFALSE);
    global("collections", "OrderedDict");
    put(op::EMPTY_TUPLE);
    put(op::REDUCE);
    memoize();
    put(op::TUPLE);
    memoize();
    put(op::REDUCE);
    memoize();
  }
  static bool hashable(const py_object& k) {
    switch (k.kind()) {
      case py_kind::list: case py_kind::dict: case py_kind::tensor: return false;
      case py_kind::tuple:
        return std::all_of(k.items().begin(), k.items().end(), [](const py_object& i) { return hashable(i); });
      default: return true;
    }
  }

  void save(const py_object& o, std::size_t depth, std::string& path) {
    if (depth > max_depth)
      throw error(error_kind::invalid_argument, "pickle: " + path_or_root(path) + ": nesting deeper than " +
                                                    std::to_string(max_depth) + " levels");
    const std::size_t mark = path.size();
    switch (o.kind()) {
      case py_kind::none: put(op::NONE); return;
      case py_kind::boolean: put(o.as_bool() ? op::NEWTRUE : op::NEWFALSE); return;
      case py_kind::integer: integer(o.as_int()); return;
      case py_kind::floating: {
        put(op::BINFLOAT);
        const auto bits = std::bit_cast<std::uint64_t>(o.as_float());
        for (int i = 7; i >= 0; --i) put(static_cast<std::uint8_t>(bits >> (8 * i)));
        return;
      }
      case py_kind::string: str(o.as_str(), path); return;
      case py_kind::bytes: {
        const auto b = o.as_bytes();
        if (b.empty()) {
          global("__builtin__", "bytes");
          put(op::EMPTY_TUPLE);
        } else {
          global("_codecs", "encode");
          std::string text;  // each byte as the latin-1 character of that code, in UTF-8
          for (auto x : b) {
            const auto c = static_cast<unsigned char>(x);
            if (c < 0x80) {
              text += static_cast<char>(c);
            } else {
              text += static_cast<char>(0xc0 | (c >> 6));
              text += static_cast<char>(0x80 | (c & 0x3f));
            }
          }
          str(text, path);
          str("latin1", path);
          put(op::TUPLE2);
          memoize();
        }
        put(op::REDUCE);
        memoize();
        return;
      }
      case py_kind::tuple: {
        const auto& items = o.items();
        if (items.empty()) {
          put(op::EMPTY_TUPLE);
          return;
        }
        if (items.size() > 3) put(op::MARK);
        for (std::size_t i = 0; i < items.size(); ++i) {
          path.resize(mark);
          path += "[" + std::to_string(i) + "]";
          save(items[i], depth + 1, path);
        }
        path.resize(mark);
        put(items.size() > 3 ? op::TUPLE : static_cast<std::uint8_t>(op::TUPLE1 + items.size() - 1));
        memoize();
        return;
      }
      case py_kind::list: {
        const auto& items = o.items();
        put(op::EMPTY_LIST);
        memoize();
        for (std::size_t start = 0; start < items.size(); start += batch) {
          const std::size_t end = std::min(items.size(), start + batch);
          if (end - start > 1) put(op::MARK);
          for (std::size_t i = start; i < end; ++i) {
            path.resize(mark);
            path += "[" + std::to_string(i) + "]";
            save(items[i], depth + 1, path);
          }
          put(end - start > 1 ? op::APPENDS : op::APPEND);
        }
        path.resize(mark);
        return;
      }
      case py_kind::dict: {
        const auto& entries = o.entries();
        if (o.is_ordered_dict()) {
          global("collections", "OrderedDict");
          put(op::EMPTY_TUPLE);
          put(op::REDUCE);
        } else {
          put(op::EMPTY_DICT);
        }
        memoize();
        for (std::size_t start = 0; start < entries.size(); start += batch) {
          const std::size_t end = std::min(entries.size(), start + batch);
          if (end - start > 1) put(op::MARK);
          for (std::size_t i = start; i < end; ++i) {
            path.resize(mark);
            if (!hashable(entries[i].first))
              throw error(error_kind::invalid_argument, "pickle: " + path_or_root(path) + ": dict key of type " +
                                                            std::string(to_string(entries[i].first.kind())) +
                                                            " is not hashable in Python");
            save(entries[i].first, depth + 1, path);
            path += path_step(entries[i].first);
            save(entries[i].second, depth + 1, path);
          }
          put(end - start > 1 ? op::SETITEMS : op::SETITEM);
        }
        path.resize(mark);
        return;
      }
      case py_kind::tensor: tensor(o.as_tensor(), path); return;
    }
  }

  std::vector<std::byte> out_;
  std::unordered_map<std::string, std::uint32_t> memo_;
  std::uint32_t next_ = 0;
};

}  // namespace detail

/// Unpickles `data` without running anything: only plain containers, numbers, strings, bytes
/// and torch tensors (`_rebuild_tensor_v2`, `_rebuild_parameter`, `OrderedDict`, storage
/// types) are accepted; anything else is a `corrupt` error naming `source`, the offset and the
/// refused global or opcode. Tensors come back with their storage view and no bytes.
///
/// @code
/// auto pkl = zip.read("archive/data.pkl");
/// ckpt::interop::py_object root = ckpt::interop::unpickle(pkl, "model.pt: archive/data.pkl");
/// @endcode
inline py_object unpickle(std::span<const std::byte> data, std::string source, unpickle_limits limits = {}) {
  return detail::unpickler(data, std::move(source), limits).run();
}

/// Pickles `root` with protocol 2, as `torch.save` does; every tensor must already name its
/// storage record (`torch_writer` takes care of that). Readable by Python's `pickle` and
/// `torch.load`.
///
/// @code
/// std::vector<std::byte> pkl = ckpt::interop::pickle(py_object::dict({{"iteration", 100}}));
/// @endcode
inline std::vector<std::byte> pickle(const py_object& root) { return detail::pickler().run(root); }

}  // namespace ckpt::interop
