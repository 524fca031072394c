// The sm_90a verify kernel for fp16 q and an e4m3 KV cache, persistent schedule (verify_launch.cuh).
#include "verify_attention.cuh"

DDTREE_INSTANTIATE_VERIFY_ATTENTION(cutlass::half_t, true, true)
