#pragma once
// The load stage between opening a tag and reading it: one index of what the checkpoint holds
// (it also answers `visitor::saved` while the state is visited), the config check, matching the
// live names against the stored ones, and the restore plan: every tensor and value this rank
// reads, checked (dtype, shape, layout, device, per-rank values under a topology change)
// before any byte is read.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "../error.hpp"
#include "../options.hpp"
#include "../topology.hpp"
#include "../visitor.hpp"
#include "chunk_details.hpp"
#include "chunk_reader.hpp"
#include "metadata.hpp"
#include "name_index.hpp"
#include "region.hpp"
#include "tag_store.hpp"

#include "../impl/decl.hpp"

namespace ckpt::detail {

/// What a tag holds, by name: built once per load from its metadata (the names are views into
/// it), so every lookup while visiting, matching and planning is one hash probe.
class stored_index final : public saved_contents {
 public:
  explicit stored_index(const metadata& md) : md_(&md), tensors_(md.tensors, name_of) {
    for (const auto& val : md.values) values_[val.name].push_back(&val);
  }

  std::optional<saved_tensor> tensor(std::string_view name) const override {
    const auto* t = find_tensor(name);
    if (!t) return std::nullopt;
    return saved_tensor{t->type, t->shape};
  }
  bool value(std::string_view name) const override { return values_.count(name) != 0; }
  std::size_t tensor_count() const override { return md_->tensors.size(); }
  /// md.tensors by name (positions in it), for the stages that look names up in a footer.
  const name_index& tensors_by_name() const noexcept { return tensors_; }

  const tensor_meta* find_tensor(std::string_view name) const {
    const auto k = tensors_.find(name, md_->tensors, name_of);
    return k == name_index::npos ? nullptr : &md_->tensors[k];
  }
  /// The stored copies of value `name`, one per rank that saved it (nullptr: none).
  const std::vector<const value_meta*>* find_value(std::string_view name) const {
    const auto it = values_.find(name);
    return it == values_.end() ? nullptr : &it->second;
  }

 private:
  static std::string_view name_of(const tensor_meta& t) noexcept { return t.name; }

  const metadata* md_;
  name_index tensors_;  // positions in md_->tensors
  std::unordered_map<std::string_view, std::vector<const value_meta*>> values_;
};

/// A `mismatch` error listing every config key whose saved and live values differ (keys in
/// `ignore` aside).
CKPT_DECL void check_config(const metadata& md, const config& live, const std::vector<std::string>& ignore, const std::string& md_name);

/// The stored record of each live tensor, in the visitor's order (nullptr: not stored). Found
/// once, by `match_names`, and taken by `plan_restore`, so that a load looks each name up once.
using stored_matches = table_vector<const tensor_meta*>;

/// Lists live names the checkpoint lacks (missing), stored names the live state lacks
/// (unexpected) and stored names inside skipped groups (skipped); returns what each live
/// tensor matched.
CKPT_DECL stored_matches match_names(const metadata& md, const stored_index& index, const visitor& v, load_result& result);

/// With pipeline stages each rank holds only some tensors: a stored name is unexpected only
/// when no rank holds it (collective over `comm`).
template <class Comm>
void agree_on_unexpected(Comm& comm, load_result& result) {
  if (comm.size() == 1) return;
  std::string mine;
  for (const auto& n : result.unexpected) mine += n + '\n';
  const auto all = comm.all_gather(as_bytes(mine));
  std::map<std::string, std::size_t, std::less<>> seen;
  for (const auto& b : all) {
    std::string_view text(reinterpret_cast<const char*>(b.data()), b.size());
    for (std::size_t at = 0; at < text.size();) {
      const auto nl = text.find('\n', at);
      ++seen[std::string(text.substr(at, nl - at))];
      at = nl + 1;
    }
  }
  std::erase_if(result.unexpected, [&](const std::string& n) { return seen[n] != all.size(); });
}

/// What a load reads for this rank, decided (and checked) before any byte is read.
struct restore_plan {
  table_vector<tensor_load> tensors;  // one per tensor: table memory (table_memory.hpp)
  std::vector<std::pair<const value_entry*, const value_meta*>> values;  // live value, stored one
};

/// The regions of stored tensors a plan reads (what chunk_reader::load reads from): views of
/// the plan's live tensors, one entry per tensor, in table memory. (With two shapes copied
/// into each entry of a vector grown by doubling, a model of 100,000 tensors made this list
/// 5.6 MB, and twice that while it grew, of fresh memory to fault in at every load: 26 ms.)
inline table_vector<wanted_region> regions_read(const metadata& md, const restore_plan& plan) {
  table_vector<wanted_region> out;
  out.reserve(plan.tensors.size());
  for (const auto& w : plan.tensors) {
    const auto& ref = *w.ref;
    if (ref.nbytes() == 0) continue;
    out.push_back({static_cast<std::size_t>(w.stored - md.tensors.data()), {offset_in_stored(ref), ref.shape()}});
  }
  return out;
}

/// The storage keys of the shard files a plan reads, each once, in the metadata's file order:
/// the files of the chunks that overlap its tensors (as chunk_reader::load picks them) and of
/// its values. What a memory tier must have on a node before the node's ranks load. Decided
/// from the metadata alone (a version-2 tag's layouts), without reading any shard file.
inline std::vector<std::string> files_read(const metadata& md, const restore_plan& plan) {
  auto used = files_holding(md, regions_read(md, plan));
  for (const auto& [live, stored] : plan.values) used[stored->file] = true;
  std::vector<std::string> keys;
  for (std::uint32_t f = 0; f < used.size(); ++f)
    if (used[f]) keys.push_back(file_key(md, f));
  return keys;
}

/// Version 2: reads the chunk details a plan needs (detail/chunk_details.hpp) from the footers
/// of the files it reads (taking what `prefetch` read already), and tells `verify` those files
/// are checked. With `also`, the whole of that stored tensor too (the validation logits).
/// `index` is md's stored_index. Returns the bytes read.
template <class Store, class Verify>
std::uint64_t read_plan_details(const Store& storage, metadata& md, const stored_index& index, const restore_plan& plan,
                                const tensor_meta* also, Verify& verify, details_prefetch<Store>* prefetch = nullptr) {
  if (md.format_version == 1) return 0;
  auto wanted = regions_read(md, plan);
  if (also)
    wanted.push_back({static_cast<std::size_t>(also - md.tensors.data()), {std::span(no_offset).first(also->shape.size()), also->shape}});
  std::vector<bool> tensors(md.tensors.size(), false);
  for (const auto& w : wanted) tensors[w.tensor] = true;
  const auto files = files_holding(md, wanted);
  const auto bytes = read_chunk_details(storage, md, tensors, files, nullptr, prefetch, &index.tensors_by_name());
  for (std::uint32_t f = 0; f < files.size(); ++f)
    if (files[f]) verify.checked(f);
  return bytes;
}

/// The file a load on `rank` most likely reads: the one shard file that rank saved, if it saved
/// exactly one (a load on the topology it was saved on reads that file alone). Version 2 only.
inline std::optional<std::uint32_t> own_file(const metadata& md, std::uint32_t rank) {
  if (md.format_version == 1) return std::nullopt;
  std::optional<std::uint32_t> found;
  for (std::uint32_t f = 0; f < md.files.size(); ++f) {
    if (md.files[f].rank != rank) continue;
    if (found) return std::nullopt;
    found = f;
  }
  return found;
}

/// Who is loading: what the plan checks the live state against besides the checkpoint.
struct restore_context {
  std::uint32_t rank = 0;
  topology live_topology;
  std::string md_name;  // metadata.json as the Storage describes it, for messages
};

/// Checks the live state against the checkpoint and decides what to read: every live tensor
/// that is stored (`matches`, what `match_names` found for `v`), and the stored value each live
/// value is restored from. `accepts(where)` says whether the DevicePolicy can load into a
/// tensor there.
CKPT_DECL restore_plan plan_restore(const metadata& md, const stored_index& index, const visitor& v, const stored_matches& matches,
                                   const load_options& opts, const restore_context& ctx,
                                   const std::function<bool(device)>& accepts, load_result& result);

}  // namespace ckpt::detail

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "../impl/restore_plan.ipp"
#endif
