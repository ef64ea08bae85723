#pragma once
/// @file checkpointer.hpp
/// `ckpt::checkpointer`: saves and loads a Checkpointable state under a root, composing a
/// ShardPolicy, a Storage, a Codec and a DevicePolicy.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "concepts.hpp"
#include "config.hpp"
#include "detail/collective.hpp"
#include "detail/commit.hpp"
#include "detail/chunk_reader.hpp"
#include "detail/coverage.hpp"
#include "detail/format.hpp"
#include "detail/hash.hpp"
#include "detail/metadata.hpp"
#include "detail/pipeline.hpp"
#include "detail/region.hpp"
#include "detail/shard_io.hpp"
#include "detail/streamed_gather.hpp"
#include "error.hpp"
#include "host_copy.hpp"
#include "names.hpp"
#include "options.hpp"
#include "posix.hpp"
#include "raw.hpp"
#include "save_handle.hpp"
#include "single_process.hpp"
#include "visitor.hpp"
#include "zstd.hpp"

namespace ckpt {

/// A committed tag, as `checkpointer::tags()` lists them.
struct tag_info {
  std::string tag;
  std::uint64_t iteration = 0;
  bool latest = false;  ///< the tag `latest` names
};

namespace detail {
/// A ShardPolicy that sends every rank's tensors to rank 0 (see gather_to_root).
template <class P>
concept gathers = requires { requires P::gathers; };

/// A gathering policy whose communicator moves bytes point to point: shards stream to rank 0
/// chunk by chunk at save (see streamed_gather.hpp).
template <class P>
concept streams = gathers<P> && Transport<typename P::communicator_type>;

/// A streaming policy that also scatters at load: rank 0 reads, the others receive.
template <class P>
concept scatters = streams<P> && requires(const P& p) { { p.scatter_on_load } -> std::convertible_to<bool>; };

inline constexpr std::uint64_t max_gather_bytes = (std::uint64_t{1} << 31) - 1;
inline constexpr std::string_view marker_file = ".ckpt_tag";  // "this directory is a ckpt tag"
inline constexpr std::string_view metadata_file = "metadata.json";
inline constexpr std::string_view latest_file = "latest";
inline constexpr std::string_view validation_name = "__ckpt.validation_logits";

inline std::string join(const std::vector<std::string>& v, std::size_t max_shown = 50) {
  std::string s;
  for (std::size_t i = 0; i < v.size() && i < max_shown; ++i) s += (i ? ", " : "") + printable(v[i]);
  if (v.size() > max_shown) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

inline std::string index_string(std::uint64_t flat, const shape_t& shape) {
  shape_t idx(shape.size());
  for (std::size_t d = shape.size(); d > 0; --d) {
    idx[d - 1] = shape[d - 1] ? flat % shape[d - 1] : 0;
    flat = shape[d - 1] ? flat / shape[d - 1] : 0;
  }
  return to_string(idx);
}
}  // namespace detail

/// Saves and loads the whole training state of an engine under one root.
///
/// Template parameters choose, at compile time, who writes what (`ShardPolicy`), where bytes
/// go (`Storage`), how they are encoded (`Codec`) and how they reach host memory
/// (`DevicePolicy`). Every save follows the commit protocol of docs/format.md: shard files
/// first, `metadata.json` last, then `latest`, each written under a temporary name, fsync'd and
/// renamed; a crash at any point leaves the previous checkpoint loadable.
///
/// @code
/// ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, "/ckpt/run1", {.keep_last_n = 3}};
/// cp.save(step, model, {.config = args});
/// auto r = cp.load(model, {.config = args});   // from `latest`
/// step = r.iteration;
/// @endcode
template <class Policy = single_process, class Store = posix, class Enc = raw, class Device = host_copy>
class checkpointer {
  static_assert(detail::diagnose_shard_policy<Policy>());
  static_assert(detail::diagnose_storage<Store>());
  static_assert(detail::diagnose_codec<Enc>());
  static_assert(detail::diagnose_device_policy<Device>());

 public:
  using policy_type = Policy;
  using storage_type = Store;
  using codec_type = Enc;
  using device_type = Device;

  checkpointer(Policy policy, Store storage, checkpointer_options options = {}, Enc codec = {}, Device device = {})
      : policy_(std::move(policy)), storage_(std::move(storage)), options_(std::move(options)),
        codec_(std::move(codec)), device_(std::move(device)) {
    if (options_.chunk_bytes == 0) throw error(error_kind::invalid_argument, "checkpointer_options::chunk_bytes must be > 0");
  }

  /// Waits for a save_async still in flight (its error, if any, is lost: call `wait()` first).
  ~checkpointer() { finish_pending(false); }
  // A background save refers to this object, so it stays where it was made.
  checkpointer(const checkpointer&) = delete;
  checkpointer& operator=(const checkpointer&) = delete;
  checkpointer(checkpointer&&) = delete;
  checkpointer& operator=(checkpointer&&) = delete;

  Policy& policy() noexcept { return policy_; }
  Store& storage() noexcept { return storage_; }
  const checkpointer_options& options() const noexcept { return options_; }

  /// Saves `state` as iteration `iteration` and commits it (collective: every rank calls it).
  /// On return the tag is committed and `latest` names it. On error the previous checkpoint
  /// still loads; the new tag is committed only if the failure came after its metadata.json
  /// was published (while replacing `latest` or applying retention), and is then complete.
  /// A save_async still in flight is finished first (and its error, if nobody saw it, thrown).
  template <class T>
  void save(std::uint64_t iteration, const T& state, const save_options& opts = {}) {
    static_assert(detail::diagnose_checkpointable<T>());
    finish_pending(true);
    auto plan = plan_save(iteration, state, opts);
    write_and_commit(plan, device_);
  }

  /// Starts a save and returns once `state` is snapshotted into host buffers; writing and
  /// committing continue on a background thread (collective: every rank calls it). The caller
  /// may change its tensors as soon as this returns. At most one save is in flight: the next
  /// save, save_async or load first waits for it, and throws its error if no handle's `wait()`
  /// has. The snapshot buffers are kept and reused by the next async save.
  ///
  /// On more than one rank the communicator is used from the background thread, so it must
  /// say it is safe to (`ckpt::mpi` needs MPI_Init_thread with MPI_THREAD_MULTIPLE).
  ///
  /// @code
  /// auto pending = cp.save_async(step, model, {.config = args});
  /// for (int i = 0; i < 100; ++i) train_step(model);  // overlaps the write
  /// pending.wait();                                   // committed, or throws
  /// @endcode
  template <class T>
  save_handle save_async(std::uint64_t iteration, const T& state, const save_options& opts = {}) {
    static_assert(detail::diagnose_checkpointable<T>());
    finish_pending(true);
    auto& comm = policy_.communicator();
    detail::collective(comm, [&] {
      if (comm.size() > 1) {
        if constexpr (requires { { comm.thread_safe() } -> std::convertible_to<bool>; }) {
          if (!comm.thread_safe())
            throw error(error_kind::invalid_argument,
                        "save_async on " + std::to_string(comm.size()) +
                            " ranks uses the communicator from a background thread; initialise MPI with "
                            "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or use save");
        } else {
          throw error(error_kind::invalid_argument,
                      "save_async on more than one rank needs a Communicator that may be used from a background "
                      "thread and says so with `bool thread_safe() const`");
        }
      }
    });
    auto plan = std::make_shared<save_plan>(plan_save(iteration, state, opts));
    detail::collective(comm, [&] { snapshot(*plan); });
    auto st = std::make_shared<detail::async_save_state>();
    pending_ = st;
    background_ = std::thread([this, plan, st] {
      std::exception_ptr failure;
      detail::lower_thread_priority(options_.async_nice);  // inherited by the pipeline's threads
      try {
        host_copy host;  // the snapshot is in host memory, whatever the tensors' device
        write_and_commit(*plan, host);
      } catch (...) {
        failure = std::current_exception();
      }
      st->finish(failure);
    });
    return save_handle(st);
  }

  /// Waits for the save_async in flight, if any, and throws its error if no handle's `wait()`
  /// has. Call it before exiting so the last checkpoint is committed.
  void wait() { finish_pending(true); }

  /// Loads a committed checkpoint into `state` (collective: every rank calls it) and returns
  /// what was loaded. By default the tag `latest` names; see `load_options`.
  template <class T>
  load_result load(T& state, const load_options& opts = {}) {
    static_assert(detail::diagnose_checkpointable<T>());
    finish_pending(true);
    auto& comm = policy_.communicator();
    // Rank 0 resolves the tag and reads metadata.json once; the others receive its bytes.
    std::string tag, text, map;
    std::optional<detail::metadata> parsed;  // rank 0 parses metadata.json once, to find the map
    detail::collective(comm, [&] {
      if (comm.rank() == 0) {
        tag = resolve_tag(opts);
        text = read_text(tag + "/" + std::string(detail::metadata_file), detail::max_metadata_bytes);
        const auto& md = parsed.emplace(detail::decode_metadata(text, storage_.describe(tag + "/" + std::string(detail::metadata_file))));
        // chunk_map.bin belongs to a committed tag: missing or resized, it is damage.
        const auto key = chunk_map_key(tag, md);
        const auto size = storage_.size(key);
        if (!size || *size != md.chunk_map.size)
          throw error(error_kind::corrupt, storage_.describe(key) + (size ? " has " + std::to_string(*size) + " bytes" : " is missing") +
                                               ", metadata.json recorded " + std::to_string(md.chunk_map.size));
        map = read_text(key, md.chunk_map.size);
      }
    });
    broadcast_string(comm, tag);
    broadcast_string(comm, text);
    broadcast_string(comm, map);
    const std::string md_name = storage_.describe(tag + "/" + std::string(detail::metadata_file));
    detail::metadata md;
    load_result result;
    visitor v;
    saved_contents contents;  // what v.saved() answers while the state is visited
    detail::collective(comm, [&] {
      md = parsed ? std::move(*parsed) : detail::decode_metadata(text, md_name);
      detail::decode_chunk_map(detail::as_bytes(map), md, storage_.describe(chunk_map_key(tag, md)));
      detail::validate_metadata(md, tag, md_name);
      for (const auto& t : md.tensors)
        detail::check_tiling(t.name, t.shape, t.chunks, [&](std::size_t i) -> const std::string& { return md.files[t.chunks.file[i]].path; },
                             error_kind::corrupt, md_name + ": ");
      (void)policy_.topology();
      result.tag = tag;
      result.iteration = md.iteration;
      result.config = md.config;
      result.topology = md.topology;
      if (opts.config && opts.check_config) check_config(md, *opts.config, opts.ignore_config_keys, md_name);
      std::vector<std::string> skip = opts.skip_groups;
      if (!opts.load_optimizer) skip.push_back(options_.optimizer_group);
      for (const auto& t : md.tensors) contents.add_tensor(t.name, t.type, t.shape);
      for (const auto& val : md.values) contents.add_value(val.name);
      v = visitor(skip, contents);
      detail::visit_state(v, state);
      match_names(md, v, result);
    });
    if (comm.size() > 1) {
      // With pipeline stages each rank holds only some tensors: a stored name is unexpected
      // only when no rank holds it.
      std::string mine;
      for (const auto& n : result.unexpected) mine += n + '\n';
      const auto all = comm.all_gather(detail::as_bytes(mine));
      std::map<std::string, std::size_t> seen;
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
    if constexpr (detail::scatters<Policy>) {
      if (policy_.scatter_on_load && comm.size() > 1) {
        scatter_restore(md, v, opts, result);
        return result;
      }
    }
    detail::collective(comm, [&] {
      const auto plan = plan_restore(md, v, opts, result);
      auto verify_file = file_verifier(md, result);
      read_restore(md, plan, opts, verify_file, result);
    });
    return result;
  }

  /// Applies the retention rule now, as a save with `keep_last_n = keep` would after its
  /// commit: deletes the oldest committed tags beyond the newest `keep` (never the one `latest`
  /// names) and whatever crashed saves left behind. Returns what it deleted, or with `dry_run`
  /// what it would delete. Deleting holds the root's writer lock (this checkpointer's, if it
  /// has saved, or else one taken for the call), so a prune never races another writer's save:
  /// while one holds the root, prune fails with `busy`.
  ///
  /// @code
  /// for (const auto& gone : cp.prune(3)) std::printf("deleted %s\n", gone.c_str());
  /// @endcode
  std::vector<std::string> prune(std::size_t keep, bool dry_run = false) {
    if (keep == 0) throw error(error_kind::invalid_argument, "prune: keep must be at least 1");
    finish_pending(true);
    if (dry_run) return retention_victims("", keep);
    std::optional<typename detail::writer_lock_of<Store>::type> held_for_this_call;
    if constexpr (detail::lockable_root<Store>)
      if (!writer_lock_) held_for_this_call.emplace(storage_.lock_writer(options_.wait_for_other_writer));
    auto victims = retention_victims("", keep);
    for (const auto& name : victims) remove_entry(name);
    return victims;
  }

  /// The tag `latest` names, or nothing when there is no (valid) `latest`.
  std::optional<std::string> latest() const {
    if (!storage_.size(std::string(detail::latest_file))) return std::nullopt;
    return detail::decode_latest(read_text(std::string(detail::latest_file), 1024), storage_.describe("latest"));
  }

  /// The committed tags under the root, oldest iteration first.
  std::vector<tag_info> tags() const {
    std::vector<tag_info> out;
    std::optional<std::string> last;
    try {
      last = latest();
    } catch (const error& e) {
      if (e.kind() != error_kind::corrupt) throw;  // an unreadable latest must not look absent
    }
    for (const auto& name : storage_.list("")) {
      if (!tag_problem(name).empty() || !committed(name)) continue;
      try {
        const auto key = name + "/" + std::string(detail::metadata_file);
        const auto md = detail::decode_metadata(read_text(key, detail::max_metadata_bytes), storage_.describe(key));
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

 private:
  // --- save -----------------------------------------------------------------------------------

  /// What a save writes, once every rank agreed on it.
  struct save_plan {
    std::string tag;
    std::uint64_t iteration = 0;
    ckpt::config config;
    bool overwrite = true;
    std::vector<detail::stored_tensor> mine;  // the tensors this rank writes
    std::vector<detail::stored_value> values;
    std::vector<std::string> held;  // tensors this rank holds but leaves to another writer
    detail::gathered at_root;       // under a gathering policy: what the other ranks sent rank 0
    // Streamed gathers: for each of `mine`, -1 for rank 0's own, else the rank whose bytes are
    // received as they are written; on the other ranks, the tensors they send rank 0.
    std::vector<int> source;
    std::vector<detail::stored_tensor> sent;
    std::uint64_t transfer_chunk = 0;  // rank 0's chunk size, which the transfers follow
  };

  /// The collective first half of a save: validates the state and agrees on what each rank
  /// writes (and, for gathering policies, moves it to rank 0).
  template <class T>
  save_plan plan_save(std::uint64_t iteration, const T& state, const save_options& opts) {
    auto& comm = policy_.communicator();
    save_plan plan;
    plan.tag = opts.tag.value_or(default_tag(iteration));
    plan.iteration = iteration;
    plan.config = opts.config;
    plan.overwrite = opts.overwrite;
    const std::string& tag = plan.tag;
    auto& mine = plan.mine;
    auto& values = plan.values;
    auto& held = plan.held;
    auto& at_root = plan.at_root;
    visitor v;
    detail::collective(comm, [&] {
      if (comm.rank() == 0) take_writer_lock();  // rank 0 commits: its lock stands for the job
      validate_tag(tag);
      (void)policy_.topology();  // a layout that does not fit the world fails here, on every rank
      detail::visit_state(v, state);
      for (const auto& t : v.tensors()) {
        check_tensor(t.name, t.ref);
        if (!device_.accepts(t.ref.where()))
          throw error(error_kind::invalid_argument, "tensor " + detail::printable(t.name) +
                                                        " lives on a device this checkpointer's DevicePolicy does not "
                                                        "handle (host_copy handles host memory only)");
        if (policy_.writes(t.name, t.ref))
          mine.push_back({t.name, t.ref});
        else
          held.push_back(t.name);  // rank 0 checks that some rank did write it
      }
      if (opts.validation_logits && comm.rank() == 0) {
        if (!is_floating(opts.validation_logits->type()))
          throw error(error_kind::invalid_argument, "validation logits must be floating point, not " +
                                                        std::string(to_string(opts.validation_logits->type())));
        check_tensor("validation logits", *opts.validation_logits);
        if (opts.validation_logits->where().type != device::kind::host)
          throw error(error_kind::invalid_argument, "validation logits must be in host memory");
        mine.push_back({std::string(detail::validation_name), *opts.validation_logits});
      }
      for (const auto& val : v.values()) values.push_back({val.name, static_cast<std::uint32_t>(comm.rank()), val.save()});
    });
    agree_on(comm, tag, iteration);
    if constexpr (detail::gathers<Policy>) {
      // Streamed: only names and shapes go through the gather; the bytes follow point to
      // point while rank 0 writes. Otherwise everything passes through one gather.
      constexpr bool streamed = detail::streams<Policy>;
      std::string packed;
      detail::collective(comm, [&] {
        if (comm.rank() != 0) {
          packed = detail::pack_for_root(mine, values, device_, !streamed);
          if (streamed) plan.sent = std::move(mine);
          mine.clear();
          values.clear();
        }
      });
      if constexpr (!streamed) {
        // Refuse, on every rank alike, what would not fit in a message (MPI counts are ints).
        const std::uint64_t size = packed.size();
        const auto sizes = comm.all_gather(std::as_bytes(std::span(&size, 1)));
        detail::collective(comm, [&] {
          std::uint64_t total = 0;
          for (const auto& b : sizes) {
            std::uint64_t n = 0;
            std::memcpy(&n, b.data(), std::min<std::size_t>(b.size(), 8));
            total += n;
          }
          if (total > detail::max_gather_bytes)
            throw error(error_kind::invalid_argument, "gather_to_root: the state is " + std::to_string(total) +
                                                          " bytes, more than the " + std::to_string(detail::max_gather_bytes) +
                                                          " one gather can carry; use megatron");
        });
      }
      auto parts = comm.gather(detail::as_bytes(packed), 0);
      detail::collective(comm, [&] {
        for (std::size_t r = 1; r < parts.size(); ++r) detail::unpack_at_root(parts[r], static_cast<int>(r), at_root, !streamed);
      });
      plan.source.assign(mine.size(), -1);
      for (std::size_t i = 0; i < at_root.tensors.size(); ++i) {
        mine.push_back(std::move(at_root.tensors[i]));
        plan.source.push_back(streamed ? at_root.from[i] : -1);
      }
      for (auto& val : at_root.values) values.push_back(std::move(val));
      if constexpr (streamed) {
        // The transfers follow rank 0's chunking, whatever the other ranks' options say.
        std::vector<std::byte> chunk(sizeof(std::uint64_t));
        const std::uint64_t mine_chunk = options_.chunk_bytes;
        std::memcpy(chunk.data(), &mine_chunk, sizeof mine_chunk);
        comm.broadcast(chunk, 0);
        std::memcpy(&plan.transfer_chunk, chunk.data(), sizeof plan.transfer_chunk);
      }
    }
    return plan;
  }

  /// Copies every tensor this rank writes into host buffers the checkpointer keeps (reused by
  /// the next async save), and points the plan at the copies. In a streamed gather, rank 0
  /// receives the other ranks' tensors into such buffers and they send them: once this returns
  /// on a rank, its tensors may change.
  void snapshot(save_plan& plan) {
    if constexpr (detail::streams<Policy>) {
      auto& comm = policy_.communicator();
      if (!plan.sent.empty()) {
        detail::send_to_root(comm, plan.sent, plan.transfer_chunk, device_);
        plan.sent.clear();
      }
      if (std::any_of(plan.source.begin(), plan.source.end(), [](int r) { return r >= 0; })) {
        detail::receiving_device<Device, typename Policy::communicator_type> rx(device_, comm, plan.mine, plan.source,
                                                                                  plan.transfer_chunk);
        try {
          copy_into_snapshot(plan, rx);
        } catch (...) {
          rx.drain();
          throw;
        }
        plan.source.clear();  // every tensor is in host memory now
        return;
      }
    }
    copy_into_snapshot(plan, device_);
  }

  template <class Dev>
  void copy_into_snapshot(save_plan& plan, Dev& device) {
    std::size_t k = 0;
    for (auto& t : plan.mine) {
      if (k == snapshot_.size()) snapshot_.emplace_back();
      auto& buf = snapshot_[k];
      const bool remote = k < plan.source.size() && plan.source[k] >= 0;
      ++k;
      buf.resize(static_cast<std::size_t>(t.ref.nbytes()), device_);
      if (remote) {
        for (const auto& r : detail::transfer_ranges(t.ref, plan.transfer_chunk))
          device.to_host(t.ref, r.offset, buf.span().subspan(static_cast<std::size_t>(r.offset), static_cast<std::size_t>(r.bytes)));
      } else if (t.ref.where().type == device::kind::host) {
        if (!buf.empty()) std::memcpy(buf.data(), t.ref.data(), buf.size());
      } else {
        device.to_host(t.ref, 0, buf.span());
      }
      tensor_ref copy(t.ref.type(), t.ref.shape(), buf.data());
      if (t.ref.shard()) copy.sharded(*t.ref.shard());
      t.ref = std::move(copy);
    }
  }

  /// The collective second half: prepare the tag, write every rank's file, commit.
  template <class Dev>
  void write_and_commit(const save_plan& plan, Dev& device) {
    auto& comm = policy_.communicator();
    const std::string& tag = plan.tag;
    detail::collective(comm, [&] {
      if (comm.rank() == 0) prepare_tag(tag, plan.overwrite);
    });
    comm.barrier();
    std::optional<detail::written_shard> written;
    detail::collective(comm, [&] {
      if constexpr (detail::streams<Policy>) {
        if (!plan.sent.empty()) detail::send_to_root(comm, plan.sent, plan.transfer_chunk, device);
      }
      if (auto path = policy_.shard_file()) {
        const auto rank = static_cast<std::uint32_t>(comm.rank());
        if constexpr (detail::streams<Policy>) {
          if (std::any_of(plan.source.begin(), plan.source.end(), [](int r) { return r >= 0; })) {
            // The other ranks' chunks arrive as the pipeline stages them (see receiving_device).
            detail::receiving_device<Dev, typename Policy::communicator_type> rx(device, comm, plan.mine, plan.source,
                                                                               plan.transfer_chunk);
            try {
              detail::check_key(*path);
              written = detail::write_shard(storage_, tag, *path, rank, plan.mine, plan.values, codec_, rx, write_settings());
            } catch (...) {
              rx.drain();
              throw;
            }
            if (!rx.complete()) {
              rx.drain();
              throw error(error_kind::communication, "gather_to_root: rank 0 wrote its file without every chunk sent to it");
            }
            return;
          }
        }
        detail::check_key(*path);
        written = detail::write_shard(storage_, tag, *path, rank, plan.mine, plan.values, codec_, device, write_settings());
      } else if (!plan.mine.empty() || !plan.values.empty()) {
        throw error(error_kind::invalid_argument, "the shard policy gives rank " + std::to_string(comm.rank()) +
                                                      " tensors to write but no file to write them to");
      }
    });
    const auto report = detail::encode_report(written, plan.held);
    auto reports = comm.gather(detail::as_bytes(report), 0);
    detail::collective(comm, [&] {
      if (comm.rank() == 0) commit(tag, plan.iteration, plan.config, reports);
    });
    detail::collective(comm, [&] {
      if (comm.rank() == 0) apply_retention(tag);
    });
  }

  /// Joins the background save, if any; throws its error when `rethrow` and nobody saw it.
  void finish_pending(bool rethrow) {
    if (background_.joinable()) background_.join();
    if (auto st = std::exchange(pending_, nullptr)) {
      std::lock_guard lock(st->mu);
      const bool unseen = !st->observed;
      st->observed = true;
      if (rethrow && unseen && st->failure) std::rethrow_exception(st->failure);
    }
  }


  detail::write_settings write_settings() const noexcept {
    return {options_.chunk_bytes, options_.threads, options_.buffer_bytes};
  }

  static void check_tensor(const std::string& name, const tensor_ref& t) {
    if (t.data() == nullptr && t.nbytes() != 0)
      throw error(error_kind::invalid_argument, "tensor " + detail::printable(name) + " has no data pointer");
    if (t.shape().size() > detail::max_dims)
      throw error(error_kind::invalid_argument, "tensor " + detail::printable(name) + " has more than 64 dimensions");
    if (const auto& s = t.shard(); s && !s->replicated) {
      const auto n = t.shape().size();
      if (s->global_shape.size() != n || s->offset.size() != n)
        throw error(error_kind::invalid_argument, "tensor " + detail::printable(name) + ": shard spec has " +
                                                      std::to_string(s->global_shape.size()) + "-d global shape and " +
                                                      std::to_string(s->offset.size()) + "-d offset for a " +
                                                      std::to_string(n) + "-d tensor");
      detail::element_count(s->global_shape, "tensor " + name);
      for (std::size_t d = 0; d < n; ++d)
        if (s->offset[d] > s->global_shape[d] || t.shape()[d] > s->global_shape[d] - s->offset[d])
          throw error(error_kind::invalid_argument, "tensor " + detail::printable(name) + ": local shape " +
                                                        detail::to_string(t.shape()) + " at offset " +
                                                        detail::to_string(s->offset) + " exceeds the global shape " +
                                                        detail::to_string(s->global_shape));
    }
  }

  /// Takes the root's writer lock at the first save, and keeps it for the checkpointer's life.
  void take_writer_lock() {
    if constexpr (detail::lockable_root<Store>)
      if (!writer_lock_) writer_lock_.emplace(storage_.lock_writer(options_.wait_for_other_writer));
  }

  /// All ranks must save the same tag at the same iteration.
  template <class Comm>
  static void agree_on(Comm& comm, const std::string& tag, std::uint64_t iteration) {
    if (comm.size() == 1) return;
    const std::string mine = std::to_string(iteration) + " " + tag;
    const auto all = comm.all_gather(detail::as_bytes(mine));
    detail::collective(comm, [&] {
      for (std::size_t r = 1; r < all.size(); ++r)
        if (all[r] != all[0]) {
          auto text = [&](std::size_t i) { return std::string(reinterpret_cast<const char*>(all[i].data()), all[i].size()); };
          throw error(error_kind::invalid_argument, "ranks disagree on what to save: rank 0 has iteration and tag '" +
                                                        text(0) + "', rank " + std::to_string(r) + " has '" + text(r) + "'");
        }
    });
  }

  /// The storage key of a tag's chunk_map.bin, its path checked before any read.
  std::string chunk_map_key(const std::string& tag, const detail::metadata& md) const {
    const auto where = storage_.describe(tag + "/" + std::string(detail::metadata_file));
    try {
      detail::check_key(md.chunk_map.path);
    } catch (const error& e) {
      throw error(error_kind::corrupt, where + ": " + e.what());
    }
    if (md.chunk_map.path.find('/') != std::string::npos || md.chunk_map.path == detail::metadata_file ||
        md.chunk_map.path == detail::marker_file)
      throw error(error_kind::corrupt, where + ": chunk_map names " + detail::printable(md.chunk_map.path));
    return tag + "/" + md.chunk_map.path;
  }

  /// Whether `tag` is a directory ckpt started: it holds ckpt's marker, or nothing but the
  /// temporary file of a marker whose writer was killed before renaming it. (An empty
  /// directory may be anyone's, so it is left alone; a save into it still works.)
  bool started_by_ckpt(const std::string& tag) const {
    if (storage_.size(tag + "/" + std::string(detail::marker_file))) return true;
    const auto entries = storage_.list(tag);
    const std::string temp_marker = std::string(detail::marker_file) + ".tmp.";
    return !entries.empty() &&
           std::all_of(entries.begin(), entries.end(), [&](const std::string& e) { return e.starts_with(temp_marker); });
  }

  bool committed(const std::string& tag) const {
    return storage_.size(tag + "/" + std::string(detail::metadata_file)).has_value();
  }

  /// Rank 0, before any shard is written: refuse or uncommit an existing tag, and mark the
  /// directory as ckpt's so a crashed save can be recognised and cleaned up later.
  void prepare_tag(const std::string& tag, bool overwrite) {
    if (committed(tag)) {
      std::optional<std::string> last;
      try {
        last = latest();
      } catch (const error& e) {
        if (e.kind() != error_kind::corrupt) throw;
      }
      if (last && *last == tag)
        throw error(error_kind::invalid_argument, "tag " + detail::printable(tag) +
                                                      " is the one 'latest' names: saving over it could lose the last "
                                                      "good checkpoint; save under another tag");
      if (!overwrite)
        throw error(error_kind::invalid_argument, "tag " + detail::printable(tag) + " is already committed (set overwrite)");
      storage_.remove(tag + "/" + std::string(detail::metadata_file));  // uncommit first, then rewrite
    }
    // A directory of that name that ckpt did not write is the user's: never write into it (a
    // failed save would otherwise mark it as ckpt's and the next cleanup would delete it).
    // One with ckpt's marker but no metadata.json is what a crashed save left: start afresh.
    const auto existing = storage_.list(tag);
    if (!existing.empty()) {
      if (!started_by_ckpt(tag))
        throw error(error_kind::invalid_argument, storage_.describe(tag) +
                                                      " exists and was not written by ckpt; refusing to save into it");
      if (!committed(tag)) remove_tag(tag);
    }
    // The marker goes first, so that anything else in the directory is known to be ckpt's. If
    // writing it fails in a directory this save just created, take the directory away again.
    const bool fresh = storage_.list(tag).empty();
    try {
      write_file(tag + "/" + std::string(detail::marker_file),
                 "written by ckpt; this tag is committed once metadata.json exists\n");
    } catch (const error&) {
      if (fresh) {
        try {
          storage_.remove_all(tag);
        } catch (const error&) {
          // the marker failure is the error worth reporting
        }
      }
      throw;
    }
  }

  /// Rank 0: merge the ranks' indexes, check the tiling, write metadata.json, then latest.
  void commit(const std::string& tag, std::uint64_t iteration, const config& cfg,
              const std::vector<std::vector<std::byte>>& reports) {
    // The previous commit's tables and staging buffer are reused (see merge_reports).
    auto md = detail::merge_reports(tag, iteration, policy_.topology(), cfg, reports, detail::merge_threads(), &last_commit_);
    {
      auto w = storage_.create(tag + "/" + md.chunk_map.path);
      detail::write_chunk_map(md, w, chunk_map_staging_);
      w.sync();
      w.publish();
    }
    write_file(tag + "/" + std::string(detail::metadata_file), detail::encode_metadata(md));  // the commit point
    last_commit_ = std::move(md);
    write_file(std::string(detail::latest_file), detail::encode_latest(tag));
  }

  void write_file(const std::string& key, std::string_view content) {
    auto w = storage_.create(key);
    w.write(std::as_bytes(std::span(content.data(), content.size())));
    w.sync();
    w.publish();
  }

  /// Rank 0, after a commit: delete committed tags beyond keep_last_n (never the one `latest`
  /// names, never directories without ckpt's marker or metadata) and leftovers of crashed saves.
  void apply_retention(const std::string& current) {
    for (const auto& name : retention_victims(current, options_.keep_last_n)) remove_entry(name);
  }

  /// What the retention rule deletes, in the order it deletes them: temporary `latest` files
  /// and tags of saves that never committed, then the oldest committed tags beyond `keep`
  /// (0: keep all). `current` (the tag just saved, or none) and the tag `latest` names stay.
  std::vector<std::string> retention_victims(const std::string& current, std::size_t keep) const {
    std::vector<std::string> out;
    for (const auto& name : storage_.list("")) {
      if (name.starts_with(std::string(detail::latest_file) + ".tmp.")) {
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

  void remove_entry(const std::string& name) {
    if (name.starts_with(std::string(detail::latest_file) + ".tmp."))
      storage_.remove(name);
    else
      remove_tag(name);
  }

  /// Deletes one of ckpt's tag directories so that, however it is interrupted, what is left is
  /// still recognisably ckpt's and uncommitted: metadata.json goes first, the marker last (a
  /// kill in the middle leaves the marker, and the next save finishes the job), and an empty
  /// directory at worst. Deleting the tree in the file system's order could remove the marker
  /// first and leave files that no later save would touch.
  void remove_tag(const std::string& tag) {
    storage_.remove(tag + "/" + std::string(detail::metadata_file));
    for (const auto& entry : storage_.list(tag))
      if (entry != detail::marker_file) storage_.remove_all(tag + "/" + entry);
    storage_.remove_all(tag);  // the marker, then the directory
  }

  // --- load -----------------------------------------------------------------------------------

  std::string read_text(const std::string& key, std::uint64_t limit) const {
    const auto size = storage_.size(key);
    if (!size) throw error(error_kind::not_found, "no such file: " + storage_.describe(key));
    if (*size > limit)
      throw error(error_kind::corrupt, storage_.describe(key) + " is " + std::to_string(*size) + " bytes, more than the " +
                                           std::to_string(limit) + " such a file can hold");
    std::string s(*size, '\0');
    storage_.read(key, 0, std::as_writable_bytes(std::span(s.data(), s.size())));
    return s;
  }

  std::string existing_tags_text() const {
    std::vector<std::string> names;
    for (const auto& t : tags()) names.push_back(t.tag + (t.latest ? " (latest)" : ""));
    return names.empty() ? "there are no committed tags under " + storage_.describe("")
                         : "committed tags: " + detail::join(names);
  }

  std::string resolve_tag(const load_options& opts) const {
    if (opts.tag) {
      validate_tag(*opts.tag);
      if (!committed(*opts.tag))
        throw error(error_kind::not_found, "no committed tag " + detail::printable(*opts.tag) + "; " + existing_tags_text());
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
    if (!last) throw error(error_kind::not_found, "no checkpoint to load: " + storage_.describe("latest") + " does not exist");
    if (!committed(*last))
      throw error(error_kind::not_found, storage_.describe("latest") + " names " + detail::printable(*last) +
                                             ", which is not committed (no metadata.json); " + existing_tags_text());
    return *last;
  }

  template <class Comm>
  static void broadcast_string(Comm& comm, std::string& s) {
    if (comm.size() == 1) return;
    std::vector<std::byte> b(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
    comm.broadcast(b, 0);
    s.assign(reinterpret_cast<const char*>(b.data()), b.size());
  }

  static void check_config(const detail::metadata& md, const config& live, const std::vector<std::string>& ignore,
                           const std::string& md_name) {
    std::set<std::string> keys;
    for (const auto& [k, _] : md.config.entries()) keys.insert(k);
    for (const auto& [k, _] : live.entries()) keys.insert(k);
    std::string diffs;
    for (const auto& k : keys) {
      if (std::find(ignore.begin(), ignore.end(), k) != ignore.end()) continue;
      const auto* a = md.config.find(k);
      const auto* b = live.find(k);
      if (a && b && *a == *b) continue;
      diffs += (diffs.empty() ? "" : "; ") + k + " saved " + (a ? *a : std::string("(absent)")) + ", current " +
               (b ? *b : std::string("(absent)"));
    }
    if (!diffs.empty()) throw error(error_kind::mismatch, "config mismatch in " + md_name + ": " + diffs);
  }

  /// Lists live names the checkpoint lacks (missing), stored names the live state lacks
  /// (unexpected) and stored names inside skipped groups (skipped).
  static void match_names(const detail::metadata& md, const visitor& v, load_result& result) {
    std::unordered_set<std::string_view> stored;
    for (const auto& t : md.tensors) stored.insert(t.name);
    std::unordered_set<std::string_view> stored_values;
    for (const auto& val : md.values) stored_values.insert(val.name);
    std::set<std::string_view> live;
    for (const auto& t : v.tensors()) {
      live.insert(t.name);
      if (!stored.count(t.name)) result.missing.push_back(t.name);
    }
    for (const auto& val : v.values()) {
      live.insert(val.name);
      if (!stored_values.count(val.name)) result.missing.push_back(val.name);
    }
    std::unordered_set<std::string_view> done;  // values appear once per rank
    auto classify = [&](const std::string& name) {
      if (name.starts_with("__ckpt") || live.count(name) || !done.insert(name).second) return;
      (v.in_skipped_group(name) ? result.skipped : result.unexpected).push_back(name);
    };
    for (const auto& t : md.tensors) classify(t.name);
    for (const auto& val : md.values) classify(val.name);
  }

  using tensor_load = detail::tensor_load;

  /// What a load reads for this rank, decided (and checked) before any byte is read.
  struct restore_plan {
    std::vector<tensor_load> tensors;
    std::vector<std::pair<const value_entry*, const detail::value_meta*>> values;  // live value, stored one
  };

  /// Checks the live state against the checkpoint and decides what to read: every live tensor
  /// that is stored, and the stored value each live value is restored from.
  restore_plan plan_restore(const detail::metadata& md, const visitor& v, const load_options& opts, load_result& result) {
    auto& comm = policy_.communicator();
    const std::string tag_dir = md.tag + "/";
    std::unordered_map<std::string_view, const detail::tensor_meta*> stored;
    for (const auto& t : md.tensors) stored.emplace(t.name, &t);
    std::unordered_map<std::string_view, std::vector<const detail::value_meta*>> stored_values;
    for (const auto& val : md.values) stored_values[val.name].push_back(&val);
    const std::string md_name = storage_.describe(tag_dir + std::string(detail::metadata_file));
    if (opts.strict && (!result.missing.empty() || !result.unexpected.empty())) {
      std::string msg = "checkpoint " + md.tag + " does not match the live state";
      if (!result.missing.empty()) msg += "; missing from the checkpoint: " + detail::join(result.missing);
      if (!result.unexpected.empty()) msg += "; in the checkpoint but not in the live state: " + detail::join(result.unexpected);
      throw error(error_kind::mismatch, msg + " (" + md_name + ")");
    }
    for (const auto& t : v.tensors()) {
      auto it = stored.find(t.name);
      if (it == stored.end()) continue;
      const auto& s = *it->second;
      // Layouts first: a column-major tensor's shapes are in memory order, which only make
      // sense to the user reversed (and a square matrix's agree in either order).
      if (s.order != t.ref.order() ||
          (s.order == layout::column_major && (s.type != t.ref.type() || s.shape != t.ref.global_shape())))
        throw error(error_kind::mismatch, "tensor " + detail::printable(t.name) + ": saved " + std::string(to_string(s.type)) +
                                              " " + std::string(to_string(s.order)) + " " +
                                              detail::to_string(detail::logical_shape(s.shape, s.order)) + ", live " +
                                              std::string(to_string(t.ref.type())) + " " + std::string(to_string(t.ref.order())) +
                                              " " + detail::to_string(detail::logical_shape(t.ref.global_shape(), t.ref.order())) +
                                              " (" + md_name + ")");
      if (s.type != t.ref.type() || s.shape != t.ref.global_shape())
        throw error(error_kind::mismatch, "tensor " + detail::printable(t.name) + ": saved " + std::string(to_string(s.type)) +
                                              " " + detail::to_string(s.shape) + ", live " +
                                              std::string(to_string(t.ref.type())) + " " +
                                              detail::to_string(t.ref.global_shape()) + " (" + md_name + ")");
      if (!t.ref.writable())
        throw error(error_kind::invalid_argument, "tensor " + detail::printable(t.name) + " is read-only and cannot be loaded into");
      if (!device_.accepts(t.ref.where()))
        throw error(error_kind::invalid_argument, "tensor " + detail::printable(t.name) + " lives on a device the DevicePolicy does not handle");
    }

    // Per-rank values decide before any byte is read whether the load can go ahead at all.
    const auto live_topology = policy_.topology();
    const bool same_layout = md.topology == live_topology;
    if (!same_layout && opts.on_topology_change == topology_change::error && !v.values().empty())
      throw error(error_kind::mismatch, "checkpoint " + md.tag + " was saved with " + to_string(md.topology) +
                                            " and is loaded with " + to_string(live_topology) +
                                            ": per-rank values (RNG states) cannot be restored rank-for-rank; set "
                                            "load_options::on_topology_change to keep_live or from_rank_0");

    restore_plan plan;
    for (const auto& t : v.tensors())
      if (auto it = stored.find(t.name); it != stored.end()) plan.tensors.push_back({it->second, &t.name, &t.ref});

    // Values are per rank: restored rank-for-rank when the layout is the one saved, otherwise
    // as the caller chose.
    const auto my_rank = same_layout ? static_cast<std::uint32_t>(comm.rank()) : 0u;
    for (const auto& val : v.values()) {
      auto it = stored_values.find(val.name);
      if (it == stored_values.end()) continue;
      if (!same_layout && opts.on_topology_change == topology_change::keep_live) {
        result.kept_live.push_back(val.name);
        continue;
      }
      const detail::value_meta* pick = nullptr;
      for (const auto* m : it->second)
        if (m->rank == my_rank) pick = m;
      if (!pick)
        throw error(error_kind::mismatch, "value " + detail::printable(val.name) + " was not saved by rank " +
                                              std::to_string(my_rank) + " (" + md_name + ")");
      plan.values.emplace_back(&val, pick);
    }
    return plan;
  }

  /// Checks a shard file's header, trailer and footer index the first time a load touches it.
  auto file_verifier(const detail::metadata& md, load_result& result) const {
    return [this, &md, &result, verified = std::set<std::uint32_t>{}](std::uint32_t f) mutable {
      if (!verified.insert(f).second) return;
      const auto& fm = md.files[f];
      detail::verify_shard_file(storage_, md.tag + "/" + fm.path, fm.size, fm.index_xxh3);
      result.bytes_read += detail::header_used + detail::trailer_bytes;
    };
  }

  /// Reads the chunks that overlap the planned tensors, verifies them, and restores values.
  template <class Verify>
  void read_restore(const detail::metadata& md, const restore_plan& plan, const load_options& opts, Verify& verify_file,
                    load_result& result) {
    const std::string tag_dir = md.tag + "/";
    result.bytes_read += chunks().load(plan.tensors, md, tag_dir, verify_file, device_);
    if (opts.validation_logits) check_validation(md, *opts.validation_logits, opts, tag_dir, verify_file, result);
    // Values last: they are small, and restoring them only after every tensor verified keeps
    // iteration counters and RNGs consistent with the weights.
    for (const auto& [val, pick] : plan.values) {
      verify_file(pick->file);
      const auto key = tag_dir + md.files[pick->file].path;
      const auto bytes = detail::read_value(storage_, key, *pick);
      result.bytes_read += bytes.size();
      val->load(bytes, "value " + detail::printable(val->name) + " in " + storage_.describe(key));
    }
  }

  /// gather_to_root's load over a Transport: rank 0 reads every rank's tensors and values and
  /// sends them; the others receive them straight into their tensors (GPU memory, with NCCL)
  /// and never touch storage. Rank 0 holds one tensor of another rank at a time.
  void scatter_restore(const detail::metadata& md, const visitor& v, const load_options& opts, load_result& result) {
    auto& comm = policy_.communicator();
    restore_plan plan;
    std::string request;
    detail::collective(comm, [&] {
      plan = plan_restore(md, v, opts, result);
      if (comm.rank() == 0) return;  // rank 0 also checks the validation logits; the others read nothing
      detail::scatter_request req;
      for (const auto& t : plan.tensors) {
        req.tensors.push_back({static_cast<std::uint32_t>(t.stored - md.tensors.data()), t.ref->shape(), t.ref->global_offset()});
      }
      for (const auto& pv : plan.values) req.values.push_back(static_cast<std::uint32_t>(pv.second - md.values.data()));
      request = detail::encode_request(req);
    });
    const auto requests = comm.gather(detail::as_bytes(request), 0);
    detail::collective(comm, [&] {
      if (comm.rank() == 0)
        serve_scatter(md, plan, opts, requests, result);
      else
        receive_scatter(md, plan);
    });
  }

  /// Rank 0: its own load, then each other rank's tensors and values, in rank order. Whatever
  /// fails, every rank still waiting is told so (one status word each), then the error is thrown.
  void serve_scatter(const detail::metadata& md, const restore_plan& own, const load_options& opts,
                     const std::vector<std::vector<std::byte>>& requests, load_result& result) {
    auto& comm = policy_.communicator();
    auto verify_file = file_verifier(md, result);
    const std::string tag_dir = md.tag + "/";
    std::exception_ptr failure;
    try {
      read_restore(md, own, opts, verify_file, result);
    } catch (...) {
      failure = std::current_exception();
    }
    std::vector<shape_t> shapes;
    for (const auto& t : md.tensors) shapes.push_back(t.shape);
    host_copy host;
    std::vector<std::byte> buffer;
    load_result ignored;  // the bytes rank 0 reads for others are not its own load's
    auto tell_failed = [&](int r) {
      try {
        detail::send_status(comm, detail::scatter_failed, r);
      } catch (...) {
        // a broken communicator: the error already on its way out is the one to report
      }
    };
    for (int r = 1; r < comm.size(); ++r) {
      if (failure) {
        tell_failed(r);
        continue;
      }
      try {
        const auto req = detail::decode_request(requests[static_cast<std::size_t>(r)], r, md.tensors.size(), shapes, md.values.size());
        for (const auto& t : req.tensors) {
          const auto& stored = md.tensors[t.stored];
          const std::string what = "tensor " + detail::printable(stored.name) + " for rank " + std::to_string(r);
          buffer.resize(static_cast<std::size_t>(detail::checked_mul(detail::element_count(t.shape, what), size_of(stored.type), what)));
          tensor_ref slice(stored.type, t.shape, buffer.data());
          slice.sharded(shard_spec{.global_shape = stored.shape, .offset = t.offset});
          ignored.bytes_read += chunks().load({{&stored, &stored.name, &slice}}, md, tag_dir, verify_file, host);
          detail::send_status(comm, detail::scatter_ok, r);
          comm.send_host(buffer, r);
        }
        for (auto index : req.values) {
          const auto& pick = md.values[index];
          verify_file(pick.file);
          const auto bytes = detail::read_value(storage_, tag_dir + md.files[pick.file].path, pick);
          detail::send_status(comm, detail::scatter_ok, r);
          comm.send_host(bytes, r);
        }
        detail::send_status(comm, detail::scatter_end, r);
      } catch (...) {
        failure = std::current_exception();
        tell_failed(r);
      }
    }
    if (failure) std::rethrow_exception(failure);
  }

  /// A rank other than 0: receives its tensors and values from rank 0, in the order it asked.
  /// Rank 0 sends every item whatever happens here, so a local failure (a value whose type
  /// changed, a tensor the Transport cannot receive into) does not stop the receiving: the
  /// rest is received (into a sink if need be) up to rank 0's last word, then the first error
  /// is thrown.
  void receive_scatter(const detail::metadata& md, const restore_plan& plan) {
    auto& comm = policy_.communicator();
    auto expect = [&](const std::string& what) {
      const auto status = detail::recv_status(comm);
      if (status == detail::scatter_ok) return;
      throw error(error_kind::io, std::string(status == detail::scatter_failed ? "rank 0 failed to read " : "rank 0 sent nothing for ") +
                                      what + " (rank 0's error follows from rank 0)");
    };
    std::exception_ptr failure;
    std::vector<std::byte> bytes;
    auto sink = [&](std::uint64_t n) {  // what could not land where it belongs
      try {
        bytes.resize(static_cast<std::size_t>(n));
        comm.recv_host(bytes, 0);
      } catch (...) {
        std::rethrow_exception(failure);  // the communicator itself is broken
      }
    };
    for (const auto& t : plan.tensors) {
      expect("tensor " + detail::printable(*t.name));
      if (failure) {
        sink(t.ref->nbytes());
        continue;
      }
      bool received = false;
      try {
        if (detail::transport_moves(comm, *t.ref)) {
          comm.recv_tensor(*t.ref, 0, t.ref->nbytes(), 0);
          received = true;
        } else {  // staged through the DevicePolicy (GPU memory over MPI)
          bytes.resize(static_cast<std::size_t>(t.ref->nbytes()));
          comm.recv_host(bytes, 0);
          received = true;
          device_.from_host(bytes, *t.ref, 0);
        }
      } catch (...) {
        failure = std::current_exception();
        if (!received) sink(t.ref->nbytes());
      }
    }
    for (const auto& [val, pick] : plan.values) {
      expect("value " + detail::printable(val->name));
      bytes.resize(static_cast<std::size_t>(pick->size));
      comm.recv_host(bytes, 0);
      if (failure) continue;
      try {
        val->load(bytes, "value " + detail::printable(val->name) + " received from rank 0 (" +
                             storage_.describe(md.tag + "/" + md.files[pick->file].path) + ")");
      } catch (...) {
        failure = std::current_exception();
      }
    }
    if (detail::recv_status(comm) != detail::scatter_end)
      throw error(error_kind::io, "rank 0 failed after sending this rank's state (rank 0's error follows from rank 0)");
    if (failure) std::rethrow_exception(failure);
  }

  /// The load stage that reads, verifies and decodes chunks into tensors (detail/chunk_reader.hpp).
  detail::chunk_reader<Store, Enc> chunks() const { return {storage_, codec_, options_.threads}; }

  template <class Verify>
  void check_validation(const detail::metadata& md, const tensor_ref& live, const load_options& opts,
                        const std::string& tag_dir, Verify& verify_file, load_result& result) {
    const detail::tensor_meta* s = nullptr;
    for (const auto& t : md.tensors)
      if (t.name == detail::validation_name) s = &t;
    if (!s) throw error(error_kind::not_found, "checkpoint " + md.tag + " holds no validation logits (save them with save_options::validation_logits)");
    if (!is_floating(live.type()) || live.where().type != device::kind::host)
      throw error(error_kind::invalid_argument, "validation logits must be a floating-point host tensor");
    if (s->shape != live.shape())
      throw error(error_kind::mismatch, "validation logits: saved shape " + detail::to_string(s->shape) + ", current " +
                                            detail::to_string(live.shape()));
    std::vector<std::byte> saved(detail::element_count(s->shape, "validation logits") * size_of(s->type));
    tensor_ref saved_ref(s->type, s->shape, saved.data());
    host_copy host;
    const std::string name = "validation logits";
    result.bytes_read += chunks().load({{s, &name, &saved_ref}}, md, tag_dir, verify_file, host);
    const auto n = live.numel();
    std::uint64_t bad = 0, worst = 0;
    double worst_diff = 0;  // over the failing elements; NaN counts as infinitely far
    for (std::uint64_t i = 0; i < n; ++i) {
      const double a = element_as_double(saved.data(), s->type, i);
      const double b = element_as_double(live.data(), live.type(), i);
      const double diff = std::fabs(a - b);
      if (diff <= opts.atol + opts.rtol * std::fabs(a)) continue;  // like torch.allclose; false for NaN
      const double key = std::isnan(diff) ? HUGE_VAL : diff;
      if (bad++ == 0 || key > worst_diff) {
        worst_diff = key;
        worst = i;
      }
    }
    if (bad) {
      std::ostringstream msg;
      msg.precision(9);
      msg << "validation logits differ from those saved with " << md.tag << ": " << bad << " of " << n
          << " elements outside rtol=" << opts.rtol << " atol=" << opts.atol << "; max abs difference " << worst_diff
          << " at " << detail::index_string(worst, live.shape()) << " (saved "
          << element_as_double(saved.data(), s->type, worst) << ", now " << element_as_double(live.data(), live.type(), worst)
          << ")";
      throw error(error_kind::mismatch, msg.str());
    }
  }

  Policy policy_;
  Store storage_;
  checkpointer_options options_;
  Enc codec_;
  Device device_;
  // The save_async in flight: its thread (which uses this object) and its shared state.
  std::thread background_;
  std::shared_ptr<detail::async_save_state> pending_;
  std::vector<detail::staging_buffer<Device>> snapshot_;  // async saves' copies of the tensors, reused (pinned when lent)
  // Rank 0's last commit: its chunk tables are reused by the next one, as is the buffer the
  // chunk map is streamed through.
  detail::metadata last_commit_;
  std::vector<std::byte> chunk_map_staging_;
  // Rank 0: the root's writer lock, from the first save on (Storages that have one).
  std::optional<typename detail::writer_lock_of<Store>::type> writer_lock_;
};

}  // namespace ckpt
