// The sm_90a verify kernel for fp16 q and KV, split schedule (verify_launch.cuh).
#include "verify_attention.cuh"

DDTREE_INSTANTIATE_VERIFY_ATTENTION(cutlass::half_t, false, false)
