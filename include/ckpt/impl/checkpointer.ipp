#pragma once
// The members of ckpt::checkpointer (checkpointer.hpp), each a short sequence of stage calls.
// A header-only build includes this at the end of checkpointer.hpp. With
// CKPT_SEPARATE_COMPILATION, impl/src.hpp includes it to compile the checkpointers
// impl/instances.hpp lists, and so does any translation unit that makes another checkpointer
// (a Storage, Codec, DevicePolicy or ShardPolicy of its own): without it, that program fails to
// link, naming the members it lacks (the constructor, the destructor, `save_state`,
// `load_state`). The back ends' headers outside ckpt.hpp (mpi.hpp, s3.hpp, in_process.hpp,
// memory_tier.hpp, cuda/) include it.

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../checkpointer.hpp"
#include "../detail/chunk_reader.hpp"
#include "../detail/collective.hpp"
#include "../detail/commit.hpp"
#include "../detail/gather.hpp"
#include "../detail/restore_plan.hpp"
#include "../detail/save_plan.hpp"
#include "../detail/shard_io.hpp"
#include "../detail/snapshot.hpp"
#include "../detail/tag_store.hpp"
#include "../detail/validation_logits.hpp"
#include "../error.hpp"
#include "../names.hpp"
#include "../preemption.hpp"

namespace ckpt {

namespace detail {
/// save_async on several ranks uses the communicator from a background thread.
template <class Comm>
void check_async_allowed(const Comm& comm) {
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

/// Every rank gets rank 0's `s` (a std::string or a table_string).
template <class Comm, class String>
void broadcast_string(Comm& comm, String& s) {
  if (comm.size() == 1) return;
  std::vector<std::byte> b(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
  comm.broadcast(b, 0);
  s.assign(reinterpret_cast<const char*>(b.data()), b.size());
}
}  // namespace detail

template <class Policy, class Store, class Enc, class Device>
checkpointer<Policy, Store, Enc, Device>::checkpointer(Policy policy, Store storage, checkpointer_options options, Enc codec,
                                                       Device device)
    : policy_(std::move(policy)), storage_(std::move(storage)), options_(std::move(options)), codec_(std::move(codec)),
      device_(std::move(device)), tags_(std::make_unique<detail::tag_store<Store>>(storage_)) {
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
  background_.settle(true);  // its thread is joined by the next one's
  auto& comm = policy_.communicator();
  detail::collective(comm, [&] { detail::check_async_allowed(comm); });
  auto plan = std::make_shared<detail::save_plan>(plan_save(iteration, state, opts));
  detail::collective(comm, [&] {
    if (!snapshot_) snapshot_ = std::make_unique<detail::snapshot_buffers<Device>>(detail::worker_count(options_.threads));
    detail::through_gather<Policy>(comm, *plan, device_, [&](auto& via) { snapshot_->take(*plan, via, device_); });
  });
  auto st = std::make_shared<detail::async_save_state>();
  background_.start(st, [this, plan, st] {
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
  // The details of the chunks in this rank's own file, read while the state is visited and
  // planned (read_plan_details takes them if the plan reads that file).
  detail::details_prefetch<Store> prefetch;
  bool scatter = false;
  if constexpr (detail::scatters<Policy>) scatter = policy_.scatter_on_load && comm.size() > 1;
  if constexpr (detail::concurrent_reads<Store>)
    if (!scatter)
      if (const auto f = detail::own_file(md, static_cast<std::uint32_t>(comm.rank()))) prefetch.start(storage_, md, index.tensors_by_name(), *f);
  visitor v;
  const auto plan = plan_load(state, opts, md, index, ctx, v, result);
  const auto read_own = [&](const detail::restore_plan& own, detail::file_verifier<Store>& verify) {
    read_restore(md, own, opts, verify, result);
  };
  if constexpr (detail::scatters<Policy>) {
    if (scatter) {
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
    result.bytes_read += detail::read_plan_details(storage_, md, index, plan, logits, verify, &prefetch);
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
  detail::stored_matches matches;
  detail::collective(comm, [&] {
    if (opts.config && opts.check_config) detail::check_config(md, *opts.config, opts.ignore_config_keys, ctx.md_name);
    std::vector<std::string> skip = opts.skip_groups;
    if (!opts.load_optimizer) skip.push_back(options_.optimizer_group);
    v = visitor(skip, index);
    state.visit(v);
    matches = detail::match_names(md, index, v, result);
  });
  detail::agree_on_unexpected(comm, result);
  detail::restore_plan plan;
  const auto accepts = [&](device where) { return device_.accepts(where); };
  detail::collective(comm, [&] { plan = detail::plan_restore(md, index, v, matches, opts, ctx, accepts, result); });
  return plan;
}

template <class Policy, class Store, class Enc, class Device>
detail::save_plan checkpointer<Policy, Store, Enc, Device>::plan_save(std::uint64_t iteration, detail::state_ref state, const save_options& opts) {
  auto& comm = policy_.communicator();
  auto plan = detail::new_save_plan(iteration, opts);
  detail::collective(comm, [&] {
    if (comm.rank() == 0) tags_->lock_writer(options_.wait_for_other_writer);  // rank 0 commits: its lock stands for the job
    validate_tag(plan.tag);
    (void)policy_.topology();  // a layout that does not fit the world fails here, on every rank
    visitor v;
    v.reserve(visited_tensors_);  // the last save's count: a model's tensors rarely change
    state.visit(v);
    visited_tensors_ = v.tensors().size();
    detail::collect_state(plan, v, policy_, device_, opts, comm.rank());
  });
  detail::agree_on(comm, plan.tag, iteration);
  detail::gather_plan<Policy>(comm, plan, device_, save_chunking());
  return plan;
}

template <class Policy, class Store, class Enc, class Device>
template <class Dev>
void checkpointer<Policy, Store, Enc, Device>::write_and_commit(detail::save_plan& plan, Dev& device) {
  auto& comm = policy_.communicator();
  removal_.join();  // the last retention's deletion, if still running (a save_async's write comes here first)
  detail::collective(comm, [&] {
    if (comm.rank() == 0) tags_->prepare(plan.tag, plan.overwrite);
  });
  // Every chunk's place in its tensor is known before the first byte is written, so the ranks
  // report their files' plans first and rank 0 merges them while the bytes are written; after
  // writing, only the files' sizes and index checksums and the values' places follow. What
  // ranks have in common reaches rank 0 once: only the lowest rank of each schema sends it.
  std::optional<detail::shard_plan> own;
  detail::collective(comm, [&] {
    own = plan_own_shard(plan, !detail::receives_through_gather<Policy>(plan) && detail::has_host_view<Dev>);
  });
  const auto summary = detail::summarize(own ? &own->shard : nullptr, plan.held);
  const auto report = detail::encode_report(summary, detail::sends_schema(comm, summary));
  // Alone, a rank merges its own report where it lies: a model of many tensors makes one of
  // megabytes, which a gather would copy into fresh memory.
  std::vector<std::vector<std::byte>> gathered;
  if (comm.size() > 1) gathered = comm.gather(detail::as_bytes(report), 0);
  detail::background_merge merge;  // declared after the reports, which it reads: joined first
  detail::collective(comm, [&] {  // a thread that cannot start fails every rank, not rank 0 alone
    if (comm.rank() == 0)
      merge.start(plan.tag, plan.iteration, policy_.topology(), plan.config,
                  comm.size() > 1 ? detail::report_views(gathered) : std::vector{detail::as_bytes(report)});
  });
  comm.barrier();
  std::optional<detail::written_shard> written;
  detail::collective(comm, [&] {
    detail::through_gather<Policy>(comm, plan, device, [&](auto& via) { written = write_own_shard(plan, own, via); });
  });
  const auto facts = detail::encode_written(written ? &*written : nullptr);
  const auto all_facts = comm.gather(detail::as_bytes(facts), 0);
  detail::collective(comm, [&] {
    if (comm.rank() != 0) return;
    auto merged = merge.get();
    detail::attach_written(merged.md, all_facts);
    tags_->commit(merged);
  });
  detail::collective(comm, [&] {
    if (comm.rank() == 0) apply_retention(plan.tag);
  });
}

template <class Policy, class Store, class Enc, class Device>
void checkpointer<Policy, Store, Enc, Device>::apply_retention(const std::string& saved) {
  // The last deletion's error is thrown now that this save has committed: failing the save
  // before it wrote would stop a run from checkpointing over a cleanup problem. Its leftovers
  // are uncommitted tags, which retention_victims lists again.
  const auto earlier = removal_.take_failure();
  auto victims = tags_->retention_victims(saved, options_.keep_last_n);
  if constexpr (detail::removes_in_background<Store>) {
    auto doomed = tags_->uncommit(victims);  // no longer committed once this save returns
    if (!doomed.empty())
      removal_.start([store = &storage_, doomed = std::move(doomed)] {
        for (const auto& tag : doomed) detail::remove_uncommitted_tag(*store, tag);
      });
  } else {
    tags_->remove(victims);
  }
  if (earlier) std::rethrow_exception(earlier);
}

template <class Policy, class Store, class Enc, class Device>
std::optional<detail::shard_plan> checkpointer<Policy, Store, Enc, Device>::plan_own_shard(const detail::save_plan& plan, bool boxes) {
  const auto path = policy_.shard_file();
  if (!path) {
    if (!plan.mine.empty() || !plan.values.empty())
      throw error(error_kind::invalid_argument, "the shard policy gives rank " + std::to_string(policy_.communicator().rank()) +
                                                    " tensors to write but no file to write them to");
    return std::nullopt;
  }
  detail::check_key(*path);
  auto cut = save_chunking();
  cut.boxes = boxes;
  return detail::plan_shard(*path, static_cast<std::uint32_t>(policy_.communicator().rank()), plan.mine, codec_, cut);
}

template <class Policy, class Store, class Enc, class Device>
template <class Dev>
std::optional<detail::written_shard> checkpointer<Policy, Store, Enc, Device>::write_own_shard(
    const detail::save_plan& plan, std::optional<detail::shard_plan>& own, Dev& device) {
  if (!own) return std::nullopt;
  return detail::write_shard(storage_, plan.tag, std::move(*own), plan.mine, plan.values, codec_, device,
                             detail::write_settings{options_.threads, options_.buffer_bytes, options_.place_for_memory});
}

template <class Policy, class Store, class Enc, class Device>
void checkpointer<Policy, Store, Enc, Device>::finish_pending(bool rethrow) {
  background_.finish(rethrow);
  removal_.join();  // a load reads from a quiet disk; a prune lists what is really there
}

template <class Policy, class Store, class Enc, class Device>
void checkpointer<Policy, Store, Enc, Device>::wait() {
  finish_pending(true);
  if (const auto failure = removal_.take_failure()) std::rethrow_exception(failure);
}

template <class Policy, class Store, class Enc, class Device>
detail::metadata checkpointer<Policy, Store, Enc, Device>::open_for_load(const load_options& opts, detail::restore_context& ctx) {
  auto& comm = policy_.communicator();
  detail::tag_bytes bytes;
  detail::collective(comm, [&] {
    if (comm.rank() == 0) bytes = tags_->read(tags_->resolve(opts));
  });
  detail::broadcast_string(comm, bytes.tag);
  detail::broadcast_string(comm, bytes.metadata_json);
  detail::broadcast_string(comm, bytes.chunk_map);
  detail::metadata md;
  detail::collective(comm, [&] {
    ctx.md_name = storage_.describe(detail::metadata_key(bytes.tag));
    md = tags_->decode(std::move(bytes));
    ctx.live_topology = policy_.topology();
    ctx.rank = static_cast<std::uint32_t>(comm.rank());
  });
  return md;
}

template <class Policy, class Store, class Enc, class Device>
void checkpointer<Policy, Store, Enc, Device>::read_restore(const detail::metadata& md, const detail::restore_plan& plan, const load_options& opts,
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

template <class Policy, class Store, class Enc, class Device>
std::vector<std::string> checkpointer<Policy, Store, Enc, Device>::files_for(detail::state_ref state, const load_options& opts) {
  finish_pending(true);
  detail::restore_context ctx;
  const auto md = open_for_load(opts, ctx);
  const detail::stored_index index(md);
  load_result result;
  visitor v;
  const auto plan = plan_load(state, opts, md, index, ctx, v, result);
  return detail::files_read(md, plan);
}

template <class Policy, class Store, class Enc, class Device>
detail::chunking checkpointer<Policy, Store, Enc, Device>::save_chunking() const {
  return {.chunk_bytes = options_.chunk_bytes, .reshard_blocks = options_.reshard_blocks};
}

template <class Policy, class Store, class Enc, class Device>
detail::chunk_reader<Store, Enc> checkpointer<Policy, Store, Enc, Device>::chunks() const {
  return {storage_, codec_, options_.threads};
}

template <class Policy, class Store, class Enc, class Device>
std::optional<std::string> checkpointer<Policy, Store, Enc, Device>::latest() const {
  return tags_->latest();
}

template <class Policy, class Store, class Enc, class Device>
std::vector<tag_info> checkpointer<Policy, Store, Enc, Device>::tags() const {
  return tags_->tags();
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
  if (dry_run) return tags_->retention_victims("", keep);
  // A failed background deletion left uncommitted tags, which this prune lists and deletes
  // again: its own error, if any, is the one to report.
  (void)removal_.take_failure();
  // Held for this call only when no save of this checkpointer holds it already.
  std::optional<detail::tag_store<Store>> for_this_call;
  auto& store = tags_->holds_writer_lock() ? *tags_ : for_this_call.emplace(storage_);
  store.lock_writer(options_.wait_for_other_writer);
  auto victims = store.retention_victims("", keep);
  store.remove(victims);
  return victims;
}

}  // namespace ckpt
