// How rank 0's commit work and every rank's load planning grow with the number of ranks.
//
// Feeds the real code (detail::summarize and merge_reports, the chunk map and metadata
// encoders, the decoders, validation, the layout's overlap search and read_chunk_details) with
// synthetic reports: R ranks, each holding a 1/R slice of every one of T tensors, as a
// tensor-parallel job of R ranks would. Each report is what that rank sends: its own part, and
// its schema only where it is the lowest rank with that schema. Prints one row per R: the
// first commit and the median of the later ones, split into the merge (parse, merge, check)
// and the durable writes of chunk_map.bin and metadata.json; raw_s is the baseline for the
// writes, the same bytes written and fsynced raw right after each commit (this disk's speed
// varies several-fold from minute to minute).
//
// Then one rank's load planning (rank R/2 of a layout with half as many ranks, so it needs
// parts of two files): decode and check metadata.json and chunk_map.bin (which rank 0 reads once
// and broadcasts), find the files its slices overlap, read and check their footer indexes from
// disk (two real shard files are written for it), and plan the copies. The metadata bytes:
// metadata_B and chunk_map_B (read once, by rank 0), footer_B (what each rank reads of its
// files' footers), and load_total_B, all of them over a restart of every rank.
//
//   bench/commit_scale [--tensors 1000] [--ranks 256,512,1024,2048,4096] [--runs 4] [--dir /tmp]
//                      [--threads N]   (rank 0's merge threads; default: the cores, at most 8)

#include <ckpt/ckpt.hpp>
#include <ckpt/detail/chunk_details.hpp>
#include <ckpt/detail/commit.hpp>
#include <ckpt/detail/metadata.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <map>
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

/// What rank `r` of `ranks` wrote: one chunk of every tensor, and two values.
ckpt::detail::written_shard shard(std::uint32_t r, std::uint32_t ranks, std::uint32_t tensors) {
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
                  pos * 2654435761u + r);
    pos += 4096;
  }
  w.index.values.push_back({"rng", r, pos, 5000, 1});
  w.index.values.push_back({"step", r, pos + 5000, 9, 2});
  return w;
}

/// Where the footer index of such a shard starts: after its chunks and values.
std::uint64_t index_offset(std::uint32_t tensors) { return ckpt::detail::align_up(4096 + std::uint64_t{tensors} * 4096 + 5009); }

/// Writes rank r's shard file in write_shard's order (header, chunks, values, footer index,
/// trailer; the chunks 4 KiB apart, as small chunks may be, and their bytes left zero, which no
/// planning reads) and records its size and footer checksum in `w`.
void write_shard_file(ckpt::posix& disk, const std::string& tag, ckpt::detail::written_shard& w, std::uint32_t tensors) {
  const auto index = ckpt::detail::encode_index(w.index);
  const auto at = index_offset(tensors);
  std::vector<std::byte> file(at + index.size() + ckpt::detail::trailer_bytes);
  const auto h = ckpt::detail::make_header();
  std::memcpy(file.data(), h.data(), h.size());
  std::memcpy(file.data() + at, index.data(), index.size());
  w.index_xxh3 = ckpt::detail::xxh3(std::as_bytes(std::span(index.data(), index.size())));
  const auto t = ckpt::detail::make_trailer({at, index.size(), w.index_xxh3});
  std::memcpy(file.data() + at + index.size(), t.data(), t.size());
  w.size = file.size();
  auto out = disk.create(tag + "/" + w.path);
  out.write(file);
  out.sync();
  out.publish();
}

void write_synced(ckpt::posix& disk, const std::string& key, std::initializer_list<std::string_view> parts) {
  auto w = disk.create(key);
  for (const auto part : parts) w.write(std::as_bytes(std::span(part.data(), part.size())));
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
  runs = std::max(runs, 2);  // one first commit, then at least one
  const auto root = std::filesystem::path(dir) / ("ckpt-commit-scale-" + std::to_string(::getpid()));
  ckpt::posix disk(root);
  std::printf("%8s %10s %10s %9s %9s %9s %10s %12s %12s %10s %14s %14s %13s\n", "ranks", "chunks", "commit_s", "merge_s",
              "write_s", "raw_s", "plan_s", "metadata_B", "chunk_map_B", "footer_B", "load_total_B", "first_commit_s",
              "first_merge_s");
  for (const auto ranks : sizes) {
    // The two ranks whose files the planning rank reads get real files; the others' files are
    // never read (their sizes are about the same).
    const std::uint32_t needed[2] = {ranks / 2, ranks / 2 + 1};
    std::map<std::uint32_t, ckpt::detail::written_shard> real;
    for (const auto r : needed) real.emplace(r, shard(r, ranks, tensors));
    std::uint64_t file_size = 0;
    {
      ckpt::detail::written_shard probe = shard(0, ranks, tensors);
      file_size = index_offset(tensors) + ckpt::detail::encode_index(probe.index).size() + ckpt::detail::trailer_bytes;
    }
    std::vector<std::vector<std::byte>> reports;
    reports.reserve(ranks);
    std::map<std::uint64_t, std::uint32_t> lowest;  // schema hash -> the lowest rank with it
    for (std::uint32_t r = 0; r < ranks; ++r) {
      auto w = shard(r, ranks, tensors);
      w.size = file_size;
      w.index_xxh3 = r;
      if (real.count(r)) {
        const auto index = ckpt::detail::encode_index(w.index);
        w.index_xxh3 = ckpt::detail::xxh3(std::as_bytes(std::span(index.data(), index.size())));
        w.size = index_offset(tensors) + index.size() + ckpt::detail::trailer_bytes;
      }
      const auto summary = ckpt::detail::summarize(w, {});
      const bool first = lowest.emplace(summary.schema_hash, r).second;
      const auto s = ckpt::detail::encode_report(summary, first);
      const auto* b = reinterpret_cast<const std::byte*>(s.data());
      reports.emplace_back(b, b + s.size());
    }
    std::vector<double> commit_s, plan_s, merge_s, write_s, raw_s;
    double first_commit_s = 0, first_merge_s = 0;
    std::vector<std::byte> staging;
    std::string map;
    std::size_t md_bytes = 0, map_bytes = 0;
    std::uint64_t footer_bytes = 0;
    for (int run = 0; run < runs; ++run) {
      const std::string tag = "global_step" + std::to_string(run);
      for (auto& [r, w] : real) write_shard_file(disk, tag, w, tensors);  // what the ranks wrote (not timed)
      // Rank 0's commit, as a save does it: merge and check, and encode the tensors' records of
      // metadata.json (background_merge's thread), then stream the chunk map and write
      // metadata.json around the records, both durably (tag_store::commit).
      auto t0 = clock_type::now();
      auto md = ckpt::detail::merge_reports(tag, 1, {ranks, 1, 1, ranks}, {}, reports, threads);
      const auto records = ckpt::detail::encode_tensor_records(md);
      const double merged = seconds_since(t0);
      auto t1 = clock_type::now();
      {
        auto w = disk.create(tag + "/chunk_map.bin");
        ckpt::detail::write_chunk_map(md, w, staging);
        w.sync();
        w.publish();
      }
      const auto around = ckpt::detail::encode_metadata_around(md, records);
      write_synced(disk, tag + "/metadata.json", {around.head, records, around.tail});
      const double written = seconds_since(t1);
      if (run == 0) {  // the first commit of a job
        first_commit_s = seconds_since(t0);
        first_merge_s = merged;
      } else {
        commit_s.push_back(seconds_since(t0));
        merge_s.push_back(merged);
        write_s.push_back(written);
      }
      map.resize(md.chunk_map.size);  // what rank 0 reads and broadcasts (not timed)
      disk.read(tag + "/chunk_map.bin", 0, std::as_writable_bytes(std::span(map.data(), map.size())));
      const auto text = around.head + records + around.tail;  // metadata.json as written (not timed)
      md_bytes = text.size();
      map_bytes = map.size();
      // The baseline: the same bytes written and fsynced raw, right after, on the same disk.
      t1 = clock_type::now();
      write_synced(disk, tag + "/raw_map", {map});
      write_synced(disk, tag + "/raw_metadata", {text});
      if (run > 0) raw_s.push_back(seconds_since(t1));

      // A rank's load planning: parse and check the metadata, find the files its slice of every
      // tensor overlaps, read their footers, then the chunks overlapping its slices (here rank
      // ranks/2 of a layout with half as many ranks).
      t0 = clock_type::now();
      auto back = ckpt::detail::decode_metadata(text, "metadata.json");
      ckpt::detail::decode_chunk_map(std::as_bytes(std::span(map.data(), map.size())), back, "chunk_map.bin");
      ckpt::detail::validate_metadata(back, tag, "metadata.json");
      const ckpt::shape_t off = {(ranks / 2) * rows_per_rank, 0}, shape = {2 * rows_per_rank, cols};
      std::vector<ckpt::detail::wanted_region> wanted;
      for (std::size_t t = 0; t < back.tensors.size(); ++t) wanted.push_back({t, {off, shape}});
      const auto files = ckpt::detail::files_holding(back, wanted);
      footer_bytes = ckpt::detail::read_chunk_details(disk, back, std::vector<bool>(back.tensors.size(), true), files);
      std::uint64_t runs_found = 0;
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
    // A restart of every rank: rank 0 reads metadata.json and chunk_map.bin once (the
    // communicator broadcasts them), and each rank the footers of the files it reads.
    const auto load_total = md_bytes + map_bytes + static_cast<std::uint64_t>(ranks) * footer_bytes;
    std::printf("%8u %10llu %10.3f %9.3f %9.3f %9.3f %10.3f %12zu %12zu %10llu %14llu %14.3f %13.3f\n", ranks,
                static_cast<unsigned long long>(ranks) * tensors, median(commit_s), median(merge_s), median(write_s),
                median(raw_s), median(plan_s), md_bytes, map_bytes, static_cast<unsigned long long>(footer_bytes),
                static_cast<unsigned long long>(load_total), first_commit_s, first_merge_s);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(root);
}
