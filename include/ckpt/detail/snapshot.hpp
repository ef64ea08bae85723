#pragma once
// The snapshot stage of save_async: every tensor this rank writes is copied into host buffers
// the checkpointer keeps (pinned when the DevicePolicy lends them, and reused by the next async
// save), and the plan is pointed at the copies, so training may change its tensors while the
// write goes on in the background.

#include <cstddef>
#include <cstring>
#include <vector>

#include "../tensor.hpp"
#include "save_plan.hpp"
#include "staging_buffer.hpp"
#include "streamed_gather.hpp"

namespace ckpt::detail {

template <class Device>
class snapshot_buffers {
 public:
  /// Copies the plan's tensors through `via` (the DevicePolicy `owner`, or the gather stage's
  /// receiving device, which takes other ranks' bytes as they arrive) into the buffers, which
  /// borrow from `owner`.
  template <class Via>
  void take(save_plan& plan, Via& via, Device& owner) {
    std::size_t k = 0;
    for (auto& t : plan.mine) {
      if (k == buffers_.size()) buffers_.emplace_back();
      auto& buf = buffers_[k];
      const bool remote = k < plan.source.size() && plan.source[k] >= 0;
      ++k;
      buf.resize(static_cast<std::size_t>(t.ref.nbytes()), owner);
      if (remote) {
        for (const auto& r : transfer_ranges(t.ref, plan.transfers))
          via.to_host(t.ref, r.offset, buf.span().subspan(static_cast<std::size_t>(r.offset), static_cast<std::size_t>(r.bytes)));
      } else if (t.ref.where().type == device::kind::host) {
        if (!buf.empty()) std::memcpy(buf.data(), t.ref.data(), buf.size());
      } else {
        via.to_host(t.ref, 0, buf.span());
      }
      tensor_ref copy(t.ref.type(), t.ref.shape(), buf.data());
      if (t.ref.shard()) copy.sharded(*t.ref.shard());
      copy.laid_out(t.ref.order());  // a column-major tensor stays one
      t.ref = std::move(copy);
    }
  }

 private:
  std::vector<staging_buffer<Device>> buffers_;
};

}  // namespace ckpt::detail
