// Inside ir/: what the shape rules share across their files (shape_rules.cpp holds lax's ops and the dispatch,
// shape_rules_model_ops.cpp the ops remat adds to lax). Not part of ir/'s interface.
#pragma once

#include "ir/graph.h"

#include <string>
#include <string_view>
#include <vector>

namespace remat::ir::shape_rules {

// One op's inputs as a rule sees them; `where` names the op for error messages.
struct Ctx {
  std::string_view where;
  const std::vector<Type>& in;
  const Attrs& attrs;
  const Graph* body;
};

std::string types_str(const std::vector<Type>& ts);  // "(f32[2,3], i32[2])"

// The rules of the ops beyond lax (shape_rules_model_ops.cpp), as shape_rules.cpp's dispatch names them.
std::vector<Type> rule_rope(const Ctx& c);
std::vector<Type> rule_attention(const Ctx& c);
std::vector<Type> rule_attention_grad(const Ctx& c);
std::vector<Type> rule_softmax(const Ctx& c);
std::vector<Type> rule_softmax_grad(const Ctx& c);
std::vector<Type> rule_log_softmax(const Ctx& c);
std::vector<Type> rule_log_softmax_grad(const Ctx& c);
std::vector<Type> rule_rms_norm(const Ctx& c);
std::vector<Type> rule_rms_norm_grad(const Ctx& c);
std::vector<Type> rule_target_log_prob(const Ctx& c);
std::vector<Type> rule_target_log_prob_grad(const Ctx& c);
std::vector<Type> rule_swiglu(const Ctx& c);
std::vector<Type> rule_swiglu_grad(const Ctx& c);
std::vector<Type> rule_adamw(const Ctx& c);

}  // namespace remat::ir::shape_rules
