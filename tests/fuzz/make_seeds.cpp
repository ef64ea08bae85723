// Writes the fuzz targets' seed corpus (tests/fuzz/corpus/) from real checkpoints: a few
// states saved by ckpt into memory, cut into the pieces each target reads. Its output is
// committed; rerun it whenever the format changes, so the fuzzers start from valid inputs.
//
//   ninja -C build tests/fuzz/make_seeds && build/tests/fuzz/make_seeds tests/fuzz/corpus

#include <ckpt/ckpt.hpp>
#include <ckpt/detail/commit.hpp>
#include <ckpt/detail/format.hpp>
#include <ckpt/detail/metadata.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct small {
  std::vector<float> w = std::vector<float>(300, 1.5f);
  std::vector<std::int8_t> b = std::vector<std::int8_t>(7, 3);
  std::uint64_t step = 9;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("layer.w", ckpt::view(w.data(), {10, 30}));
    v.group("optimizer", [&](auto& g) { g.tensor("b", b); });
    v.value("step", step);
  }
};

struct wide {
  std::vector<ckpt::bfloat16> e = std::vector<ckpt::bfloat16>(2 * 3 * 4 * 5);
  std::vector<double> d = std::vector<double>(1);
  float scalar = 2;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("embed", ckpt::view(e.data(), {2, 3, 4, 5}));
    v.tensor("d", d);
    v.tensor("scalar", ckpt::view(&scalar, {}));
  }
};

/// A column-major matrix (as the Eigen adapter saves one) beside a row-major one: metadata.json's
/// "layout" member and bit 7 of the index's dtype byte.
struct column_major {
  std::vector<float> m = std::vector<float>(6 * 4, 0.25f);  // a column-major 6x4: memory-order [4, 6]
  std::vector<std::int32_t> r = std::vector<std::int32_t>(2 * 3, 7);
  template <class V>
  void checkpoint(V& v) {
    v.tensor("m", ckpt::view(m.data(), {4, 6}).laid_out(ckpt::layout::column_major));
    v.tensor("r", ckpt::view(r.data(), {2, 3}));
  }
};

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string as_string(const std::vector<std::byte>& b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

template <class State>
void seeds(const fs::path& out, const std::string& name, std::uint64_t chunk_bytes) {
  namespace d = ckpt::detail;
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem, {.chunk_bytes = chunk_bytes}};
  State s;
  cp.save(5, s);
  const std::string tag = "global_step5";
  const auto shard = as_string(mem.bytes(tag + "/mp_rank_00/model_optim_rng.ckpt"));
  const auto t = d::check_trailer(std::span<const std::byte, d::trailer_bytes>(
                                      reinterpret_cast<const std::byte*>(shard.data()) + shard.size() - d::trailer_bytes, d::trailer_bytes),
                                  shard.size(), "seed");
  write(out / "index" / (name + "_index"), shard.substr(t.index_offset, t.index_size));
  write(out / "index" / (name + "_index_and_trailer"), shard.substr(t.index_offset));
  const auto text = as_string(mem.bytes(tag + "/metadata.json"));
  const auto doc_begin = d::envelope_head.size() + 16 + d::envelope_mid.size();
  const auto doc = text.substr(doc_begin, text.size() - doc_begin - d::envelope_tail.size());
  write(out / "metadata" / (name + "_doc_and_map"), doc + std::string(1, '\0') + as_string(mem.bytes(tag + "/chunk_map.bin")));
  write(out / "metadata" / (name + "_file"), text);
  write(out / "latest" / (name + "_latest"), as_string(mem.bytes("latest")));
}

/// Format-2 maps of several ranks, merged as rank 0 merges them: a grid whose cells are in
/// files 3, 2, 1, 0 (a falling run), and a list (an uneven split).
void merged_seeds(const fs::path& out) {
  namespace d = ckpt::detail;
  auto shard = [](std::uint32_t r, std::uint64_t row0, std::uint64_t rows, std::uint64_t total) {
    d::written_shard w;
    w.path = "mp_rank_0" + std::to_string(r) + "/model_optim_rng.ckpt";
    w.index.rank = r;
    auto& g = w.index.tensors.emplace_back();
    g.name = "w";
    g.global_shape = {total, 6};
    g.chunks.ndim = 2;
    g.chunks.push(0, ckpt::shape_t{row0, 0}, ckpt::shape_t{rows, 6}, 0, 4096, rows * 24, r);
    w.size = 65536;
    return w;
  };
  auto save = [&](const std::string& name, const std::vector<d::written_shard>& ws) {
    std::vector<std::vector<std::byte>> reports;
    for (const auto& w : ws) {
      const auto s = d::encode_report(w, {});
      reports.emplace_back(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
    }
    const auto n = static_cast<std::uint32_t>(ws.size());
    auto md = d::merge_reports("global_step5", 5, {n, 1, 1, n}, {}, reports, 1);
    const auto map = d::encode_chunk_map(md);
    md.chunk_map.size = map.size();
    md.chunk_map.xxh3 = d::xxh3(std::as_bytes(std::span(map.data(), map.size())));
    const auto text = d::encode_metadata(md);
    const auto doc_begin = d::envelope_head.size() + 16 + d::envelope_mid.size();
    const auto doc = text.substr(doc_begin, text.size() - doc_begin - d::envelope_tail.size());
    write(out / "metadata" / (name + "_doc_and_map"), doc + std::string(1, '\0') + map);
  };
  save("grid4", {shard(0, 6, 2, 8), shard(1, 4, 2, 8), shard(2, 2, 2, 8), shard(3, 0, 2, 8)});
  save("list3", {shard(0, 0, 3, 8), shard(1, 3, 3, 8), shard(2, 6, 2, 8)});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: make_seeds OUT_DIR\n"), 2;
  seeds<small>(argv[1], "small", 256);
  seeds<wide>(argv[1], "wide", 64);
  seeds<small>(argv[1], "one_chunk", std::uint64_t{1} << 20);
  seeds<column_major>(argv[1], "column_major", 32);
  merged_seeds(argv[1]);
  return 0;
}
