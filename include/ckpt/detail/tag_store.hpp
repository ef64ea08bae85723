#pragma once
// The tags under a root: which are committed, which one `latest` names, resolving what a load
// asks for, reading a tag's metadata, and the commit protocol's steps on rank 0 (prepare,
// commit, retention) under the root's writer lock. Everything here runs on one rank; the
// checkpointer decides which rank calls what.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../names.hpp"
#include "../options.hpp"
#include "../topology.hpp"
#include "commit.hpp"
#include "format.hpp"
#include "keys.hpp"
#include "metadata.hpp"

namespace ckpt::detail {

inline constexpr std::string_view marker_file = ".ckpt_tag";  // "this directory is a ckpt tag"
inline constexpr std::string_view metadata_file = "metadata.json";
inline constexpr std::string_view latest_file = "latest";

/// `tag`/metadata.json.
inline std::string metadata_key(std::string_view tag) { return join_key(tag, metadata_file); }

/// "a", "b", ... "z" -> "'a', 'b', ..., 'z'", at most `max_shown` of them.
inline std::string join(const std::vector<std::string>& v, std::size_t max_shown = 50) {
  std::string s;
  for (std::size_t i = 0; i < v.size() && i < max_shown; ++i) s += (i ? ", " : "") + printable(v[i]);
  if (v.size() > max_shown) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

/// A tag's metadata as rank 0 read it: metadata.json and chunk_map.bin, sizes checked, and the
/// metadata parsed once already (to find the map). Other ranks receive the two texts. The texts
/// are in table memory (table_memory.hpp): for 100,000 tensors they are 9 and 6 MB, which a
/// process's first load otherwise faulted in afresh, 4 KiB at a time (reading them took 59 ms
/// there, 27 ms in table memory).
struct tag_bytes {
  std::string tag;
  table_string metadata_json;
  table_string chunk_map;
  std::optional<metadata> parsed;
};

/// The tags under one Storage's root (see the file comment). Holds a reference to the
/// Storage, and on rank 0 what one commit leaves for the next: its chunk tables, the buffer the
/// chunk map is streamed through, and the root's writer lock.
/// Deletes the rest of one of ckpt's tag directories, whose metadata.json is gone already, so
/// that, however it is interrupted, what is left is still recognisably ckpt's and uncommitted:
/// the marker goes last (a kill in the middle leaves it, and the next save finishes the job), and
/// an empty directory at worst. Deleting the tree in the file system's order could remove the
/// marker first and leave files that no later save would touch. Uses nothing but `store`'s
/// `list`, `remove_all`: retention may run it on a thread of its own.
template <class Store>
void remove_uncommitted_tag(Store& store, const std::string& tag) {
  for (const auto& entry : store.list(tag))
    if (entry != marker_file) store.remove_all(join_key(tag, entry));
  store.remove_all(tag);  // the marker, then the directory
}

template <class Store>
class tag_store {
 public:
  explicit tag_store(Store& storage) : storage_(&storage) {}

  // --- reading the root -----------------------------------------------------------------------

  /// The tag `latest` names, or nothing when there is no `latest`.
  std::optional<std::string> latest() const {
    if (!storage_->size(std::string(latest_file))) return std::nullopt;
    return decode_latest(read_text(std::string(latest_file), 1024), storage_->describe(latest_file));
  }

  /// The committed tags, oldest iteration first.
  std::vector<tag_info> tags() const {
    std::vector<tag_info> out;
    std::optional<std::string> last;
    try {
      last = latest();
    } catch (const error& e) {
      if (e.kind() != error_kind::corrupt) throw;  // an unreadable latest must not look absent
    }
    for (const auto& name : storage_->list("")) {
      if (!tag_problem(name).empty() || !committed(name)) continue;
      try {
        const auto key = metadata_key(name);
        const auto md = decode_metadata(read_text(key, max_metadata_bytes), storage_->describe(key));
        out.push_back({name, md.iteration, last && *last == name});
      } catch (const error& e) {
        // A damaged metadata.json is not a committed tag we can vouch for; but an I/O error
        // says nothing about the tag, and hiding it could let retention delete the wrong one.
        if (e.kind() != error_kind::corrupt) throw;
      }
    }
    std::sort(out.begin(), out.end(), [](const tag_info& a, const tag_info& b) {
      return a.iteration != b.iteration ? a.iteration < b.iteration : a.tag < b.tag;
    });
    return out;
  }

  bool committed(const std::string& tag) const { return storage_->size(metadata_key(tag)).has_value(); }

  /// The tag a load asks for: `opts.tag`, else the tag of `opts.iteration`, else `latest`'s;
  /// `not_found`, listing what there is, when it is not committed.
  std::string resolve(const load_options& opts) const {
    if (opts.tag) {
      validate_tag(*opts.tag);
      if (!committed(*opts.tag))
        throw error(error_kind::not_found, "no committed tag " + printable(*opts.tag) + "; " + existing_tags_text());
      return *opts.tag;
    }
    if (opts.iteration) {
      const auto t = default_tag(*opts.iteration);
      if (committed(t)) return t;
      for (const auto& info : tags())
        if (info.iteration == *opts.iteration) return info.tag;
      throw error(error_kind::not_found,
                  "no committed tag for iteration " + std::to_string(*opts.iteration) + "; " + existing_tags_text());
    }
    const auto last = latest();
    if (!last) throw error(error_kind::not_found, "no checkpoint to load: " + storage_->describe(latest_file) + " does not exist");
    if (!committed(*last))
      throw error(error_kind::not_found, storage_->describe(latest_file) + " names " + printable(*last) +
                                             ", which is not committed (no metadata.json); " + existing_tags_text());
    return *last;
  }

  /// Reads a committed tag's metadata.json and chunk_map.bin (a missing or resized map is damage).
  tag_bytes read(const std::string& tag) const {
    validate_tag(tag);
    tag_bytes out{tag, {}, {}, {}};
    const auto md_key = metadata_key(tag);
    if (!storage_->size(md_key))
      throw error(error_kind::not_found, "no committed tag " + printable(tag) + ": " + storage_->describe(md_key) + " does not exist");
    out.metadata_json = read_text<table_string>(md_key, max_metadata_bytes);
    const auto& md = out.parsed.emplace(decode_metadata(out.metadata_json, storage_->describe(md_key)));
    const auto key = chunk_map_key(tag, md);
    const auto size = storage_->size(key);
    if (!size || *size != md.chunk_map.size)
      throw error(error_kind::corrupt, storage_->describe(key) + (size ? " has " + std::to_string(*size) + " bytes" : " is missing") +
                                           ", metadata.json recorded " + std::to_string(md.chunk_map.size));
    out.chunk_map = read_text<table_string>(key, md.chunk_map.size);
    return out;
  }

  /// The metadata of a tag read by `read` (here or, its bytes received, on another rank), its
  /// chunk map merged and everything checked that can be without reading a shard file. With
  /// `check_tiling`, every tensor's chunks are checked to cover it exactly once (a reader that
  /// touches few tensors checks each as it reads it instead).
  metadata decode(tag_bytes&& bytes, bool check_all_tiling = true) const {
    const auto md_name = storage_->describe(metadata_key(bytes.tag));
    metadata md = bytes.parsed ? std::move(*bytes.parsed) : decode_metadata(bytes.metadata_json, md_name);
    decode_chunk_map(as_bytes(bytes.chunk_map), md, storage_->describe(chunk_map_key(bytes.tag, md)));
    validate_metadata(md, bytes.tag, md_name);
    if (check_all_tiling)
      for (const auto& t : md.tensors)
        if (!t.placement) check_stored_tiling(md, t, md_name);  // version 2: decode_chunk_map checked each layout
    return md;
  }

  /// `read` then `decode`.
  metadata open(const std::string& tag, bool check_all_tiling = true) const { return decode(read(tag), check_all_tiling); }

  template <class String = std::string>
  String read_text(const std::string& key, std::uint64_t limit) const {
    const auto size = storage_->size(key);
    if (!size) throw error(error_kind::not_found, "no such file: " + storage_->describe(key));
    if (*size > limit)
      throw error(error_kind::corrupt, storage_->describe(key) + " is " + std::to_string(*size) + " bytes, more than the " +
                                           std::to_string(limit) + " such a file can hold");
    String s(*size, '\0');
    storage_->read(key, 0, std::as_writable_bytes(std::span(s.data(), s.size())));
    return s;
  }

  // --- the commit protocol, on rank 0 ---------------------------------------------------------

  /// Takes the root's writer lock (Storages that have one) if not held, and keeps it for this
  /// object's life.
  void lock_writer(bool wait) {
    if constexpr (lockable_root<Store>)
      if (!writer_lock_) writer_lock_.emplace(storage_->lock_writer(wait));
  }
  bool holds_writer_lock() const noexcept { return writer_lock_.has_value(); }

  /// Before any shard is written: refuse or uncommit an existing tag, and mark the directory
  /// as ckpt's so a crashed save can be recognised and cleaned up later.
  void prepare(const std::string& tag, bool overwrite) {
    if (committed(tag)) {
      std::optional<std::string> last;
      try {
        last = latest();
      } catch (const error& e) {
        if (e.kind() != error_kind::corrupt) throw;
      }
      if (last && *last == tag)
        throw error(error_kind::invalid_argument, "tag " + printable(tag) +
                                                      " is the one 'latest' names: saving over it could lose the last "
                                                      "good checkpoint; save under another tag");
      if (!overwrite) throw error(error_kind::invalid_argument, "tag " + printable(tag) + " is already committed (set overwrite)");
      storage_->remove(metadata_key(tag));  // uncommit first, then rewrite
    }
    // A directory of that name that ckpt did not write is the user's: never write into it (a
    // failed save would otherwise mark it as ckpt's and the next cleanup would delete it).
    // One with ckpt's marker but no metadata.json is what a crashed save left: start afresh.
    if (!storage_->list(tag).empty()) {
      if (!started_by_ckpt(tag))
        throw error(error_kind::invalid_argument, storage_->describe(tag) + " exists and was not written by ckpt; refusing to save into it");
      if (!committed(tag)) remove_tag(tag);
    }
    // The marker goes first, so that anything else in the directory is known to be ckpt's. If
    // writing it fails in a directory this save just created, take the directory away again.
    const bool fresh = storage_->list(tag).empty();
    try {
      mark(tag);
    } catch (const error&) {
      if (fresh) {
        try {
          storage_->remove_all(tag);
        } catch (const error&) {
          // the marker failure is the error worth reporting
        }
      }
      throw;
    }
  }

  /// Writes chunk_map.bin, metadata.json (the commit point), then `latest`, for the metadata
  /// merged from the ranks' reports (merge_reports), its tiling checked, and completed with
  /// what the ranks wrote (attach_written). metadata.json is written around the tensors'
  /// records the merge encoded, not copied into one string with them.
  void commit(merged_metadata& merged) {
    auto& md = merged.md;
    {
      auto w = storage_->create(join_key(md.tag, md.chunk_map.path));
      write_chunk_map(md, w, chunk_map_staging_);
      w.sync();
      w.publish();
    }
    const auto around = encode_metadata_around(md, merged.tensor_records);
    write_file(metadata_key(md.tag), {around.head, merged.tensor_records, around.tail});  // the commit point
    write_file(std::string(latest_file), {encode_latest(md.tag)});
  }

  /// What the retention rule deletes, in the order it deletes them: temporary `latest` files
  /// and tags of saves that never committed, then the oldest committed tags beyond `keep`
  /// (0: keep all). `current` (the tag just saved, or none) and the tag `latest` names stay.
  std::vector<std::string> retention_victims(const std::string& current, std::size_t keep) const {
    std::vector<std::string> out;
    for (const auto& name : storage_->list("")) {
      if (is_temporary_latest(name)) {
        out.push_back(name);  // a temporary `latest` of a save that crashed before its rename
        continue;
      }
      if (name == current || !tag_problem(name).empty()) continue;
      if (committed(name)) continue;  // handled below, through tags()
      if (started_by_ckpt(name)) out.push_back(name);  // a save that never committed
    }
    if (keep == 0) return out;
    const auto last = latest();  // throws rather than guess which tag latest names
    auto all = tags();
    if (all.size() <= keep) return out;
    const auto doomed = all.size() - keep;
    for (std::size_t i = 0; i < doomed; ++i) {
      if (all[i].tag == last || all[i].tag == current) continue;
      out.push_back(all[i].tag);
    }
    return out;
  }

  /// Deletes what `retention_victims` listed.
  void remove(const std::vector<std::string>& victims) {
    for (const auto& tag : uncommit(victims)) remove_uncommitted_tag(*storage_, tag);
  }

  /// The first half of `remove`, quick whatever the tags hold: deletes the temporary `latest`
  /// files among `victims` and the metadata.json of each tag, and returns the tags, whose files
  /// `remove_uncommitted_tag` deletes (on another thread, if the Store allows it).
  std::vector<std::string> uncommit(const std::vector<std::string>& victims) {
    std::vector<std::string> tags;
    for (const auto& name : victims) {
      if (is_temporary_latest(name)) {
        storage_->remove(name);
      } else {
        storage_->remove(metadata_key(name));
        tags.push_back(name);
      }
    }
    return tags;
  }

  /// Writes ckpt's marker into `tag`: the directory is ckpt's, and committed once metadata.json
  /// exists.
  void mark(const std::string& tag) {
    write_file(join_key(tag, marker_file), {"written by ckpt; this tag is committed once metadata.json exists\n"});
  }

  /// Writes `parts`, one after another, as the file `key`, durably.
  void write_file(const std::string& key, std::initializer_list<std::string_view> parts) {
    auto w = storage_->create(key);
    for (const auto part : parts) w.write(std::as_bytes(std::span(part.data(), part.size())));
    w.sync();
    w.publish();
  }

 private:
  static bool is_temporary_latest(const std::string& name) { return name.starts_with(std::string(latest_file) + ".tmp."); }

  /// The storage key of a tag's chunk_map.bin, its path checked before any read.
  std::string chunk_map_key(const std::string& tag, const metadata& md) const {
    const auto where = storage_->describe(metadata_key(tag));
    try {
      check_key(md.chunk_map.path);
    } catch (const error& e) {
      throw error(error_kind::corrupt, where + ": " + e.what());
    }
    if (md.chunk_map.path.find('/') != std::string::npos || md.chunk_map.path == metadata_file || md.chunk_map.path == marker_file)
      throw error(error_kind::corrupt, where + ": chunk_map names " + printable(md.chunk_map.path));
    return join_key(tag, md.chunk_map.path);
  }

  /// Whether `tag` is a directory ckpt started: it holds ckpt's marker, or nothing but the
  /// temporary file of a marker whose writer was killed before renaming it. (An empty
  /// directory may be anyone's, so it is left alone; a save into it still works.)
  bool started_by_ckpt(const std::string& tag) const {
    if (storage_->size(join_key(tag, marker_file))) return true;
    const auto entries = storage_->list(tag);
    const std::string temp_marker = std::string(marker_file) + ".tmp.";
    return !entries.empty() &&
           std::all_of(entries.begin(), entries.end(), [&](const std::string& e) { return e.starts_with(temp_marker); });
  }

  /// Deletes one of ckpt's tag directories: metadata.json first, the marker last.
  void remove_tag(const std::string& tag) {
    storage_->remove(metadata_key(tag));
    remove_uncommitted_tag(*storage_, tag);
  }

  std::string existing_tags_text() const {
    std::vector<std::string> names;
    for (const auto& t : tags()) names.push_back(t.tag + (t.latest ? " (latest)" : ""));
    return names.empty() ? "there are no committed tags under " + storage_->describe("") : "committed tags: " + join(names);
  }

  Store* storage_;
  std::vector<std::byte> chunk_map_staging_;  // the buffer the chunk map is streamed through
  std::optional<typename writer_lock_of<Store>::type> writer_lock_;
};

}  // namespace ckpt::detail
