#pragma once
// The snapshot stage of save_async: every tensor this rank writes is copied into host buffers
// the checkpointer keeps (pinned when the DevicePolicy lends them, and reused by the next async
// save), and the plan is pointed at the copies, so training may change its tensors while the
// write goes on in the background. Host tensors are copied by the caller's thread and the crew's
// helpers (copy_crew.hpp), since training waits for the copy.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../tensor.hpp"
#include "copy_crew.hpp"
#include "save_plan.hpp"
#include "staging_buffer.hpp"
#include "streamed_gather.hpp"

namespace ckpt::detail {

template <class Device>
class snapshot_buffers {
 public:
  /// `threads`: the most threads that copy host tensors, the caller's included.
  explicit snapshot_buffers(unsigned threads) : crew_(threads) {}

  /// Copies the plan's tensors through `via` (the DevicePolicy `owner`, or the gather stage's
  /// receiving device, which takes other ranks' bytes as they arrive) into the buffers, which
  /// borrow from `owner`.
  template <class Via>
  void take(save_plan& plan, Via& via, Device& owner) {
    // GPU tensors' copies into lent buffers are enqueued one behind the other and waited for
    // together, at the end: one wait per tensor left the copy engine idle between tensors.
    copies_in_flight<Via> copies;
    host_copies_.clear();
    std::size_t k = 0;
    for (auto& t : plan.mine) {
      if (k == buffers_.size()) buffers_.emplace_back();
      auto& buf = buffers_[k];
      const bool remote = k < plan.source.size() && plan.source[k] >= 0;
      ++k;
      // A host tensor's copy lies as far into its page as the tensor does: the shard file places
      // its large chunks for that (format.hpp, placed_from), and a load into the tensor's memory
      // then reads them in place, as after a synchronous save.
      const bool host = !remote && t.ref.where().type == device::kind::host;
      const auto in_page = host ? static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(t.ref.data()) % 4096) : 0;
      const auto bytes = static_cast<std::size_t>(t.ref.nbytes());
      buf.resize(bytes + in_page, owner);
      const auto into = buf.span().subspan(in_page);
      if (remote) {
        for (const auto& r : transfer_ranges(t.ref, plan.transfers))
          via.to_host(t.ref, r.offset, into.subspan(static_cast<std::size_t>(r.offset), static_cast<std::size_t>(r.bytes)));
      } else if (host) {
        host_copies_.push_back({into.data(), static_cast<const std::byte*>(t.ref.data()), bytes});
      } else {
        copies.start(via, t.ref, 0, into);
      }
      tensor_ref copy(t.ref.type(), t.ref.shape(), into.data());
      if (t.ref.shard()) copy.sharded(*t.ref.shard());
      copy.laid_out(t.ref.order());  // a column-major tensor stays one
      t.ref = std::move(copy);
    }
    // The host copies wait for the loop, which may itself wait for device copies (past 8 in
    // flight): in a state of both kinds, the CPU idles there. A state lies on one device or on
    // the host, as a rule, and split over threads the host copies gain more than that costs.
    crew_.copy(host_copies_);  // while the device copies land
    copies.wait();
  }

 private:
  // Page-aligned where not lent, and from 2 MiB on in huge pages: the next async save copies
  // into them after seconds of training, and into ordinary pages that first copy ran 16-23 %
  // slower than a copy repeated at once, into huge pages 7-10 % (docs/performance.md).
  std::vector<staging_buffer<Device, 4096, true>> buffers_;
  std::vector<copy_job> host_copies_;
  copy_crew crew_;
};

}  // namespace ckpt::detail
