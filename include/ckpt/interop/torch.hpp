#pragma once
/// @file interop/torch.hpp
/// PyTorch `.pt` files (the zip format `torch.save` has written since PyTorch 1.6): a streaming
/// writer and a checking reader, both on `py_object` trees.
///
/// A `.pt` file is a zip archive with one top folder: `data.pkl` (the pickled object tree,
/// whose tensors refer to storages by key), `data/<key>` (each storage's raw little-endian
/// elements), `version` and, since PyTorch 2.0, `byteorder`.

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../dtype.hpp"
#include "../error.hpp"
#include "../names.hpp"
#include "../tensor.hpp"
#include "host_tensor.hpp"
#include "pickle.hpp"
#include "py_object.hpp"
#include "unpickle.hpp"
#include "zip.hpp"

namespace ckpt::interop {

namespace detail {
/// Calls `fn(tensor, path)` for every tensor in the tree under `o`, depth first, with its place
/// in the tree as `path` (e.g. `['model']['fc.weight']`, built on the given prefix). Throws
/// `invalid_argument` for a tree nested deeper than 1000 levels.
template <class F>
void for_each_tensor(py_object& o, std::string& path, std::size_t depth, F&& fn) {
  if (depth > 1000) throw error(error_kind::invalid_argument, "object tree nested deeper than 1000 levels at " + path_or_root(path));
  const std::size_t mark = path.size();
  switch (o.kind()) {
    case py_kind::list: case py_kind::tuple: {
      auto& items = o.items();
      for (std::size_t i = 0; i < items.size(); ++i) {
        path.resize(mark);
        path += "[" + std::to_string(i) + "]";
        for_each_tensor(items[i], path, depth + 1, fn);
      }
      break;
    }
    case py_kind::dict:
      for (auto& [key, value] : o.entries()) {  // keys are hashable, so never tensors
        path.resize(mark);
        path += path_step(key);
        for_each_tensor(value, path, depth + 1, fn);
      }
      break;
    case py_kind::tensor: fn(o.as_tensor(), static_cast<const std::string&>(path)); break;
    default: break;
  }
  path.resize(mark);
}
}  // namespace detail

/// How `torch_writer` names and lays out the archive.
///
/// @code
/// ckpt::interop::torch_writer w("mymodel.pt", {.archive_name = "mymodel"});  // as torch.save names it
/// @endcode
struct torch_writer_options {
  /// The top folder inside the zip. torch.save uses the file's stem; torch.load accepts any.
  std::string archive_name = "archive";
  zip_writer_options zip;
};

/// Writes a `.pt` file that `torch.load` reads, one tensor at a time: `add_tensor` writes the
/// tensor's bytes to the archive at once and returns the node to place in the tree, so a large
/// model is never held whole. `finish` pickles the tree, writes the central directory, fsyncs
/// and renames the file into place; until then `path` is untouched, and a writer destroyed
/// without `finish` (or after a failure) leaves nothing behind.
///
/// @code
/// ckpt::interop::torch_writer w("model_optim_rng.pt");
/// auto model = py_object::ordered_dict();
/// for (auto& [name, t] : weights) model.set(name, w.add_tensor(t));  // t: a host_tensor
/// w.finish(py_object::dict({{"iteration", 1000}, {"model", model}}));
/// @endcode
class torch_writer {
 public:
  explicit torch_writer(std::filesystem::path path, torch_writer_options options = {})
      : archive_(std::move(options.archive_name)), zip_(std::move(path), options.zip) {
    if (archive_.empty() || archive_.size() > 255 || archive_.find('/') != std::string::npos ||
        archive_.find('\\') != std::string::npos || archive_ == "." || archive_ == ".." ||
        !ckpt::detail::valid_utf8(archive_))
      throw error(error_kind::invalid_argument, "torch archive name " + ckpt::detail::printable(archive_) +
                                                    " must be one non-empty path component");
  }

  /// Writes a dense row-major tensor as a new storage record; returns its tree node.
  py_object add_tensor(dtype type, shape_t shape, std::span<const std::byte> data) {
    const std::string what = zip_.path().string() + ": tensor " + std::to_string(storages_.size());
    const std::uint64_t bytes = ckpt::detail::checked_mul(ckpt::detail::element_count(shape, what), size_of(type), what);
    if (bytes != data.size())
      throw error(error_kind::invalid_argument, what + " of dtype " + std::string(to_string(type)) + " and shape " +
                                                    ckpt::detail::to_string(shape) + " needs " + std::to_string(bytes) +
                                                    " bytes, got " + std::to_string(data.size()));
    auto node = begin_tensor(type, std::move(shape));
    write(data);
    end_tensor();
    return node;
  }

  /// Starts a storage record for a dense row-major tensor whose bytes come in pieces, for a
  /// tensor larger than one wants to hold: `write` them in order, then `end_tensor`. Returns the
  /// tree node, like `add_tensor`. No other tensor may start before this one ends.
  ///
  /// @code
  /// auto node = w.begin_tensor(ckpt::dtype::f32, {1 << 20, 4096});
  /// for (auto& block : blocks) w.write(block);  // 16 GiB, a block at a time
  /// w.end_tensor();
  /// @endcode
  py_object begin_tensor(dtype type, shape_t shape) {
    if (open_) throw error(error_kind::invalid_argument, zip_.path().string() + ": a tensor started before the last one ended");
    const std::string what = zip_.path().string() + ": tensor " + std::to_string(storages_.size());
    const std::uint64_t numel = ckpt::detail::element_count(shape, what);
    const std::uint64_t bytes = ckpt::detail::checked_mul(numel, size_of(type), what);
    const std::string key = std::to_string(storages_.size());
    zip_.begin(archive_ + "/data/" + key, bytes);
    open_ = true;
    storages_.emplace(key, written{type, numel});
    py_tensor t;
    t.value.type = type;
    t.value.shape = std::move(shape);
    t.storage.key = key;
    t.storage.numel = numel;
    t.storage.stride = contiguous_strides(t.value.shape);
    return py_object(std::move(t));
  }
  /// The next bytes of the tensor `begin_tensor` started.
  void write(std::span<const std::byte> piece) {
    if (!open_) throw error(error_kind::invalid_argument, zip_.path().string() + ": write with no tensor started");
    zip_.write(piece);
  }
  /// Ends the tensor `begin_tensor` started; an error if its bytes are not all written.
  void end_tensor() {
    if (!open_) throw error(error_kind::invalid_argument, zip_.path().string() + ": end_tensor with no tensor started");
    open_ = false;
    zip_.end();
  }
  py_object add_tensor(const host_tensor& t) { return add_tensor(t.type, t.shape, t.data); }
  /// A tensor of C++ elements (`float`, `ckpt::bfloat16`, `std::int64_t`, `bool`, ...).
  template <element_type T>
  py_object add_tensor(std::span<const T> values, shape_t shape) {
    return add_tensor(dtype_of<std::remove_cv_t<T>>::value, std::move(shape), std::as_bytes(values));
  }

  /// Pickles `root` as `data.pkl` and publishes the file. Tensors in `root` that carry their
  /// own bytes (built from a `host_tensor`) are written as new storages first; tensors from
  /// `add_tensor` refer to what was already written.
  void finish(py_object root) {
    assign_storages(root);
    const auto pkl = pickle(root);
    zip_.add(archive_ + "/data.pkl", pkl);
    zip_.add(archive_ + "/byteorder", std::as_bytes(std::span(std::string_view("little"))));
    zip_.add(archive_ + "/version", std::as_bytes(std::span(std::string_view("3\n"))));
    zip_.finish();
  }

  /// The final path of the file.
  const std::filesystem::path& path() const noexcept { return zip_.path(); }

 private:
  struct written {
    dtype type;
    std::uint64_t numel;
  };

  static std::vector<std::uint64_t> contiguous_strides(const shape_t& shape) {
    std::vector<std::uint64_t> s(shape.size());
    std::uint64_t step = 1;
    for (std::size_t i = shape.size(); i-- > 0;) {
      s[i] = step;
      step *= shape[i] == 0 ? 1 : shape[i];
    }
    return s;
  }

  void assign_storages(py_object& root) {
    std::string path;
    try {
      detail::for_each_tensor(root, path, 0, [&](py_tensor& t, const std::string& at) { assign_storage(t, at); });
    } catch (const error& e) {
      if (std::string_view(e.what()).starts_with(zip_.path().string())) throw;
      throw error(e.kind(), zip_.path().string() + ": " + e.what());
    }
  }

  /// A tensor of the tree: written now if it carries its bytes, else checked against what
  /// `add_tensor` wrote under its storage key.
  void assign_storage(py_tensor& t, const std::string& path) {
    const std::string where = zip_.path().string() + ": tensor " + detail::path_or_root(path);
    if (t.storage.key.empty()) {
      py_object fresh = add_tensor(t.value);
      const bool grad = t.requires_grad;
      t = std::move(fresh.as_tensor());
      t.requires_grad = grad;
    } else {
      const auto it = storages_.find(t.storage.key);
      if (it == storages_.end())
        throw error(error_kind::invalid_argument, where + " refers to storage " + ckpt::detail::printable(t.storage.key) +
                                                      ", which this writer did not write");
      if (it->second.type != t.value.type || it->second.numel != t.storage.numel)
        throw error(error_kind::invalid_argument,
                    where + " says its storage " + ckpt::detail::printable(t.storage.key) + " holds " +
                        std::to_string(t.storage.numel) + " " + std::string(to_string(t.value.type)) +
                        " elements, but " + std::to_string(it->second.numel) + " " +
                        std::string(to_string(it->second.type)) + " elements were written");
    }
    if (auto p = detail::view_problem(t); !p.empty()) throw error(error_kind::invalid_argument, where + " " + p);
  }

  std::string archive_;
  zip_writer zip_;
  std::map<std::string, written> storages_;
  bool open_ = false;  // a tensor begun and not yet ended
};

/// Writes `root` (whose tensors carry their bytes) to a `.pt` file in one call.
///
/// @code
/// ckpt::interop::save_torch("state.pt", py_object::dict({{"w", host_tensor{ckpt::dtype::f32, {2}, bytes}}}));
/// @endcode
inline void save_torch(const std::filesystem::path& path, py_object root, torch_writer_options options = {}) {
  torch_writer w(path, std::move(options));
  w.finish(std::move(root));
}

/// Bounds on what `load_torch` reads before it allocates.
///
/// @code
/// auto root = ckpt::interop::load_torch("big.pt", {.limits = {.max_objects = 1 << 24}});
/// @endcode
struct torch_load_options {
  unpickle_limits limits;
  std::uint64_t max_pickle_bytes = std::uint64_t{1} << 30;  ///< size of data.pkl
  /// false: a tensor that is the whole of its own storage comes back with its dtype and shape
  /// but no bytes (`value.data` empty), to be read piece by piece with `torch_tensor_source`;
  /// views and shared storages are read as usual. Everything else is checked as usual.
  bool read_tensors = true;
};

namespace detail {

/// True when `t` is the whole of its storage, in row-major order.
inline bool whole_contiguous(const py_tensor& t) {
  if (t.storage.offset != 0 || t.value.numel() != t.storage.numel) return false;
  std::uint64_t step = 1;
  for (std::size_t i = t.value.shape.size(); i-- > 0;) {
    if (t.value.shape[i] != 1 && t.storage.stride[i] != step) return false;  // a size-1 dim's stride is irrelevant
    step *= t.value.shape[i];
  }
  return true;
}

/// Copies the strided view of `t` out of `storage` into row-major `out` (already checked to
/// lie within the storage).
inline void gather(const py_tensor& t, const std::byte* storage, std::byte* out) {
  const std::size_t es = size_of(t.value.type);
  const auto& shape = t.value.shape;
  const auto& stride = t.storage.stride;
  if (t.value.numel() == 0) return;
  if (shape.empty()) {
    std::memcpy(out, storage + t.storage.offset * es, es);
    return;
  }
  const std::size_t rank = shape.size();
  const std::uint64_t inner = shape[rank - 1], inner_stride = stride[rank - 1];
  std::vector<std::uint64_t> idx(rank - 1, 0);
  std::uint64_t base = t.storage.offset;  // element offset of the current row
  while (true) {
    if (inner_stride == 1) {
      std::memcpy(out, storage + base * es, inner * es);
      out += inner * es;
    } else {
      for (std::uint64_t j = 0; j < inner; ++j, out += es) std::memcpy(out, storage + (base + j * inner_stride) * es, es);
    }
    std::size_t d = rank - 1;  // odometer over the outer dimensions
    while (d > 0) {
      --d;
      if (++idx[d] < shape[d]) {
        base += stride[d];
        break;
      }
      base -= (shape[d] - 1) * stride[d];
      idx[d] = 0;
      if (d == 0) return;
    }
    if (rank == 1) return;
  }
}

/// The folder a torch.save archive keeps its records in: whatever the first entry sits in, as
/// torch's own reader decides it.
inline std::string archive_top(const zip_reader& zip) {
  const std::string file = zip.path().string();
  if (zip.entries().empty()) throw error(error_kind::corrupt, file + ": empty zip archive, not a torch.save file");
  const std::string& first = zip.entries().front().name;
  const auto slash = first.find('/');
  if (slash == std::string::npos || slash == 0)
    throw error(error_kind::corrupt, file + ": zip entry " + ckpt::detail::printable(first) +
                                         " is not inside a folder, so this is not a torch.save archive");
  return first.substr(0, slash);
}

struct tensor_site {
  py_tensor* tensor;
  std::string path;
};
inline void collect_tensors(py_object& o, std::string& path, std::vector<tensor_site>& out) {
  for_each_tensor(o, path, 0, [&](py_tensor& t, const std::string& where) { out.push_back({&t, where}); });
}

}  // namespace detail

/// Reads a `.pt` file written by `torch.save` (or `torch_writer`) without running any code:
/// the pickle may only hold containers, numbers, strings and tensors (see `unpickle`). Every
/// tensor comes back contiguous and row-major in `as_tensor().value`, whatever its strides,
/// storage offset or sharing in the file; an `nn.Parameter` comes back as its tensor.
///
/// Checked: zip structure and CRC-32 of everything read, that each storage record holds
/// exactly numel × element size bytes, that every view lies inside its storage, and that
/// tensors sharing a storage agree on its dtype and size. Errors name the file and the
/// tensor's place in the tree, e.g. `['model']['layers.0.weight']`.
///
/// @code
/// py_object ckpt = ckpt::interop::load_torch("model_optim_rng.pt");
/// const auto& w = ckpt.at("model").at("embedding.weight").as_tensor().value;  // host_tensor
/// std::int64_t it = ckpt.at("iteration").as_int();
/// @endcode
inline py_object load_torch(const std::filesystem::path& path, torch_load_options options = {}) {
  const std::string file = path.string();
  {
    // Say what a non-zip file is before the zip reader calls it corrupt.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      throw error(err == ENOENT ? error_kind::not_found : error_kind::io, "open " + file + ": " + std::strerror(err));
    }
    unsigned char magic[4] = {};
    const ssize_t n = ::pread(fd, magic, sizeof magic, 0);
    ::close(fd);
    if (n == 4 && magic[0] == 0x80 && magic[1] <= 5)
      throw error(error_kind::invalid_argument,
                  file + ": this looks like a legacy (pre-zip) torch.save file (_use_new_zipfile_serialization=False), which ckpt "
                         "does not read; load it in Python and save it again with a current torch.save");
    if (n != 4 || magic[0] != 'P' || magic[1] != 'K' || magic[2] != 3 || magic[3] != 4)
      throw error(error_kind::corrupt, file + ": not a PyTorch .pt file (no zip archive; torch.save writes zip archives "
                                              "since PyTorch 1.6)");
  }
  zip_reader zip(path);
  const std::string top = detail::archive_top(zip);
  const zip_entry* pkl = zip.find(top + "/data.pkl");
  if (!pkl)
    throw error(error_kind::corrupt, file + ": no " + ckpt::detail::printable(top + "/data.pkl") +
                                         " record, so this is not a torch.save archive (TorchScript archives are not supported)");
  if (const zip_entry* bo = zip.find(top + "/byteorder")) {
    if (bo->size > 16) throw error(error_kind::corrupt, file + ": byteorder record of " + std::to_string(bo->size) + " bytes");
    const auto b = zip.read(bo->name);
    const std::string order(reinterpret_cast<const char*>(b.data()), b.size());
    if (order != "little")
      throw error(error_kind::invalid_argument, file + ": tensors are stored " + ckpt::detail::printable(order) +
                                                    "-endian; ckpt reads little-endian files only");
  }
  if (pkl->size > options.max_pickle_bytes)
    throw error(error_kind::corrupt, file + ": " + pkl->name + " is " + std::to_string(pkl->size) +
                                         " bytes (the limit is " + std::to_string(options.max_pickle_bytes) + ")");
  const auto pickled = zip.read(pkl->name);
  py_object root = unpickle(pickled, file + ": " + pkl->name, options.limits);

  std::vector<detail::tensor_site> sites;
  std::string path_buf;
  detail::collect_tensors(root, path_buf, sites);

  // Storages: check each record once, count its users so shared ones are read once and freed
  // after their last tensor.
  struct storage_use {
    const zip_entry* record = nullptr;
    dtype type{};
    std::uint64_t numel = 0;
    std::string first_path;
    std::size_t users = 0;
    std::vector<std::byte> bytes;
    bool loaded = false;
  };
  std::map<std::string, storage_use> storages;
  for (const auto& s : sites) {
    const auto& t = *s.tensor;
    const std::string where = file + ": tensor " + detail::path_or_root(s.path);
    auto [it, fresh] = storages.try_emplace(t.storage.key);
    auto& u = it->second;
    if (fresh) {
      const std::string name = top + "/data/" + t.storage.key;
      u.record = zip.find(name);
      if (!u.record)
        throw error(error_kind::corrupt, where + " uses storage record " + ckpt::detail::printable(name) +
                                             ", which the archive lacks");
      u.type = t.value.type;
      u.numel = t.storage.numel;
      u.first_path = s.path;
      const std::uint64_t es = size_of(t.value.type);
      if (u.numel > u.record->size / es || u.numel * es != u.record->size)
        throw error(error_kind::corrupt, where + ": storage record " + ckpt::detail::printable(name) + " has " +
                                             std::to_string(u.record->size) + " bytes, but the storage needs " +
                                             std::to_string(u.numel) + " x " + std::to_string(es) + " bytes");
    } else if (u.type != t.value.type || u.numel != t.storage.numel) {
      throw error(error_kind::corrupt, where + " shares storage " + ckpt::detail::printable(t.storage.key) + " with " +
                                           detail::path_or_root(u.first_path) + " but disagrees on it (" +
                                           std::string(to_string(t.value.type)) + " x " + std::to_string(t.storage.numel) +
                                           " vs " + std::string(to_string(u.type)) + " x " + std::to_string(u.numel) + ")");
    }
    ++u.users;
  }
  for (auto& s : sites) {
    auto& t = *s.tensor;
    auto& u = storages.at(t.storage.key);
    const std::size_t es = size_of(t.value.type);
    if (!options.read_tensors && u.users == 1 && !u.loaded && detail::whole_contiguous(t)) {
      --u.users;  // left for torch_tensor_source
      continue;
    }
    t.value.data.assign(static_cast<std::size_t>(t.value.numel() * es), std::byte{});
    if (u.users == 1 && !u.loaded && detail::whole_contiguous(t)) {
      zip.read(*u.record, t.value.data);  // straight into the tensor, CRC-32 checked
    } else {
      if (!u.loaded) {
        u.bytes.resize(u.record->size);
        zip.read(*u.record, u.bytes);
        u.loaded = true;
      }
      detail::gather(t, u.bytes.data(), t.value.data.data());
    }
    if (--u.users == 0) std::vector<std::byte>().swap(u.bytes);
  }
  return root;
}

/// Reads the elements of the tensors `load_torch(path, {.read_tensors = false})` left unread,
/// a piece at a time, straight from the archive: memory holds the piece, never the file.
///
/// Every byte is verified: a pass that reads a tensor from its first byte to its last, in
/// order (as a save does), checks the record's CRC-32 when it reaches the end and throws
/// `corrupt` on a mismatch; a read out of that order first checks the whole record. Reads of
/// one source may come from several threads (they are serialised).
///
/// @code
/// ckpt::interop::torch_load_options lazy;
/// lazy.read_tensors = false;
/// auto root = ckpt::interop::load_torch("model_optim_rng.pt", lazy);
/// ckpt::interop::torch_tensor_source src("model_optim_rng.pt");
/// std::vector<std::byte> first_mib(1 << 20);
/// src.read(root.at("model").at("embedding.word_embeddings.weight").as_tensor(), 0, first_mib);
/// @endcode
class torch_tensor_source {
 public:
  explicit torch_tensor_source(const std::filesystem::path& path) : zip_(path), top_(detail::archive_top(zip_)) {}

  /// Bytes [offset, offset + out.size()) of `t`'s elements (row-major, as `value.data` would
  /// hold them).
  void read(const py_tensor& t, std::uint64_t offset, std::span<std::byte> out) {
    const std::lock_guard lock(mutex_);
    const zip_entry& e = zip_.at(top_ + "/data/" + t.storage.key);
    const std::uint64_t es = size_of(t.value.type), start = t.storage.offset * es;
    if (!detail::whole_contiguous(t) || start != 0 || e.size != t.value.numel() * es)
      throw error(error_kind::invalid_argument, zip_.path().string() + ": storage " + ckpt::detail::printable(t.storage.key) +
                                                    " is not one tensor's whole elements, which load_torch reads itself");
    if (verified_all_) return zip_.read_at(e, offset, out);  // checked once, whole, by verify_all
    auto& p = passes_[e.name];
    if (offset == 0) p = {};  // a new pass from the start
    if (offset != p.next) {
      verify_whole(e);
      p.next = e.size + 1;  // out of order: nothing more to check in this pass
    }
    zip_.read_at(e, offset, out);
    if (p.next == offset) {
      p.crc = ckpt::interop::detail::crc32_update(p.crc, out);
      p.next += out.size();
      if (p.next == e.size && p.crc != e.crc32)
        throw error(error_kind::corrupt, zip_.path().string() + ": zip entry " + ckpt::detail::printable(e.name) + " (a tensor's elements): CRC-32 mismatch");
    }
  }

  /// Checks the CRC-32 of every record of the archive now, a block at a time; afterwards
  /// reads in any order are served without checking again. For tensors read in many small
  /// pieces out of order (a ZeRO partition's flat vectors, cut into parameters): one extra
  /// sequential pass instead of a whole-record check per piece.
  void verify_all() {
    const std::lock_guard lock(mutex_);
    if (verified_all_) return;
    for (const auto& e : zip_.entries()) verify_whole(e);
    verified_all_ = true;
  }

  const std::filesystem::path& path() const noexcept { return zip_.path(); }

 private:
  void verify_whole(const zip_entry& e) {
    std::vector<std::byte> block(static_cast<std::size_t>(std::min<std::uint64_t>(e.size, std::uint64_t{16} << 20)));
    std::uint32_t crc = 0;
    for (std::uint64_t at = 0; at < e.size; at += block.size()) {
      const auto part = std::span(block).first(static_cast<std::size_t>(std::min<std::uint64_t>(block.size(), e.size - at)));
      zip_.read_at(e, at, part);
      crc = ckpt::interop::detail::crc32_update(crc, part);
    }
    if (crc != e.crc32)
      throw error(error_kind::corrupt, zip_.path().string() + ": zip entry " + ckpt::detail::printable(e.name) + " (a tensor's elements): CRC-32 mismatch");
  }

  struct pass {
    std::uint64_t next = 0;  // the byte a read in order continues at
    std::uint32_t crc = 0;   // of bytes [0, next)
  };
  zip_reader zip_;
  std::string top_;
  std::map<std::string, pass> passes_;
  bool verified_all_ = false;
  std::mutex mutex_;
};

}  // namespace ckpt::interop
