#pragma once
/// @file interop/py_object.hpp
/// `ckpt::interop::py_object`: the Python values a PyTorch checkpoint holds (None, bools,
/// ints, floats, strings, bytes, lists, tuples, dicts and tensors), as `unpickle.hpp` reads
/// them from a `.pt` file and `pickle.hpp` writes them, and the checks of a tensor's strided
/// view of its storage that both ends share.

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

/// The Python class a value was reconstructed from, where it is not the plain builtin of its
/// kind. The unpickler builds these as data (it never runs a class); the kind says how the
/// value is held:
///
/// | class | kind | holds |
/// |---|---|---|
/// | `ordered_dict` | dict | `collections.OrderedDict` (a state dict) |
/// | `defaultdict` | dict | `collections.defaultdict` (its default factory is not kept) |
/// | `argparse_namespace` | dict | `argparse.Namespace`: the attributes, by name |
/// | `set`, `frozenset` | list | the elements, in the pickle's order |
/// | `torch_size` | tuple | `torch.Size`: the dimensions |
/// | `torch_dtype` | str | a `torch.dtype` such as `torch.float16`: the name, "float16" |
/// | `numpy_dtype` | str | a `numpy.dtype`: its array-protocol string, such as "<u4" |
/// | `numpy_array` | tuple | a `numpy.ndarray`: (dtype string, shape tuple, bytes in C order) |
/// | `object` | dict | an instance of an attribute-holder class the frameworks save (DeepSpeed's loss scaler, `fragment_address`, `types.SimpleNamespace`): its attributes; `python_class_name()` names the class |
/// | `enum_member` | int or str | a member of an enum the frameworks save (`ZeroStageEnum`, Megatron's `ModelType`, `signal.Signals`): its value, or its name where it was pickled by name; `python_class_name()` names the enum |
///
/// @code
/// if (args.py_class() == ckpt::interop::py_class::argparse_namespace) use(args.at("hidden_size").as_int());
/// @endcode
enum class py_class : std::uint8_t {
  builtin, ordered_dict, defaultdict, argparse_namespace, set, frozenset, torch_size, torch_dtype, numpy_dtype, numpy_array,
  object, enum_member
};

/// The class's Python name ("argparse.Namespace", "numpy.ndarray"; "" for a builtin).
///
/// @code
/// std::cout << ckpt::interop::to_string(ckpt::interop::py_class::torch_size);  // "torch.Size"
/// @endcode
constexpr std::string_view to_string(py_class c) noexcept {
  switch (c) {
    case py_class::builtin: return "";
    case py_class::ordered_dict: return "collections.OrderedDict";
    case py_class::defaultdict: return "collections.defaultdict";
    case py_class::argparse_namespace: return "argparse.Namespace";
    case py_class::set: return "set";
    case py_class::frozenset: return "frozenset";
    case py_class::torch_size: return "torch.Size";
    case py_class::torch_dtype: return "torch.dtype";
    case py_class::numpy_dtype: return "numpy.dtype";
    case py_class::numpy_array: return "numpy.ndarray";
    case py_class::object: return "object";
    case py_class::enum_member: return "enum";
  }
  return "";
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
  bool is_ordered_dict() const noexcept { return kind_ == py_kind::dict && class_ == py_class::ordered_dict; }
  /// The Python class the value was reconstructed from (`py_class::builtin` for plain values).
  py_class python_class() const noexcept { return class_; }
  /// The class's full Python name: "argparse.Namespace", or for an `object` or `enum_member`
  /// the class it was saved as ("deepspeed.runtime.zero.config.ZeroStageEnum"); "" for a builtin.
  std::string python_class_name() const {
    return class_ == py_class::object || class_ == py_class::enum_member ? class_name_ : std::string(to_string(class_));
  }
  /// The same value, marked as an instance of `c` (which must suit its kind, see `py_class`);
  /// `name` is the class's full name, for an `object` or an `enum_member`.
  py_object with_class(py_class c, std::string name = {}) && {
    class_ = c;
    class_name_ = std::move(name);
    return std::move(*this);
  }

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
  /// Appends `d[key] = value` to a dict without looking for an equal key first: for keys the
  /// caller knows are distinct (a checkpoint's tensor names), where `set`'s search would make
  /// a dict of n entries cost n²/2 comparisons (a 100,000-tensor export spent most of its
  /// time there).
  void insert_new(py_object key, py_object value) {
    expect(py_kind::dict);
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
    o.class_ = ordered ? py_class::ordered_dict : py_class::builtin;
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
    if (class_ != py_class::builtin && class_ != py_class::ordered_dict) {
      // "argparse.Namespace{...}", "torch.Size(2, 3)": the class, then the data it holds.
      out += python_class_name();
      if (kind_ == py_kind::string || kind_ == py_kind::integer) out += "(";
    }
    switch (kind_) {
      case py_kind::none: out += "None"; break;
      case py_kind::boolean: out += std::get<bool>(v_) ? "True" : "False"; break;
      case py_kind::integer:
        out += std::to_string(std::get<std::int64_t>(v_));
        if (class_ != py_class::builtin) out += ")";
        break;
      case py_kind::floating: {
        char buf[64];
        const auto r = std::to_chars(buf, buf + sizeof buf, std::get<double>(v_));
        std::string s(buf, r.ptr);
        if (s.find_first_of(".ein") == std::string::npos) s += ".0";
        out += s;
        break;
      }
      case py_kind::string:
        out += ckpt::detail::printable(std::get<std::string>(v_));
        if (class_ != py_class::builtin) out += ")";
        break;
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
  py_class class_ = py_class::builtin;
  std::string class_name_;  // for py_class::object and py_class::enum_member
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

/// The torch storage class of each ckpt dtype, as pickles name it ("FloatStorage"); empty for
/// the dtypes torch has no such class for (u16, u32, u64 and FP8: torch >= 2.1 pickles their
/// tensors with `_rebuild_tensor_v3` over a `torch.storage.UntypedStorage`).
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
    case dtype::u16: case dtype::u32: case dtype::u64: case dtype::f8_e4m3: case dtype::f8_e5m2: return "";
  }
  return "";
}
/// The dtype of a torch storage class name, or nothing for the ones ckpt lacks (complex, quantized).
inline std::optional<dtype> dtype_of_torch_storage(std::string_view name) noexcept {
  if (name.empty()) return std::nullopt;
  for (std::uint8_t id = 1; id <= last_dtype_id; ++id)
    if (torch_storage_name(static_cast<dtype>(id)) == name) return static_cast<dtype>(id);
  return std::nullopt;
}
/// The name of the `torch.dtype` of each ckpt dtype ("float32", "bfloat16", "uint16",
/// "float8_e4m3fn", ...), as a pickle names it after `torch.`.
constexpr std::string_view torch_dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::f64: return "float64";
    case dtype::f32: return "float32";
    case dtype::f16: return "float16";
    case dtype::bf16: return "bfloat16";
    case dtype::i64: return "int64";
    case dtype::i32: return "int32";
    case dtype::i16: return "int16";
    case dtype::i8: return "int8";
    case dtype::u8: return "uint8";
    case dtype::boolean: return "bool";
    case dtype::u16: return "uint16";
    case dtype::u32: return "uint32";
    case dtype::u64: return "uint64";
    case dtype::f8_e4m3: return "float8_e4m3fn";
    case dtype::f8_e5m2: return "float8_e5m2";
  }
  return "";
}
/// The ckpt dtype of a `torch.dtype` name, or nothing for the ones ckpt lacks (complex,
/// quantized, the fnuz and e8m0 float8 formats). torch's aliases (`float`, `half`, `long`, ...)
/// are accepted too.
inline std::optional<dtype> dtype_of_torch_dtype(std::string_view name) noexcept {
  static constexpr std::pair<std::string_view, dtype> aliases[] = {
      {"double", dtype::f64}, {"float", dtype::f32}, {"half", dtype::f16},
      {"long", dtype::i64},   {"int", dtype::i32},   {"short", dtype::i16}};
  for (const auto& [alias, t] : aliases)
    if (alias == name) return t;
  for (std::uint8_t id = 1; id <= last_dtype_id; ++id)
    if (torch_dtype_name(static_cast<dtype>(id)) == name) return static_cast<dtype>(id);
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

}  // namespace ckpt::interop
