// Helpers shared by the native and MPI backends. Private to comm.
#pragma once

#include <vector>

#include "shoal/tensor/dtype.h"

namespace shoal::comm {

// f16/bf16 <-> f32, for reductions that accumulate in f32.
std::vector<float> widen_half(const void* p, std::size_t n, DType dt);
void narrow_half(const std::vector<float>& v, void* p, DType dt);
// avg = sum / ranks (integers truncate toward zero; bool unchanged).
void divide_by_size(void* buf, std::size_t n, DType dt, int size);

}  // namespace shoal::comm
