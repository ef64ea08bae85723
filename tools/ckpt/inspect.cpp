// ckpt ls, inspect, verify and prune: what a root holds, what one tag holds, whether every
// byte of it is sound, and the retention rule applied by hand.

#include <cinttypes>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>

#include <ckpt/ckpt.hpp>
#include <ckpt/detail/metadata.hpp>
#include <ckpt/reader.hpp>

#include "cli.hpp"

namespace ckpt_tool {
namespace fs = std::filesystem;

namespace {

std::uint64_t tree_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

std::string local_time(fs::file_time_type t) {
  const auto sys = std::chrono::time_point_cast<std::chrono::seconds>(t - fs::file_time_type::clock::now() +
                                                                     std::chrono::system_clock::now());
  const std::time_t tt = std::chrono::system_clock::to_time_t(sys);
  std::tm tm{};
  localtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string shape_text(const ckpt::shape_t& s) { return ckpt::detail::to_string(s); }

std::string json_array(const std::vector<std::string>& v, bool quote) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + (quote ? json_string(v[i]) : v[i]);
  return out + "]";
}

std::string json_shape(const ckpt::shape_t& s) {
  std::vector<std::string> parts;
  for (auto d : s) parts.push_back(std::to_string(d));
  return json_array(parts, false);
}

}  // namespace

int run_ls(const ls_args& a) {
  const fs::path root = a.root;
  if (!fs::is_directory(root)) throw ckpt::error(ckpt::error_kind::not_found, "no such checkpoint root: " + a.root);
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, root};
  std::optional<std::string> latest;
  std::string latest_problem;
  try {
    latest = cp.latest();
  } catch (const ckpt::error& e) {
    latest_problem = e.what();
  }
  struct row {
    std::string tag, state, date;
    std::optional<std::uint64_t> iteration;
    std::uint64_t bytes = 0;
    bool is_latest = false;
  };
  std::vector<row> rows;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory()) continue;
    const auto name = entry.path().filename().string();
    if (!ckpt::tag_problem(name).empty()) continue;
    const auto md = entry.path() / std::string(ckpt::detail::metadata_file);
    const bool committed = fs::exists(md);
    if (!committed && !fs::exists(entry.path() / std::string(ckpt::detail::marker_file))) continue;  // not ckpt's
    row r;
    r.tag = name;
    r.state = committed ? "committed" : "uncommitted";
    r.date = local_time(fs::last_write_time(committed ? md : entry.path()));
    if (committed) {
      try {
        std::ifstream in(md, std::ios::binary);
        std::string text((std::istreambuf_iterator<char>(in)), {});
        if (text.size() > ckpt::detail::max_metadata_bytes) throw ckpt::error(ckpt::error_kind::corrupt, "too large");
        r.iteration = ckpt::detail::decode_metadata(text, md.string()).iteration;
      } catch (const ckpt::error&) {
        r.state = "damaged";
      }
    }
    r.bytes = tree_bytes(entry.path());
    r.is_latest = latest && *latest == name;
    rows.push_back(std::move(r));
  }
  std::sort(rows.begin(), rows.end(), [](const row& x, const row& y) {
    const auto xi = x.iteration.value_or(UINT64_MAX), yi = y.iteration.value_or(UINT64_MAX);
    return xi != yi ? xi < yi : x.tag < y.tag;
  });
  if (a.json) {
    std::printf("{\"root\": %s, \"latest\": %s, \"tags\": [", json_string(a.root).c_str(),
                latest ? json_string(*latest).c_str() : "null");
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      std::printf("%s\n  {\"tag\": %s, \"state\": \"%s\", \"iteration\": %s, \"bytes\": %" PRIu64 ", \"date\": \"%s\", \"latest\": %s}",
                  i ? "," : "", json_string(r.tag).c_str(), r.state.c_str(),
                  r.iteration ? std::to_string(*r.iteration).c_str() : "null", r.bytes, r.date.c_str(), r.is_latest ? "true" : "false");
    }
    std::printf("\n]}\n");
    return exit_ok;
  }
  std::printf("%-24s %12s  %-11s %10s  %-19s\n", "TAG", "ITERATION", "STATE", "SIZE", "DATE");
  for (const auto& r : rows)
    std::printf("%-24s %12s  %-11s %10s  %-19s%s\n", r.tag.c_str(), r.iteration ? std::to_string(*r.iteration).c_str() : "-",
                r.state.c_str(), human_bytes(static_cast<double>(r.bytes)).c_str(), r.date.c_str(), r.is_latest ? "  <- latest" : "");
  if (rows.empty()) std::printf("(no checkpoints under %s)\n", a.root.c_str());
  if (!latest_problem.empty()) std::printf("latest: %s\n", latest_problem.c_str());
  else if (!latest) std::printf("latest: none\n");
  return exit_ok;
}

int run_inspect(const inspect_args& a) {
  const auto loc = locate(a.path, a.tag);
  ckpt::reader r{ckpt::posix(loc.root), loc.tag};
  const auto& info = r.info();
  if (a.json) {
    std::ostringstream o;
    o << "{\"tag\": " << json_string(info.tag) << ", \"iteration\": " << info.iteration
      << ", \"format_version\": " << info.format_version << ",\n \"topology\": {\"tp\": " << info.topology.tp
      << ", \"pp\": " << info.topology.pp << ", \"dp\": " << info.topology.dp << ", \"world\": " << info.topology.world << "},\n"
      << " \"config\": {";
    bool first = true;
    for (const auto& [k, v] : info.config.entries()) {
      o << (first ? "" : ", ") << json_string(k) << ": " << json_config_value(v);
      first = false;
    }
    o << "},\n \"raw_bytes\": " << info.raw_bytes << ", \"stored_bytes\": " << info.stored_bytes << ",\n \"files\": [";
    for (std::size_t i = 0; i < info.files.size(); ++i)
      o << (i ? ", " : "") << "{\"path\": " << json_string(info.files[i].path) << ", \"rank\": " << info.files[i].rank
        << ", \"bytes\": " << info.files[i].bytes << "}";
    o << "],\n \"tensors\": [";
    for (std::size_t i = 0; i < info.tensors.size(); ++i) {
      const auto& t = info.tensors[i];
      o << (i ? "," : "") << "\n  {\"name\": " << json_string(t.name) << ", \"dtype\": \"" << ckpt::to_string(t.type)
        << "\", \"shape\": " << json_shape(t.shape)
        << ", \"layout\": " << (t.order == ckpt::layout::column_major ? "\"column_major\"" : "\"row_major\"") << ", \"shards\": " << t.files.size() << ", \"chunks\": " << t.chunks
        << ", \"codecs\": " << json_array(t.codecs, true) << ", \"stored_bytes\": " << t.stored_bytes
        << ", \"raw_bytes\": " << t.raw_bytes;
      if (a.chunks) {
        o << ", \"chunk_list\": [";
        const auto cs = r.chunks(t.name);
        for (std::size_t k = 0; k < cs.size(); ++k)
          o << (k ? ", " : "") << "{\"file\": " << json_string(cs[k].file) << ", \"offset\": " << json_shape(cs[k].offset)
            << ", \"shape\": " << json_shape(cs[k].shape) << ", \"codec\": " << json_string(ckpt::codec_name(cs[k].codec))
            << ", \"file_offset\": " << cs[k].file_offset << ", \"stored_bytes\": " << cs[k].stored_bytes << "}";
        o << "]";
      }
      o << "}";
    }
    o << "],\n \"values\": [";
    for (std::size_t i = 0; i < info.values.size(); ++i)
      o << (i ? ", " : "") << "{\"name\": " << json_string(info.values[i].name) << ", \"rank\": " << info.values[i].rank
        << ", \"bytes\": " << info.values[i].bytes << "}";
    o << "]}\n";
    std::fputs(o.str().c_str(), stdout);
    return exit_ok;
  }
  std::printf("tag        %s (iteration %" PRIu64 ", format v%u)\n", info.tag.c_str(), info.iteration, info.format_version);
  std::printf("root       %s\n", loc.root.c_str());
  std::printf("topology   %s\n", ckpt::to_string(info.topology).c_str());
  std::printf("size       %s stored, %s raw, in %zu file(s)\n", human_bytes(static_cast<double>(info.stored_bytes)).c_str(),
              human_bytes(static_cast<double>(info.raw_bytes)).c_str(), info.files.size());
  std::printf("config    ");
  if (info.config.entries().empty()) std::printf(" (none)");
  for (const auto& [k, v] : info.config.entries()) std::printf(" %s=%s", k.c_str(), v.c_str());
  std::printf("\n\n");
  std::size_t w = 6;
  for (const auto& t : info.tensors) w = std::max(w, t.name.size());
  std::printf("%-*s  %-7s %-20s %6s  %-16s %10s %10s\n", static_cast<int>(w), "TENSOR", "DTYPE", "SHAPE", "SHARDS", "CODEC", "STORED", "RAW");
  for (const auto& t : info.tensors) {
    std::string codecs;
    for (const auto& c : t.codecs) codecs += (codecs.empty() ? "" : ",") + c;
    // A column-major tensor's shape (and its chunks') is in memory order: say so, with the logical one.
    const std::string order = t.order == ckpt::layout::column_major
                                  ? "  column-major (logical " + shape_text(ckpt::detail::logical_shape(t.shape, t.order)) + ")"
                                  : "";
    std::printf("%-*s  %-7s %-20s %6zu  %-16s %10s %10s%s\n", static_cast<int>(w), t.name.c_str(), std::string(ckpt::to_string(t.type)).c_str(),
                shape_text(t.shape).c_str(), t.files.size(), codecs.c_str(), human_bytes(static_cast<double>(t.stored_bytes)).c_str(),
                human_bytes(static_cast<double>(t.raw_bytes)).c_str(), order.c_str());
    if (a.chunks)
      for (const auto& c : r.chunks(t.name))
        std::printf("    %s offset %s shape %s %s %s\n", c.file.c_str(), shape_text(c.offset).c_str(), shape_text(c.shape).c_str(),
                    ckpt::codec_name(c.codec).c_str(), human_bytes(static_cast<double>(c.stored_bytes)).c_str());
  }
  if (!info.values.empty()) {
    std::printf("\n%-*s  %6s %10s\n", static_cast<int>(w), "VALUE", "RANK", "BYTES");
    for (const auto& v : info.values) std::printf("%-*s  %6u %10" PRIu64 "\n", static_cast<int>(w), v.name.c_str(), v.rank, v.bytes);
  }
  return exit_ok;
}

int run_verify(const verify_args& a) {
  const auto loc = locate(a.path, a.tag);
  std::optional<ckpt::reader<>> r;
  try {
    r.emplace(ckpt::posix(loc.root), loc.tag);
  } catch (const ckpt::error& e) {
    if (e.kind() != ckpt::error_kind::corrupt) throw;
    std::printf("DAMAGED: %s\n", e.what());  // the metadata itself cannot be trusted
    return exit_negative;
  }
  progress_bar bar("verify", r->info().stored_bytes);
  const auto rep = r->verify([&](std::uint64_t done, std::uint64_t) { bar.update(done); });
  bar.finish();
  const auto& info = r->info();
  if (rep.ok()) {
    if (!a.quiet)
      std::printf("OK: %s (iteration %" PRIu64 "): %zu tensors, %" PRIu64 " chunks, %zu values, %s checked in %zu file(s)\n",
                  info.tag.c_str(), info.iteration, info.tensors.size(), rep.chunks_checked, info.values.size(),
                  human_bytes(static_cast<double>(rep.bytes_checked)).c_str(), info.files.size());
    return exit_ok;
  }
  std::printf("DAMAGED: %s (iteration %" PRIu64 "): %zu problem(s)\n", info.tag.c_str(), info.iteration, rep.problems.size());
  for (const auto& p : rep.problems) std::printf("  %s\n", p.c_str());
  return exit_negative;
}

int run_prune(const prune_args& a) {
  if (!fs::is_directory(a.root)) throw ckpt::error(ckpt::error_kind::not_found, "no such checkpoint root: " + a.root);
  ckpt::checkpointer<ckpt::single_process, ckpt::posix> cp{{}, fs::path(a.root)};
  const auto gone = cp.prune(a.keep, a.dry_run);
  for (const auto& g : gone) std::printf("%s %s\n", a.dry_run ? "would delete" : "deleted", g.c_str());
  if (gone.empty()) std::printf("nothing to delete (keeping the newest %zu)\n", a.keep);
  return exit_ok;
}

}  // namespace ckpt_tool
