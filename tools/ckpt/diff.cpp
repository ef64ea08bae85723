// ckpt diff A B: tensor by tensor, the largest absolute and relative differences; the tensors,
// values and config keys only one side has. Memory stays bounded: tensors are compared in
// blocks of at most --block-bytes a side (64 MiB), small tensors batched into one read.

#include <cinttypes>
#include <cmath>
#include <map>
#include <set>

#include <ckpt/ckpt.hpp>
#include <ckpt/reader.hpp>

#include "cli.hpp"
#include "compare.hpp"

namespace ckpt_tool {

namespace {

std::string number(double v) {
  if (std::isinf(v)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

}  // namespace

int run_diff(const diff_args& args) {
  const auto la = locate(args.a), lb = locate(args.b);
  ckpt::reader ra{ckpt::posix(la.root), la.tag}, rb{ckpt::posix(lb.root), lb.tag};
  const auto &ia = ra.info(), &ib = rb.info();
  bool different = false;
  std::printf("A: %s (iteration %" PRIu64 ")\nB: %s (iteration %" PRIu64 ")\n", (la.root / ia.tag).c_str(), ia.iteration,
              (lb.root / ib.tag).c_str(), ib.iteration);

  // Config: every key whose value differs or that one side lacks.
  std::set<std::string> keys;
  for (const auto& [k, v] : ia.config.entries()) keys.insert(k);
  for (const auto& [k, v] : ib.config.entries()) keys.insert(k);
  for (const auto& k : keys) {
    if (!args.config) break;
    const auto *x = ia.config.find(k), *y = ib.config.find(k);
    if (x && y && *x == *y) continue;
    different = true;
    std::printf("config %s: A %s, B %s\n", k.c_str(), x ? x->c_str() : "(absent)", y ? y->c_str() : "(absent)");
  }

  // Tensors: the ones only one side has, then a block-wise comparison of the common ones.
  std::vector<std::pair<const ckpt::tensor_info*, const ckpt::tensor_info*>> common;
  for (const auto& t : ia.tensors) {
    if (const auto* u = rb.find(t.name)) common.emplace_back(&t, u);
    else {
      different = true;
      std::printf("only in A: tensor %s\n", t.name.c_str());
    }
  }
  for (const auto& t : ib.tensors)
    if (!ra.find(t.name)) {
      different = true;
      std::printf("only in B: tensor %s\n", t.name.c_str());
    }

  std::uint64_t total = 0;
  for (const auto& [x, y] : common) total += x->raw_bytes;
  progress_bar bar("diff", total);
  const auto diffs = compare_tensors(ra, rb, common, args.atol, args.rtol, args.block_bytes, [&](std::uint64_t done) { bar.update(done); });
  bar.finish();

  std::size_t w = 6;
  for (const auto& [x, y] : common) w = std::max(w, x->name.size());
  std::size_t differing = 0;
  if (!common.empty())
    std::printf("%-*s  %10s %10s %12s  %s\n", static_cast<int>(w), "TENSOR", "MAX_ABS", "MAX_REL", "MISMATCHED", "RESULT");
  for (std::size_t k = 0; k < common.size(); ++k) {
    const auto& d = diffs[k];
    const bool bad = !d.problem.empty() || d.mismatched != 0;
    differing += bad;
    if (!d.problem.empty()) {
      std::printf("%-*s  %s\n", static_cast<int>(w), common[k].first->name.c_str(), d.problem.c_str());
      continue;
    }
    const char* result = bad ? "DIFFERENT" : d.max_abs == 0 ? "equal" : "within tolerance";
    std::printf("%-*s  %10s %10s %12" PRIu64 "  %s\n", static_cast<int>(w), common[k].first->name.c_str(), number(d.max_abs).c_str(),
                number(d.max_rel).c_str(), d.mismatched, result);
  }
  different = different || differing != 0;

  // Values: per name and rank, equal bytes or not.
  if (args.values) {
    std::map<std::pair<std::string, std::uint32_t>, int> seen;  // 1: A, 2: B, 3: both
    for (const auto& v : ia.values) seen[{v.name, v.rank}] |= 1;
    for (const auto& v : ib.values) seen[{v.name, v.rank}] |= 2;
    for (const auto& [key, sides] : seen) {
      const auto& [name, rank] = key;
      if (sides != 3) {
        different = true;
        std::printf("only in %s: value %s of rank %u\n", sides == 1 ? "A" : "B", name.c_str(), rank);
      } else if (ra.value_bytes(name, rank) != rb.value_bytes(name, rank)) {
        different = true;
        std::printf("value %s of rank %u differs\n", name.c_str(), rank);
      }
    }
  }
  std::printf("%s\n", different ? "DIFFERENT" : "EQUAL");
  return different ? exit_negative : exit_ok;
}

}  // namespace ckpt_tool
