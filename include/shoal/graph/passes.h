// Graph passes: reverse-mode autodiff, dead-code elimination, verification,
// buffer-reuse memory planning, and JSON / Graphviz DOT dumps. Each pass
// edits or reads one Graph; not thread-safe for the same graph.
#pragma once

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "shoal/graph/graph.h"

namespace shoal::graph {

// Appends gradient nodes computing d(loss)/d(w) for each w in wrt; returns
// one Value per w (a zero constant where w does not reach loss). loss must be
// a floating tensor; its seed gradient is ones. Errors name the node whose op
// has no gradient rule.
Result<std::vector<Value>> autodiff(Graph& g, Value loss, const std::vector<Value>& wrt);

// Marks nodes that no graph output depends on as dead; returns how many.
int eliminate_dead_code(Graph& g);

// Ops whose output element i depends only on element i of each same-shaped
// input, whatever its position (relu, add, ...): any order of the elements,
// any layout all full-size operands share, gives the same values.
bool elementwise(const std::string& op);

// transpose(f(transpose(x, p)), q), where f is elementwise with one input
// (relu, tanh, ...) and q undoes p, becomes f(x); so does
// reshape(f(reshape(x)), back to x's shape), and either pair with no f
// between becomes x. The ONNX import lowers a 3-D
// convolution through its frames (N, D, C, H, W) and back, so the
// activation between two of them sat between a transpose and its inverse;
// a 1-D net's [N, C, L] activation sat between reshapes from and to the
// [N, C, 1, L] of its 2-D convolutions, batch norms and pools. Looks at
// nodes from `first` on; returns how many it rewrote. The pairs are left
// for dead-code elimination when nothing else reads them.
Result<int> cancel_shape_pairs(Graph& g, int first = 0);

// Checks every alive node: known op, inputs alive, attrs allowed, stored
// types equal to re-inferred ones, no cycle. Errors name the node and shapes.
Status verify(const Graph& g);

// Buffer-reuse plan over one arena: each planned value gets an offset; two
// values share bytes only when their lifetimes in `order` do not overlap.
struct MemoryPlan {
  std::map<Value, std::size_t> offset;
  std::size_t arena_bytes = 0;  // peak
  std::size_t naive_bytes = 0;  // sum of all planned buffers, for comparison
};
// Values of "input" and "constant" nodes live outside the arena. Graph
// outputs live to the end. `extend_until` lets a caller keep a value alive
// until a later position (e.g. inputs of async nodes until their wait).
// A pack: values placed back to back, in this order, with no padding
// between them (one span a collective can work on in place); aliases[i],
// when given, shares members[i]'s bytes (an in-place output). The pack
// lives from its first member's definition to the last use of any member
// or alias. Members must be distinct arena values, each in one pack.
struct Pack {
  std::vector<Value> members, aliases;
};
// Values in `outside` get no bytes in the arena (the caller stores them).
MemoryPlan plan_memory(const Graph& g, const std::vector<int>& order,
                       const std::map<Value, int>& extend_until = {}, std::size_t alignment = 64,
                       const std::vector<Pack>& packs = {}, const std::set<Value>& outside = {});

// Floating-point operations of one node's products, multiply and add
// counted apart (2·M·N·K for matmul and linear, 2·|y|·Cin/groups·kH·kW for
// a convolution and each of its gradients); 0 for every other op. The sum
// over a training step's alive nodes is the step's model FLOPs, forward
// and backward, as Megatron counts them for model FLOPs utilization.
double node_flops(const Graph& g, const Node& n);
double graph_flops(const Graph& g);

// Mixed precision (--precision bf16), as autocast does it: every matmul and
// linear whose operands are f32 reads bf16 copies of them made by "cast"
// nodes placed in the graph (one per value, shared by its forward and
// backward users) and writes f32 (attribute dst). Everything else — biases,
// norms, softmax, the loss, reductions, the optimizer and the f32 master
// weights — is left as it was. Products oneDNN cannot run in bf16
// (broadcast batch shapes, empty operands) are left in f32. Convolutions
// and their gradients keep f32 operands and get the attribute
// precision=bf16 instead: their kernel reorders every operand into
// oneDNN's blocked layout anyway, and converts to bf16 in that same pass.
// Last, a product whose f32 output only reaches a cast through shape ops
// (attention's heads: linear -> reshape -> transpose) writes bf16 itself
// and that cast goes.
struct PrecisionReport {
  int products = 0;         // matmuls and linears that now read bf16
  int casts = 0;            // cast nodes added
  int kept = 0;             // products left in f32
  int convolutions = 0;     // convolution nodes marked precision=bf16
  int narrowed = 0;         // products that write bf16 themselves (dst bf16)
  int read_bf16 = 0;        // products writing bf16 that GELU or softmax reads
  int norms_read_bf16 = 0;  // convolutions writing bf16 that batch norms read
};
Result<PrecisionReport> autocast_bf16(Graph& g);

// Selective activation recomputation (--recompute selective), as Megatron
// does it for attention: the region from a product through elementwise
// ops (scale, mask) to a softmax — nodes among the first `forward_end`
// (the forward, before autodiff), each value used only inside the region
// but the softmax's — is computed again for the backward: the backward's
// uses of the softmax output read a copy of the region appended after
// every other node. The executor schedules a ready node of higher id only
// when nothing of lower id is ready, so each copy runs just before its
// layer's backward needs it, and the [B, H, T, T] probabilities no longer
// live from the forward to the backward. Regions are copied last layer
// first, so the copy needed first has the lowest id.
struct RecomputeReport {
  int regions = 0;  // softmax regions recomputed
  int nodes = 0;    // nodes copied
};
Result<RecomputeReport> recompute_attention(Graph& g, int forward_end);
// Full recomputation (--recompute full): of the forward's values, only the
// inputs of the normalization layers (the residual stream of a transformer,
// what enters each batch norm of a CNN), parameters, inputs and constants
// are kept for the backward; every other value the backward reads is
// computed again from them by copies appended last layer first.
Result<RecomputeReport> recompute_full(Graph& g, int forward_end);

std::string to_json(const Graph& g);
std::string to_dot(const Graph& g);

}  // namespace shoal::graph
