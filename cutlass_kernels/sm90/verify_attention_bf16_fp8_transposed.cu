// The transposed e4m3 kernel for bf16 q, split schedule (verify_launch.cuh).
#include "verify_attention_transposed.cuh"

DDTREE_INSTANTIATE_VERIFY_ATTENTION_TRANSPOSED(cutlass::bfloat16_t)
