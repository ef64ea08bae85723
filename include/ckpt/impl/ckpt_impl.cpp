// The ckpt_impl library of meson.build and CMakeLists.txt: ckpt's type-independent parts,
// compiled once with CKPT_SEPARATE_COMPILATION (see src.hpp). A project that builds ckpt its
// own way compiles this one file the same way.
#include "src.hpp"
