// Tensor parallelism inside the model (Megatron-LM's layout; docs/parallelism.md): the pieces model.cpp traces
// where the mesh has a `tensor` axis of t > 1 ranks. Every rank of the axis runs the same program on the same
// sequences, holding 1/t of the heads, of the MLP width and of the vocabulary. A parallel block (attention, MLP)
// reads its input whole (`enter`: replicated, or gathered along the sequence under sequence parallelism) and
// leaves as a sum over the ranks of its partial outputs (`leave`: an all-reduce, or a reduce-scatter along the
// sequence). The objective is the replicated loss counted once: an all-reduce's transpose is the identity,
// pvary's (a replicated value read by rank-varying computation) a sum (ir/ops.h).
#pragma once

#include "ir/ir.h"
#include "nn/model.h"

namespace remat::nn::tensor_parallel {

// t: the ranks of the mesh axis `tensor` (1 without it).
int64_t degree(const ModelConfig& c);

// A parallel block's input from the activation between blocks: under sequence parallelism [B,T/t,D] gathered
// along the sequence to [B,T,D], else the replicated [B,T,D] through pvary (Megatron's f).
ir::Tensor enter(const ModelConfig& c, ir::Tensor h);
// A parallel block's output from the rank's partial sum [B,T,D]: reduce-scattered along the sequence under
// sequence parallelism, else all-reduced (Megatron's g).
ir::Tensor leave(const ModelConfig& c, ir::Tensor partial);
// A parameter every tensor rank holds whole (a norm scale), as a rank's computation on its slice of the
// sequence reads it: through pvary under sequence parallelism (its gradient is then summed over the ranks).
ir::Tensor whole_param(const ModelConfig& c, ir::Tensor p);

// The key or value kernel [D, KV/t, Dh] a rank's query heads read: its own block, or with fewer kv heads than
// ranks (each held whole, [D, KV, Dh]) the one kv head its query heads share, sliced at its coordinate.
ir::Tensor kv_kernel(ir::Builder& b, const ModelConfig& c, ir::Tensor kernel);

// The vocabulary-parallel embedding: the rows of the rank's block [V/t, D] of the table for the ids inside
// its range, zeros for the others, in `dtype`, summed over the ranks by `leave`.
ir::Tensor embed(ir::Builder& b, const ModelConfig& c, ir::Tensor table, ir::Tensor inputs, DType dtype);

// log_softmax(logits)[target] over the whole vocabulary from the rank's logits [..., V/t] (f32), without
// gathering them: the max and the sum of exponentials over the vocabulary reduced over the ranks, the
// target's logit taken from the rank whose block holds it. The shape of `targets`.
ir::Tensor target_log_probs(ir::Builder& b, const ModelConfig& c, ir::Tensor logits, ir::Tensor targets);

// The whole logits [..., V] from the ranks' blocks [..., V/t] (for sampling; the loss never gathers them).
ir::Tensor gather_logits(const ModelConfig& c, ir::Tensor logits);

}  // namespace remat::nn::tensor_parallel
