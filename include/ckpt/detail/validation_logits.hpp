#pragma once
// Validation logits: a save may carry the model's outputs on a fixed batch (rank 0's, in host
// memory), stored as ckpt's own tensor; a load may compare the live model's outputs on that
// batch with them, as torch.allclose would, and fail naming the worst element.

#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "../dtype.hpp"
#include "../error.hpp"
#include "../host_copy.hpp"
#include "../options.hpp"
#include "../tensor.hpp"
#include "chunk_reader.hpp"
#include "metadata.hpp"

namespace ckpt::detail {

inline constexpr std::string_view validation_name = "__ckpt.validation_logits";

/// "[i, j, k]": the multi-index of element `flat` of a row-major `shape`.
inline std::string index_string(std::uint64_t flat, const shape_t& shape) {
  shape_t idx(shape.size());
  for (std::size_t d = shape.size(); d > 0; --d) {
    idx[d - 1] = shape[d - 1] ? flat % shape[d - 1] : 0;
    flat = shape[d - 1] ? flat / shape[d - 1] : 0;
  }
  return to_string(idx);
}

/// Save: what the logits must be before a save may carry them.
inline void check_validation_logits(const tensor_ref& logits) {
  if (!is_floating(logits.type()))
    throw error(error_kind::invalid_argument, "validation logits must be floating point, not " + std::string(to_string(logits.type())));
  if (logits.where().type != device::kind::host) throw error(error_kind::invalid_argument, "validation logits must be in host memory");
}

/// Load: reads the saved logits through `chunks` (every chunk verified) and compares `live`
/// with them within `opts.rtol` and `opts.atol`; a `mismatch` error names how many elements
/// differ and the worst.
template <class Chunks, class Verify>
void compare_validation_logits(const metadata& md, const tensor_ref& live, const load_options& opts, const Chunks& chunks,
                               Verify& verify_file, load_result& result) {
  const tensor_meta* s = nullptr;
  for (const auto& t : md.tensors)
    if (t.name == validation_name) s = &t;
  if (!s) throw error(error_kind::not_found, "checkpoint " + md.tag + " holds no validation logits (save them with save_options::validation_logits)");
  if (!is_floating(live.type()) || live.where().type != device::kind::host)
    throw error(error_kind::invalid_argument, "validation logits must be a floating-point host tensor");
  if (s->shape != live.shape())
    throw error(error_kind::mismatch, "validation logits: saved shape " + to_string(s->shape) + ", current " + to_string(live.shape()));
  std::vector<std::byte> saved(element_count(s->shape, "validation logits") * size_of(s->type));
  tensor_ref saved_ref(s->type, s->shape, saved.data());
  host_copy host;
  const std::string name = "validation logits";
  const tensor_load one[]{{s, &name, &saved_ref}};
  result.bytes_read += chunks.load(std::span(one), md, verify_file, host);
  const auto n = live.numel();
  std::uint64_t bad = 0, worst = 0;
  double worst_diff = 0;  // over the failing elements; NaN counts as infinitely far
  for (std::uint64_t i = 0; i < n; ++i) {
    const double a = element_as_double(saved.data(), s->type, i);
    const double b = element_as_double(live.data(), live.type(), i);
    const double diff = std::fabs(a - b);
    if (diff <= opts.atol + opts.rtol * std::fabs(a)) continue;  // like torch.allclose; false for NaN
    const double key = std::isnan(diff) ? HUGE_VAL : diff;
    if (bad++ == 0 || key > worst_diff) {
      worst_diff = key;
      worst = i;
    }
  }
  if (bad) {
    std::ostringstream msg;
    msg.precision(9);
    msg << "validation logits differ from those saved with " << md.tag << ": " << bad << " of " << n
        << " elements outside rtol=" << opts.rtol << " atol=" << opts.atol << "; max abs difference " << worst_diff << " at "
        << index_string(worst, live.shape()) << " (saved " << element_as_double(saved.data(), s->type, worst) << ", now "
        << element_as_double(live.data(), live.type(), worst) << ")";
    throw error(error_kind::mismatch, msg.str());
  }
}

}  // namespace ckpt::detail
