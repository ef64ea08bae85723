#pragma once
/// @file checkpointer.hpp
/// `ckpt::checkpointer`: saves and loads a Checkpointable state under a root, composing a
/// ShardPolicy, a Storage, a Codec and a DevicePolicy.
///
/// Each public call is a short sequence of stages, one header each (docs/architecture.md):
/// save:  save_plan -> agree -> gather -> [snapshot] -> tag_store.prepare -> shard_io write
///        -> tag_store.commit -> retention
/// load:  tag_store open -> restore_plan -> (gather's scatter | chunk_reader) -> values
///
/// This header declares the class; impl/checkpointer.ipp defines its members, with the stages.
/// A header-only build includes both. With CKPT_SEPARATE_COMPILATION, the checkpointers
/// impl/instances.hpp lists are compiled once (impl/src.hpp) and a translation unit that uses
/// only those never parses the stages; one that makes any other checkpointer (its own Storage,
/// say) includes <ckpt/impl/checkpointer.ipp>. The back ends' own headers (mpi.hpp, s3.hpp,
/// in_process.hpp, memory_tier.hpp, cuda/) include it for their users.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "concepts.hpp"
#include "config.hpp"
#include "detail/background_removal.hpp"
#include "host_copy.hpp"
#include "options.hpp"
#include "posix.hpp"
#include "raw.hpp"
#include "save_handle.hpp"
#include "single_process.hpp"
#include "visitor.hpp"

namespace ckpt {

namespace detail {
// The stages' types, which the class only names (impl/checkpointer.ipp includes their headers).
struct save_plan;
struct restore_plan;
struct restore_context;
struct metadata;
struct chunking;
struct written_shard;
struct shard_plan;
class stored_index;
template <class Store>
class tag_store;
template <class Store>
class file_verifier;
template <class Store, class Enc>
class chunk_reader;
template <class Device>
class snapshot_buffers;
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
  /// has. The snapshot buffers are kept and reused by the next async save. Host tensors are
  /// copied by the calling thread and helper threads that stay parked between saves: at most
  /// `checkpointer_options::threads` in all, one per 32 MiB (a smaller state is copied by the
  /// caller alone).
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
  /// has; then waits for retention's deletion of older tags and throws its error. Call it
  /// before exiting so the last checkpoint is committed and nothing is left half deleted.
  void wait();

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
    return files_for(detail::state_ref(state), opts);
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
  std::optional<std::string> latest() const;

  /// The committed tags under the root, oldest iteration first.
  std::vector<tag_info> tags() const;

 private:
  // The bodies of save, save_async, load and files_to_read, which do not depend on the
  // state's type, and the stages they run (all in impl/checkpointer.ipp).
  void save_state(std::uint64_t iteration, detail::state_ref state, const save_options& opts);
  save_handle save_state_async(std::uint64_t iteration, detail::state_ref state, const save_options& opts);
  load_result load_state(detail::state_ref state, const load_options& opts);
  std::vector<std::string> files_for(detail::state_ref state, const load_options& opts);

  /// The collective first half of a save: validates the state and agrees on what each rank
  /// writes (and, for gathering policies, moves it to rank 0).
  detail::save_plan plan_save(std::uint64_t iteration, detail::state_ref state, const save_options& opts);
  /// The collective second half: prepare the tag, write every rank's file, commit, apply
  /// retention.
  template <class Dev>
  void write_and_commit(detail::save_plan& plan, Dev& device);
  /// This rank's shard file, if the ShardPolicy gives it one, planned (`boxes`: blocks of
  /// columns, for a device with a host view) before any of it is written.
  std::optional<detail::shard_plan> plan_own_shard(const detail::save_plan& plan, bool boxes);
  /// Writes the shard file `own` plans (none: this rank writes no file).
  template <class Dev>
  std::optional<detail::written_shard> write_own_shard(const detail::save_plan& plan, std::optional<detail::shard_plan>& own,
                                                       Dev& device);
  /// Rank 0, after a commit: deletes what the retention rule names, in the background where
  /// the Store allows it; throws the error of the deletion the last save left running.
  void apply_retention(const std::string& saved);
  /// Joins the background save, if any, and then retention's deletion; throws the save's error
  /// when `rethrow` and nobody saw it.
  void finish_pending(bool rethrow);

  /// Rank 0 resolves the tag and reads its metadata once; every rank decodes and checks it.
  detail::metadata open_for_load(const load_options& opts, detail::restore_context& ctx);
  detail::restore_plan plan_load(detail::state_ref state, const load_options& opts, const detail::metadata& md,
                                 const detail::stored_index& index, const detail::restore_context& ctx, visitor& v,
                                 load_result& result);
  /// Reads the chunks that overlap the planned tensors, verifies them, checks the validation
  /// logits, and restores values.
  void read_restore(const detail::metadata& md, const detail::restore_plan& plan, const load_options& opts,
                    detail::file_verifier<Store>& verify_file, load_result& result);

  /// How this checkpointer's saves cut tensors into chunks (boxes are write_shard's choice).
  detail::chunking save_chunking() const;
  /// The load stage that reads, verifies and decodes chunks into tensors (detail/chunk_reader.hpp).
  detail::chunk_reader<Store, Enc> chunks() const;

  Policy policy_;
  Store storage_;
  checkpointer_options options_;
  Enc codec_;
  Device device_;
  // Rank 0: the tags under the root, with what one commit leaves the next and the writer lock.
  // Held by pointer so that this header only names the stage (and a translation unit that
  // never makes a checkpointer of its own does not parse it).
  std::unique_ptr<detail::tag_store<Store>> tags_;
  // The save_async in flight: its thread (which uses this object) and its shared state.
  detail::background_save background_;
  // Rank 0: the deletion the last save's retention left running (Stores with background_removal).
  detail::background_removal removal_;
  // async saves' copies of the tensors, made by the first and reused
  std::unique_ptr<detail::snapshot_buffers<Device>> snapshot_;
  // should_save: the communicator copy the ranks agree through (made by its first call), and
  // whether they agreed that a rank was signalled.
  std::shared_ptr<void> agreement_;
  bool preempted_ = false;
  // The tensors the last save visited: the next save's visitor makes room for as many.
  std::size_t visited_tensors_ = 0;
};

}  // namespace ckpt

#if !defined(CKPT_SEPARATE_COMPILATION)
#include "impl/checkpointer.ipp"
#endif
