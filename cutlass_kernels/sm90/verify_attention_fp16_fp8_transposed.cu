// The transposed e4m3 kernel for fp16 q, split schedule (verify_launch.cuh).
#include "verify_attention_transposed.cuh"

DDTREE_INSTANTIATE_VERIFY_ATTENTION_TRANSPOSED(cutlass::half_t)
