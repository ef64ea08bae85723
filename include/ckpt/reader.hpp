#pragma once
/// @file reader.hpp
/// `ckpt::reader`: one committed tag opened read-only, without the Checkpointable type that
/// saved it. It is what tools need (`ckpt inspect`, `verify`, `diff`, `export`): what the tag
/// holds, any tensor or slice of it by name, the saved bytes of a value, and a check of every
/// byte that reports all problems instead of stopping at the first.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "config.hpp"
#include "detail/chunk_details.hpp"
#include "detail/chunk_reader.hpp"
#include "detail/coverage.hpp"
#include "detail/hash.hpp"
#include "detail/metadata.hpp"
#include "detail/region.hpp"
#include "detail/shard_io.hpp"
#include "detail/tag_store.hpp"
#include "detail/validation_logits.hpp"
#include "host_copy.hpp"
#include "dtype.hpp"
#include "error.hpp"
#include "names.hpp"
#include "posix.hpp"
#include "raw.hpp"
#include "single_process.hpp"
#include "tensor.hpp"
#include "topology.hpp"
#include "zstd.hpp"

namespace ckpt {

/// The name of a codec id, as `ckpt inspect` shows it ("codec 7" for one ckpt does not know).
inline std::string codec_name(std::uint8_t id) {
  if (const auto* c = detail::find_builtin_codec(id)) return c->name;
  return "codec " + std::to_string(id);
}

/// One stored piece of a tensor: where it lives and how it is stored.
struct chunk_info {
  std::string file;       ///< shard file, relative to the tag directory
  shape_t offset, shape;  ///< the region of the global tensor it holds
  std::uint8_t codec = 0;
  std::uint64_t file_offset = 0;  ///< where its stored bytes start in the file
  std::uint64_t stored_bytes = 0, raw_bytes = 0;
};

/// One tensor of a checkpoint, as metadata.json and the chunk map describe it.
struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  shape_t shape;  ///< global shape, in memory order: reversed logical shape when column-major
  /// The order of its bytes: `column_major` for a tensor saved so (by the Eigen adapter, say),
  /// whose logical shape is `shape` reversed; `read` needs a buffer laid out the same.
  ///
  /// @code
  /// if (t.order == ckpt::layout::column_major) std::printf("%s is column-major\n", t.name.c_str());
  /// @endcode
  layout order = layout::row_major;
  std::uint64_t raw_bytes = 0;     ///< numel * element size
  std::uint64_t stored_bytes = 0;  ///< after compression
  std::size_t chunks = 0;
  std::vector<std::string> files{};   ///< distinct shard files holding it (its shards), sorted
  std::vector<std::string> codecs{};  ///< distinct codecs of its chunks, sorted
};

/// One per-rank value (an RNG state, a counter): its saved bytes are cereal's encoding.
struct value_info {
  std::string name;
  std::uint32_t rank = 0;
  std::uint64_t bytes = 0;
};

/// A shard file of the tag.
struct file_info {
  std::string path;  ///< relative to the tag directory
  std::uint32_t rank = 0;
  std::uint64_t bytes = 0;
};

/// Everything a committed tag records about itself, without reading any tensor data.
struct checkpoint_info {
  std::string tag;
  std::uint64_t iteration = 0;
  std::uint32_t format_version = 0;
  ckpt::topology topology;
  ckpt::config config;
  std::vector<file_info> files;
  std::vector<tensor_info> tensors;  ///< in the order metadata.json lists them
  std::vector<value_info> values;
  std::uint64_t raw_bytes = 0, stored_bytes = 0;  ///< over all tensors
};

/// What `reader::verify` found: every problem, each naming the file, tensor or value.
struct verify_report {
  std::vector<std::string> problems;
  std::uint64_t bytes_checked = 0;  ///< bytes read and hashed
  std::uint64_t chunks_checked = 0;
  bool ok() const noexcept { return problems.empty(); }
};

/// A committed tag opened for reading. The constructor reads and checks metadata.json and the
/// chunk map (it throws `not_found` or `corrupt`); nothing else is read until asked.
///
/// @code
/// ckpt::reader r{ckpt::posix("/ckpt/run1")};  // the tag `latest` names; or pass a tag
/// for (const auto& t : r.info().tensors) std::printf("%s %s\n", t.name.c_str(), ckpt::detail::to_string(t.shape).c_str());
/// std::vector<float> w(4096 * 1024);
/// r.read("layers.0.w", ckpt::view(w, {4096, 1024}));
/// if (auto rep = r.verify(); !rep.ok()) for (auto& p : rep.problems) std::puts(p.c_str());
/// @endcode
template <class Store = posix>
class reader {
 public:
  /// Progress of a long read: bytes done so far and the total.
  using progress = std::function<void(std::uint64_t done, std::uint64_t total)>;

  /// Opens `tag`, or the tag `latest` names when none is given.
  explicit reader(Store storage, std::optional<std::string> tag = std::nullopt)
      : tag_(std::make_unique<opened>(std::move(storage))) {
    const detail::tag_store<Store> tags(tag_->storage);
    if (!tag) {
      tag = tags.latest();
      if (!tag) throw error(error_kind::not_found, "no checkpoint to read: " + tag_->storage.describe("latest") + " does not exist");
    }
    md_name_ = tag_->storage.describe(detail::metadata_key(*tag));
    // Each tensor's tiling is checked the first time it is read (see read_all), not here.
    tag_->md = tags.open(*tag, /*check_all_tiling=*/false);
    // Version 2: the chunks' details, from the footers. A damaged file is kept aside, so that
    // inspect still shows the tag and verify reports every problem.
    (void)detail::read_all_chunk_details(tag_->storage, tag_->md, &damaged_files_);
    tag_->verified.emplace(tag_->storage, tag_->md);
    build_info();
    tiling_checked_.assign(tag_->md.tensors.size(), false);
  }

  /// What the tag holds.
  const checkpoint_info& info() const noexcept { return info_; }

  /// The tensor called `name`, or nullptr.
  const tensor_info* find(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    return it == by_name_.end() ? nullptr : &info_.tensors[it->second];
  }

  /// The chunks of tensor `name` (throws `not_found` for an unknown name).
  std::vector<chunk_info> chunks(std::string_view name) const {
    const auto& t = stored(name);
    std::vector<chunk_info> out;
    const auto& c = t.chunks;
    const auto elem = size_of(t.type);
    for (std::size_t i = 0; i < c.size(); ++i) {
      const auto off = c.offset(i), shp = c.shape(i);
      out.push_back({tag_->md.files[c.file[i]].path, shape_t(off.begin(), off.end()), shape_t(shp.begin(), shp.end()), c.codec[i],
                     c.file_offset[i], c.stored_size[i], c.elements(i) * elem});
    }
    return out;
  }

  /// Fills `out` from tensor `name`, verifying every chunk read. `out` must have the stored
  /// dtype; it is the whole tensor, or a slice of it when it carries a `shard_spec` (only the
  /// chunks overlapping the slice are read). Several tensors at once share one pass over the
  /// metadata: prefer `read_each` for many.
  void read(const std::string& name, tensor_ref out) {
    std::vector<std::pair<std::string, tensor_ref>> one{{name, std::move(out)}};
    read_all(one);
  }

  /// Fills every `(name, tensor)` pair, like `read`, in one load.
  void read_all(std::vector<std::pair<std::string, tensor_ref>>& targets) {
    for (const auto& [n, ref] : targets) {
      const auto& t = stored(n);
      if (ref.type() != t.type || ref.global_shape() != t.shape || ref.order() != t.order) {
        // Column-major tensors are named by layout too (their shapes here are in memory order).
        const bool layouts = ref.order() != t.order || t.order == layout::column_major;
        const auto lay = [&](layout l) { return layouts ? std::string(to_string(l)) + " " : std::string(); };
        throw error(error_kind::mismatch, "tensor " + detail::printable(n) + " is " + std::string(to_string(t.type)) + " " +
                                              lay(t.order) + detail::to_string(t.shape) + " in " + md_name_ +
                                              ", the buffer given is " + std::string(to_string(ref.type())) + " " +
                                              lay(ref.order()) + detail::to_string(ref.global_shape()));
      }
    }
    // Through the chunk reader, with the metadata opened once: each read costs what its chunks
    // cost, however many tensors the tag holds. Each tensor's tiling is checked the first time
    // it is read, each shard file's header, trailer and index the first time a chunk of it is.
    std::vector<detail::tensor_load> wanted;
    wanted.reserve(targets.size());
    for (const auto& [n, ref] : targets) {
      const auto k = by_name_.find(n)->second;
      const auto& t = tag_->md.tensors[k];
      if (!tiling_checked_[k]) {
        check_files_of(t);
        detail::check_stored_tiling(tag_->md, t, md_name_);
        tiling_checked_[k] = true;
      }
      wanted.push_back({&t, &n, &ref});
    }
    const raw codec;
    host_copy host;
    (void)detail::chunk_reader<Store, raw>(tag_->storage, codec, 0).load(wanted, tag_->md, *tag_->verified, host);
  }

  /// The tag's validation logits (saved with `save_options::validation_logits`), or nullptr.
  /// They are ckpt's own tensor, which `read` does not reach: read them with
  /// `read_validation_logits`.
  const tensor_info* validation_logits() const { return find(detail::validation_name); }

  /// Fills `out`, a host tensor of the logits' dtype and shape, with the tag's validation
  /// logits, every chunk's checksum verified (a tool moving a checkpoint to another format
  /// carries them with it; a training run compares them with `load_options::validation_logits`).
  ///
  /// @code
  /// if (const auto* l = r.validation_logits()) {
  ///   std::vector<float> logits(l->raw_bytes / sizeof(float));  // when l->type == ckpt::dtype::f32
  ///   r.read_validation_logits(ckpt::view(logits, l->shape));
  /// }
  /// @endcode
  void read_validation_logits(tensor_ref out) {
    const auto* info = validation_logits();
    if (!info) throw error(error_kind::not_found, md_name_ + " holds no validation logits");
    const auto& t = stored(detail::validation_name);
    if (out.type() != t.type || out.shape() != t.shape || (out.shard() && !out.shard()->replicated) || out.where().type != device::kind::host)
      throw error(error_kind::mismatch, "validation logits are " + std::string(to_string(t.type)) + " " + detail::to_string(t.shape) + " in " +
                                            md_name_ + ", the buffer given is " + std::string(to_string(out.type())) + " " +
                                            detail::to_string(out.shape()) + (out.where().type != device::kind::host ? " off the host" : ""));
    check_files_of(t);
    detail::check_stored_tiling(tag_->md, t, md_name_);
    const std::string name = "validation logits";
    const raw codec;
    host_copy host;
    const detail::tensor_load one[]{{&t, &name, &out}};
    (void)detail::chunk_reader<Store, raw>(tag_->storage, codec, 0).load(std::span(one), tag_->md, *tag_->verified, host);
  }

  /// The saved bytes of value `name` as rank `rank` saved it, checksum verified.
  std::vector<std::byte> value_bytes(std::string_view name, std::uint32_t rank = 0) {
    for (const auto& v : tag_->md.values)
      if (v.name == name && v.rank == rank) return detail::read_value(tag_->storage, detail::file_key(tag_->md, v.file), v);
    throw error(error_kind::not_found, "no value " + detail::printable(name) + " of rank " + std::to_string(rank) + " in " + md_name_);
  }

  /// Reads every byte the tag's metadata points to and checks it: each shard file's size,
  /// header, trailer and footer index; each chunk's checksum and that it decodes to its size;
  /// each value's checksum; and that the chunks of every tensor cover it exactly once. Returns
  /// every problem found (I/O errors included) rather than throwing at the first.
  verify_report verify(const progress& on_progress = {}) {
    verify_report rep;
    auto& st = tag_->storage;
    std::vector<bool> file_ok(tag_->md.files.size(), true);
    for (std::size_t f = 0; f < tag_->md.files.size(); ++f) {
      const auto& fm = tag_->md.files[f];
      try {
        if (f < damaged_files_.size() && !damaged_files_[f].empty())
          throw error(error_kind::corrupt, damaged_files_[f]);  // its footer failed when the tag was opened
        detail::verify_shard_file(st, detail::file_key(tag_->md, static_cast<std::uint32_t>(f)), fm.size, fm.index_xxh3);
      } catch (const error& e) {
        rep.problems.push_back(e.what());
        // A missing or resized file would fail every chunk in it with the same story.
        file_ok[f] = st.size(detail::file_key(tag_->md, static_cast<std::uint32_t>(f))) == fm.size;
      }
    }
    for (const auto& t : tag_->md.tensors) {
      if (t.placement) continue;  // version 2: its layout was checked to tile it when the tag was opened
      try {
        detail::check_stored_tiling(tag_->md, t, md_name_);
      } catch (const error& e) {
        rep.problems.push_back(e.what());
      }
    }
    // Every chunk, file by file in file order, so the disk reads sequentially.
    struct item {
      std::uint32_t file;
      std::uint64_t at;
      const detail::tensor_meta* tensor;
      std::size_t chunk;
    };
    std::vector<item> items;
    std::uint64_t total = 0;
    for (const auto& t : tag_->md.tensors)
      for (std::size_t i = 0; i < t.chunks.size(); ++i) {
        items.push_back({t.chunks.file[i], t.chunks.file_offset[i], &t, i});
        total += t.chunks.stored_size[i];
      }
    for (const auto& v : tag_->md.values) total += v.size;
    std::sort(items.begin(), items.end(), [](const item& a, const item& b) { return std::tie(a.file, a.at) < std::tie(b.file, b.at); });
    std::vector<std::byte> buffer, decoded;
    for (const auto& it : items) {
      if (!file_ok[it.file]) continue;
      const auto& c = it.tensor->chunks;
      const auto i = it.chunk;
      const auto key = detail::file_key(tag_->md, it.file);
      const auto where = st.describe(key) + ", tensor " + detail::printable(it.tensor->name) + ", chunk at offset " +
                         std::to_string(c.file_offset[i]);
      try {
        buffer.resize(c.stored_size[i]);
        st.read(key, c.file_offset[i], buffer);
        rep.bytes_checked += buffer.size();
        ++rep.chunks_checked;
        if (const auto h = detail::xxh3(buffer); h != c.xxh3[i]) {
          rep.problems.push_back(where + ": checksum " + detail::to_hex(h) + ", metadata recorded " + detail::to_hex(c.xxh3[i]));
        } else {
          decoded.resize(c.elements(i) * size_of(it.tensor->type));
          decode_builtin(c.codec[i], buffer, it.tensor->type, decoded, where);
        }
      } catch (const error& e) {
        rep.problems.push_back(std::string(e.what()).starts_with(where) ? e.what() : where + ": " + e.what());
      }
      if (on_progress) on_progress(rep.bytes_checked, total);
    }
    for (const auto& v : tag_->md.values) {
      if (!file_ok[v.file]) continue;
      const auto key = detail::file_key(tag_->md, v.file);
      try {
        rep.bytes_checked += detail::read_value(st, key, v).size();
      } catch (const error& e) {
        const std::string what = e.what();
        rep.problems.push_back(e.kind() == error_kind::corrupt ? what : st.describe(key) + ", value " + detail::printable(v.name) + ": " + what);
      }
      if (on_progress) on_progress(rep.bytes_checked, total);
    }
    return rep;
  }

  /// The storage the tag lives in.
  Store& storage() noexcept { return tag_->storage; }

 private:
  /// Version 2: throws the error of a damaged file that holds chunks of `t` (their details
  /// could not be read from its footer), rather than a tiling error about chunks it lacks.
  void check_files_of(const detail::tensor_meta& t) const {
    if (!t.placement) return;
    for (std::uint32_t f = 0; f < damaged_files_.size(); ++f)
      if (!damaged_files_[f].empty() && detail::chunks_in_file_count(*t.placement, f) > 0)
        throw error(error_kind::corrupt, damaged_files_[f]);
  }

  const detail::tensor_meta& stored(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) throw error(error_kind::not_found, "no tensor " + detail::printable(name) + " in " + md_name_);
    return tag_->md.tensors[it->second];
  }

  /// Decodes with one of ckpt's own codecs; a chunk of another codec has had its checksum
  /// checked, which is all a reader without that codec can vouch for.
  static void decode_builtin(std::uint8_t id, std::span<const std::byte> in, dtype t, std::span<std::byte> out,
                             const std::string& where) {
    try {
      (void)detail::decode_builtin(id, in, t, out);
    } catch (const error& e) {
      throw error(e.kind(), where + ": " + e.what());
    }
  }

  void build_info() {
    info_.tag = tag_->md.tag;
    info_.iteration = tag_->md.iteration;
    info_.format_version = tag_->md.format_version;
    info_.topology = tag_->md.topology;
    info_.config = tag_->md.config;
    for (const auto& f : tag_->md.files) info_.files.push_back({f.path, f.rank, f.size});
    for (const auto& v : tag_->md.values) info_.values.push_back({v.name, v.rank, v.size});
    for (std::size_t k = 0; k < tag_->md.tensors.size(); ++k) {
      const auto& t = tag_->md.tensors[k];
      tensor_info ti;
      ti.name = t.name;
      ti.type = t.type;
      ti.shape = t.shape;
      ti.order = t.order;
      const auto elem = size_of(t.type);
      std::set<std::uint32_t> files;
      std::set<std::string> codecs;
      for (std::size_t i = 0; i < t.chunks.size(); ++i) {
        ti.raw_bytes += t.chunks.elements(i) * elem;
        ti.stored_bytes += t.chunks.stored_size[i];
        files.insert(t.chunks.file[i]);
        codecs.insert(codec_name(t.chunks.codec[i]));
      }
      ti.chunks = t.chunks.size();
      for (auto f : files) ti.files.push_back(tag_->md.files[f].path);
      std::sort(ti.files.begin(), ti.files.end());
      ti.codecs.assign(codecs.begin(), codecs.end());
      info_.raw_bytes += ti.raw_bytes;
      info_.stored_bytes += ti.stored_bytes;
      by_name_.emplace(t.name, k);
      info_.tensors.push_back(std::move(ti));
    }
  }

  /// What the verifier refers to, held by pointer so that a reader can move.
  struct opened {
    explicit opened(Store s) : storage(std::move(s)) {}
    Store storage;
    detail::metadata md;
    std::optional<detail::file_verifier<Store>> verified;  // each shard file's header, trailer and index, once
  };
  std::unique_ptr<opened> tag_;
  checkpoint_info info_;
  std::string md_name_;
  std::map<std::string, std::size_t> by_name_;
  std::vector<bool> tiling_checked_;  // per tensor of tag_->md: read_all checked its chunks tile it
  std::vector<std::string> damaged_files_;  // version 2: per file, why its footer failed ("" if sound)
};

}  // namespace ckpt
