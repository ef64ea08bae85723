// expect: ckpt/adapters/libtorch.hpp needs LibTorch
// The LibTorch adapter without LibTorch's C++ API headers on the include path: a clear #error
// saying what to install, not a cascade of unknown names.
#include <ckpt/adapters/libtorch.hpp>

int main() {}
