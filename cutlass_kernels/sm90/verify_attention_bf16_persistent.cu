// The sm_90a verify kernel for bf16 q and KV, persistent schedule (verify_launch.cuh).
#include "verify_attention.cuh"

DDTREE_INSTANTIATE_VERIFY_ATTENTION(cutlass::bfloat16_t, true, false)
