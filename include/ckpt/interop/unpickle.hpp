#pragma once
/// @file interop/unpickle.hpp
/// A restricted unpickler for PyTorch checkpoints: it accepts what `torch.load(weights_only=
/// True)` accepts, and nothing that could run code.
///
/// It never calls anything: the few globals it accepts (OrderedDict, the torch tensor rebuild
/// functions, torch storage types) are interpreted by ckpt itself, everything else is refused
/// by name. Every length is checked against the remaining input before anything is allocated,
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

}  // namespace ckpt::interop
