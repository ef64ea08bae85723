#include <ckpt/ckpt.hpp>  // what every checkpointing TU pays before it uses anything
