#pragma once
/// @file cuda/device_guard.hpp
/// Puts back the calling thread's current CUDA device (its current context) when a scope ends.
/// ckpt's GPU policies select the GPU of the tensor or communicator they work on; the host
/// engine that called them must find its own device current afterwards, as PyTorch's
/// `c10::cuda::CUDAGuard` leaves it. Written against a `Runtime`, like the policies.
///
/// This header includes no CUDA header.

namespace ckpt::cuda::detail {

/// Saves the thread's current device on construction and restores it on destruction; the
/// scope in between selects whatever device it needs.
///
/// @code
/// ckpt::cuda::detail::device_guard guard(rt);  // remembers the caller's device
/// rt.set_device(tensor_gpu);                  // work on the tensor's GPU
/// @endcode                                    // the caller's device is current again
template <class Runtime>
class device_guard {
 public:
  explicit device_guard(Runtime& rt) noexcept : rt_(rt), saved_(rt.current_device()) {}
  ~device_guard() { rt_.restore_device(saved_); }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  Runtime& rt_;
  typename Runtime::device_state saved_;
};

}  // namespace ckpt::cuda::detail
