#pragma once
// The definitions of detail/restore_plan.hpp: the config check and matching names.
// Header-only builds include this at the end of detail/restore_plan.hpp; CKPT_SEPARATE_COMPILATION builds
// compile it once, in the translation unit that includes ckpt/impl/src.hpp.

#include <set>
#include <unordered_set>

namespace ckpt::detail {

CKPT_DECL void check_config(const metadata& md, const config& live, const std::vector<std::string>& ignore, const std::string& md_name) {
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

CKPT_DECL void match_names(const metadata& md, const stored_index& index, const visitor& v, load_result& result) {
  std::unordered_set<std::string_view> live;
  std::size_t found = 0;
  for (const auto& t : v.tensors()) {
    if (index.find_tensor(t.name)) {
      found += !t.name.starts_with("__ckpt");  // counted against the stored names classify looks at
    } else {
      result.missing.push_back(t.name);
      live.insert(t.name);  // live, though not a stored tensor's name
    }
  }
  // Live names are distinct, stored ones distinct: when as many live tensors are stored as there
  // are stored tensors not named "__ckpt…" (which classify passes over), none of those is left
  // over, and the set of every live name (100,000 of them, at every load) is not needed.
  const auto own = static_cast<std::size_t>(
      std::count_if(md.tensors.begin(), md.tensors.end(), [](const tensor_meta& t) { return t.name.starts_with("__ckpt"); }));
  const bool all_stored_live = found == md.tensors.size() - own;
  if (!all_stored_live)
    for (const auto& t : v.tensors()) live.insert(t.name);
  for (const auto& val : v.values()) {
    live.insert(val.name);
    if (!index.find_value(val.name)) result.missing.push_back(val.name);
  }
  std::unordered_set<std::string_view> done;  // values appear once per rank
  auto classify = [&](const std::string& name) {
    // (With every stored tensor live, a live tensor's name is a stored tensor's name or in
    // `live` as a missing one.)
    const bool is_live = live.count(name) || (all_stored_live && index.find_tensor(name));
    if (name.starts_with("__ckpt") || is_live || !done.insert(name).second) return;
    (v.in_skipped_group(name) ? result.skipped : result.unexpected).push_back(name);
  };
  if (!all_stored_live)
    for (const auto& t : md.tensors) classify(t.name);
  for (const auto& val : md.values) classify(val.name);
}

}  // namespace ckpt::detail
