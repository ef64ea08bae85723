#pragma once
/// @file checkpointer.hpp
/// `ckpt::checkpointer`: saves and loads a Checkpointable state under a root, composing a
/// ShardPolicy, a Storage, a Codec and a DevicePolicy.
///
/// Each public call is a short sequence of stages, one header each (docs/architecture.md):
/// save:  save_plan -> agree -> gather -> [snapshot] -> tag_store.prepare -> shard_io write
///        -> tag_store.commit -> retention
/// load:  tag_store open -> restore_plan -> (gather's scatter | chunk_reader) -> values

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "concepts.hpp"
#include "config.hpp"
#include "detail/chunk_reader.hpp"
#include "detail/collective.hpp"
#include "detail/commit.hpp"
#include "detail/gather.hpp"
#include "detail/restore_plan.hpp"
#include "detail/save_plan.hpp"
#include "detail/shard_io.hpp"
#include "detail/snapshot.hpp"
#include "detail/tag_store.hpp"
#include "detail/validation_logits.hpp"
#include "error.hpp"
#include "host_copy.hpp"
#include "names.hpp"
#include "options.hpp"
#include "posix.hpp"
#include "preemption.hpp"
#include "raw.hpp"
#include "save_handle.hpp"
#include "single_process.hpp"
#include "visitor.hpp"

namespace ckpt {

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

  checkpointer(Policy policy, Store storage, checkpointer_options options = {}, Enc codec = {}, Device device = {});

  /// Waits for a save_async still in flight (its error, if any, is lost: call `wait()` first).
  ~checkpointer();
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
    save_state(iteration, detail::state_ref(state), opts);
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
    return save_state_async(iteration, detail::state_ref(state), opts);
  }

  /// Waits for the save_async in flight, if any, and throws its error if no handle's `wait()`
  /// has. Call it before exiting so the last checkpoint is committed.
  void wait() { finish_pending(true); }

  /// Loads a committed checkpoint into `state` (collective: every rank calls it) and returns
  /// what was loaded. By default the tag `latest` names; see `load_options`.
  template <class T>
  load_result load(T& state, const load_options& opts = {}) {
    static_assert(detail::diagnose_checkpointable<T>());
    return load_state(detail::state_ref(state), opts);
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
  std::vector<std::string> prune(std::size_t keep, bool dry_run = false);

  /// The storage keys of the shard files a `load(state, opts)` would read on this rank, decided
  /// exactly as that load decides them, without reading any of them (collective). A memory tier
  /// uses it to bring those files to a node before its ranks load.
  template <class T>
  std::vector<std::string> files_to_read(T& state, const load_options& opts = {}) {
    static_assert(detail::diagnose_checkpointable<T>());
    finish_pending(true);
    detail::restore_context ctx;
    const auto md = open_for_load(opts, ctx);
    const detail::stored_index index(md);
    load_result result;
    visitor v;
    const auto plan = plan_load(detail::state_ref(state), opts, md, index, ctx, v, result);
    return detail::files_read(md, plan);
  }

  /// Whether to save at `step` (collective: every rank calls it at every step it may save):
  /// true when `every` > 0 and `step` is a multiple of it, and true from the first call after a
  /// preemption signal (`ckpt::preemption::install`) reached any rank, on every rank at the
  /// same step. After that, `preempted()` is true: save, then stop.
  ///
  /// The ranks agree through their own copy of the policy's communicator (`ckpt::mpi`
  /// duplicates it), made by the first call, so the agreement never meets the messages of a
  /// save_async running in the background. That first call waits for a save_async in flight.
  ///
  /// @code
  /// ckpt::preemption::install();
  /// for (; step < steps; ++step) {
  ///   train_step();
  ///   if (cp.should_save(step, 1000)) cp.save(step, model);
  ///   if (cp.preempted()) break;  // every rank leaves after the same step
  /// }
  /// @endcode
  bool should_save(std::uint64_t step, std::uint64_t every = 0);

  /// Whether a `should_save` found that some rank was signalled to stop.
  bool preempted() const noexcept { return preempted_; }

  /// The tag `latest` names, or nothing when there is no (valid) `latest`.
  std::optional<std::string> latest() const { return tags_.latest(); }

  /// The committed tags under the root, oldest iteration first.
  std::vector<tag_info> tags() const { return tags_.tags(); }

 private:
  // The bodies of save, save_async and load, which do not depend on the state's type: defined
  // below the class, out of line, so that CKPT_SEPARATE_COMPILATION's `extern template`
  // keeps them out of the user's translation units.
  void save_state(std::uint64_t iteration, detail::state_ref state, const save_options& opts);
  save_handle save_state_async(std::uint64_t iteration, detail::state_ref state, const save_options& opts);
  load_result load_state(detail::state_ref state, const load_options& opts);

  detail::restore_plan plan_load(detail::state_ref state, const load_options& opts, const detail::metadata& md,
                                 const detail::stored_index& index, const detail::restore_context& ctx, visitor& v,
                                 load_result& result);

  /// The collective first half of a save: validates the state and agrees on what each rank
  /// writes (and, for gathering policies, moves it to rank 0).
  detail::save_plan plan_save(std::uint64_t iteration, detail::state_ref state, const save_options& opts) {
    auto& comm = policy_.communicator();
    auto plan = detail::new_save_plan(iteration, opts);
    detail::collective(comm, [&] {
      if (comm.rank() == 0) tags_.lock_writer(options_.wait_for_other_writer);  // rank 0 commits: its lock stands for the job
      validate_tag(plan.tag);
      (void)policy_.topology();  // a layout that does not fit the world fails here, on every rank
      visitor v;
      state.visit(v);
      detail::collect_state(plan, v, policy_, device_, opts, comm.rank());
    });
    detail::agree_on(comm, plan.tag, iteration);
    detail::gather_plan<Policy>(comm, plan, device_, save_chunking());
    return plan;
  }

  /// The collective second half: prepare the tag, write every rank's file, commit, apply
  /// retention.
  template <class Dev>
  void write_and_commit(detail::save_plan& plan, Dev& device) {
    auto& comm = policy_.communicator();
    detail::collective(comm, [&] {
      if (comm.rank() == 0) tags_.prepare(plan.tag, plan.overwrite);
    });
    comm.barrier();
    std::optional<detail::written_shard> written;
    detail::collective(comm, [&] {
      detail::through_gather<Policy>(comm, plan, device, [&](auto& via) { written = write_own_shard(plan, via); });
    });
    // What ranks have in common reaches rank 0 once: only the lowest rank of each schema sends it.
    const auto summary = detail::summarize(written, plan.held);
    const auto report = detail::encode_report(summary, detail::sends_schema(comm, summary));
    auto reports = comm.gather(detail::as_bytes(report), 0);
    detail::collective(comm, [&] {
      if (comm.rank() == 0) tags_.commit(plan.tag, plan.iteration, policy_.topology(), plan.config, reports);
    });
    detail::collective(comm, [&] {
      if (comm.rank() == 0) tags_.remove(tags_.retention_victims(plan.tag, options_.keep_last_n));
    });
  }

  /// This rank's shard file, if the ShardPolicy gives it one.
  template <class Dev>
  std::optional<detail::written_shard> write_own_shard(const detail::save_plan& plan, Dev& device) {
    const auto path = policy_.shard_file();
    if (!path) {
      if (!plan.mine.empty() || !plan.values.empty())
        throw error(error_kind::invalid_argument, "the shard policy gives rank " + std::to_string(policy_.communicator().rank()) +
                                                      " tensors to write but no file to write them to");
      return std::nullopt;
    }
    detail::check_key(*path);
    const auto rank = static_cast<std::uint32_t>(policy_.communicator().rank());
    return detail::write_shard(storage_, plan.tag, *path, rank, plan.mine, plan.values, codec_, device,
                               detail::write_settings{save_chunking(), options_.threads, options_.buffer_bytes});
  }

  /// save_async on several ranks uses the communicator from a background thread.
  template <class Comm>
  static void check_async_allowed(const Comm& comm) {
    if (comm.size() == 1) return;
    if constexpr (detail::reports_thread_safety<Comm>) {
      if (!comm.thread_safe())
        throw error(error_kind::invalid_argument, "save_async on " + std::to_string(comm.size()) +
                                                      " ranks uses the communicator from a background thread; initialise MPI with "
                                                      "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or use save");
    } else {
      throw error(error_kind::invalid_argument,
                  "save_async on more than one rank needs a Communicator that may be used from a background "
                  "thread and says so with `bool thread_safe() const`");
    }
  }

  /// Joins the background save, if any; throws its error when `rethrow` and nobody saw it.
  void finish_pending(bool rethrow) { detail::finish_background_save(background_, pending_, rethrow); }

  /// Rank 0 resolves the tag and reads its metadata once; every rank decodes and checks it.
  detail::metadata open_for_load(const load_options& opts, detail::restore_context& ctx) {
    auto& comm = policy_.communicator();
    detail::tag_bytes bytes;
    detail::collective(comm, [&] {
      if (comm.rank() == 0) bytes = tags_.read(tags_.resolve(opts));
    });
    broadcast_string(comm, bytes.tag);
    broadcast_string(comm, bytes.metadata_json);
    broadcast_string(comm, bytes.chunk_map);
    detail::metadata md;
    detail::collective(comm, [&] {
      ctx.md_name = storage_.describe(detail::metadata_key(bytes.tag));
      md = tags_.decode(std::move(bytes));
      ctx.live_topology = policy_.topology();
      ctx.rank = static_cast<std::uint32_t>(comm.rank());
    });
    return md;
  }

  template <class Comm>
  static void broadcast_string(Comm& comm, std::string& s) {
    if (comm.size() == 1) return;
    std::vector<std::byte> b(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
    comm.broadcast(b, 0);
    s.assign(reinterpret_cast<const char*>(b.data()), b.size());
  }

  /// Reads the chunks that overlap the planned tensors, verifies them, checks the validation
  /// logits, and restores values.
  void read_restore(const detail::metadata& md, const detail::restore_plan& plan, const load_options& opts,
                    detail::file_verifier<Store>& verify_file, load_result& result) {
    result.bytes_read += chunks().load(plan.tensors, md, verify_file, device_);
    if (opts.validation_logits) detail::compare_validation_logits(md, *opts.validation_logits, opts, chunks(), verify_file, result);
    // Values last: they are small, and restoring them only after every tensor verified keeps
    // iteration counters and RNGs consistent with the weights.
    for (const auto& [val, pick] : plan.values) {
      verify_file(pick->file);
      const auto key = detail::file_key(md, pick->file);
      const auto bytes = detail::read_value(storage_, key, *pick);
      result.bytes_read += bytes.size();
      val->load(bytes, "value " + detail::printable(val->name) + " in " + storage_.describe(key));
    }
  }

  /// How this checkpointer's saves cut tensors into chunks (boxes are write_shard's choice).
  detail::chunking save_chunking() const { return {.chunk_bytes = options_.chunk_bytes, .reshard_blocks = options_.reshard_blocks}; }

  /// The load stage that reads, verifies and decodes chunks into tensors (detail/chunk_reader.hpp).
  detail::chunk_reader<Store, Enc> chunks() const { return {storage_, codec_, options_.threads}; }

  Policy policy_;
  Store storage_;
  checkpointer_options options_;
  Enc codec_;
  Device device_;
  // Rank 0: the tags under the root, with what one commit leaves the next and the writer lock.
  detail::tag_store<Store> tags_;
  // The save_async in flight: its thread (which uses this object) and its shared state.
  std::thread background_;
  std::shared_ptr<detail::async_save_state> pending_;
  detail::snapshot_buffers<Device> snapshot_;  // async saves' copies of the tensors, reused
  // should_save: the communicator copy the ranks agree through (made by its first call), and
  // whether they agreed that a rank was signalled.
  std::shared_ptr<void> agreement_;
  bool preempted_ = false;
};


template <class Policy, class Store, class Enc, class Device>
checkpointer<Policy, Store, Enc, Device>::checkpointer(Policy policy, Store storage, checkpointer_options options, Enc codec,
                                                       Device device)
    : policy_(std::move(policy)), storage_(std::move(storage)), options_(std::move(options)), codec_(std::move(codec)),
      device_(std::move(device)), tags_(storage_) {
  if (options_.chunk_bytes == 0) throw error(error_kind::invalid_argument, "checkpointer_options::chunk_bytes must be > 0");
}

template <class Policy, class Store, class Enc, class Device>
checkpointer<Policy, Store, Enc, Device>::~checkpointer() {
  finish_pending(false);
}

template <class Policy, class Store, class Enc, class Device>
void checkpointer<Policy, Store, Enc, Device>::save_state(std::uint64_t iteration, detail::state_ref state, const save_options& opts) {
  finish_pending(true);
  auto plan = plan_save(iteration, state, opts);
  write_and_commit(plan, device_);
}

template <class Policy, class Store, class Enc, class Device>
save_handle checkpointer<Policy, Store, Enc, Device>::save_state_async(std::uint64_t iteration, detail::state_ref state,
                                                                     const save_options& opts) {
  finish_pending(true);
  auto& comm = policy_.communicator();
  detail::collective(comm, [&] { check_async_allowed(comm); });
  auto plan = std::make_shared<detail::save_plan>(plan_save(iteration, state, opts));
  detail::collective(comm, [&] {
    detail::through_gather<Policy>(comm, *plan, device_, [&](auto& via) { snapshot_.take(*plan, via, device_); });
  });
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

template <class Policy, class Store, class Enc, class Device>
load_result checkpointer<Policy, Store, Enc, Device>::load_state(detail::state_ref state, const load_options& opts) {
  finish_pending(true);
  auto& comm = policy_.communicator();
  detail::restore_context ctx;
  auto md = open_for_load(opts, ctx);
  const detail::stored_index index(md);  // also what v.saved() answers while the state is visited
  load_result result{.tag = md.tag, .iteration = md.iteration, .config = md.config, .topology = md.topology};
  visitor v;
  const auto plan = plan_load(state, opts, md, index, ctx, v, result);
  const auto read_own = [&](const detail::restore_plan& own, detail::file_verifier<Store>& verify) {
    read_restore(md, own, opts, verify, result);
  };
  if constexpr (detail::scatters<Policy>) {
    if (policy_.scatter_on_load && comm.size() > 1) {
      detail::collective(comm, [&] {  // rank 0 reads for every rank
        if (comm.rank() == 0) result.bytes_read += detail::read_all_chunk_details(storage_, md);
      });
      detail::scatter_load(comm, storage_, md, plan, chunks(), device_, read_own, result);
      return result;
    }
  }
  detail::collective(comm, [&] {
    detail::file_verifier<Store> verify(storage_, md);
    const detail::tensor_meta* logits = nullptr;
    if (opts.validation_logits)
      if (const auto* t = index.find_tensor(detail::validation_name)) logits = t;
    result.bytes_read += detail::read_plan_details(storage_, md, plan, logits, verify);
    read_own(plan, verify);
    result.bytes_read += verify.bytes_read();
  });
  return result;
}

template <class Policy, class Store, class Enc, class Device>
detail::restore_plan checkpointer<Policy, Store, Enc, Device>::plan_load(detail::state_ref state, const load_options& opts,
                                                                         const detail::metadata& md,
                                                                         const detail::stored_index& index,
                                                                         const detail::restore_context& ctx, visitor& v,
                                                                         load_result& result) {
  auto& comm = policy_.communicator();
  detail::collective(comm, [&] {
    if (opts.config && opts.check_config) detail::check_config(md, *opts.config, opts.ignore_config_keys, ctx.md_name);
    std::vector<std::string> skip = opts.skip_groups;
    if (!opts.load_optimizer) skip.push_back(options_.optimizer_group);
    v = visitor(skip, index);
    state.visit(v);
    detail::match_names(md, index, v, result);
  });
  detail::agree_on_unexpected(comm, result);
  detail::restore_plan plan;
  const auto accepts = [&](device where) { return device_.accepts(where); };
  detail::collective(comm, [&] { plan = detail::plan_restore(md, index, v, opts, ctx, accepts, result); });
  return plan;
}

template <class Policy, class Store, class Enc, class Device>
bool checkpointer<Policy, Store, Enc, Device>::should_save(std::uint64_t step, std::uint64_t every) {
  using comm_type = std::remove_cvref_t<decltype(policy_.communicator())>;
  static_assert(std::is_copy_constructible_v<comm_type>,
                "ckpt: should_save agrees through a copy of the policy's communicator; this one cannot be copied");
  std::uint64_t signalled = preemption::requested() ? 1 : 0;
  if (policy_.communicator().size() > 1) {
    if (!agreement_) {
      finish_pending(true);  // the copy is made collectively, on the policy's communicator
      agreement_ = std::make_shared<comm_type>(policy_.communicator());
    }
    signalled = std::static_pointer_cast<comm_type>(agreement_)->all_reduce_max(signalled);
  }
  if (signalled) preempted_ = true;
  return preempted_ || (every != 0 && step % every == 0);
}

template <class Policy, class Store, class Enc, class Device>
std::vector<std::string> checkpointer<Policy, Store, Enc, Device>::prune(std::size_t keep, bool dry_run) {
  if (keep == 0) throw error(error_kind::invalid_argument, "prune: keep must be at least 1");
  finish_pending(true);
  if (dry_run) return tags_.retention_victims("", keep);
  // Held for this call only when no save of this checkpointer holds it already.
  std::optional<detail::tag_store<Store>> for_this_call;
  auto& store = tags_.holds_writer_lock() ? tags_ : for_this_call.emplace(storage_);
  store.lock_writer(options_.wait_for_other_writer);
  auto victims = store.retention_victims("", keep);
  store.remove(victims);
  return victims;
}

}  // namespace ckpt
