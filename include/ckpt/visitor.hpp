#pragma once
/// @file visitor.hpp
/// The visitor a Checkpointable type describes itself to: `tensor`, `value` and `group`.

#include <array>
#include <bit>
#include <cstring>
#include <functional>
#include <locale>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <cereal/archives/portable_binary.hpp>
#include <cereal/cereal.hpp>
#include <cereal/types/array.hpp>
#include <cereal/types/bitset.hpp>
#include <cereal/types/chrono.hpp>
#include <cereal/types/complex.hpp>
#include <cereal/types/deque.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/set.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/tuple.hpp>
#include <cereal/types/unordered_map.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/variant.hpp>
#include <cereal/types/vector.hpp>

#include "detail/name_set.hpp"
#include "detail/span_stream.hpp"
#include "detail/table_memory.hpp"
#include "error.hpp"
#include "impl/decl.hpp"
#include "names.hpp"
#include "tensor.hpp"

namespace ckpt {

class visitor;

/// Customisation point for types you cannot edit: specialise it with
/// `static void checkpoint(ckpt::visitor& v, T& x)`. It takes priority over a member function.
///
/// @code
/// template <> struct ckpt::checkpoint_traits<thirdparty::adam> {
///   static void checkpoint(ckpt::visitor& v, thirdparty::adam& a) {
///     v.tensor("m", a.m);
///     v.tensor("v", a.v);
///     v.value("step", a.step);
///   }
/// };
/// @endcode
template <class T, class = void>
struct checkpoint_traits {
  /// Marks the primary template: "no customisation" (see concepts.hpp for the rules).
  static constexpr bool ckpt_primary_template = true;
};

/// Customisation point that turns a user type into a tensor: specialise it with
/// `static tensor_ref ref(T&)`. ckpt provides it for `std::vector` and `std::array` of element
/// types, for element-type scalars and for `tensor_ref` itself.
///
/// @code
/// template <> struct ckpt::tensor_traits<my::matrix> {
///   static ckpt::tensor_ref ref(my::matrix& m) { return ckpt::view(m.data(), {m.rows(), m.cols()}); }
/// };
/// @endcode
template <class T, class = void>
struct tensor_traits {
  static constexpr bool ckpt_primary_template = true;
};

template <element_type T, class A>
struct tensor_traits<std::vector<T, A>> {
  static_assert(!std::is_same_v<T, bool>, "ckpt: std::vector<bool> is not contiguous: use std::vector<std::uint8_t>");
  static tensor_ref ref(std::vector<T, A>& v) { return view(v.data(), {v.size()}); }
};
template <element_type T, std::size_t N>
struct tensor_traits<std::array<T, N>> {
  static tensor_ref ref(std::array<T, N>& a) { return view(a.data(), {N}); }
};
template <element_type T>
struct tensor_traits<T> {
  static tensor_ref ref(T& x) { return view(&x, {}); }  // a scalar: shape []
};
template <>
struct tensor_traits<tensor_ref> {
  static tensor_ref ref(const tensor_ref& t) { return t; }
};

/// Befriend this class to let ckpt call a private `checkpoint` member.
///
/// @code
/// class model {
///   friend class ckpt::access;
///   template <class V> void checkpoint(V& v) { v.tensor("w", w_); }
///   std::vector<float> w_;
/// };
/// @endcode
class access {
 public:
  template <class T, class V>
  static auto checkpoint(T& x, V& v) -> decltype(x.checkpoint(v)) {
    return x.checkpoint(v);
  }
};

namespace detail {
template <class T>
void visit_state(visitor& v, T& state);  // defined in concepts.hpp, after the priority rules

template <class T>
concept has_tensor_traits = !requires { tensor_traits<std::remove_cvref_t<T>>::ckpt_primary_template; } &&
                            requires(T& x) {
                              { tensor_traits<std::remove_cvref_t<T>>::ref(x) } -> std::convertible_to<tensor_ref>;
                            };

template <class T>
concept cereal_value = cereal::traits::is_output_serializable<T, cereal::PortableBinaryOutputArchive>::value &&
                       cereal::traits::is_input_serializable<T, cereal::PortableBinaryInputArchive>::value;

// Random engines and distributions of <random> have no cereal support but are streamable, and
// the standard guarantees that streaming out and back in reproduces the same state.
template <class T>
concept streamed_value = !cereal_value<T> && requires(std::ostream& os, std::istream& is, T& x) {
  os << x;
  is >> x;
};

// An arithmetic value is stored as cereal's PortableBinary archive stores it, a byte-order flag
// (1: little-endian) and then its bytes, written here directly: the same bytes, without an
// archive and a stream for every integer a state holds.
template <class T>
concept plain_number = std::is_arithmetic_v<T> && std::endian::native == std::endian::little;

template <class T>
concept storable_value = plain_number<T> || cereal_value<T> || streamed_value<T>;

template <class T>
std::vector<std::byte> encode_value(const T& x) {
  if constexpr (plain_number<T>) {
    std::vector<std::byte> out(1 + sizeof(T));
    out[0] = std::byte{1};
    std::memcpy(out.data() + 1, &x, sizeof(T));
    return out;
  } else {
    std::ostringstream os(std::ios::binary);
    if constexpr (cereal_value<T>) {
      cereal::PortableBinaryOutputArchive ar(os);
      ar(x);
    } else {
      os.imbue(std::locale::classic());
      os << x;
    }
    const std::string s = std::move(os).str();
    const auto* b = reinterpret_cast<const std::byte*>(s.data());
    return {b, b + s.size()};
  }
}

/// Restores `x` from bytes written by encode_value; every byte must be consumed, so a value
/// whose type changed since the save is reported instead of half-read.
template <class T>
void decode_value(std::span<const std::byte> bytes, T& x, const std::string& where) {
  if constexpr (plain_number<T>) {
    if (bytes.size() != 1 + sizeof(T) || bytes[0] != std::byte{1})
      throw error(error_kind::mismatch, where + ": stored " + std::to_string(bytes.size()) + " bytes, the live type (a " +
                                            std::to_string(sizeof(T)) + "-byte number) reads " + std::to_string(1 + sizeof(T)) +
                                            (bytes.empty() || bytes[0] == std::byte{1} ? "" : " in little-endian order"));
    if constexpr (std::is_same_v<T, bool>) {
      if (bytes[1] != std::byte{0} && bytes[1] != std::byte{1})
        throw error(error_kind::mismatch, where + ": stored byte " + std::to_string(static_cast<unsigned>(bytes[1])) + " is not a bool");
    }
    std::memcpy(&x, bytes.data() + 1, sizeof(T));
  } else {
    span_streambuf buf(bytes);
    std::istream is(&buf);
    bool parsed = true;
    try {
      if constexpr (cereal_value<T>) {
        cereal::PortableBinaryInputArchive ar(is);
        ar(x);
      } else {
        is.imbue(std::locale::classic());
        is >> x;
        parsed = static_cast<bool>(is);
        is >> std::ws;
      }
    } catch (const error& e) {  // a type's own load refused what it read: say which value
      throw error(e.kind(), where + ": " + e.what());
    } catch (const std::exception& e) {
      throw error(error_kind::mismatch, where + ": cannot be read as the live type (" + e.what() + ")");
    }
    if (!parsed) throw error(error_kind::mismatch, where + ": the stored text does not parse as the live type");
    if (buf.remaining() != 0)
      throw error(error_kind::mismatch, where + ": stored " + std::to_string(bytes.size()) + " bytes, the live type read " +
                                            std::to_string(bytes.size() - buf.remaining()));
  }
}
}  // namespace detail

/// One tensor of the visited state, with its full hierarchical name.
struct tensor_entry {
  std::string name;
  tensor_ref ref;
};

/// One value of the visited state: how to turn it into bytes and back.
struct value_entry {
  std::string name;
  std::function<std::vector<std::byte>()> save;
  std::function<void(std::span<const std::byte>, const std::string& where)> load;
};

/// What the checkpoint a load reads holds under one tensor name (see `visitor::saved`).
struct saved_tensor {
  dtype type;
  shape_t shape;  ///< the global shape (a sharded tensor's whole, not one rank's slice)

  /// Elements of the global shape (metadata.json's shapes were checked not to overflow).
  std::uint64_t numel() const { return detail::element_count(shape, "saved tensor"); }
};

/// The names a load's checkpoint holds, for `visitor::saved`: the checkpointer's index of
/// metadata.json (detail::stored_index), built once per load and also used to match and plan
/// the restore.
class saved_contents {
 public:
  /// The saved dtype and global shape of tensor `name`, or nullopt.
  virtual std::optional<saved_tensor> tensor(std::string_view name) const = 0;
  /// Whether value `name` is stored.
  virtual bool value(std::string_view name) const = 0;
  /// How many tensors the checkpoint holds: a load's visitor makes room for as many (0: unknown).
  virtual std::size_t tensor_count() const { return 0; }

 protected:
  saved_contents() = default;
  saved_contents(const saved_contents&) = default;
  saved_contents& operator=(const saved_contents&) = default;
  ~saved_contents() = default;
};

/// A value type that stands for state living elsewhere (a handle, such as
/// `ckpt::libtorch::generator`): `v.value(name, handle(...))` may pass it as a temporary, which
/// the visitor keeps. Declare it with a member `using ckpt_value_handle = void;`.
template <class T>
concept value_handle = requires { typename std::remove_cvref_t<T>::ckpt_value_handle; };

/// What a Checkpointable type describes itself to. The same `checkpoint(v)` function serves
/// save and load: the visitor only records references, and ckpt reads from them on save and
/// writes into them on load.
///
/// State that does not exist until the engine has run (an optimizer's moments, created on its
/// first step) is created on load from what the checkpoint holds: `v.saved(name)` tells a
/// load's `checkpoint` the saved dtype and shape, before the tensor is registered. Once
/// registered it is an ordinary tensor: checked against the checkpoint, resharded, and counted
/// by `load_options::strict` like any other.
///
/// @code
/// struct model {
///   std::vector<float> w, b;
///   std::mt19937 rng;
///   adam opt;
///   template <class V> void checkpoint(V& v) {
///     v.tensor("fc.weight", ckpt::view(w, {64, 32}));
///     v.tensor("fc.bias", b);
///     v.value("rng", rng);
///     v.group("optimizer", opt);  // skippable on load
///   }
/// };
/// @endcode
class visitor {
 public:
  /// A visitor that skips the groups whose full names are listed (load without the optimizer).
  explicit visitor(std::vector<std::string> skip_groups = {}) : skip_(std::move(skip_groups)) {}
  /// A load's visitor: `saved` answers from `contents`, which must outlive the visit.
  visitor(std::vector<std::string> skip_groups, const saved_contents& contents) : skip_(std::move(skip_groups)), saved_(&contents) {
    reserve(contents.tensor_count());
  }

  /// Makes room for `tensors` tensors, so that recording them reallocates nothing: a capacity
  /// hint, as std::vector::reserve. A load's visitor makes room for the checkpoint's tensors by
  /// itself; the checkpointer hints each save with the tensors its last save visited.
  ///
  /// @code
  /// ckpt::visitor v;
  /// v.reserve(100'000);  // a mixture-of-experts model's tensors
  /// model.checkpoint(v);
  /// @endcode
  void reserve(std::size_t tensors) {
    tensors_.reserve(tensors);
    seen_.reserve(tensors, tensors * 32);  // room for names of 32 bytes on average
  }

  /// True while a load visits the state, false on save.
  bool loading() const noexcept { return saved_ != nullptr; }

  /// On load, the dtype and global shape the checkpoint holds for the tensor `name` (inside
  /// the current group, as `tensor` would name it); std::nullopt on save or when the
  /// checkpoint has no such tensor. It lets `checkpoint` create state that exists only once
  /// the engine has run, with the saved shape, and then register it:
  ///
  /// @code
  /// std::vector<float> exp_avg;  // empty until the optimizer's first step
  /// template <class V> void checkpoint(V& v) {
  ///   if (const auto s = v.saved("exp_avg"); s && exp_avg.empty()) exp_avg.resize(s->numel());
  ///   if (!exp_avg.empty()) v.tensor("exp_avg", exp_avg);
  /// }
  /// @endcode
  std::optional<saved_tensor> saved(std::string_view name) const {
    if (!saved_) return std::nullopt;
    return saved_->tensor(prefix_ + std::string(name));
  }
  /// On load, whether the checkpoint holds the value `name` (inside the current group); false
  /// on save.
  bool saved_value(std::string_view name) const { return saved_ && saved_->value(prefix_ + std::string(name)); }

  /// Records a tensor: a `tensor_ref`, or anything `tensor_traits` adapts (`std::vector`,
  /// `std::array`, an element-type scalar).
  template <class T>
  void tensor(std::string_view name, T&& t) {
    static_assert(detail::has_tensor_traits<T>,
                  "ckpt: v.tensor(name, x) needs x to be a ckpt::tensor_ref (ckpt::view(ptr, shape)), a "
                  "std::vector or std::array of an element type, an element-type scalar, or a type with a "
                  "ckpt::tensor_traits<T> specialisation providing `static ckpt::tensor_ref ref(T&)`");
    auto full = qualified(name);
    add_tensor(std::move(full), tensor_traits<std::remove_cvref_t<T>>::ref(t));
  }

  /// Records a value: anything cereal can serialise (counters, configs, strings, containers of
  /// them), and the engines and distributions of <random>, which are saved through their
  /// standard text form.
  template <class T>
  void value(std::string_view name, T& x) {
    static_assert(detail::storable_value<T>,
                  "ckpt: v.value(name, x) needs x to be cereal-serialisable (add `template <class A> void "
                  "serialize(A& ar) { ar(members...); }`) or streamable with << and >>");
    auto full = qualified(name);
    values_.push_back({std::move(full), [&x] { return detail::encode_value(x); },
                       [&x](std::span<const std::byte> b, const std::string& where) { detail::decode_value(b, x, where); }});
  }
  /// Records a value handle (see `value_handle`) passed as a temporary: the visitor keeps it.
  template <value_handle T>
    requires(!std::is_lvalue_reference_v<T>)
  void value(std::string_view name, T&& handle) {
    using H = std::remove_cvref_t<T>;
    static_assert(detail::storable_value<H>, "ckpt: a value handle must be cereal-serialisable or streamable");
    auto full = qualified(name);
    auto kept = std::make_shared<H>(std::forward<T>(handle));
    values_.push_back({std::move(full), [kept] { return detail::encode_value(*kept); },
                       [kept](std::span<const std::byte> b, const std::string& where) { detail::decode_value(b, *kept, where); }});
  }

  /// A named subtree: every name recorded inside `f` is prefixed with "name.". `f` is either
  /// callable with the visitor or a Checkpointable object. Load can skip a group by name
  /// (`load_options::skip_groups`, `load_optimizer = false` for "optimizer").
  template <class F>
  void group(std::string_view name, F&& f) {
    auto full = qualified(name);
    for (const auto& s : skip_)
      if (s == full) {
        skipped_.push_back(full);
        return;
      }
    const auto saved = std::move(prefix_);
    prefix_ = full + ".";
    if constexpr (std::is_invocable_v<F&, visitor&>)
      f(*this);
    else
      detail::visit_state(*this, f);
    prefix_ = std::move(saved);
  }

  /// The tensors recorded so far, in visiting order (a std::vector, in memory kept for tables:
  /// detail/table_memory.hpp).
  const detail::table_vector<tensor_entry>& tensors() const noexcept { return tensors_; }
  /// The tensors recorded so far, moved out: a save's plan takes them (and their names) instead
  /// of copying them; the visitor holds none afterwards.
  detail::table_vector<tensor_entry> take_tensors() noexcept { return std::move(tensors_); }
  /// The values recorded so far, in visiting order.
  const std::vector<value_entry>& values() const noexcept { return values_; }

  /// True when `name` lies inside a group this visitor skipped.
  bool in_skipped_group(std::string_view name) const noexcept {
    for (const auto& g : skipped_)
      if (name.size() > g.size() && name.starts_with(g) && name[g.size()] == '.') return true;
    return false;
  }

 private:
  /// `name` under the current group, checked and not named before (impl/visitor.ipp).
  std::string qualified(std::string_view name);
  /// Records a tensor, refusing what its adapter or shard spec found wrong (impl/visitor.ipp).
  void add_tensor(std::string full, tensor_ref ref);


  std::vector<std::string> skip_;
  const saved_contents* saved_ = nullptr;
  std::vector<std::string> skipped_;
  std::string prefix_;
  detail::name_set seen_;
  detail::table_vector<tensor_entry> tensors_;
  std::vector<value_entry> values_;
};

}  // namespace ckpt

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "impl/visitor.ipp"
#endif
