#pragma once
/// @file version.hpp
/// The library version, and the on-disk format version it writes.

#define CKPT_VERSION_MAJOR 0
#define CKPT_VERSION_MINOR 1
#define CKPT_VERSION_PATCH 0

namespace ckpt {
/// "0.1.0"
inline constexpr const char* version = "0.1.0";
/// The format version written to metadata.json, chunk_map.bin and every shard file
/// (docs/format.md). ckpt reads versions 1 and 2.
inline constexpr unsigned format_version = 2;
}  // namespace ckpt
