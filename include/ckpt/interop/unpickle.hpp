#pragma once
/// @file interop/unpickle.hpp
/// A restricted unpickler for PyTorch checkpoints: it accepts what `torch.load(weights_only=
/// True)` accepts, the plain data that GPT-NeoX, DeepSpeed and Megatron-LM put beside the
/// tensors, and nothing that could run code.
///
/// It never calls anything: the globals it accepts are interpreted by ckpt itself as data, and
/// everything else is refused by name. Besides OrderedDict, the torch tensor rebuild functions
/// and torch storage types, those are: `argparse.Namespace` (the attributes, as a dict),
/// `set`/`frozenset`, `collections.defaultdict`, `torch.Size`, `torch.dtype` values such as
/// `torch.float16`, and numpy's arrays, dtypes and scalars (`np.random.get_state()`), each
/// marked with its `py_class`. Every length is checked against the remaining input before anything is allocated,
/// memo indices are bounded by what was stored, objects are counted and nesting depth is
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
#include "pickle_opcodes.hpp"
#include "py_object.hpp"

namespace ckpt::interop {

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
          check_expansion(result);
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
          const auto state = pop(c);
          build(top(c), state);
          break;
        }
        case op::NEWOBJ: {
          // cls.__new__(cls, *args), how protocol 2 pickles an instance: only for the classes
          // of plain data, which take no arguments (their state comes by BUILD).
          const auto args = pop(c);
          const auto cls = top(c);
          if (nodes_[cls].kind != pk::callable) fail("NEWOBJ may only make an allowed class, not a " + describe(cls));
          if (nodes_[args].kind != pk::tuple) fail("NEWOBJ arguments must be a tuple, not a " + describe(args));
          stack_.back() = instance(cls, nodes_[args].items, "NEWOBJ");
          break;
        }
        case op::EMPTY_SET: {
          const auto n = make(pk::list);
          nodes_[n].cls = py_class::set;
          push(n);
          break;
        }
        case op::ADDITEMS: {
          const auto items = pop_mark(c);
          const auto n = top(c);
          if (nodes_[n].kind != pk::list || nodes_[n].cls != py_class::set) fail("ADDITEMS needs a set, not a " + describe(n));
          add_to_set(n, items);
          break;
        }
        case op::FROZENSET: {
          const auto items = pop_mark(c);
          const auto n = make(pk::list);
          nodes_[n].cls = py_class::frozenset;
          add_to_set(n, items);
          push(n);
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
    none, boolean, integer, floating, string, bytes, list, tuple, dict, tensor, callable, storage_type, storage,
    ndarray  // a numpy array until its BUILD: items {dtype node, shape tuple node}, s its bytes
  };
  enum class fn : std::uint8_t {
    ordered_dict, rebuild_tensor_v2, rebuild_tensor_v3, rebuild_tensor, rebuild_parameter, rebuild_parameter_with_state,
    codecs_encode, empty_bytes,
    // classes and functions of plain data (the writers' args, RNG states and bookkeeping)
    namespace_class, set_class, frozenset_class, defaultdict_class, torch_size_class, object_class, copyreg_reconstructor,
    numpy_reconstruct, numpy_ndarray_class, numpy_dtype_class, numpy_scalar,
    factory_type,     // builtins.list, dict, int, ...: only as a defaultdict's factory
    attribute_class,  // an attribute holder of the frameworks': made empty, filled by BUILD
    enum_class,       // an enum of the frameworks': Enum(value)
    getattr_enum      // getattr(Enum, 'name'), how Python 3.11 pickles an enum member
  };
  struct pnode {
    pk kind = pk::none;
    py_class cls = py_class::builtin;  // the class a container, str or array was made as
    std::uint32_t cls_name = 0;        // object and enum_member: index in class_names_
    bool flag = false;        // bool value; tensor requires_grad; ndarray: built
    std::int64_t i = 0;       // int; callable: fn; storage_type: dtype id (0: unsupported; untyped_storage);
                              // tensor/storage: side index
    double f = 0;
    std::string s;            // str, bytes; callable and storage_type: the global's full name
    std::vector<std::uint32_t> items;  // list, tuple; dict: key, value, key, value, ...
  };
  struct pstorage {
    std::uint32_t type = 0;  // storage_type node
    std::string key, location;
    std::uint64_t numel = 0;
  };
  // storage_type's i for torch.storage.UntypedStorage: bytes, typed by the tensor (_rebuild_tensor_v3).
  static constexpr std::int64_t untyped_storage = -1;
  struct ptensor {
    std::uint32_t storage = 0;  // storage node
    std::uint8_t type = 0;      // _rebuild_tensor_v3's dtype id; 0: the storage type's
    std::string other_dtype;    // _rebuild_tensor_v3's dtype when ckpt has none for it ("complex64")
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
    if ((x.cls == py_class::object || x.cls == py_class::enum_member) && x.kind != pk::callable)
      return ckpt::detail::printable(class_names_[x.cls_name]);
    if (x.cls != py_class::builtin && x.kind != pk::callable) return std::string(to_string(x.cls));
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
      case pk::ndarray: return "numpy.ndarray";
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
    const bool word = !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
      return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
    });
    if (full == "collections.OrderedDict") return callable(fn::ordered_dict);
    if (full == "torch._utils._rebuild_tensor_v2") return callable(fn::rebuild_tensor_v2);
    if (full == "torch._utils._rebuild_tensor_v3") return callable(fn::rebuild_tensor_v3);
    if (full == "torch._utils._rebuild_tensor") return callable(fn::rebuild_tensor);
    if (full == "torch._utils._rebuild_parameter") return callable(fn::rebuild_parameter);
    if (full == "torch._utils._rebuild_parameter_with_state") return callable(fn::rebuild_parameter_with_state);
    if (full == "_codecs.encode") return callable(fn::codecs_encode);
    if (full == "builtins.bytes" || full == "__builtin__.bytes") return callable(fn::empty_bytes);
    // Plain data the training frameworks save beside the tensors (docs/cli.md lists them).
    if (full == "argparse.Namespace") return callable(fn::namespace_class);
    if (full == "builtins.set" || full == "__builtin__.set") return callable(fn::set_class);
    if (full == "builtins.frozenset" || full == "__builtin__.frozenset") return callable(fn::frozenset_class);
    if (full == "collections.defaultdict") return callable(fn::defaultdict_class);
    if (full == "torch.Size") return callable(fn::torch_size_class);
    if (full == "builtins.object" || full == "__builtin__.object") return callable(fn::object_class);
    if (full == "copyreg._reconstructor" || full == "copy_reg._reconstructor") return callable(fn::copyreg_reconstructor);
    if (full == "numpy.core.multiarray._reconstruct" || full == "numpy._core.multiarray._reconstruct")
      return callable(fn::numpy_reconstruct);
    if (full == "numpy.ndarray") return callable(fn::numpy_ndarray_class);
    if (full == "numpy.dtype") return callable(fn::numpy_dtype_class);
    if (full == "numpy.core.multiarray.scalar" || full == "numpy._core.multiarray.scalar") return callable(fn::numpy_scalar);
    if (module == "builtins" || module == "__builtin__") {
      static constexpr std::string_view factories[] = {"list", "dict", "int", "float", "str", "tuple", "bool"};
      if (std::find(std::begin(factories), std::end(factories), name) != std::end(factories)) return callable(fn::factory_type);
    }
    if (is_attribute_class(full)) return callable(fn::attribute_class);
    if (is_enum_class(full)) return callable(fn::enum_class);
    if (full == "builtins.getattr" || full == "__builtin__.getattr") return callable(fn::getattr_enum);
    if (module == "signal" && word && name.starts_with("SIG") && name != "SIG_DFL" && name != "SIG_IGN") {
      // Python <= 3.11 pickles a signal.Signals member as the module's constant (signal.SIGTERM).
      const auto n = make(pk::string);
      nodes_[n].cls = py_class::enum_member;
      nodes_[n].cls_name = class_name("signal.Signals");
      nodes_[n].s = name;
      return n;
    }
    if (module == "torch" && is_torch_dtype_name(name)) {
      // torch.dtype pickles as the global itself (torch.float16): a value, not something to call.
      const auto n = make(pk::string);
      nodes_[n].cls = py_class::torch_dtype;
      nodes_[n].s = name;
      return n;
    }
    // torch >= 2.1 stores the dtypes that have no legacy storage class (uint16 and wider
    // unsigned, float8) as an untyped storage of bytes that _rebuild_tensor_v3 types.
    if (full == "torch.storage.UntypedStorage" || full == "torch.UntypedStorage") {
      const auto n = make(pk::storage_type);
      nodes_[n].i = untyped_storage;
      nodes_[n].s = full;
      return n;
    }
    // A storage class is only a type tag inside a persistent id; it is never called. Classes
    // ckpt has no dtype for (complex, quantized) are kept so the error can name the tensor.
    if (module == "torch" && word && name.ends_with("Storage") && name != "Storage") {
      const auto n = make(pk::storage_type);
      const auto t = dtype_of_torch_storage(name);
      nodes_[n].i = t ? static_cast<std::int64_t>(*t) : 0;
      nodes_[n].s = full;
      return n;
    }
    fail("global " + ckpt::detail::printable(full) +
         " is not allowed (a checkpoint may only use collections.OrderedDict, the torch._utils tensor rebuild "
         "functions, torch storage types (torch.storage.UntypedStorage too), torch.Size and torch dtypes, "
         "argparse.Namespace, set, frozenset, "
         "collections.defaultdict, and numpy arrays, dtypes and scalars)");
  }

  /// Classes the frameworks save whose instances are only attributes (NEWOBJ, then BUILD with
  /// their __dict__): DeepSpeed's loss scalers and ZeRO's fragment addresses, Megatron's
  /// optimizer config, types.SimpleNamespace. Read as data; nothing of theirs runs.
  static bool is_attribute_class(std::string_view full) {
    static constexpr std::string_view classes[] = {
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", "deepspeed.runtime.fp16.loss_scaler.LossScaler",
        "deepspeed.utils.tensor_fragment.fragment_address", "megatron.core.optimizer.optimizer_config.OptimizerConfig",
        "types.SimpleNamespace"};
    return std::find(std::begin(classes), std::end(classes), full) != std::end(classes);
  }
  /// Enums the frameworks save (DeepSpeed's ZeRO stage, Megatron's model type and attention
  /// settings in its args, the signal its args name).
  static bool is_enum_class(std::string_view full) {
    static constexpr std::string_view enums[] = {
        "deepspeed.runtime.zero.config.ZeroStageEnum", "megatron.core.enums.ModelType", "megatron.model.enums.ModelType",
        "megatron.core.transformer.enums.AttnBackend", "megatron.core.transformer.enums.AttnMaskType",
        "megatron.core.transformer.enums.CudaGraphModule", "megatron.core.transformer.enums.CudaGraphScope",
        "megatron.core.transformer.enums.InferenceCudaGraphScope", "megatron.core.rerun_state_machine.RerunMode",
        "megatron.core.rerun_state_machine.RerunState", "megatron.core.rerun_state_machine.RerunDiagnostic",
        "signal.Signals"};
    return std::find(std::begin(enums), std::end(enums), full) != std::end(enums);
  }
  std::uint32_t class_name(const std::string& full) {
    const auto it = std::find(class_names_.begin(), class_names_.end(), full);
    if (it != class_names_.end()) return static_cast<std::uint32_t>(it - class_names_.begin());
    class_names_.push_back(full);
    return static_cast<std::uint32_t>(class_names_.size() - 1);
  }

  static std::string supported_torch_dtypes() {
    std::string out;
    for (std::uint8_t id = 1; id <= last_dtype_id; ++id) {
      if (!out.empty()) out += ", ";
      out += torch_dtype_name(static_cast<dtype>(id));
    }
    return out;
  }

  static bool is_torch_dtype_name(std::string_view name) {
    static constexpr std::string_view names[] = {
        "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool", "uint16", "uint32",
        "uint64", "complex32", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
        "float8_e8m0fnu", "qint8", "quint8", "qint32", "quint4x2", "quint2x4", "double", "float", "half", "long", "int",
        "short", "cfloat", "cdouble", "chalf"};
    return std::find(std::begin(names), std::end(names), name) != std::end(names);
  }

  /// A set's elements, each once (Python keeps the first of equal elements).
  void add_to_set(std::uint32_t set, std::span<const std::uint32_t> items) {
    for (const auto item : items) {
      const auto [it, fresh] = dict_index_.try_emplace({set, key_class(item, 0)}, nodes_[set].items.size());
      if (fresh) nodes_[set].items.push_back(item);
    }
  }

  /// OrderedDict([(k, v), ...]): the pairs into dict `d`.
  void set_pairs(std::uint32_t d, std::uint32_t pairs, const std::string& name) {
    const auto& l = nodes_[pairs];
    if (l.kind != pk::list && l.kind != pk::tuple) fail(name + " takes a list of (key, value) pairs, not a " + describe(pairs));
    std::vector<std::uint32_t> kv;
    for (const auto p : l.items) {
      if (nodes_[p].kind != pk::tuple || nodes_[p].items.size() != 2) fail(name + " takes (key, value) pairs, not a " + describe(p));
      kv.push_back(nodes_[p].items[0]);
      kv.push_back(nodes_[p].items[1]);
    }
    set_items(d, kv);
  }

  /// An instance of an allowed class of plain data, before its state (BUILD).
  std::uint32_t instance(std::uint32_t cls, std::span<const std::uint32_t> args, const char* how) {
    const auto f = static_cast<fn>(nodes_[cls].i);
    const std::string name = nodes_[cls].s;  // a copy: make() may move the nodes
    if (f == fn::namespace_class) {
      arity(name, args.size(), 0, 0);
      const auto d = make(pk::dict);
      nodes_[d].cls = py_class::argparse_namespace;
      return d;
    }
    if (f == fn::ordered_dict) {
      arity(name, args.size(), 0, 0);
      const auto d = make(pk::dict);
      nodes_[d].cls = py_class::ordered_dict;
      return d;
    }
    if (f == fn::attribute_class) {
      arity(name, args.size(), 0, 0);
      const auto d = make(pk::dict);
      nodes_[d].cls = py_class::object;
      nodes_[d].cls_name = class_name(name);
      return d;
    }
    fail(std::string(how) + " may not make " + ckpt::detail::printable(name) +
         " (only argparse.Namespace, collections.OrderedDict and the frameworks' attribute holders are made this way)");
  }

  /// BUILD: an object's state after it was made. Only the objects of plain data take one.
  void build(std::uint32_t target, std::uint32_t state) {
    auto& t = nodes_[target];
    const auto& st = nodes_[state];
    if (t.kind == pk::dict && t.cls == py_class::ordered_dict) {
      // torch.save's one BUILD: attributes of a state dict (`_metadata`), not part of the data.
      if (st.kind != pk::dict && st.kind != pk::none) fail("BUILD state of an OrderedDict must be a dict, not a " + describe(state));
      return;
    }
    if (t.kind == pk::dict && (t.cls == py_class::argparse_namespace || t.cls == py_class::object)) {
      // The instance's __dict__, or (__dict__, slots) as copyreg makes it.
      std::uint32_t attrs = state;
      if (st.kind == pk::tuple && st.items.size() == 2 && nodes_[st.items[1]].kind == pk::none) attrs = st.items[0];
      const std::string what = describe(target);
      if (nodes_[attrs].kind != pk::dict) fail("BUILD state of an " + what + " must be a dict, not a " + describe(attrs));
      for (std::size_t i = 0; i < nodes_[attrs].items.size(); i += 2)
        if (nodes_[nodes_[attrs].items[i]].kind != pk::string)
          fail(what + " attribute names must be strings, not a " + describe(nodes_[attrs].items[i]));
      const std::vector<std::uint32_t> kv = nodes_[attrs].items;
      set_items(target, kv);
      return;
    }
    if (t.kind == pk::string && t.cls == py_class::numpy_dtype) return build_numpy_dtype(target, state);
    if (t.kind == pk::ndarray) return build_numpy_array(target, state);
    fail("BUILD is only allowed on an OrderedDict, an argparse.Namespace and numpy arrays and dtypes, not on a " +
         describe(target));
  }

  // ----- numpy ---------------------------------------------------------------------------------
  // A dtype is kept as its array-protocol string ("<u4", "|b1"); an array as that string, its
  // shape and its bytes in C order. Only numeric dtypes: an object array could hold anything.

  /// Bytes of one element of numpy type code `code` ("u4" -> 4), or 0 if ckpt does not read it.
  static std::size_t numpy_itemsize(std::string_view code) {
    if (code.size() < 2) return 0;
    const char k = code[0];
    if (k != 'b' && k != 'i' && k != 'u' && k != 'f' && k != 'c') return 0;
    std::size_t n = 0;
    const auto r = std::from_chars(code.data() + 1, code.data() + code.size(), n);
    if (r.ec != std::errc{} || r.ptr != code.data() + code.size()) return 0;
    const bool ok = (k == 'b' && n == 1) || ((k == 'i' || k == 'u') && (n == 1 || n == 2 || n == 4 || n == 8)) ||
                    (k == 'f' && (n == 2 || n == 4 || n == 8)) || (k == 'c' && (n == 8 || n == 16));
    return ok ? n : 0;
  }

  /// numpy.dtype(code, align, copy): the type code; its byte order comes with BUILD.
  std::uint32_t numpy_dtype(std::span<const std::uint32_t> args, const std::string& name) {
    arity(name, args.size(), 1, 3);
    if (nodes_[args[0]].kind != pk::string || numpy_itemsize(nodes_[args[0]].s) == 0)
      fail("numpy dtype " + (nodes_[args[0]].kind == pk::string ? ckpt::detail::printable(nodes_[args[0]].s) : describe(args[0])) +
           " is not a numeric dtype ckpt reads (bool, int, uint, float and complex of the usual sizes)");
    const std::string code = nodes_[args[0]].s;  // a copy: make() may move the nodes
    const auto n = make(pk::string);
    nodes_[n].cls = py_class::numpy_dtype;
    nodes_[n].s = (numpy_itemsize(code) == 1 ? "|" : "<") + code;
    return n;
  }
  /// (version, byte order, subarray, names, fields, elsize, alignment, flags): only the order matters.
  void build_numpy_dtype(std::uint32_t target, std::uint32_t state) {
    const auto& st = nodes_[state];
    if (st.kind != pk::tuple || st.items.size() < 2 || nodes_[st.items[1]].kind != pk::string)
      fail("BUILD state of a numpy dtype must be a tuple starting (version, byte order), not a " + describe(state));
    const std::string& order = nodes_[st.items[1]].s;
    if (order != "<" && order != ">" && order != "|" && order != "=")
      fail("numpy dtype byte order " + ckpt::detail::printable(order) + " is not one of <, >, |, =");
    for (std::size_t i = 2; i < std::min<std::size_t>(st.items.size(), 5); ++i)
      if (nodes_[st.items[i]].kind != pk::none) fail("structured numpy dtypes (subarrays, fields) are not supported");
    // One-byte types have no order ('|'); "=" and "|" on a wider one mean this machine's,
    // little-endian wherever ckpt runs.
    auto& d = nodes_[target].s;
    if (d[0] != '|') d[0] = order == ">" ? '>' : '<';
  }
  std::uint32_t numpy_array(std::span<const std::uint32_t> args, const std::string& name) {
    // _reconstruct(numpy.ndarray, (0,), b'b'): an empty array, filled by BUILD.
    arity(name, args.size(), 3, 3);
    if (nodes_[args[0]].kind != pk::callable || static_cast<fn>(nodes_[args[0]].i) != fn::numpy_ndarray_class)
      fail(name + " may only make a numpy.ndarray, not a " + describe(args[0]));
    const auto n = make(pk::ndarray);
    nodes_[n].items = {0, 0};
    return n;
  }
  /// (version, shape, dtype, is_fortran, raw bytes), or without the version.
  void build_numpy_array(std::uint32_t target, std::uint32_t state) {
    const auto& st = nodes_[state];
    if (st.kind != pk::tuple || (st.items.size() != 5 && st.items.size() != 4))
      fail("BUILD state of a numpy array must be (version, shape, dtype, is_fortran, data), not a " + describe(state));
    const std::size_t at = st.items.size() == 5 ? 1 : 0;
    const auto shape = arg_dims(st.items[at], "numpy array shape");
    const auto dt = st.items[at + 1];
    if (nodes_[dt].kind != pk::string || nodes_[dt].cls != py_class::numpy_dtype)
      fail("numpy array dtype must be a numpy.dtype, not a " + describe(dt));
    const bool fortran = arg_bool(st.items[at + 2], "numpy array is_fortran") && shape.size() > 1;
    const auto& data = nodes_[st.items[at + 3]];
    if (data.kind != pk::bytes) fail("numpy array data must be bytes (an object array is not data), not a " + describe(st.items[at + 3]));
    std::uint64_t count = numpy_itemsize(std::string_view(nodes_[dt].s).substr(1));
    for (const auto d : shape)
      if (d != 0 && count > std::numeric_limits<std::uint64_t>::max() / d) fail("numpy array shape overflows 64 bits");
      else count *= d;
    if (count != data.s.size())
      fail("numpy array of shape " + ckpt::detail::to_string(shape) + " and dtype " + nodes_[dt].s + " needs " +
           std::to_string(count) + " bytes, its data has " + std::to_string(data.s.size()));
    auto& t = nodes_[target];
    if (t.flag) fail("BUILD of a numpy array that was already built");
    const auto shape_node = st.items[at];
    std::string bytes = fortran ? c_order(data.s, shape, numpy_itemsize(std::string_view(nodes_[dt].s).substr(1))) : data.s;
    t.flag = true;
    t.items = {dt, shape_node};
    t.s = std::move(bytes);
  }
  /// The elements of a Fortran-ordered array (first index fastest), in C order (last fastest).
  static std::string c_order(const std::string& f, std::span<const std::uint64_t> shape, std::size_t item) {
    std::string out(f.size(), '\0');
    const std::size_t rank = shape.size();
    std::vector<std::uint64_t> fstride(rank, 1), index(rank, 0);
    for (std::size_t k = 1; k < rank; ++k) fstride[k] = fstride[k - 1] * shape[k - 1];
    const std::uint64_t count = item ? f.size() / item : 0;
    for (std::uint64_t c = 0; c < count; ++c) {  // c walks C order; index is its multi-index
      std::uint64_t at = 0;
      for (std::size_t k = 0; k < rank; ++k) at += index[k] * fstride[k];
      std::memcpy(out.data() + c * item, f.data() + at * item, item);
      for (std::size_t k = rank; k-- > 0;) {
        if (++index[k] < shape[k]) break;
        index[k] = 0;
      }
    }
    return out;
  }
  /// numpy.core.multiarray.scalar(dtype, bytes): the Python number it holds.
  std::uint32_t numpy_scalar(std::span<const std::uint32_t> args, const std::string& name) {
    arity(name, args.size(), 2, 2);
    if (nodes_[args[0]].kind != pk::string || nodes_[args[0]].cls != py_class::numpy_dtype)
      fail(name + " needs a numpy.dtype, not a " + describe(args[0]));
    if (nodes_[args[1]].kind != pk::bytes) fail(name + " needs the scalar's bytes, not a " + describe(args[1]));
    const std::string dtype = nodes_[args[0]].s, raw = nodes_[args[1]].s;  // copies: make() may move the nodes
    const std::string_view d = dtype;
    const std::size_t size = numpy_itemsize(d.substr(1));
    if (raw.size() != size)
      fail("numpy scalar of dtype " + dtype + " has " + std::to_string(raw.size()) + " bytes, not " + std::to_string(size));
    std::uint64_t bits = 0;
    for (std::size_t i = 0; i < size; ++i) {
      const auto b = static_cast<std::uint8_t>(raw[d[0] == '>' ? i : size - 1 - i]);
      bits = (bits << 8) | b;
    }
    const char k = d[1];
    if (k == 'b') {
      const auto n = make(pk::boolean);
      nodes_[n].flag = bits != 0;
      return n;
    }
    if (k == 'i' || k == 'u') {
      std::int64_t v = static_cast<std::int64_t>(bits);
      if (k == 'i' && size < 8 && (bits >> (8 * size - 1)) & 1) v = static_cast<std::int64_t>(bits | (~std::uint64_t{0} << (8 * size)));
      if (k == 'u' && size == 8 && bits > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail("numpy uint64 scalar " + std::to_string(bits) + " does not fit a 64-bit int");
      const auto n = make(pk::integer);
      nodes_[n].i = v;
      return n;
    }
    if (k == 'f') {
      double v = 0;
      if (size == 8) v = std::bit_cast<double>(bits);
      else if (size == 4) v = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
      else v = float16::to_float(static_cast<std::uint16_t>(bits));
      const auto n = make(pk::floating);
      nodes_[n].f = v;
      return n;
    }
    fail("numpy scalar of dtype " + dtype + " (complex) is not supported");
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
        // OrderedDict() or, from some writers, OrderedDict([(key, value), ...]).
        arity(name, args.size(), 0, 1);
        const auto d = make(pk::dict);
        nodes_[d].cls = py_class::ordered_dict;
        if (args.size() == 1) set_pairs(d, args[0], name);
        return d;
      }
      case fn::namespace_class: return instance(callee, args, "REDUCE");
      case fn::set_class: case fn::frozenset_class: {
        // set([items]) or set(): protocol 2's way of pickling a set.
        arity(name, args.size(), 0, 1);
        const auto n = make(pk::list);
        nodes_[n].cls = f == fn::set_class ? py_class::set : py_class::frozenset;
        if (args.size() == 1) {
          const auto& l = nodes_[args[0]];
          if (l.kind != pk::list && l.kind != pk::tuple) fail(name + " takes a list of its elements, not a " + describe(args[0]));
          const std::vector<std::uint32_t> items = l.items;
          add_to_set(n, items);
        }
        return n;
      }
      case fn::defaultdict_class: {
        // defaultdict(factory): the items follow by SETITEMS; the factory is not data.
        arity(name, args.size(), 0, 1);
        if (args.size() == 1 && nodes_[args[0]].kind != pk::none &&
            !(nodes_[args[0]].kind == pk::callable && static_cast<fn>(nodes_[args[0]].i) == fn::factory_type))
          fail(name + "'s default factory may only be None or a builtin type (list, dict, int, ...), not a " + describe(args[0]));
        const auto d = make(pk::dict);
        nodes_[d].cls = py_class::defaultdict;
        return d;
      }
      case fn::torch_size_class: {
        arity(name, args.size(), 0, 1);
        const auto n = make(pk::tuple);
        nodes_[n].cls = py_class::torch_size;
        if (args.size() == 1) {
          const auto dims = arg_dims(args[0], "torch.Size");
          (void)dims;  // checked: non-negative ints
          nodes_[n].items = nodes_[args[0]].items;
        }
        return n;
      }
      case fn::copyreg_reconstructor: {
        // copyreg._reconstructor(cls, object, None), protocols 0 and 1's way of making an instance.
        arity(name, args.size(), 3, 3);
        const auto cls = args[0];
        if (nodes_[cls].kind != pk::callable) fail(name + " needs an allowed class, not a " + describe(cls));
        if (nodes_[args[1]].kind != pk::callable || static_cast<fn>(nodes_[args[1]].i) != fn::object_class ||
            nodes_[args[2]].kind != pk::none)
          fail(name + " is only allowed as copyreg._reconstructor(cls, object, None)");
        return instance(cls, {}, "copyreg._reconstructor");
      }
      case fn::attribute_class: return instance(callee, args, "REDUCE");  // types.SimpleNamespace()
      case fn::enum_class: {
        // Enum(value): the member, kept as its value.
        arity(name, args.size(), 1, 1);
        const auto& v = nodes_[args[0]];
        if (v.kind != pk::integer && v.kind != pk::string)
          fail(name + " takes its member's value (an int or a str), not a " + describe(args[0]));
        const auto n = make(v.kind);
        nodes_[n] = nodes_[args[0]];
        nodes_[n].cls = py_class::enum_member;
        nodes_[n].cls_name = class_name(name);
        return n;
      }
      case fn::getattr_enum: {
        // getattr(Enum, 'NAME'): only an allowed enum's member, kept as its name.
        arity(name, args.size(), 2, 2);
        if (nodes_[args[0]].kind != pk::callable || static_cast<fn>(nodes_[args[0]].i) != fn::enum_class)
          fail(name + " is only allowed on the frameworks' enums, not on a " + describe(args[0]));
        const pnode e = nodes_[args[0]], member = nodes_[args[1]];  // copies: make() may move the nodes
        if (member.kind != pk::string || member.s.empty() || member.s.size() > 128 ||
            !std::all_of(member.s.begin(), member.s.end(), [](char ch) {
              return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
            }))
          fail(name + " takes an enum member's name (letters, digits, '_'), not a " + describe(args[1]));
        const auto n = make(pk::string);
        nodes_[n].s = member.s;
        nodes_[n].cls = py_class::enum_member;
        nodes_[n].cls_name = class_name(e.s);
        return n;
      }
      case fn::numpy_reconstruct: return numpy_array(args, name);
      case fn::numpy_dtype_class: return numpy_dtype(args, name);
      case fn::numpy_scalar: return numpy_scalar(args, name);
      case fn::numpy_ndarray_class: case fn::object_class: case fn::factory_type:
        fail(name + " may not be called here");
      case fn::rebuild_tensor: case fn::rebuild_tensor_v2: case fn::rebuild_tensor_v3: {
        // (storage, storage_offset, size, stride[, requires_grad, backward_hooks[, metadata]]);
        // v3: (storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype[, metadata])
        if (f == fn::rebuild_tensor) arity(name, args.size(), 4, 4);
        else if (f == fn::rebuild_tensor_v2) arity(name, args.size(), 6, 7);
        else arity(name, args.size(), 7, 8);
        if (nodes_[args[0]].kind != pk::storage) fail(name + " needs a storage, not a " + describe(args[0]));
        const bool untyped = nodes_[storages_[static_cast<std::size_t>(nodes_[args[0]].i)].type].i == untyped_storage;
        if (untyped != (f == fn::rebuild_tensor_v3))
          fail(untyped ? name + " cannot type an untyped storage (only torch._utils._rebuild_tensor_v3 does)"
                       : name + " needs a torch.storage.UntypedStorage, not a typed storage");
        ptensor t;
        t.storage = args[0];
        if (f == fn::rebuild_tensor_v3) {
          const auto& d = nodes_[args[6]];
          if (d.kind != pk::string || d.cls != py_class::torch_dtype) fail(name + " needs a torch dtype, not a " + describe(args[6]));
          if (const auto dt = dtype_of_torch_dtype(d.s))
            t.type = static_cast<std::uint8_t>(*dt);
          else
            t.other_dtype = d.s;  // refused when the tensor is converted, naming its path
        }
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
        const std::size_t meta = f == fn::rebuild_tensor_v3 ? 7 : 6;
        if (args.size() == meta + 1 && nodes_[args[meta]].kind != pk::none && nodes_[args[meta]].kind != pk::dict)
          fail("tensor metadata must be None or a dict, not a " + describe(args[meta]));
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

  /// The bytes of the result node `n` itself stands for (its children not included).
  std::uint64_t own_bytes(std::uint32_t n) const {
    const pnode& x = nodes_[n];
    std::uint64_t bytes = sizeof(py_object) + x.s.size();
    if (x.kind == pk::tensor) {
      const auto& t = tensors_[static_cast<std::size_t>(x.i)];
      const auto& st = storages_[static_cast<std::size_t>(nodes_[t.storage].i)];
      bytes += sizeof(py_tensor) + 2 * sizeof(std::uint64_t) * t.shape.size() + st.key.size() + st.location.size();
    }
    return bytes;
  }

  /// What converting a node makes: objects and bytes, each shared reference counted every time
  /// it is reached (convert copies it each time), saturating at the largest count. Not
  /// `complete` where the count stopped at a node convert refuses (a container that contains
  /// itself, nesting past the limit): then it is what convert makes before it gets there.
  struct expansion {
    std::uint64_t objects = 0, bytes = 0;
    bool complete = true;
  };
  static std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
    return a > std::numeric_limits<std::uint64_t>::max() - b ? std::numeric_limits<std::uint64_t>::max() : a + b;
  }

  /// The expansion of `n`, each node's computed once (`memo`, `state`: 0 new, 1 on the path, 2
  /// done), in convert's order, up to the first node convert refuses for its place.
  expansion expanded(std::uint32_t n, std::size_t depth, std::vector<expansion>& memo, std::vector<std::uint8_t>& state) const {
    if (depth > limits_.max_depth || state[n] == 1) return {0, 0, false};
    if (state[n] == 2) return memo[n];
    state[n] = 1;
    const pnode& x = nodes_[n];
    expansion e{1, own_bytes(n)};
    std::span<const std::uint32_t> children;
    if (x.kind == pk::list || x.kind == pk::tuple || x.kind == pk::dict) children = x.items;
    else if (x.kind == pk::ndarray && x.flag) children = std::span<const std::uint32_t>(x.items).subspan(1, 1);  // the shape
    for (const auto child : children) {
      const auto c = expanded(child, depth + 1, memo, state);
      e.objects = saturating_add(e.objects, c.objects);
      e.bytes = saturating_add(e.bytes, c.bytes);
      if (!c.complete) return {e.objects, e.bytes, false};  // the rest is never reached
    }
    state[n] = 2;
    return memo[n] = e;
  }

  /// Refuses, before converting anything, a result whose shared references expand past the
  /// limits: a few hundred bytes of pickle can reference one list from another 2^40 times over,
  /// and convert would otherwise build max_objects objects (hundreds of MiB) before it stopped.
  /// An expansion cut short by a node convert refuses is checked too: convert would make at
  /// least that much before it reached that node. (Otherwise convert reports that node.)
  void check_expansion(std::uint32_t root) const {
    std::vector<expansion> memo(nodes_.size());
    std::vector<std::uint8_t> state(nodes_.size(), 0);
    const auto e = expanded(root, 0, memo, state);
    const auto count = [](std::uint64_t n) {
      return n == std::numeric_limits<std::uint64_t>::max() ? std::string("2^64 or more") : std::to_string(n);
    };
    if (e.objects > limits_.max_objects)
      fail_at("", "more than " + std::to_string(limits_.max_objects) + " objects (shared references included): " + count(e.objects));
    if (e.bytes > limits_.max_result_bytes)
      fail_at("", "the result would exceed " + std::to_string(limits_.max_result_bytes) +
                      " bytes (shared references are copied): " + count(e.bytes));
  }

  py_object convert(std::uint32_t n, std::size_t depth, std::string& path) {
    if (depth > limits_.max_depth)
      fail_at(path, "nesting deeper than " + std::to_string(limits_.max_depth) + " levels");
    if (++converted_ > limits_.max_objects)
      fail_at(path, "more than " + std::to_string(limits_.max_objects) + " objects (shared references included)");
    const pnode& x = nodes_[n];
    result_bytes_ += own_bytes(n);
    if (result_bytes_ > limits_.max_result_bytes)
      fail_at(path, "the result would exceed " + std::to_string(limits_.max_result_bytes) +
                        " bytes (shared references are copied)");
    switch (x.kind) {
      case pk::none: return py_object();
      case pk::boolean: return py_object(x.flag);
      case pk::integer: return py_object(x.i).with_class(x.cls, class_of(x));
      case pk::floating: return py_object(x.f);
      case pk::string: return py_object(x.s).with_class(x.cls, class_of(x));
      case pk::bytes: return py_object::bytes(x.s);
      case pk::callable: case pk::storage_type:
        fail_at(path, "global " + ckpt::detail::printable(x.s) + " cannot be used as a value");
      case pk::storage: fail_at(path, "a bare storage cannot be used as a value");
      case pk::tensor: return tensor(n, path);
      case pk::ndarray: {
        if (!x.flag) fail_at(path, "a numpy array without its data (no BUILD)");
        auto shape = convert(x.items[1], depth + 1, path);
        return py_object::tuple({py_object(nodes_[x.items[0]].s).with_class(py_class::numpy_dtype), std::move(shape),
                                 py_object::bytes(x.s)})
            .with_class(py_class::numpy_array);
      }
      case pk::list: case pk::tuple: case pk::dict: break;
    }
    if (on_path_[n]) fail_at(path, "recursive structure (a container contains itself)");
    on_path_[n] = 1;
    const std::size_t mark = path.size();
    py_object out;
    if (x.kind == pk::dict) {
      out = (nodes_[n].cls == py_class::ordered_dict ? py_object::ordered_dict() : py_object::dict()).with_class(x.cls, class_of(x));
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
      out = (x.kind == pk::list ? py_object::list(std::move(items)) : py_object::tuple(std::move(items))).with_class(x.cls);
    }
    path.resize(mark);
    on_path_[n] = 0;
    return out;
  }

  std::string class_of(const pnode& x) const {
    return x.cls == py_class::object || x.cls == py_class::enum_member ? class_names_[x.cls_name] : std::string();
  }

  py_object tensor(std::uint32_t n, const std::string& path) const {
    const auto& t = tensors_[static_cast<std::size_t>(nodes_[n].i)];
    const auto& s = storages_[static_cast<std::size_t>(nodes_[t.storage].i)];
    const auto& type = nodes_[s.type];
    if (type.i == 0)
      throw error(error_kind::invalid_argument,
                  source_ + ": tensor " + path_or_root(path) + " has storage type " + ckpt::detail::printable(type.s) +
                      ", a dtype ckpt does not support (supported: " + supported_torch_dtypes() + ")");
    if (!t.other_dtype.empty())
      throw error(error_kind::invalid_argument, source_ + ": tensor " + path_or_root(path) + " has dtype torch." +
                                                    t.other_dtype + ", which ckpt does not support (supported: " +
                                                    supported_torch_dtypes() + ")");
    py_tensor out;
    out.value.type = static_cast<dtype>(t.type ? t.type : type.i);
    out.value.shape = t.shape;
    std::uint64_t numel = s.numel;
    if (type.i == untyped_storage) {  // bytes: a whole number of the tensor's elements
      const auto es = size_of(out.value.type);
      if (numel % es != 0)
        fail_at(path, "tensor of dtype " + std::string(to_string(out.value.type)) + " has an untyped storage " +
                          ckpt::detail::printable(s.key) + " of " + std::to_string(numel) + " bytes, not a multiple of " +
                          std::to_string(es));
      numel /= es;
    }
    out.storage = torch_storage{s.key, numel, s.location, t.offset, t.stride};
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
  std::vector<std::string> class_names_{""};  // of objects and enum members; 0: none
  std::vector<std::uint8_t> on_path_;
  std::uint64_t converted_ = 0, result_bytes_ = 0;
};

}  // namespace detail

/// Unpickles `data` without running anything: only plain containers, numbers, strings, bytes
/// and torch tensors (`_rebuild_tensor_v2`, torch >= 2.1's `_rebuild_tensor_v3`,
/// `_rebuild_parameter`, `OrderedDict`, storage types) are accepted; anything else is a
/// `corrupt` error naming `source`, the offset and the refused global or opcode. Tensors come back with their storage view and no bytes.
///
/// @code
/// auto pkl = zip.read("archive/data.pkl");
/// ckpt::interop::py_object root = ckpt::interop::unpickle(pkl, "model.pt: archive/data.pkl");
/// @endcode
inline py_object unpickle(std::span<const std::byte> data, std::string source, unpickle_limits limits = {}) {
  return detail::unpickler(data, std::move(source), limits).run();
}

}  // namespace ckpt::interop
