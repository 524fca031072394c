// __byte_perm on the host, for the host-side checks (its default mode: selector nibbles 0-7 pick
// bytes of {y, x}; the sign-replicating mode is not used by the kernels).
#pragma once

#include <cstdint>

inline uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t selector) {
  const uint64_t bytes = uint64_t(y) << 32 | x;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) out |= uint32_t((bytes >> (8 * ((selector >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return out;
}
