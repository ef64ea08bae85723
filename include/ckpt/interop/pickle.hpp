#pragma once
/// @file interop/pickle.hpp
/// A protocol-2 pickler for `py_object` trees that writes tensors the way `torch.save` does,
/// so that Python's `pickle` and `torch.load` read what ckpt writes.

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

namespace detail {

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
  void tuple_of(std::span<const std::uint64_t> dims) {
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
    // A dtype with a legacy storage class (FloatStorage, ...) pickles as torch.save has always
    // written it; the others (u16, u32, u64, FP8) as torch >= 2.1 writes them: an untyped
    // storage of bytes, typed by _rebuild_tensor_v3's last argument. torch 1.x cannot read those.
    const auto storage_class = torch_storage_name(t.value.type);
    const bool v3 = storage_class.empty();
    const std::uint64_t es = size_of(t.value.type);
    if (v3 && s.numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / es)
      throw error(error_kind::invalid_argument, "pickle: " + path_or_root(path) + ": storage too large");
    global("torch._utils", v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
    put(op::MARK);
    put(op::MARK);
    str("storage", path);
    if (v3)
      global("torch.storage", "UntypedStorage");
    else
      global("torch", storage_class);
    str(s.key, path);
    str(s.location, path);
    integer(static_cast<std::int64_t>(v3 ? s.numel * es : s.numel));  // an untyped storage counts bytes
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
    if (v3) global("torch", torch_dtype_name(t.value.type));
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

  /// module.name(items), with `o`'s items as a plain list or tuple: how a set or a torch.Size pickles.
  bool call_with_items(std::string_view module, std::string_view name, const py_object& o, std::size_t depth, std::string& path) {
    global(module, name);
    save(py_object(o).with_class(py_class::builtin), depth + 1, path);
    put(op::TUPLE1);
    put(op::REDUCE);
    memoize();
    return true;
  }

  /// The classes of plain data, written as CPython's protocol-2 pickler writes them (the
  /// unpickler reads them back): argparse.Namespace, sets, torch.Size, torch dtypes, numpy
  /// arrays and dtypes. Returns false for a value of a builtin class.
  bool save_class(const py_object& o, std::size_t depth, std::string& path) {
    switch (o.python_class()) {
      case py_class::argparse_namespace: {
        if (!o.is_dict()) return false;
        global("argparse", "Namespace");
        put(op::EMPTY_TUPLE);
        put(op::NEWOBJ);
        memoize();
        save(py_object(o).with_class(py_class::builtin), depth + 1, path);  // its __dict__
        put(op::BUILD);
        return true;
      }
      case py_class::set: case py_class::frozenset:
        if (!o.is_list()) return false;
        return call_with_items("__builtin__", o.python_class() == py_class::set ? "set" : "frozenset", o, depth, path);
      case py_class::torch_size:
        if (!o.is_tuple()) return false;
        return call_with_items("torch", "Size", o, depth, path);
      case py_class::torch_dtype: {
        if (!o.is_str()) return false;
        global("torch", o.as_str());
        return true;
      }
      case py_class::numpy_dtype: {
        if (!o.is_str() || o.as_str().size() < 3) return false;
        const std::string& d = o.as_str();  // "<u4": byte order, then the type code
        global("numpy", "dtype");
        str(d.substr(1), path);
        put(op::NEWFALSE);
        put(op::NEWTRUE);
        put(op::TUPLE3);
        put(op::REDUCE);
        memoize();
        put(op::MARK);
        integer(3);
        str(d.substr(0, 1), path);
        put(op::NONE);
        put(op::NONE);
        put(op::NONE);
        integer(-1);
        integer(-1);
        integer(0);
        put(op::TUPLE);
        put(op::BUILD);
        return true;
      }
      case py_class::numpy_array: {
        if (!o.is_tuple() || o.size() != 3) return false;
        global("numpy.core.multiarray", "_reconstruct");
        global("numpy", "ndarray");
        integer(0);
        put(op::TUPLE1);
        save(py_object::bytes(std::string_view("b")), depth + 1, path);
        put(op::TUPLE3);
        put(op::REDUCE);
        memoize();
        put(op::MARK);
        integer(1);
        save(o.items()[1], depth + 1, path);  // the shape
        save(o.items()[0], depth + 1, path);  // the dtype
        put(op::NEWFALSE);                    // C order
        save(o.items()[2], depth + 1, path);  // the bytes
        put(op::TUPLE);
        put(op::BUILD);
        return true;
      }
      default: return false;
    }
  }

  void save(const py_object& o, std::size_t depth, std::string& path) {
    if (depth > max_depth)
      throw error(error_kind::invalid_argument, "pickle: " + path_or_root(path) + ": nesting deeper than " +
                                                    std::to_string(max_depth) + " levels");
    if (o.python_class() != py_class::builtin && o.python_class() != py_class::ordered_dict && save_class(o, depth, path)) return;
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

/// Pickles `root` with protocol 2, as `torch.save` does; every tensor must already name its
/// storage record (`torch_writer` takes care of that). Readable by Python's `pickle` and
/// `torch.load`.
///
/// @code
/// std::vector<std::byte> pkl = ckpt::interop::pickle(py_object::dict({{"iteration", 100}}));
/// @endcode
inline std::vector<std::byte> pickle(const py_object& root) { return detail::pickler().run(root); }

}  // namespace ckpt::interop
