// How rank 0's commit work and every rank's load planning grow with the number of ranks.
//
// Feeds the real code (detail::merge_reports, the chunk map and metadata encoders, the
// decoders, validation, the tiling check and the overlap planner) with synthetic reports: R
// ranks, each holding a 1/R slice of every one of T tensors, as a tensor-parallel job of R
// ranks would. Prints one row per R: the first commit (which allocates rank 0's tables) and the
// median of the later ones (which reuse them, as a job committing every N steps does), split
// into the merge (parse, merge, check) and the durable writes of chunk_map.bin and
// metadata.json; raw_s is the baseline for the writes, the same bytes written and fsynced raw
// right after each commit (this disk's speed varies several-fold from minute to minute).
//
//   bench/commit_scale [--tensors 1000] [--ranks 256,512,1024,2048,4096] [--runs 4] [--dir /tmp]
//                      [--threads N]   (rank 0's merge threads; default: the cores, at most 8)

#include <ckpt/ckpt.hpp>
#include <ckpt/detail/commit.hpp>
#include <ckpt/detail/metadata.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

constexpr std::uint64_t rows_per_rank = 4, cols = 256;

/// The report rank `r` of `ranks` sends after writing: one chunk of every tensor, and values.
std::vector<std::byte> report(std::uint32_t r, std::uint32_t ranks, std::uint32_t tensors) {
  ckpt::detail::written_shard w;
  w.path = "mp_rank_" + std::to_string(r) + "/model_optim_rng.ckpt";
  w.index.rank = r;
  std::uint64_t pos = 4096;
  for (std::uint32_t t = 0; t < tensors; ++t) {
    auto& g = w.index.tensors.emplace_back();
    g.name = "layers." + std::to_string(t / 8) + ".w" + std::to_string(t % 8);
    g.type = ckpt::dtype::bf16;
    g.global_shape = {rows_per_rank * ranks, cols};
    g.chunks.ndim = 2;
    const std::uint64_t bytes = rows_per_rank * cols * 2;
    g.chunks.push(0, ckpt::shape_t{r * rows_per_rank, 0}, ckpt::shape_t{rows_per_rank, cols}, 0, pos, bytes,
                  pos * 2654435761u);
    pos += 4096;
  }
  w.index.values.push_back({"rng", r, pos, 5000, 1});
  w.index.values.push_back({"step", r, pos + 5000, 9, 2});
  w.size = pos + 5009 + 1000000;  // room for the index and trailer
  w.index_xxh3 = r;
  const auto s = ckpt::detail::encode_report(w, {});
  const auto* b = reinterpret_cast<const std::byte*>(s.data());
  return {b, b + s.size()};
}

void write_synced(ckpt::posix& disk, const std::string& key, std::string_view content) {
  auto w = disk.create(key);
  w.write(std::as_bytes(std::span(content.data(), content.size())));
  w.sync();
  w.publish();
}

}  // namespace

int main(int argc, char** argv) {
  std::uint32_t tensors = 1000;
  int runs = 4;
  unsigned threads = ckpt::detail::merge_threads();
  std::vector<std::uint32_t> sizes = {256, 512, 1024, 2048, 4096};
  std::string dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--tensors") tensors = static_cast<std::uint32_t>(std::stoul(v));
    else if (a == "--runs") runs = std::stoi(v);
    else if (a == "--threads") threads = static_cast<unsigned>(std::stoul(v));
    else if (a == "--dir") dir = v;
    else if (a == "--ranks") {
      sizes.clear();
      std::stringstream ss(v);
      for (std::string x; std::getline(ss, x, ',');) sizes.push_back(static_cast<std::uint32_t>(std::stoul(x)));
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  runs = std::max(runs, 2);  // one first commit, then at least one that reuses its buffers
  const auto root = std::filesystem::path(dir) / ("ckpt-commit-scale-" + std::to_string(::getpid()));
  ckpt::posix disk(root);
  std::printf("%8s %10s %10s %9s %9s %9s %10s %12s %12s %14s %13s\n", "ranks", "chunks", "commit_s", "merge_s",
              "write_s", "raw_s", "plan_s", "metadata_B", "chunk_map_B", "first_commit_s", "first_merge_s");
  for (const auto ranks : sizes) {
    std::vector<std::vector<std::byte>> reports;
    reports.reserve(ranks);
    for (std::uint32_t r = 0; r < ranks; ++r) reports.push_back(report(r, ranks, tensors));
    std::vector<double> commit_s, plan_s, merge_s, write_s, raw_s;
    double first_commit_s = 0, first_merge_s = 0;
    ckpt::detail::metadata previous;  // what rank 0 keeps from one commit to the next
    std::vector<std::byte> staging;
    std::string map;
    std::size_t md_bytes = 0, map_bytes = 0;
    for (int run = 0; run < runs; ++run) {
      const std::string tag = "global_step" + std::to_string(run);
      // Rank 0's commit, as checkpointer::commit does it: merge and check, then stream the
      // chunk map and write metadata.json, both durably.
      auto t0 = clock_type::now();
      auto md = ckpt::detail::merge_reports(tag, 1, {ranks, 1, 1, ranks}, {}, reports, threads, &previous);
      const double merged = seconds_since(t0);
      auto t1 = clock_type::now();
      {
        auto w = disk.create(tag + "/chunk_map.bin");
        ckpt::detail::write_chunk_map(md, w, staging);
        w.sync();
        w.publish();
      }
      const auto text = ckpt::detail::encode_metadata(md);
      write_synced(disk, tag + "/metadata.json", text);
      const double written = seconds_since(t1);
      if (run == 0) {  // the first commit of a job allocates its tables; later ones reuse them
        first_commit_s = seconds_since(t0);
        first_merge_s = merged;
      } else {
        commit_s.push_back(seconds_since(t0));
        merge_s.push_back(merged);
        write_s.push_back(written);
      }
      map.resize(md.chunk_map.size);  // what a loading rank reads first (not timed)
      disk.read(tag + "/chunk_map.bin", 0, std::as_writable_bytes(std::span(map.data(), map.size())));
      md_bytes = text.size();
      map_bytes = map.size();
      previous = std::move(md);
      // The baseline: the same bytes written and fsynced raw, right after, on the same disk.
      t1 = clock_type::now();
      write_synced(disk, tag + "/raw_map", map);
      write_synced(disk, tag + "/raw_metadata", text);
      if (run > 0) raw_s.push_back(seconds_since(t1));

      // A rank's load planning: parse and check everything, then find the chunks overlapping
      // its slice of every tensor (here rank ranks/2 of a layout with half as many ranks).
      t0 = clock_type::now();
      auto back = ckpt::detail::decode_metadata(text, "metadata.json");
      ckpt::detail::decode_chunk_map(std::as_bytes(std::span(map.data(), map.size())), back, "chunk_map.bin");
      ckpt::detail::validate_metadata(back, tag, "metadata.json");
      for (const auto& t : back.tensors)
        ckpt::detail::check_tiling(t.name, t.shape, t.chunks,
                                   [&](std::size_t i) -> const std::string& { return back.files[t.chunks.file[i]].path; },
                                   ckpt::error_kind::corrupt, "");
      std::uint64_t runs_found = 0;
      const ckpt::shape_t off = {(ranks / 2) * rows_per_rank, 0}, shape = {2 * rows_per_rank, cols};
      for (const auto& t : back.tensors)
        for (std::size_t i = 0; i < t.chunks.size(); ++i) {
          const ckpt::detail::region src{t.chunks.offset(i), t.chunks.shape(i)}, dst{off, shape};
          if (ckpt::detail::overlaps(src, dst))
            runs_found += ckpt::detail::for_each_overlap_run(src, dst, 2, [](auto, auto, auto) {});
        }
      plan_s.push_back(seconds_since(t0));
      if (runs_found != static_cast<std::uint64_t>(tensors) * 2 * rows_per_rank * cols * 2) {
        std::fprintf(stderr, "planner found %llu bytes, expected %llu\n", static_cast<unsigned long long>(runs_found),
                     static_cast<unsigned long long>(tensors) * 2 * rows_per_rank * cols * 2);
        return 1;
      }
      disk.remove_all(tag);
    }
    std::printf("%8u %10llu %10.3f %9.3f %9.3f %9.3f %10.3f %12zu %12zu %14.3f %13.3f\n", ranks,
                static_cast<unsigned long long>(ranks) * tensors, median(commit_s), median(merge_s), median(write_s),
                median(raw_s), median(plan_s), md_bytes, map_bytes, first_commit_s, first_merge_s);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(root);
}
