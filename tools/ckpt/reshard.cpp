// ckpt reshard SRC DST --tp T --pp P: the checkpoint SRC rewritten as a tp=T pp=P job would
// have saved it, so that such a job (or any tool expecting Megatron's per-rank files) finds
// one file per rank. Any topology can load any checkpoint already; this changes the files.
//
// How: T*P threads play the ranks of the new job (ckpt::in_process communicator) and save
// with the megatron policy, each holding its slices as tensors whose bytes come from SRC only
// when the save stages them (source_device below). So memory stays bounded by the pipeline's
// buffers and one block per rank, whatever the model size. The result is then verified
// (checksums and coverage) and compared with SRC, tensor by tensor, bit for bit.
//
// Which dimension a tensor is split along (--split NAME=DIM overrides): the one its shards in
// SRC are split along; a tensor SRC holds whole (or replicated) stays whole, replicated over
// the new tp ranks. Which pipeline stage holds it: its stage in SRC when the pp is unchanged;
// otherwise, for names with a layer number (".layers.N." or "layers.N."), stage N*P/L of L
// layers, and for the others the first stage, or the last when SRC had them on its last one.

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <fnmatch.h>
#include <istream>
#include <iterator>
#include <map>
#include <ostream>
#include <set>
#include <thread>

#include <ckpt/ckpt.hpp>
#include <ckpt/in_process.hpp>
#include <ckpt/reader.hpp>

#include "blocks.hpp"
#include "cli.hpp"
#include "compare.hpp"
#include "layers.hpp"

namespace ckpt_tool {

namespace {

/// A value's saved bytes, passed through unchanged: streamed out as they are, and read back
/// as everything the stream holds (ckpt stores streamable values as their stream text).
struct verbatim {
  std::string bytes;
  friend std::ostream& operator<<(std::ostream& os, const verbatim& v) {
    return os.write(v.bytes.data(), static_cast<std::streamsize>(v.bytes.size()));
  }
  friend std::istream& operator>>(std::istream& is, verbatim& v) {
    v.bytes.assign(std::istreambuf_iterator<char>(is), {});
    return is;
  }
};

/// Where a rank's slice of a tensor comes from: tensor `name` of SRC, at `offset` in it.
struct lazy_slice {
  std::string name;
  ckpt::dtype type;
  ckpt::shape_t global_shape, offset, shape;
  bool replicated = false;
  std::vector<std::pair<ckpt::shape_t, ckpt::shape_t>> blocks{};  // (offset in the slice, shape)
  std::vector<std::uint64_t> block_begin{};                        // byte offset of each block
  ckpt::layout order = ckpt::layout::row_major;                    // kept as SRC stored it
};

/// A DevicePolicy whose "device" is the source checkpoint: the tensors handed to the save
/// point at lazy_slice descriptors, and staging a byte range reads the block(s) holding it
/// from SRC (one cached block, as the save stages each tensor front to back).
class source_device {
 public:
  source_device(ckpt::reader<>* src, std::uint64_t block_bytes, std::atomic<std::uint64_t>* staged)
      : src_(src), block_bytes_(block_bytes), staged_(staged) {}
  bool accepts(ckpt::device d) const noexcept { return d == ckpt::device::host(); }

  void to_host(const ckpt::tensor_ref& t, std::uint64_t offset, std::span<std::byte> dst) {
    auto& s = *reinterpret_cast<lazy_slice*>(t.data());
    if (s.blocks.empty()) {
      std::uint64_t at = 0;
      for_each_block(s.shape, ckpt::size_of(s.type), block_bytes_, [&](const ckpt::shape_t& o, const ckpt::shape_t& sh) {
        s.blocks.emplace_back(o, sh);
        s.block_begin.push_back(at);
        at += ckpt::detail::element_count(sh, s.name) * ckpt::size_of(s.type);
      });
    }
    staged_->fetch_add(dst.size(), std::memory_order_relaxed);
    while (!dst.empty()) {
      const auto k = static_cast<std::size_t>(std::upper_bound(s.block_begin.begin(), s.block_begin.end(), offset) - s.block_begin.begin()) - 1;
      if (cached_slice_ != &s || cached_block_ != k) load(s, k);
      const auto from = offset - s.block_begin[k];
      const auto n = std::min<std::uint64_t>(dst.size(), cache_.size() - from);
      std::memcpy(dst.data(), cache_.data() + from, n);
      dst = dst.subspan(n);
      offset += n;
    }
  }
  void from_host(std::span<const std::byte>, const ckpt::tensor_ref&, std::uint64_t) {
    throw ckpt::error(ckpt::error_kind::invalid_argument, "reshard: the source device is read-only");
  }

 private:
  void load(lazy_slice& s, std::size_t k) {
    const auto& [o, sh] = s.blocks[k];
    cache_.resize(ckpt::detail::element_count(sh, s.name) * ckpt::size_of(s.type));
    ckpt::shape_t global(o.size());
    for (std::size_t d = 0; d < o.size(); ++d) global[d] = s.offset[d] + o[d];
    src_->read(s.name, ckpt::tensor_ref(s.type, sh, cache_.data()).laid_out(s.order).sharded({.global_shape = s.global_shape, .offset = global}));
    cached_slice_ = &s;
    cached_block_ = k;
  }
  ckpt::reader<>* src_;
  std::uint64_t block_bytes_;
  std::atomic<std::uint64_t>* staged_;  // bytes staged by all ranks, for the progress bar
  std::vector<std::byte> cache_;
  const lazy_slice* cached_slice_ = nullptr;
  std::size_t cached_block_ = 0;
};

/// One new rank's state: its slices of the tensors of its stage, and its values.
struct rank_state {
  std::vector<lazy_slice> slices;
  std::vector<std::pair<std::string, verbatim>> values;

  template <class V>
  void checkpoint(V& v) {
    for (auto& s : slices) {
      ckpt::tensor_ref r(s.type, s.shape, static_cast<void*>(&s));
      r.laid_out(s.order);
      v.tensor(s.name, s.replicated ? std::move(r).sharded(ckpt::shard_spec::replica())
                                    : std::move(r).sharded({.global_shape = s.global_shape, .offset = s.offset}));
    }
    for (auto& [name, val] : values) v.value(name, val);
  }
};

struct plan_entry {
  const ckpt::tensor_info* tensor;
  int split = -1;  // dimension split over the new tp ranks; -1: whole, replicated
  std::uint32_t stage = 0;
};

}  // namespace

int run_reshard(const reshard_args& a) {
  const auto loc = locate(a.src, a.tag);
  ckpt::reader src{ckpt::posix(loc.root), loc.tag};
  const auto& info = src.info();
  const auto& from = info.topology;
  const std::uint32_t T = a.tp, P = a.pp;

  // Per tensor: the split dimension and the stage, as the header comment describes.
  std::map<std::string, std::uint32_t> stage_of_file;  // SRC file -> its pipeline stage
  for (const auto& f : info.files) stage_of_file[f.path] = (f.rank / from.tp) % from.pp;
  std::uint64_t layers = 0;
  for (const auto& t : info.tensors)
    if (auto l = layer_of(t.name)) layers = std::max(layers, *l + 1);
  std::vector<plan_entry> plan;
  for (const auto& t : info.tensors) {
    if (t.name.starts_with("__ckpt")) continue;  // ckpt's own (validation logits): not resharded
    plan_entry e{&t, -1, 0};
    // The dimension SRC split it along: where the boxes of its files differ.
    const auto chunks = src.chunks(t.name);
    std::map<std::string, std::pair<ckpt::shape_t, ckpt::shape_t>> box;  // file -> (lo, hi)
    for (const auto& c : chunks) {
      auto [it, fresh] = box.try_emplace(c.file, c.offset, c.offset);
      auto& [lo, hi] = it->second;
      for (std::size_t d = 0; d < c.offset.size(); ++d) {
        lo[d] = std::min(lo[d], c.offset[d]);
        hi[d] = fresh ? c.offset[d] + c.shape[d] : std::max(hi[d], c.offset[d] + c.shape[d]);
      }
    }
    std::set<int> dims;
    for (const auto& [f, b] : box)
      for (std::size_t d = 0; d < t.shape.size(); ++d)
        if (b.first[d] != 0 || b.second[d] != t.shape[d]) dims.insert(static_cast<int>(d));
    if (dims.size() > 1)
      throw ckpt::error(ckpt::error_kind::invalid_argument, "tensor " + t.name + " is split along several dimensions in " +
                                                                info.tag + "; say how to split it with --split " + t.name + "=DIM");
    if (!dims.empty()) e.split = *dims.begin();
    for (const auto& [pattern, dim] : a.splits)
      if (::fnmatch(pattern.c_str(), t.name.c_str(), 0) == 0) e.split = dim;
    if (e.split >= static_cast<int>(t.shape.size()))
      throw ckpt::error(ckpt::error_kind::invalid_argument, "--split: tensor " + t.name + " has " + std::to_string(t.shape.size()) +
                                                                " dimensions, there is no dimension " + std::to_string(e.split));
    if (T == 1) e.split = -1;
    if (e.split >= 0 && t.shape[static_cast<std::size_t>(e.split)] < T)
      throw ckpt::error(ckpt::error_kind::invalid_argument, "tensor " + t.name + ": dimension " + std::to_string(e.split) + " of " +
                                                                ckpt::detail::to_string(t.shape) + " cannot be split over tp=" +
                                                                std::to_string(T) + "; keep it whole with --split '" + t.name + "=-1'");
    std::uint32_t src_stage = 0;
    for (const auto& f : t.files) src_stage = std::max(src_stage, stage_of_file[f]);
    if (P == 1) e.stage = 0;
    else if (from.pp == P) e.stage = src_stage;
    else if (auto l = layer_of(t.name)) e.stage = static_cast<std::uint32_t>(*l * P / layers);
    else e.stage = from.pp > 1 && src_stage == from.pp - 1 ? P - 1 : 0;
    plan.push_back(e);
  }

  // Per-rank values: the new rank (t, p) takes those of the SRC rank at (t, p) when there is
  // one, otherwise rank 0's.
  std::map<std::pair<std::string, std::uint32_t>, bool> has_value;
  std::set<std::string> value_names;
  for (const auto& v : info.values) {
    has_value[{v.name, v.rank}] = true;
    value_names.insert(v.name);
  }

  const std::uint32_t world = T * P;
  auto comm_world = std::make_shared<ckpt::in_process_world>(static_cast<int>(world));
  std::vector<std::string> failures(world);
  std::vector<std::thread> ranks;
  std::atomic<std::uint64_t> staged{0};
  std::atomic<std::uint32_t> finished{0};
  const std::uint64_t per_rank_buffer = std::max<std::uint64_t>(a.memory_bytes / (2 * world), 1 << 20);
  for (std::uint32_t r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      try {
        const std::uint32_t t = r % T, p = r / T;
        ckpt::reader<> mine{ckpt::posix(loc.root), info.tag};
        rank_state state;
        for (const auto& e : plan) {
          if (e.stage != p) continue;
          lazy_slice s{e.tensor->name, e.tensor->type, e.tensor->shape, ckpt::shape_t(e.tensor->shape.size(), 0), e.tensor->shape};
          s.order = e.tensor->order;
          if (e.split < 0) {
            s.replicated = true;
          } else {
            const auto d = static_cast<std::size_t>(e.split);
            const auto n = e.tensor->shape[d];
            s.offset[d] = n * t / T;
            s.shape[d] = n * (t + 1) / T - s.offset[d];
          }
          state.slices.push_back(std::move(s));
        }
        const std::uint32_t same = t < from.tp && p < from.pp && from.dp * from.tp * from.pp == from.world ? t + from.tp * p : 0;
        for (const auto& name : value_names) {
          const auto from_rank = has_value.count({name, same}) ? same : 0u;
          if (!has_value.count({name, from_rank})) continue;
          const auto bytes = mine.value_bytes(name, from_rank);
          state.values.emplace_back(name, verbatim{std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size())});
        }
        ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix, ckpt::raw, source_device> cp{
            {.tp = T, .pp = P, .dp = 1, .comm = {comm_world, static_cast<int>(r)}},
            ckpt::posix(a.dst),
            {.keep_last_n = 0, .threads = 1, .buffer_bytes = per_rank_buffer},
            {},
            source_device(&mine, per_rank_buffer, &staged)};
        cp.save(info.iteration, state, {.config = info.config, .tag = info.tag});
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
      ++finished;
    });
  {
    progress_bar bar("reshard", info.raw_bytes);
    while (finished < world) {
      bar.update(std::min(staged.load(), info.raw_bytes));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  for (auto& th : ranks) th.join();
  for (const auto& f : failures)
    if (!f.empty()) throw ckpt::error(ckpt::error_kind::io, "reshard: " + f);

  // Verified: every checksum and the coverage of the new files, then every tensor bit for bit.
  ckpt::reader out{ckpt::posix(a.dst), info.tag};
  const auto rep = out.verify();
  if (!rep.ok()) {
    std::printf("reshard wrote %s but it does not verify:\n", (std::filesystem::path(a.dst) / info.tag).c_str());
    for (const auto& p : rep.problems) std::printf("  %s\n", p.c_str());
    return exit_error;
  }
  std::vector<std::pair<const ckpt::tensor_info*, const ckpt::tensor_info*>> pairs;
  for (const auto& e : plan) {
    const auto* o = out.find(e.tensor->name);
    if (!o) throw ckpt::error(ckpt::error_kind::io, "reshard: tensor " + e.tensor->name + " is missing from the output");
    pairs.emplace_back(e.tensor, o);
  }
  progress_bar check("compare", info.raw_bytes);
  const auto diffs = compare_tensors(src, out, pairs, 0, 0, a.memory_bytes / 2, [&](std::uint64_t d) { check.update(d); });
  check.finish();
  for (std::size_t k = 0; k < diffs.size(); ++k)
    if (!diffs[k].problem.empty() || diffs[k].mismatched)
      throw ckpt::error(ckpt::error_kind::io, "reshard: tensor " + pairs[k].first->name + " differs from the source after the rewrite");
  std::printf("resharded %s (iteration %" PRIu64 ") from %s to tp=%u pp=%u: %zu tensors, %zu files, %s; verified and equal to the source\n",
              info.tag.c_str(), info.iteration, ckpt::to_string(from).c_str(), T, P, pairs.size(), out.info().files.size(),
              human_bytes(static_cast<double>(out.info().stored_bytes)).c_str());
  return exit_ok;
}

}  // namespace ckpt_tool
