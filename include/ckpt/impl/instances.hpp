#pragma once
// The checkpointers whose bodies a CKPT_SEPARATE_COMPILATION build compiles once (impl/src.hpp)
// instead of in every translation unit that saves or loads: the default, the default with
// zstd, and the in-memory one. ckpt.hpp declares them `extern template`. Any other choice of
// template arguments is instantiated where it is used, as in a header-only build, by a
// translation unit that includes impl/checkpointer.ipp (checkpointer.hpp says why).
#define CKPT_PRECOMPILED_CHECKPOINTERS(X)               \
  X(single_process, posix, raw, host_copy)              \
  X(single_process, posix, zstd, host_copy)             \
  X(single_process, memory_storage, raw, host_copy)
